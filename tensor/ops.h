#pragma once
// The op API: plain (non-differentiable) tensor functions. Each validates its arguments,
// allocates its outputs on the inputs' device and dispatches to that device's Backend.
// autograd/ builds differentiable functions from pairs of these (forward + backward).
//
// Note [Low-precision ops]
// Every op takes F32, BF16 or F16 float tensors; the CPU and CUDA backends keep one contract:
// - The float operands of an op share one dtype, its *compute dtype*, and its outputs take it,
//   except as listed below. A mismatch is a UserError naming the op and the operands.
// - Arithmetic is f32 inside: each element is widened on load, computed as the f32 kernel
//   computes it, and rounded ONCE on store (round-to-nearest-even, core/half.h); accumulations
//   are f32/f64 as in the f32 kernel. (The CPU widens whole tensors: Note [Widening adapter].)
// - Always F32 whatever the compute dtype: layernorm mean/rstd, rmsnorm rstd, attention lse,
//   cross-entropy's per-row losses and lse, and cross-entropy_backward's `dloss`. sum_squares
//   returns a double. Reductions (sum, mean, max, sum_to, sum_all) output the input's dtype.
// - matmul: a and b share a dtype and the result has it (bf16 @ bf16 -> bf16), accumulated in
//   f32. matmul_out may write an F32 `out` from bf16/f16 inputs (mixed output), or one of theirs.
// - axpy_(alpha, x, y) accumulates gradients: x and y may be any float dtypes, mixed;
//   y = round_y(f32(y) + alpha * f32(x)).
// - embedding: out has the weight's dtype (rows are copied exactly). embedding_backward: dout
//   and dweight share a dtype; each element's sum is accumulated in f32 in the deterministic
//   order, added to the old dweight and rounded once.
// - layernorm/rmsnorm: weight (and bias) share x's dtype; dx, dweight, dbias have it; the
//   dweight/dbias column sums are f32 partials rounded once at the end.
// - dropout: the same mask as f32 for the same key (Note [Dropout mask]); out in x's dtype.
// - attention: q, k, v, out, dout, dq, dk, dv share one dtype; lse is F32.
// - rotary: x and out in the compute dtype; the cos/sin tables are F32 (as rotary_tables makes
//   them) or the compute dtype.
// - random_uniform/random_normal into BF16/F16 draw f32 exactly as for F32 and round each value;
//   copy, fill and casts convert between any dtypes (Note [Dtype conversion]).
// Tests hold a low-precision output to round(f32 op on the widened inputs) within 2 ulp of the
// output dtype at the output's magnitude (bf16: rel 2^-7, f16: rel 2^-10) plus a small atol near
// 0, and exactly where the op is exact (copy, fill, embedding forward, dropout, max).
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
// y += alpha * x (y contiguous; x, y any float dtypes: Note [Low-precision ops]).
void axpy_(float alpha, const Tensor& x, Tensor& y);
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
// sum_squares of each tensor (all on one device), in order: the same values as calling
// sum_squares on each, with one device synchronisation on a GPU.
std::vector<double> sum_squares_many(const std::vector<Tensor>& xs);
double l2_norm(const Tensor& x);
// sqrt of the sum of squares over all tensors: global gradient norm.
double global_l2_norm(const std::vector<Tensor>& xs);

// ---- matmul ----
// The result has a's and b's dtype (Note [Low-precision ops]).
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
// out = alpha * op(a) @ op(b) + beta * out, in place; out F32 or the inputs' dtype.
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
// logits [N, V] (or [..., V], flattened), targets [N] (or [...]). `classes` (default: all V)
// restricts the softmax to the first `classes` columns; the backward then writes 0 into the
// others. The result is bitwise that of narrowing the logits to `classes` columns first, without
// the copy (Note [Padded vocabulary] in models/causal_lm.h).
CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& targets,
                                 int64_t ignore_index = -100, int64_t classes = -1);
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              const Tensor& dloss, int64_t ignore_index = -100,
                              int64_t classes = -1);
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
