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
// - add_layernorm/add_rmsnorm round s, then y, as add then norm do; their backward rounds the
//   norm's dx before adding ds (two roundings, on purpose: Note [Fused residual norm]).
// - linear (Note [Linear epilogues]): one rounding of act(x @ w^T + b), unlike the composition.
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
// Note [Top-k]
// top_k(x, k): the k largest elements of each row of x (over its last dim), best first: values
// [..., k] in x's dtype (copied, not rounded) and indices [..., k] (I64, positions in the row).
// The order is total, so every backend gives the same elements in the same order: larger values
// first, equal values by smaller index; -0 and +0 are equal; every NaN ranks above +inf (as in
// torch.topk), NaNs by index. So top_k(x, 1) is max's argmax on rows without NaN. 0 <= k <= the
// row's length. A sampler uses it to bring a row's few candidates to the host instead of the
// whole vocabulary (Note [Device candidates] in sampling/sampler.h).
struct TopKResult {
  Tensor values;
  Tensor indices;
};
TopKResult top_k(const Tensor& x, int64_t k);
Tensor sum_all(const Tensor& x);  // 0-d
double sum_squares(const Tensor& x);
// sum_squares of each tensor (all on one device), in order: the same values as calling
// sum_squares on each, with one device synchronisation on a GPU.
std::vector<double> sum_squares_many(const std::vector<Tensor>& xs);
double l2_norm(const Tensor& x);
// sqrt of the sum of squares over all tensors: global gradient norm. The tensors may be on
// different devices (each one's squares are summed where it is).
double global_l2_norm(const std::vector<Tensor>& xs);

// ---- matmul ----
// The result has a's and b's dtype (Note [Low-precision ops]).
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
// out = alpha * op(a) @ op(b) + beta * out, in place; out F32 or the inputs' dtype.
void matmul_out(const Tensor& a, const Tensor& b, Tensor& out, bool trans_a, bool trans_b,
                float alpha = 1.f, float beta = 0.f);

// ---- linear with epilogues ----
//
// Note [Linear epilogues]
// linear(x, w, b, act) = act(x @ w^T + b) is one op so that a backend can fuse the bias and the
// activation into its GEMM (cuBLASLt epilogues on CUDA) instead of running extra passes over the
// output. Its semantics, which the CPU backend implements as the reference: the product is
// accumulated in f32, the bias added and the activation applied in f32, and the result rounded
// ONCE to the compute dtype. In f32 that is exactly matmul, then bias_add, then gelu (the CPU
// runs those very kernels, so its f32 results are bitwise the unfused ones). In bf16/f16 it is
// NOT the composition, which rounds after the matmul and again after the bias (and the GELU):
// the fused op is the more accurate of the two, and the two differ by about an ulp. The same
// holds for the backward pieces: dgelu is applied to the f32 product dz @ w before its one
// rounding, and bias gradients are the column sums of the f32 values (the rounded dy for
// linear_backward_weight), rounded once. `pre` (the GELU input, saved for backward) is
// x @ w^T + b rounded once; gelu is taken of the unrounded f32 value. Activation::Gelu is the
// tanh approximation of UnaryOp::Gelu (GPT-2's gelu_new).
struct LinearResult {
  Tensor y;    // [..., N]
  Tensor pre;  // [..., N], with act = Gelu and save_pre only
};
// x [..., K], weight [N, K], bias [N] or undefined; all of one dtype.
LinearResult linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
                    Activation act = Activation::None, bool save_pre = false);
struct LinearWeightGrads {
  Tensor dweight;  // [N, K]
  Tensor dbias;    // [N], when asked for
};
// dy [..., N], x [..., K] (the same leading dims): dweight = dy^T x over all rows. The bias
// gradient (with_bias) goes into a new tensor, or is written over `dbias_into` when given
// ([N], contiguous, the compute dtype, on x's device; Note [Bias gradients into their buffer] in
// autograd/grad_sink.h), which is then the returned dbias.
LinearWeightGrads linear_backward_weight(const Tensor& dy, const Tensor& x, bool with_bias,
                                         Tensor* dbias_into = nullptr);
