#pragma once
// Differentiable functions. Each is defined in functions_*.cpp with its backward beside it
// (Note [Forward and backward side by side]).
#include <optional>
#include <utility>
#include <vector>

#include "autograd/variable.h"
#include "core/rng.h"
#include "tensor/ops.h"

namespace strata::autograd {

// ---- elementwise (broadcasting; gradients are summed back to each input's shape) ----
Variable add(const Variable& a, const Variable& b);
Variable sub(const Variable& a, const Variable& b);
Variable mul(const Variable& a, const Variable& b);
Variable div(const Variable& a, const Variable& b);
Variable scale(const Variable& x, float alpha);
Variable affine(const Variable& x, float alpha, float beta);
Variable gelu(const Variable& x);  // tanh approximation (GPT-2)
Variable silu(const Variable& x);
Variable relu(const Variable& x);
Variable exp(const Variable& x);
Variable log(const Variable& x);
Variable tanh(const Variable& x);
Variable square(const Variable& x);
Variable bias_add(const Variable& x, const Variable& bias);
// Inverted dropout; identity when !training or p == 0. The mask comes from `key`.
Variable dropout(const Variable& x, float p, RngKey key, bool training = true);

// ---- linear algebra ----
Variable matmul(const Variable& a, const Variable& b, bool trans_a = false, bool trans_b = false);
// x [..., in] @ weight[out, in]^T + bias[out] (bias may be undefined), the bias added in the
// GEMM's epilogue (Note [Linear epilogues] in tensor/ops.h).
Variable linear(const Variable& x, const Variable& weight, const Variable& bias);
// Note [Tiled linear]
// linear(x, weight, bias) computed in `tiles` tiles one after another (ZeRO-Infinity's
// memory-centric tiling), so each step's working buffers are a tile's, not the layer's. Forward
// and the weight and bias gradients tile the output features (rows of the weight): output
// column j of y is x . weight[j] + bias[j] whichever tile computes it, and weight-gradient row j
// is dy[:, j]^T x over every row of the batch, the untiled products. The input gradient tiles
// the input features (columns of the weight), so each of its elements still sums over every
// output feature (tiling it by output features would add partial sums: other bits). The result
// is the untiled linear's bits wherever the GEMM computes an element's dot product the same way
// whatever the number of other columns in the call, which the tests check for the backends
// (tests/autograd/tiled_linear_test.cpp). Where the weight's (bias's) gradient is bound to a
// buffer (the Engine binds the flat units'), each tile's gradient is added into the buffer's rows
// with AccumulateGrad's own add, so no weight-sized gradient exists beside the buffer: the
// working memory of the layer's backward is one tile's (a weight used by two ops of one backward
// then sums in another order than the engine would: other bits). Tiles differ in size by at most
// one feature; `tiles` above the features is clamped, and 1 is autograd::linear itself. The
// tiles' buffers are charged to Category::Workspace.
Variable tiled_linear(const Variable& x, const Variable& weight, const Variable& bias,
                      int64_t tiles);
// GPT-2's MLP as one node: gelu(x fc_weight^T + fc_bias) proj_weight^T + proj_bias, the GELU in
// the first GEMM's epilogue and dgelu plus the bias gradient in a backward GEMM's (Note [Linear
// epilogues]). Saves what the three unfused nodes save: x, the GELU input and its output; with
// `recompute_gelu` only x and the GELU input, and backward recomputes the output for proj's
// weight gradient (Note [GELU recompute]).
Variable mlp_gelu(const Variable& x, const Variable& fc_weight, const Variable& fc_bias,
                  const Variable& proj_weight, const Variable& proj_bias,
                  bool recompute_gelu = false);

// LLaMA's MLP as one node: (silu(x gate^T) * (x up^T)) down^T, no biases. The same tensor ops
// as the five unfused nodes, forward and backward, so the same bits; it keeps x, the gate and up
// projections and their product h, not silu(gate) (recomputed in backward); with
// `recompute_swiglu` not h either (Note [SwiGLU recompute]).
Variable mlp_swiglu(const Variable& x, const Variable& gate_weight, const Variable& up_weight,
                    const Variable& down_weight, bool recompute_swiglu = false);

// ---- normalisation (last dim) ----
Variable layernorm(const Variable& x, const Variable& weight, const Variable& bias, float eps);
Variable rmsnorm(const Variable& x, const Variable& weight, float eps);
Variable softmax(const Variable& x);
// A residual add fused with the norm after it (Note [Fused residual norm] in tensor/ops.h):
// {s, y} with s = x + r and y = layernorm(s), bitwise add then layernorm on the CPU. With
// keep_sum = false the caller wants y alone: s comes back undefined and backward adds no ds.
std::pair<Variable, Variable> add_layernorm(const Variable& x, const Variable& r,
                                            const Variable& weight, const Variable& bias, float eps,
                                            bool keep_sum = true);
std::pair<Variable, Variable> add_rmsnorm(const Variable& x, const Variable& r,
                                          const Variable& weight, float eps, bool keep_sum = true);

// ---- attention ----
// q [B, H, Tq, D], k, v [B, H, Tk, D]; scale <= 0 means 1/sqrt(D).
Variable attention(const Variable& q, const Variable& k, const Variable& v, bool causal,
                   float scale = 0.f);
// Self-attention from one packed projection: qkv [B, T, 3C] holds q, k, v side by side, each
// C = n_head * D wide with its heads side by side; returns y [B, T, C], heads side by side. The
// values (and bits) of splitting qkv, moving the heads to dim 1, attention and moving them back,
// without the layout copies: q, k, v are strided views of qkv, y is attention's own output buffer,
// and backward writes dq, dk, dv into the views of one dqkv [B, T, 3C] (Note [Strided attention
// operands] in tensor/backend.h).
Variable attention_qkv(const Variable& qkv, int64_t n_head, bool causal, float scale = 0.f);
// x [B, T, H, D] with tables from tensor::rotary_tables (constants, no gradient).
Variable rotary(const Variable& x, const Tensor& cos, const Tensor& sin);

// ---- embedding and loss ----
Variable embedding(const Variable& weight, const Tensor& ids);
// Mean cross-entropy over targets != ignore_index (0 if none); logits [..., V]. With `classes`
// (< V) only the first `classes` logits of each row take part and the others get gradient 0:
// the same values as narrowing first, without copying the logits (tensor::cross_entropy).
Variable cross_entropy(const Variable& logits, const Tensor& targets, int64_t ignore_index = -100,
                       int64_t classes = -1);
// The gradient the next training loss will receive, set by a training loop that knows it before
// the forward (Trainer, bench_gpt2_cuda: the loss scale over the accumulation steps). While one
// is set, cross_entropy_consuming computes the forward and the logits' gradient in one pass (Note
// [Fused cross-entropy gradient] in functions_nn.cpp). Scopes nest; the innermost wins.
class LossGradientScope {
 public:
  explicit LossGradientScope(float grad);
  ~LossGradientScope();
  LossGradientScope(const LossGradientScope&) = delete;
  LossGradientScope& operator=(const LossGradientScope&) = delete;
  // The innermost scope's gradient, if any on this thread.
  static std::optional<float> current();

