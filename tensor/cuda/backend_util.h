#pragma once
// Host-side helpers shared by the CUDA backend's files (cuda_backend.cpp and the op-family files
// copy_fill.cpp, elementwise.cpp, reduce.cpp, norm.cpp, attention.cpp, embedding_loss.cpp): the
// kernels' views of tensors, dtype codes, launch checks and the environment switches read once.
#include <cuda_runtime.h>

#include "core/env.h"
#include "core/error.h"
#include "tensor/cuda/cuda_backend.h"
#include "tensor/cuda/kernels.h"
#include "tensor/tensor.h"

namespace strata::tensor::cuda {

inline void check_launch(const char* what) {
  check_cuda(cudaGetLastError(), what);
}

// STRATA_NORM_GRADS (Note [Fused norm weight gradients] in norm.cu), read once.
inline bool fused_norm_grads() {
  static const bool fused =
      env_choice(
          "STRATA_NORM_GRADS",
          {{"fused", "the norm backward's dx kernel also sums the weight/bias gradients"},
           {"separate", "a second kernel re-reads dy and x for the weight/bias gradients"}}) == 0;
  return fused;
}

// STRATA_DECODE_ATTENTION (Note [CUDA decode attention] in attention_decode.cu), read once.
inline bool split_decode_attention() {
  static const bool split =
      env_choice("STRATA_DECODE_ATTENTION",
                 {{"split", "decode steps (Tq <= 16 < Tk) split the keys over the device"},
                  {"off", "decode steps take the training kernels (tensor cores, else SIMT)"}}) ==
      0;
  return split;
}

// STRATA_CE_ROW_CACHE (Note [CUDA fused cross-entropy] in embedding_loss.cu), read once.
inline bool ce_row_cache() {
  static const bool cache =
      env_choice("STRATA_CE_ROW_CACHE",
                 {{"on", "the fused cross-entropy keeps its row in registers between its passes"},
                  {"off", "the fused cross-entropy reads its row again for the gradient"}}) == 0;
  return cache;
}

inline Strided view_of(const Tensor& t) {
  STRATA_CHECK(t.ndim() <= kMaxDims, "CUDA kernels take at most {} dims, got {}", kMaxDims,
               t.str());
  Strided v;
  v.ndim = t.ndim();
  for (int d = 0; d < t.ndim(); ++d) {
    v.shape[d] = t.size(d);
    v.strides[d] = t.stride(d);
  }
  return v;
}

// t viewed in `shape` (right-aligned broadcasting: missing and size-1 dims get stride 0).
inline Strided broadcast_view(const Tensor& t, const Shape& shape) {
  Strided v;
  v.ndim = shape.ndim();
  STRATA_CHECK(v.ndim <= kMaxDims, "CUDA kernels take at most {} dims", kMaxDims);
  const int lead = shape.ndim() - t.ndim();
  for (int d = 0; d < shape.ndim(); ++d) {
    v.shape[d] = shape[d];
    const int td = d - lead;
    v.strides[d] = td < 0 || t.size(td) == 1 ? 0 : t.stride(td);
  }
  return v;
}

inline int dt(DType t) {
  return static_cast<int>(t);
}

inline bool shares_bytes(const Tensor& a, const Tensor& b) {
  return a.storage() == b.storage();
}

inline bool is_float(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F16;
}

// The compute dtype of a float op (Note [Low-precision ops] in tensor/ops.h): `first`'s dtype,
// which every tensor in `rest` must share. The op layer validated this; a mismatch here is an
// internal error, reported before a kernel reads memory as the wrong type.
template <typename... Ts>
int compute_dt(const char* op, const Tensor& first, const Ts&... rest) {
  const DType t = first.dtype();
  STRATA_CHECK(is_float(t), "CUDA {}: {} is not a float tensor", op, first.str());
  [[maybe_unused]] auto same = [&](const Tensor& x) {
    STRATA_CHECK(x.dtype() == t, "CUDA {}: {} and {} differ in dtype (Note [Low-precision ops])",
                 op, first.str(), x.str());
  };
  (same(rest), ...);
  return dt(t);
}

// A launcher of kernels.h returned `enqueued` (false: no kernel for these dtypes), then the
// launch itself must have succeeded.
inline void launched(bool enqueued, const char* what) {
  STRATA_CHECK(enqueued, "CUDA {}: no kernel for these dtypes", what);
  check_launch(what);
}

}  // namespace strata::tensor::cuda