// The same product added into `dweight` in place ([N, K], contiguous, the compute dtype):
// dweight = round(dweight + dy^T x), the old value added to the f32 product before the one
// rounding, so a gradient buffer takes a weight's gradient without a pass of its own (Note
// [Weight gradients into their buffer] in autograd/grad_sink.h). Returns dbias when with_bias
// (dbias_into as above).
Tensor linear_backward_weight_into(const Tensor& dy, const Tensor& x, Tensor& dweight,
                                   bool with_bias, Tensor* dbias_into = nullptr);
struct LinearGeluGrads {
  Tensor dpre;   // [..., N]
  Tensor dbias;  // [N], when asked for
};
// dz [..., P], weight [P, N], pre [..., N]: dpre = (dz @ weight) * gelu'(pre). dbias_into as
// linear_backward_weight's.
LinearGeluGrads linear_backward_gelu(const Tensor& dz, const Tensor& weight, const Tensor& pre,
                                     bool with_bias, Tensor* dbias_into = nullptr);

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

// Note [Norm gradients into their buffer]
// A norm's weight and bias gradients are column sums over every row; on the GPU one small kernel
// finishes them (Note [Chunk partial sums] in tensor/cuda/common.cuh). AccumulateGrad then added
// each into its parameter's gradient buffer with an axpy launch of its own, a few microseconds
// for a few thousand values: two launches per LayerNorm, 194 of the 769 kernels of a GPT-2 1558M
// step. Given `into`, a norm backward adds its gradients into those tensors itself (on the GPU in
// the finisher, no extra launch): round(old + round(gradient)), the bits the axpy of the returned
// gradient gives, whatever the tensors held. The CPU computes them apart and adds them with its
// axpy, the same bits by construction. The returned dweight (and dbias) are then those tensors.
// `into` holds dweight, and dbias exactly for layernorm: contiguous [C] of the compute dtype on
// x's device. autograd's norms pass the parameters' gradient buffers where gradient_sink allows
// (Note [Weight gradients into their buffer] in autograd/grad_sink.h).
struct NormGradsInto {
  Tensor dweight, dbias;
};
LayerNormGrads layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                  const Tensor& mean, const Tensor& rstd,
                                  const NormGradsInto* into = nullptr);
NormResult rmsnorm(const Tensor& x, const Tensor& weight, float eps);
struct RmsNormGrads {
  Tensor dx, dweight;
};
RmsNormGrads rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                              const Tensor& rstd, const NormGradsInto* into = nullptr);

// Note [Fused residual norm]
// A pre-norm transformer adds each sublayer's output to the residual stream and normalises the
// sum for the next sublayer: s = x + r, y = norm(s). add_layernorm / add_rmsnorm do both in one
// pass over the row and return s (the new residual stream) and y. The numerics are those of the
// composition add(x, r) then layernorm(s): s is rounded to the compute dtype and the norm reads
// the rounded s. Backward takes dy (the gradient of y) and ds (that of s from its other users;
// undefined when it has none) and writes dsum = ds + round(dx), dx being the norm's input
// gradient rounded to the compute dtype BEFORE the add: the two roundings of the unfused graph
// (layernorm_backward's dx, then the engine's ds + dx, Note [Summing gradients in place] in
// autograd/engine.cpp), kept on purpose so that fusing changes no bits. On the CPU the fused ops
// are therefore bitwise the unfused composition in f32, bf16 and f16 (tested). dsum is the
// gradient of both x and r. The CUDA kernels keep the same rounding points but sum their rows in
// another order, so they agree with the CPU within the dtype tolerance, as every op does.
struct AddNormResult {
  Tensor s;     // x + r, the input's shape and dtype
  Tensor y;     // norm(s)
  Tensor mean;  // layernorm only
  Tensor rstd;
};
// x and r of one shape [..., C] (no broadcasting) and dtype; weight, bias [C].
AddNormResult add_layernorm(const Tensor& x, const Tensor& r, const Tensor& weight,
                            const Tensor& bias, float eps);
