#pragma once
// Gradient sinks: when a backward may add (or write) a parameter's gradient straight into its
// unit's flat gradient buffer instead of returning it for AccumulateGrad to add, and the guard
// with which parallel::Engine says when that keeps the bits (Note [Weight gradients into their
// buffer], Note [Bias gradients into their buffer]).
#include <unordered_set>

#include "autograd/variable.h"
#include "tensor/ops.h"

namespace strata::autograd {

// Note [Weight gradients into their buffer]
// On the GPU a parameter's gradient lives in its unit's flat gradient buffer (bound before
// backward, zeroed after each step; Note [Variables and leaves]), and AccumulateGrad adds each
// new gradient into it with an axpy: a pass that reads the fresh gradient and reads and writes
// the buffer, about three bytes moved per gradient byte, per micro-batch, for every parameter.
// A GEMM that makes a weight's gradient can instead add its product into the buffer itself
// (cuBLASLt's beta = 1 with C = D: the old value added to the f32 product, one rounding) and hand
// back no gradient for that input; AccumulateGrad then adds whatever else arrived (a tied
// weight's other use) and runs its hooks as usual. The linear layers (autograd::linear, the
// fused MLPs) and the tied head (autograd::matmul with a shared 2-D b) do this for their weights,
// and the embedding's scatter adds into its table's buffer (no zeroed vocabulary-sized table and
// no add after it).
//
// gradient_sink says when: a leaf that requires grad, whose bound gradient is a live,
// contiguous CUDA tensor of the weight's shape in the product's dtype. Elsewhere (the CPU, no
// bound gradient, released storage of ZeRO's transient gradients, a gradient in another dtype
// or on another device) the backward returns the gradient. The CPU keeps the separate
// add so that its bits stay those the CPU tests pin.
//
// Only while a buffer holds nothing from an earlier backward does the GEMM add into it: then
// round(0 + product) is the bits the returned gradient would have had. parallel::Engine allows
// it for a step's first micro-batch (the step zeroed the buffers) and not for the others, so a
// gradient accumulated over micro-batches keeps the bits of ZeRO stages 2 and 3, which add each
// micro-batch's rounded gradient into their partitions
// (TrainGpu.EveryZeroStageGivesStageZerosBits). With one micro-batch per step, the usual case on a
// GPU, every weight takes the fused path. Outside an Engine (GradIntoBufferGuard not in force) it
// is allowed. The bits then change only where a buffer already holds something: a second backward
// without zeroing, or a tied weight's second use within one backward (GPT-2's embedding scatter
// adds into what the head put there), where old + new is rounded once instead of twice. Order and
// results stay deterministic. STRATA_GRAD_INTO_BUFFER=off (unset, empty or on: on) returns every
// gradient, for comparing the two in a benchmark.
//
// The norms (LayerNorm, RMSNorm, and their residual-fused forms) add their weight and bias
// gradients into the buffers too, in their last kernel (Note [Norm gradients into their buffer]
// in tensor/ops.h); that add is round(old + round(gradient)), the axpy's own bits, so the
// norms' gradients keep the returned path's bits in every case, not only into zeroed buffers.
//
// The bound gradient of `w` that a backward may add a product of `dtype` into, or an undefined
// tensor when it must return the gradient instead.
Tensor gradient_sink(const Variable& w, DType dtype);

// Note [Bias gradients into their buffer]
// A linear layer's bias gradient comes out of its weight-gradient GEMM (cuBLASLt's BGRADB
// epilogue, or DGELU_BGRAD for GPT-2's c_fc), which writes it and cannot add it to what a buffer
// holds (it has no beta for the bias). Returned, it costs an axpy launch in AccumulateGrad (four
// per GPT-2 block). Where the buffer is known to hold zeros, the epilogue writes the gradient
// straight into it instead: round(0 + g) is g (but for g = -0, which
// comes out as -0 instead of +0, a gradient equal to the other for every later use: the AdamW
// update, norms and clipping of -0 and +0 are the same bits). Zeros are known only at an
// Engine's first micro-batch after the step zeroed the buffers (GradIntoBufferGuard's `zeroed`;
// ZeRO-2/3's transient buffers are zeroed as each unit's backward starts), and only for a buffer
// nothing has written in this backward: fresh_gradient_sink hands a buffer out once, and every
// buffer gradient_sink hands out (to be added into) counts as written, so a bias used twice, or a
// buffer another backward added into first, takes the returned path for its later uses, which
// AccumulateGrad adds after all of them. Outside an Engine (or with zeroed false) nothing is
// written over.
//
// The bound gradient of `b` that a backward may write its gradient over (Note [Bias gradients
// into their buffer]): as gradient_sink, and only when the guard says the buffers hold zeros and
// no sink of this buffer was handed out before in its scope; undefined otherwise.
Tensor fresh_gradient_sink(const Variable& b, DType dtype);

// dy^T x for weight `w` (and the bias gradient when with_bias): added into w's gradient buffer
// when gradient_sink allows it, and then the returned dweight is undefined (the backward returns
// no gradient for w); else returned as tensor::linear_backward_weight makes it. The bias gradient
// is written into `bias`'s buffer when fresh_gradient_sink allows it (then the returned dbias is
// undefined), else returned.
tensor::LinearWeightGrads weight_gradients(const Variable& w, const Tensor& dy, const Tensor& x,
                                           bool with_bias, const Variable& bias = Variable());

// The buffers a norm backward adds its parameter gradients into (Note [Norm gradients into their
// buffer]): `weight`'s and, when `bias` is defined, `bias`'s, when gradient_sink allows each; none
// (false) when either does not (then the norm returns both gradients).
bool norm_gradient_sinks(const Variable& weight, const Variable& bias, DType dtype,
                         tensor::NormGradsInto& into);

// STRATA_GRAD_INTO_BUFFER (read once; a value other than on/off/empty is a UserError).
bool grad_into_buffer_enabled();

// While one is alive on this thread, gradient_sink answers only when `allowed` (innermost wins),
// and fresh_gradient_sink only when also `zeroed`: every gradient buffer a backward in its scope
// may reach holds zeros when the scope begins (Note [Bias gradients into their buffer]).
class GradIntoBufferGuard {
 public:
  explicit GradIntoBufferGuard(bool allowed, bool zeroed = false);
  ~GradIntoBufferGuard();
  GradIntoBufferGuard(const GradIntoBufferGuard&) = delete;
  GradIntoBufferGuard& operator=(const GradIntoBufferGuard&) = delete;

 private:
  bool prev_, prev_zeroed_;
  std::unordered_set<const void*>* prev_handed_;
  std::unordered_set<const void*> handed_;  // buffers handed out in this scope
};

}  // namespace strata::autograd
