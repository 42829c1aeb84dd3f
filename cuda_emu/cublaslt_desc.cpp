// The emulated cuBLASLt's descriptors, C API (Note [Emulated cuBLASLt] in cublaslt.cpp): matrix
// layouts, matmul descriptors and preferences, created, destroyed, and their attributes set and
// read.
#include <cublasLt.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cuda_emu/cublaslt_types.h"

using namespace strata::cuda_emu;  // NOLINT: the C API below is global

extern "C" {

// ---- matrix layouts ----

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (layout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  auto* l = new Layout();
  l->type = static_cast<uint32_t>(type);
  l->rows = rows;
  l->cols = cols;
  l->ld = ld;
  *layout = reinterpret_cast<cublasLtMatrixLayout_t>(l);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout_of(layout);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t n) {
  Layout* l = layout_of(layout);
  if (l == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE:
      return set_attr(l->type, buf, n);
    case CUBLASLT_MATRIX_LAYOUT_ORDER:
      return set_attr(l->order, buf, n);
    case CUBLASLT_MATRIX_LAYOUT_ROWS:
      return set_attr(l->rows, buf, n);
    case CUBLASLT_MATRIX_LAYOUT_COLS:
      return set_attr(l->cols, buf, n);
    case CUBLASLT_MATRIX_LAYOUT_LD:
      return set_attr(l->ld, buf, n);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT:
      return set_attr(l->batch, buf, n);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
      return set_attr(l->stride, buf, n);
    case CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET:
      return set_attr(l->plane_offset, buf, n);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_MODE:
      return set_attr(l->batch_mode, buf, n);
    default:
      return CUBLAS_STATUS_INVALID_VALUE;
  }
}

cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t layout,
                                                cublasLtMatrixLayoutAttribute_t attr, void* buf,
                                                size_t n, size_t* written) {
  Layout* l = layout_of(layout);
  if (l == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE:
      return get_attr(l->type, buf, n, written);
    case CUBLASLT_MATRIX_LAYOUT_ORDER:
      return get_attr(l->order, buf, n, written);
    case CUBLASLT_MATRIX_LAYOUT_ROWS:
      return get_attr(l->rows, buf, n, written);
    case CUBLASLT_MATRIX_LAYOUT_COLS:
      return get_attr(l->cols, buf, n, written);
    case CUBLASLT_MATRIX_LAYOUT_LD:
      return get_attr(l->ld, buf, n, written);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT:
      return get_attr(l->batch, buf, n, written);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
      return get_attr(l->stride, buf, n, written);
    default:
      return CUBLAS_STATUS_INVALID_VALUE;
  }
}

