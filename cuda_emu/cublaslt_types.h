#pragma once
// The emulated cuBLASLt's descriptors (Note [Emulated cuBLASLt] in cublaslt.cpp): what a matrix
// layout, a matmul descriptor and a preference hold, and their attribute copies, shared by
// cublaslt.cpp (the heuristic and the GEMM) and cublaslt_desc.cpp (the descriptors' C API).
#include <cublasLt.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace strata::cuda_emu {

struct Layout {
  uint32_t type = CUDA_R_32F;
  int32_t order = CUBLASLT_ORDER_COL;
  uint64_t rows = 0;
  uint64_t cols = 0;
  int64_t ld = 0;
  int32_t batch = 1;
  int64_t stride = 0;
  int64_t plane_offset = 0;
  uint32_t batch_mode = 0;
};

struct Desc {
  int32_t compute = CUBLAS_COMPUTE_32F;
  int32_t scale = CUDA_R_32F;
  int32_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
  int32_t transa = CUBLAS_OP_N;
  int32_t transb = CUBLAS_OP_N;
  int32_t transc = CUBLAS_OP_N;
  int32_t fill_mode = CUBLAS_FILL_MODE_FULL;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  void* bias = nullptr;
  int64_t bias_batch_stride = 0;
  void* aux = nullptr;
  int64_t aux_ld = 0;
  int64_t aux_batch_stride = 0;
  int64_t alpha_vector_batch_stride = 0;
  int32_t sm_count_target = 0;
  void* unsupported_pointer[8] = {};  // scale/amax pointers: any non-null one is not supported
  int32_t aux_type = -1;
  int8_t fast_accum = 0;
  int32_t bias_type = -1;
  int32_t scale_mode[6] = {};
  void* emulation = nullptr;
};

struct Pref {
  uint32_t search_mode = 0;
  uint64_t max_workspace = 0;
  uint32_t reduction_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
  uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D
  float max_waves = 0.f;
  uint64_t impl_mask = ~uint64_t{0};
};

template <typename T>
inline cublasStatus_t set_attr(T& field, const void* buf, size_t n) {
  if (buf == nullptr || n != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(&field, buf, n);
  return CUBLAS_STATUS_SUCCESS;
}

template <typename T>
inline cublasStatus_t get_attr(const T& field, void* buf, size_t n, size_t* written) {
  if (n == 0) {
    if (written == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    *written = sizeof(T);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (buf == nullptr || n != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(buf, &field, sizeof(T));
  if (written) *written = sizeof(T);
  return CUBLAS_STATUS_SUCCESS;
}

inline Desc* desc_of(cublasLtMatmulDesc_t d) {
  return reinterpret_cast<Desc*>(d);
}
inline Layout* layout_of(cublasLtMatrixLayout_t l) {
  return reinterpret_cast<Layout*>(l);
}
inline Pref* pref_of(cublasLtMatmulPreference_t p) {
  return reinterpret_cast<Pref*>(p);
}

}  // namespace strata::cuda_emu
