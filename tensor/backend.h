#pragma once
// The backend interface: every op Strata's models need, declared once, implemented once per
// device (tensor/cpu, tensor/cuda). See Note [Backend contract].
//
// Note [Backend contract]
// The op layer (tensor/ops.h) validates shapes and dtypes, allocates outputs, and makes inputs
// contiguous unless a method says it takes any layout. A backend method therefore receives
// well-formed arguments on its own device: outputs are allocated, contiguous and of the documented
// shape. Float tensors are F32, BF16 or F16 as Note [Low-precision ops] (tensor/ops.h) says: one
// compute dtype per call, with the F32-only tensors it lists. Methods must be deterministic: the
// same inputs and thread count give the same bits on every run (no order-dependent atomics;
// reductions split the same way every run), which is what bitwise resume needs. Strata's own CPU
// kernels go further and give the same bits whatever the thread count; the oneDNN GEMM does not
// promise that across thread counts (Note [Matmul determinism] in tensor/cpu/matmul.cpp). Backward
// methods write (not accumulate) their outputs unless they say so.
#include <vector>

#include "core/rng.h"
#include "tensor/tensor.h"

namespace strata::tensor {

enum class BinaryOp : uint8_t { Add, Sub, Mul, Div };
enum class UnaryOp : uint8_t { Gelu, Silu, Relu, Exp, Log, Neg, Sqrt, Square, Tanh };
enum class ReduceOp : uint8_t { Sum, Mean, Max };
// The activation a linear applies in its epilogue (Note [Linear epilogues] in tensor/ops.h).
// Gelu is UnaryOp::Gelu: GPT-2's tanh approximation.
enum class Activation : uint8_t { None, Gelu };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;

  // ---- memory ----
  // dst = src: same shape; any layouts (both); any dtypes (converts); src may be on another
  // device of which this backend can read (CPU<->CUDA goes through the CUDA backend).
  virtual void copy(const Tensor& src, Tensor& dst) = 0;
  virtual void fill(Tensor& dst, double value) = 0;                 // any layout, any dtype
  virtual void arange(Tensor& dst, double start, double step) = 0;  // contiguous, any dtype
  virtual void random_uniform(Tensor& dst, RngKey key, float lo, float hi) = 0;
  virtual void random_normal(Tensor& dst, RngKey key, float mean, float stddev) = 0;
  // out = concat of xs along dim (xs any layout, same dtype).
  virtual void concat(const std::vector<Tensor>& xs, int dim, Tensor& out) = 0;

