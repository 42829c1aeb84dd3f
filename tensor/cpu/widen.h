#pragma once
// The widening adapter that lets every CPU kernel (written for f32) serve BF16 and F16 tensors.
//
// Note [Widening adapter]
// Note [Low-precision ops] (tensor/ops.h) asks for f32 arithmetic with one rounding per output.
// The CPU backend meets it at each entry point: when any float operand is not F32, each
// low-precision input is widened (exactly) into an f32 workspace tensor, the method calls itself
// on the f32 stand-ins, and each low-precision output is rounded once into its destination
// (round-to-nearest-even, core/half.h). Outputs that accumulate (axpy's y, embedding_backward's
// dweight, matmul with beta != 0) are widened first, so old value + new sum is rounded once.
// The result is then bitwise round(f32 kernel(widened inputs)): the CPU stays the reference the
// other backends are checked against. The f32 path never enters here, so its bits are unchanged.
// The copies cost memory and time; CPU training runs in f32, so bf16 speed here does not matter.
#include "offload/memory_stats.h"
#include "tensor/cpu/cpu_backend.h"

namespace strata::tensor::cpu {

// True for an undefined tensor, a non-float one (ids, indices) or an F32 one: nothing to widen.
inline bool needs_no_widening(const Tensor& t) {
  return !t.defined() || !is_floating(t.dtype()) || t.dtype() == DType::F32;
}

template <typename... Ts>
bool all_f32(const Ts&... ts) {
  return (needs_no_widening(ts) && ...);
}

// t itself when it needs no widening; else a contiguous f32 copy in the workspace category.
inline Tensor widened(const Tensor& t) {
  if (needs_no_widening(t)) return t;
  offload::CategoryScope scope(offload::Category::Workspace);
  Tensor f = Tensor::empty(t.shape(), DType::F32);
  CpuBackend::instance().copy(t, f);
  return f;
}

// An f32 stand-in for the output `dst`: dst itself when it is F32, else a workspace tensor
// (holding dst's values when `load`, for outputs that accumulate). commit() rounds it into dst.
class F32Out {
 public:
  explicit F32Out(Tensor& dst, bool load = false) : dst_(dst) {
    if (needs_no_widening(dst)) {
      f32_ = dst;
      return;
    }
    offload::CategoryScope scope(offload::Category::Workspace);
    f32_ = Tensor::empty(dst.shape(), DType::F32);
    if (load) CpuBackend::instance().copy(dst, f32_);
  }
  F32Out(const F32Out&) = delete;
  F32Out& operator=(const F32Out&) = delete;

  Tensor& get() { return f32_; }
  void commit() {
    if (!f32_.is_same(dst_)) CpuBackend::instance().copy(f32_, dst_);
  }

 private:
  Tensor& dst_;
  Tensor f32_;
};

}  // namespace strata::tensor::cpu
