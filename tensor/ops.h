#pragma once
// The op API: plain (non-differentiable) tensor functions. Each validates its arguments,
// allocates its outputs on the inputs' device and dispatches to that device's Backend.
// autograd/ builds differentiable functions from pairs of these (forward + backward).
#include <vector>

#include "tensor/backend.h"
#include "tensor/tensor.h"

namespace strata::tensor {

// ---- elementwise (broadcasting) ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& x, float alpha);               // alpha * x
Tensor affine(const Tensor& x, float alpha, float beta);  // alpha * x + beta
void axpy_(float alpha, const Tensor& x, Tensor& y);      // y += alpha * x (y contiguous)
Tensor unary(UnaryOp op, const Tensor& x);
Tensor unary_backward(UnaryOp op, const Tensor& x, const Tensor& dy);
inline Tensor gelu(const Tensor& x) {
  return unary(UnaryOp::Gelu, x);
}
inline Tensor silu(const Tensor& x) {
  return unary(UnaryOp::Silu, x);
}
Tensor bias_add(const Tensor& x, const Tensor& bias);
Tensor dropout(const Tensor& x, float p, RngKey key);

// ---- reductions ----
Tensor sum_to(const Tensor& x, const Shape& shape);  // backward of broadcasting
Tensor sum(const Tensor& x, int dim, bool keepdim = false);
Tensor mean(const Tensor& x, int dim, bool keepdim = false);
struct MaxResult {
  Tensor values;
  Tensor indices;
};
MaxResult max(const Tensor& x, int dim, bool keepdim = false);
Tensor sum_all(const Tensor& x);  // 0-d
double sum_squares(const Tensor& x);
double l2_norm(const Tensor& x);
// sqrt of the sum of squares over all tensors: global gradient norm.
double global_l2_norm(const std::vector<Tensor>& xs);

// ---- matmul ----
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
// out = alpha * op(a) @ op(b) + beta * out, in place.
void matmul_out(const Tensor& a, const Tensor& b, Tensor& out, bool trans_a, bool trans_b,
                float alpha = 1.f, float beta = 0.f);

// ---- normalisation (over the last dim) ----
struct NormResult {
  Tensor y;
  Tensor mean;  // layernorm only
  Tensor rstd;
};
NormResult layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps);
struct LayerNormGrads {
  Tensor dx, dweight, dbias;
};
LayerNormGrads layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                  const Tensor& mean, const Tensor& rstd);
NormResult rmsnorm(const Tensor& x, const Tensor& weight, float eps);
struct RmsNormGrads {
  Tensor dx, dweight;
};
RmsNormGrads rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                              const Tensor& rstd);
Tensor softmax(const Tensor& x);  // last dim
Tensor softmax_backward(const Tensor& y, const Tensor& dy);

// ---- attention ----
struct AttentionResult {
  Tensor out;
  Tensor lse;
};
// q [B, H, Tq, D], k, v [B, H, Tk, D]; scale defaults to 1/sqrt(D) when <= 0.
AttentionResult attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                          float scale = 0.f);
struct AttentionGrads {
  Tensor dq, dk, dv;
};
AttentionGrads attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, const Tensor& dout,
                                  bool causal, float scale = 0.f);
// x [B, T, H, D]; cos, sin [T, D/2]. See rotary_tables.
Tensor rotary(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse = false);
// cos/sin tables for positions [start, start + T) with base theta (LLaMA: 10000).
std::pair<Tensor, Tensor> rotary_tables(int64_t T, int64_t head_dim, double theta = 10000.0,
                                        int64_t start = 0, Device device = Device::cpu());

// ---- embedding and loss ----
Tensor embedding(const Tensor& weight, const Tensor& ids);  // ids any int shape -> [..., C]
// dweight += scatter(dout) — deterministic.
void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight);
struct CrossEntropyResult {
  Tensor losses;  // [N]
  Tensor lse;     // [N]
  int64_t count;  // rows whose target is not ignore_index
};
// logits [N, V] (or [..., V], flattened), targets [N] (or [...]).
CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& targets,
                                 int64_t ignore_index = -100);
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              const Tensor& dloss, int64_t ignore_index = -100);
// Number of targets not equal to ignore_index.
int64_t count_valid(const Tensor& targets, int64_t ignore_index);

// ---- shape ----
Tensor concat(const std::vector<Tensor>& xs, int dim);
// Views of consecutive pieces of the given sizes along dim.
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int dim);

// ---- comparisons (tests) ----
// max |a - b| over all elements (any float dtypes/devices/layouts, same shape).
double max_abs_diff(const Tensor& a, const Tensor& b);
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);

}  // namespace strata::tensor
