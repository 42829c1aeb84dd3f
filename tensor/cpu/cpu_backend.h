#pragma once
// The CPU backend. Methods are implemented across files by topic:
//   copy_fill.cpp    copy (strided, casting), fill, arange, random, concat
//   elementwise.cpp  binary, affine, axpy, unary(+backward), bias_add, dropout
//   reduce.cpp       sum_to, reduce, sum_squares
//   matmul.cpp       matmul (oneDNN when built with it, Eigen otherwise)
//   linear.cpp       linear with bias/GELU epilogues and its backward pieces
//   norm.cpp         layernorm, rmsnorm (also fused with a residual add), softmax
//   attention.cpp    fused causal attention, rotary
//   embedding_loss.cpp  embedding, fused softmax + cross-entropy
// All kernels parallelise with OpenMP over independent rows/elements, with a fixed split so
// results do not depend on the thread count (Note [Backend contract]).
#include "tensor/backend.h"

namespace strata::tensor::cpu {

class CpuBackend final : public Backend {
 public:
  static CpuBackend& instance();
  Device device() const override { return Device::cpu(); }

  void copy(const Tensor& src, Tensor& dst) override;
  void fill(Tensor& dst, double value) override;
  void arange(Tensor& dst, double start, double step) override;
  void random_uniform(Tensor& dst, RngKey key, float lo, float hi) override;
  void random_normal(Tensor& dst, RngKey key, float mean, float stddev) override;
  void concat(const std::vector<Tensor>& xs, int dim, Tensor& out) override;

  void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) override;
  void affine(const Tensor& x, float alpha, float beta, Tensor& out) override;
  void axpy(float alpha, const Tensor& x, Tensor& y) override;
  void unary(UnaryOp op, const Tensor& x, Tensor& out) override;
  void unary_backward(UnaryOp op, const Tensor& x, const Tensor& dy, Tensor& dx) override;
  void bias_add(const Tensor& x, const Tensor& bias, Tensor& out) override;
  void dropout(const Tensor& x, float p, RngKey key, Tensor& out) override;

  void sum_to(const Tensor& x, Tensor& out) override;
  void reduce(ReduceOp op, const Tensor& x, int dim, Tensor& out, Tensor* indices) override;
  void top_k(const Tensor& x, Tensor& values, Tensor& indices) override;
  double sum_squares(const Tensor& x) override;

  void matmul(const Tensor& a, const Tensor& b, Tensor& out, bool trans_a, bool trans_b,
              float alpha, float beta) override;

  void linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act,
                      Tensor& y, Tensor& pre) override;
  void linear_backward_weight(const Tensor& dy, const Tensor& x, Tensor& dweight, Tensor& dbias,
                              bool accumulate) override;
  void linear_backward_gelu(const Tensor& dz, const Tensor& weight, const Tensor& pre, Tensor& dpre,
                            Tensor& dbias) override;

  void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                         Tensor& y, Tensor& mean, Tensor& rstd) override;
  void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                          Tensor& dbias, bool accumulate) override;
  void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, Tensor& y,
                       Tensor& rstd) override;
  void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                        Tensor& dx, Tensor& dweight, bool accumulate) override;
  void add_layernorm_forward(const Tensor& x, const Tensor& r, const Tensor& weight,
                             const Tensor& bias, float eps, Tensor& s, Tensor& y, Tensor& mean,
                             Tensor& rstd) override;
  void add_layernorm_backward(const Tensor& dy, const Tensor& ds, const Tensor& s,
                              const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                              Tensor& dsum, Tensor& dweight, Tensor& dbias,
                              bool accumulate) override;
  void add_rmsnorm_forward(const Tensor& x, const Tensor& r, const Tensor& weight, float eps,
                           Tensor& s, Tensor& y, Tensor& rstd) override;
  void add_rmsnorm_backward(const Tensor& dy, const Tensor& ds, const Tensor& s,
                            const Tensor& weight, const Tensor& rstd, Tensor& dsum, Tensor& dweight,
                            bool accumulate) override;
  void softmax_forward(const Tensor& x, Tensor& y) override;
  void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) override;

  void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                         float scale, Tensor& out, Tensor& lse) override;
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                          const Tensor& lse, const Tensor& dout, bool causal, float scale,
                          Tensor& dq, Tensor& dk, Tensor& dv) override;
  void rotary(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse,
              Tensor& out) override;

  void embedding_forward(const Tensor& weight, const Tensor& ids, Tensor& out) override;
  void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight) override;
  void cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                             int64_t classes, Tensor& losses, Tensor& lse) override;
  void cross_entropy_norm(const Tensor& targets, int64_t ignore_index, Tensor& out) override;
  void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              const Tensor& dloss, int64_t ignore_index, int64_t classes,
                              Tensor& dlogits) override;
};

}  // namespace strata::tensor::cpu
