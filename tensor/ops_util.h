#pragma once
// Checks and helpers that the op API's files (tensor/ops*.cpp) share: the backend of an operand,
// device and dtype agreement (Note [Low-precision ops]), and [rows, C] views.
#include <initializer_list>
#include <string>

#include "core/error.h"
#include "tensor/backend.h"
#include "tensor/tensor.h"

namespace strata::tensor {

inline Backend& be(const Tensor& t) {
  STRATA_CHECK(t.defined(), "op on an undefined tensor");
  return backend_for(t.device());
}

inline void same_device(const Tensor& a, const Tensor& b, const char* op) {
  if (!(a.device() == b.device()))
    user_error("{}: tensors on different devices ({} and {})", op, a.device().str(),
               b.device().str());
}

// same_device for every defined operand of an op against the first.
inline void same_devices(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor& first = **ts.begin();
  for (const Tensor* t : ts)
    if (t->defined()) same_device(first, *t, op);
}

inline void require_float(const Tensor& t, const char* op) {
  STRATA_CHECK(is_floating(t.dtype()), "{}: expected a float tensor, got {}", op, t.str());
}

// Note [Low-precision ops]: the float operands of an op share one dtype, its compute dtype,
// which is returned. A mismatch names the op and every operand.
inline DType compute_dtype(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor& first = **ts.begin();
  bool ok = true;
  for (const Tensor* t : ts) ok = ok && is_floating(t->dtype()) && t->dtype() == first.dtype();
  if (!ok) {
    std::string all;
    for (const Tensor* t : ts) all += (all.empty() ? "" : ", ") + t->str();
    user_error(
        "{}: operands must be float tensors of one dtype (f32, bf16 or f16), got {}; cast with "
        "Tensor::to (autograd::to for variables) so they agree (Note [Low-precision ops])",
        op, all);
  }
  return first.dtype();
}

// Tensors the contract keeps in f32 whatever the compute dtype (statistics, lse, per-row losses).
inline void require_f32(const Tensor& t, const char* op, const char* what) {
  if (t.dtype() != DType::F32)
    user_error("{}: {} must be f32 whatever the compute dtype, got {} (Note [Low-precision ops])",
               op, what, t.str());
}

inline void require_int(const Tensor& t, const char* op) {
  STRATA_CHECK(t.dtype() == DType::I32 || t.dtype() == DType::I64,
               "{}: expected i32/i64 ids, got {}", op, t.str());
}

inline Tensor like(const Tensor& t) {
  return Tensor::empty(t.shape(), t.dtype(), t.device());
}

// t [..., C] as a [rows, C] view, also when C = 0 (view({-1, 0}) cannot infer the rows): the
// linear ops take no-feature inputs (K = 0: y = bias) and no-output weights (N = 0) as matmul
// does.
inline int64_t rows_of(const Tensor& t) {
  int64_t rows = 1;
  for (int i = 0; i + 1 < t.ndim(); ++i) rows *= t.size(i);
  return rows;
}
inline Tensor rows2d(const Tensor& t) {
  return t.view({rows_of(t), t.size(-1)});
}

}  // namespace strata::tensor