 private:
  std::optional<float> previous_;
};
// cross_entropy for a caller that hands its logits over (they are moved from). With a
// LossGradientScope, grad mode on and no other handle on the logits, the forward also writes the
// logits' gradient over them (read once instead of twice); otherwise, or if the loss's gradient
// turns out not to be the scope's, the result is cross_entropy's (the latter rescaled: Note
// [Fused cross-entropy gradient]).
Variable cross_entropy_consuming(Variable&& logits, const Tensor& targets,
                                 int64_t ignore_index = -100, int64_t classes = -1);

// ---- reductions ----
Variable sum(const Variable& x, int dim, bool keepdim = false);
Variable mean(const Variable& x, int dim, bool keepdim = false);
Variable max(const Variable& x, int dim, bool keepdim = false);  // gradient to the argmax
Variable sum_all(const Variable& x);
Variable mean_all(const Variable& x);

// ---- shape (views where the tensor op is a view) ----
Variable reshape(const Variable& x, const Shape& shape);
Variable transpose(const Variable& x, int d0, int d1);
Variable permute(const Variable& x, const std::vector<int>& dims);
Variable narrow(const Variable& x, int dim, int64_t start, int64_t length);
Variable slice(const Variable& x, int dim, int64_t start, int64_t end, int64_t step = 1);
Variable contiguous(const Variable& x);
// Casts between float dtypes; the gradient is cast back (Note [Low-precision ops]).
Variable to(const Variable& x, DType dtype);
Variable concat(const std::vector<Variable>& xs, int dim);
std::vector<Variable> split(const Variable& x, const std::vector<int64_t>& sizes, int dim);

}  // namespace strata::autograd