// ---- matmul descriptors ----

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  auto* d = new Desc();
  d->compute = compute;
  d->scale = scale;
  *desc = reinterpret_cast<cublasLtMatmulDesc_t>(d);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc_of(desc);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t n) {
  Desc* d = desc_of(desc);
  if (d == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
      return set_attr(d->compute, buf, n);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
      return set_attr(d->scale, buf, n);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:
      return set_attr(d->pointer_mode, buf, n);
    case CUBLASLT_MATMUL_DESC_TRANSA:
      return set_attr(d->transa, buf, n);
    case CUBLASLT_MATMUL_DESC_TRANSB:
      return set_attr(d->transb, buf, n);
    case CUBLASLT_MATMUL_DESC_TRANSC:
      return set_attr(d->transc, buf, n);
    case CUBLASLT_MATMUL_DESC_FILL_MODE:
      return set_attr(d->fill_mode, buf, n);
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      return set_attr(d->epilogue, buf, n);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      return set_attr(d->bias, buf, n);
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE:
      return set_attr(d->bias_batch_stride, buf, n);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
      return set_attr(d->aux, buf, n);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
      return set_attr(d->aux_ld, buf, n);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE:
      return set_attr(d->aux_batch_stride, buf, n);
    case CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE:
      return set_attr(d->alpha_vector_batch_stride, buf, n);
    case CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET:
      return set_attr(d->sm_count_target, buf, n);
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER:
      return set_attr(d->unsupported_pointer[0], buf, n);
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER:
      return set_attr(d->unsupported_pointer[1], buf, n);
    case CUBLASLT_MATMUL_DESC_C_SCALE_POINTER:
      return set_attr(d->unsupported_pointer[2], buf, n);
    case CUBLASLT_MATMUL_DESC_D_SCALE_POINTER:
      return set_attr(d->unsupported_pointer[3], buf, n);
    case CUBLASLT_MATMUL_DESC_AMAX_D_POINTER:
      return set_attr(d->unsupported_pointer[4], buf, n);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER:
      return set_attr(d->unsupported_pointer[5], buf, n);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER:
      return set_attr(d->unsupported_pointer[6], buf, n);
    case CUBLASLT_MATMUL_DESC_D_OUT_SCALE_POINTER:
      return set_attr(d->unsupported_pointer[7], buf, n);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE:
      return set_attr(d->aux_type, buf, n);
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM:
      return set_attr(d->fast_accum, buf, n);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      return set_attr(d->bias_type, buf, n);
    case CUBLASLT_MATMUL_DESC_A_SCALE_MODE:
      return set_attr(d->scale_mode[0], buf, n);
    case CUBLASLT_MATMUL_DESC_B_SCALE_MODE:
      return set_attr(d->scale_mode[1], buf, n);
    case CUBLASLT_MATMUL_DESC_C_SCALE_MODE:
      return set_attr(d->scale_mode[2], buf, n);
    case CUBLASLT_MATMUL_DESC_D_SCALE_MODE:
      return set_attr(d->scale_mode[3], buf, n);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_MODE:
      return set_attr(d->scale_mode[4], buf, n);
    case CUBLASLT_MATMUL_DESC_D_OUT_SCALE_MODE:
      return set_attr(d->scale_mode[5], buf, n);
    case CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR:
      return set_attr(d->emulation, buf, n);
    default:
      return CUBLAS_STATUS_INVALID_VALUE;
  }
}

cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, void* buf,
                                              size_t n, size_t* written) {
  Desc* d = desc_of(desc);
  if (d == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
      return get_attr(d->compute, buf, n, written);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
      return get_attr(d->scale, buf, n, written);
    case CUBLASLT_MATMUL_DESC_TRANSA:
      return get_attr(d->transa, buf, n, written);
    case CUBLASLT_MATMUL_DESC_TRANSB:
      return get_attr(d->transb, buf, n, written);
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      return get_attr(d->epilogue, buf, n, written);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      return get_attr(d->bias, buf, n, written);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
      return get_attr(d->aux, buf, n, written);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
      return get_attr(d->aux_ld, buf, n, written);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      return get_attr(d->bias_type, buf, n, written);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE:
      return get_attr(d->aux_type, buf, n, written);
    default:
      return CUBLAS_STATUS_INVALID_VALUE;
  }
}

// ---- preferences ----

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *pref = reinterpret_cast<cublasLtMatmulPreference_t>(new Pref());
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref_of(pref);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t n) {
  Pref* p = pref_of(pref);
  if (p == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE:
      return set_attr(p->search_mode, buf, n);
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      return set_attr(p->max_workspace, buf, n);
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
      return set_attr(p->reduction_mask, buf, n);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
      return set_attr(p->align[0], buf, n);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
      return set_attr(p->align[1], buf, n);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
      return set_attr(p->align[2], buf, n);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      return set_attr(p->align[3], buf, n);
    case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT:
      return set_attr(p->max_waves, buf, n);
    case CUBLASLT_MATMUL_PREF_IMPL_MASK:
      return set_attr(p->impl_mask, buf, n);
    default:
      return CUBLAS_STATUS_INVALID_VALUE;
  }
}

}  // extern "C"