// dx of the result is dsum. ds may be undefined (no gradient reached s). `into`: Note [Norm
// gradients into their buffer].
LayerNormGrads add_layernorm_backward(const Tensor& dy, const Tensor& ds, const Tensor& s,
                                      const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                      const NormGradsInto* into = nullptr);
AddNormResult add_rmsnorm(const Tensor& x, const Tensor& r, const Tensor& weight, float eps);
RmsNormGrads add_rmsnorm_backward(const Tensor& dy, const Tensor& ds, const Tensor& s,
                                  const Tensor& weight, const Tensor& rstd,
                                  const NormGradsInto* into = nullptr);

Tensor softmax(const Tensor& x);  // last dim
Tensor softmax_backward(const Tensor& y, const Tensor& dy);

// ---- attention ----
struct AttentionResult {
  Tensor out;
  Tensor lse;
};
// q [B, H, Tq, D], k, v [B, H, Tk, D]; scale defaults to 1/sqrt(D) when <= 0. Views whose last
// dim has stride 1 are used in place, with no copy (Note [Strided attention operands] in
// backend.h). out is a [B, Tq, H, D] buffer seen as [B, H, Tq, D], so out.transpose(1, 2) is
// contiguous and merging the heads back into [B, Tq, H * D] is a view; lse is [B, H, Tq] F32.
AttentionResult attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                          float scale = 0.f);
struct AttentionGrads {
  Tensor dq, dk, dv;
};
// dq, dk, dv come back in out's layout ([B, T, H, D] buffers seen as [B, H, T, D]).
AttentionGrads attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, const Tensor& dout,
                                  bool causal, float scale = 0.f);
// attention_backward writing into dq, dk, dv: views of q's, k's, v's shapes in the compute dtype
// with a unit last stride, e.g. the three [B, H, T, D] views of one packed [B, T, 3C] gradient
// buffer (autograd::attention_qkv). They must not overlap each other or the inputs.
void attention_backward_into(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                             const Tensor& lse, const Tensor& dout, bool causal, float scale,
                             Tensor dq, Tensor dk, Tensor dv);
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
  // F32 [2] on the logits' device: {m, 1 / m}, m = max(1, rows whose target is not
  // ignore_index). The mean loss is sum(losses) * norm[1]; reading no count on the host keeps a
  // GPU step free of waits for the device.
  Tensor norm;
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
// The same gradient written over `logits` itself (contiguous, a float dtype), which then holds
// dlogits: same bits as cross_entropy_backward, no second [N, V] buffer (Note [Logits gradient in
// place] in autograd/functions_nn.cpp).
void cross_entropy_backward_(Tensor& logits, const Tensor& targets, const Tensor& lse,
                             const Tensor& dloss, int64_t ignore_index = -100,
                             int64_t classes = -1);
// cross_entropy and, for a mean loss (sum(losses) * norm[1]) whose gradient will be `grad`, its
// backward at once: `logits` (contiguous, a float dtype) then hold the gradient
// cross_entropy_backward gives for dloss = grad / norm[0], with its bits (Note [Fused
// cross-entropy gradient] in autograd/functions_nn.cpp).
CrossEntropyResult cross_entropy_fused_(Tensor& logits, const Tensor& targets, float grad,
                                        int64_t ignore_index = -100, int64_t classes = -1);
// x *= g / expected (g: one F32 element on x's device), unless g == expected: then x is left as
// it is. Decided where g is, without a wait for a GPU.
void scale_unless_equal_(Tensor& x, const Tensor& g, float expected);

// ---- shape ----
Tensor concat(const std::vector<Tensor>& xs, int dim);
// Views of consecutive pieces of the given sizes along dim.
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int dim);

// ---- comparisons (tests) ----
// max |a - b| over all elements (any float dtypes/devices/layouts, same shape).
double max_abs_diff(const Tensor& a, const Tensor& b);
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);

}  // namespace strata::tensor