  // ---- elementwise ----
  // out = a (op) b, broadcasting a and b (any layouts, possibly zero strides) to out's shape.
  virtual void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) = 0;
  // out = alpha * x + beta (x any layout).
  virtual void affine(const Tensor& x, float alpha, float beta, Tensor& out) = 0;
  // y += alpha * x (contiguous, same shape; x and y any float dtypes, mixed). The accumulation
  // primitive of autograd.
  virtual void axpy(float alpha, const Tensor& x, Tensor& y) = 0;
  virtual void unary(UnaryOp op, const Tensor& x, Tensor& out) = 0;
  // dx = dy * d op(x)/dx.
  virtual void unary_backward(UnaryOp op, const Tensor& x, const Tensor& dy, Tensor& dx) = 0;
  // out = x + bias (bias [C] over the last dim of x [.., C]).
  virtual void bias_add(const Tensor& x, const Tensor& bias, Tensor& out) = 0;
  // Dropout with keep-mask drawn from `key` (Note [Deterministic RNG]): out = x * mask / (1 - p).
  // The same key gives the same mask, so backward calls this with dy instead of storing the mask.
  virtual void dropout(const Tensor& x, float p, RngKey key, Tensor& out) = 0;

  // ---- reductions ----
  // out = x summed over the dims where out (right-aligned, may have fewer dims) has size 1 or
  // is missing: the backward of broadcasting.
  virtual void sum_to(const Tensor& x, Tensor& out) = 0;
  // Reduce over `dim` of x; out has x's shape with dim removed (or kept as 1: same memory).
  // For Max, `indices` (I64, same shape as out) receives the argmax (first on ties).
  virtual void reduce(ReduceOp op, const Tensor& x, int dim, Tensor& out, Tensor* indices) = 0;
  // Note [Top-k] in tensor/ops.h: x [rows, n] with x.stride(1) == 1; values [rows, k] (x's
  // dtype) and indices [rows, k] (I64), both contiguous, 1 <= k <= n.
  virtual void top_k(const Tensor& x, Tensor& values, Tensor& indices) = 0;
  // Sum of squares of all elements, accumulated in double then returned (x any float dtype).
  virtual double sum_squares(const Tensor& x) = 0;
  // sum_squares of each tensor (all on this backend's device), in order. A GPU backend waits for
  // the device once for all of them instead of once each.
  virtual std::vector<double> sum_squares_many(const std::vector<Tensor>& xs) {
    std::vector<double> r;
    r.reserve(xs.size());
    for (const Tensor& x : xs) r.push_back(sum_squares(x));
    return r;
  }

  // ---- matmul ----
  // out = alpha * op(a) @ op(b) + beta * out, op = transpose of the last two dims when asked.
  // a: [..., M, K] (or [..., K, M] if trans_a), b: [..., K, N] (or [..., N, K]) or 2-D (shared
  // across the batch), out: [..., M, N]. Batch dims of a and out are equal; b's are equal or
  // absent. a and b share a dtype (F32, BF16, F16); out has it or is F32.
  virtual void matmul(const Tensor& a, const Tensor& b, Tensor& out, bool trans_a, bool trans_b,
                      float alpha, float beta) = 0;

  // ---- linear with epilogues (Note [Linear epilogues] in tensor/ops.h) ----
  // x [M, K], weight [N, K], bias [N] or undefined, y [M, N]: y = act(x @ weight^T + bias), f32
  // accumulation, bias and activation in f32, one rounding. pre [M, N] (defined only with
  // act = Gelu, when backward needs it) receives x @ weight^T + bias, the activation's input.
  virtual void linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                              Activation act, Tensor& y, Tensor& pre) = 0;
  // dweight [N, K] = dy [M, N]^T @ x [M, K] (accumulate: dweight + dy^T @ x, the old value added
  // to the f32 product before the one rounding); dbias [N] (skipped when undefined) = the column
  // sums of dy, accumulated in f32 or wider and rounded once.
  virtual void linear_backward_weight(const Tensor& dy, const Tensor& x, Tensor& dweight,
                                      Tensor& dbias, bool accumulate) = 0;
  // The gradient through a GELU epilogue: dpre [M, N] = (dz [M, P] @ weight [P, N]) * gelu'(pre),
  // in f32 and rounded once; dbias [N] (skipped when undefined) = the column sums of that f32
  // dpre (before its rounding), accumulated in f32 or wider and rounded once.
  virtual void linear_backward_gelu(const Tensor& dz, const Tensor& weight, const Tensor& pre,
                                    Tensor& dpre, Tensor& dbias) = 0;

  // ---- normalisation ----
  // x [N, C]; weight, bias [C]; y [N, C]; mean, rstd [N]. In every norm backward, `accumulate`
  // means dweight (and dbias) already hold gradients and take the new ones added in place:
  // round(old + round(gradient)), the bits AccumulateGrad's axpy_ of the returned gradient gives
  // (Note [Norm gradients into their buffer] in tensor/ops.h).
  virtual void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                 float eps, Tensor& y, Tensor& mean, Tensor& rstd) = 0;
  virtual void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                  const Tensor& mean, const Tensor& rstd, Tensor& dx,
                                  Tensor& dweight, Tensor& dbias, bool accumulate) = 0;
  // x [N, C]; weight [C]; y [N, C]; rstd [N].
  virtual void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, Tensor& y,
                               Tensor& rstd) = 0;
  virtual void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                const Tensor& rstd, Tensor& dx, Tensor& dweight,
                                bool accumulate) = 0;
  // Residual add fused with the norm (Note [Fused residual norm] in tensor/ops.h). x, r, s, y
  // [N, C]; weight, bias [C]; mean, rstd [N]. s = x + r (rounded to the compute dtype), then y,
  // mean, rstd = layernorm(s) exactly as layernorm_forward computes them from that s.
  virtual void add_layernorm_forward(const Tensor& x, const Tensor& r, const Tensor& weight,
                                     const Tensor& bias, float eps, Tensor& s, Tensor& y,
                                     Tensor& mean, Tensor& rstd) = 0;
  // dsum [N, C] = ds + round(dx), dx the input gradient layernorm_backward(dy, s, ...) computes;
  // ds undefined means no gradient reached s (dsum = round(dx)). dweight, dbias as there.
  virtual void add_layernorm_backward(const Tensor& dy, const Tensor& ds, const Tensor& s,
                                      const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                      Tensor& dsum, Tensor& dweight, Tensor& dbias,
                                      bool accumulate) = 0;
  // The same for rmsnorm: s = x + r, y, rstd = rmsnorm(s); dsum = ds + round(dx).
  virtual void add_rmsnorm_forward(const Tensor& x, const Tensor& r, const Tensor& weight,
                                   float eps, Tensor& s, Tensor& y, Tensor& rstd) = 0;
  virtual void add_rmsnorm_backward(const Tensor& dy, const Tensor& ds, const Tensor& s,
                                    const Tensor& weight, const Tensor& rstd, Tensor& dsum,
                                    Tensor& dweight, bool accumulate) = 0;
  // Softmax over the last dim of x [N, C].
  virtual void softmax_forward(const Tensor& x, Tensor& y) = 0;
  virtual void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) = 0;

  // ---- attention ----
  // Fused scaled-dot-product attention. q [B, H, Tq, D], k, v [B, H, Tk, D], out [B, H, Tq, D],
  // lse [B, H, Tq] (log-sum-exp of each score row: all backward needs besides q, k, v, out;
  // no Tq x Tk matrix is kept). Causal masks key j > query i + (Tk - Tq).
  //
  // Note [Strided attention operands]
  // q, k, v, out (and in backward dout, dq, dk, dv) may be any [B, H, T, D] views whose D stride
  // is 1; the B, H and T strides are arbitrary (an exception to Note [Backend contract]). So a
  // packed qkv buffer [B, T, 3, H, D] is read as three [B, H, T, D] views with no copy, out can be
  // a [B, T, H, D] buffer seen as [B, H, T, D] (heads back side by side for free), and dq, dk, dv
  // can be written straight into the views of one packed gradient buffer. Outputs must not
  // overlap each other or the inputs. lse is always contiguous F32. Implementations index with
  // the strides and change no arithmetic, so a strided call gives the contiguous call's bits.
  // tensor::attention makes an operand contiguous only when its D stride is not 1 (or a dim is
  // broadcast with stride 0); GPT-2 does no layout copy around attention
  // (autograd::attention_qkv).
  virtual void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                 float scale, Tensor& out, Tensor& lse) = 0;
  virtual void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, const Tensor& dout,
                                  bool causal, float scale, Tensor& dq, Tensor& dk, Tensor& dv) = 0;
  // Rotary embedding on x [B, T, H, D] (D even; pairs (2i, 2i+1) rotate), cos/sin [T, D/2].
  // inverse = true rotates by -theta (the backward).
  virtual void rotary(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse,
                      Tensor& out) = 0;

  // ---- embedding and loss ----
  // ids [N] (I32 or I64); weight [V, C]; out [N, C]. Out-of-range ids are a UserError (on a
  // GPU, raised at the next wait for the device: Note [Deferred device checks] in
  // tensor/cuda/cuda_backend.h).
  virtual void embedding_forward(const Tensor& weight, const Tensor& ids, Tensor& out) = 0;
  // dweight [V, C] += scatter of dout [N, C] by ids, deterministically (ACCUMULATES).
  virtual void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight) = 0;
  // logits [N, V]; targets [N] (I32/I64). Only the first `classes` (<= V) columns take part
  // (Note [Padded vocabulary] in models/causal_lm.h: the padding columns of a padded head are
  // skipped in place instead of narrowed and copied). losses [N] (0 where target ==
  // ignore_index), lse [N] over those columns. Out-of-range targets (other than ignore_index,
  // and >= classes counts as out of range) are a UserError.
  virtual void cross_entropy_forward(const Tensor& logits, const Tensor& targets,
                                     int64_t ignore_index, int64_t classes, Tensor& losses,
                                     Tensor& lse) = 0;
  // out (F32 [2]) = {m, 1 / m}, m = max(1, the number of targets [N] not equal to ignore_index):
  // the divisor of the mean loss, computed where the targets are (no wait for a device).
  virtual void cross_entropy_norm(const Tensor& targets, int64_t ignore_index, Tensor& out) = 0;
  // dlogits [N, V] = (softmax(logits) - onehot(target)) * dloss[row] over the first `classes`
  // columns, 0 in the rest; rows with ignore_index get 0. dloss [N] is the gradient of the total
  // objective w.r.t. each row's loss. dlogits may be logits itself (the gradient written in
  // place, tensor::cross_entropy_backward_): each element must be read before its gradient is
  // stored, and no other element read after.
  virtual void cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                                      const Tensor& lse, const Tensor& dloss, int64_t ignore_index,
                                      int64_t classes, Tensor& dlogits) = 0;
  // Both at once, for a mean loss whose gradient `grad` is known before the forward (Note
  // [Fused cross-entropy gradient] in autograd/functions_nn.cpp): losses and lse as
  // cross_entropy_forward, then logits overwritten with the gradient cross_entropy_backward gives
  // for dloss[row] = grad / norm[0] (norm: cross_entropy_norm's {m, 1 / m}). The same bits as
  // those calls; the default makes them, a GPU backend reads each row once.
  virtual void cross_entropy_fused(Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                   int64_t classes, float grad, const Tensor& norm, Tensor& losses,
                                   Tensor& lse);
  // x *= g / expected (one rounding to x's dtype), where g (F32, one element, on this device)
  // differs from `expected`; x is not touched where they are equal. The default reads g on the
  // host; a GPU backend decides on the device, without a wait.
  virtual void scale_unless_equal(Tensor& x, const Tensor& g, float expected);
};

// The backend for a device. CPU is always there; CUDA registers itself when built and a GPU is
// present (otherwise asking for it is a UserError).
Backend& backend_for(Device device);
void register_backend(DeviceType type, Backend* backend);

}  // namespace strata::tensor
