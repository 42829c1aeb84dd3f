#pragma once
// Helpers shared by the emulated cuBLASLt's tests (cublaslt_test.cpp, cublaslt_algo_test.cpp):
// encoding values in the GEMM's data types, device buffers, a handle, descriptor attributes and
// the naive references (matrix element, GELU and its derivative).
#include <gtest/gtest.h>

#include <cublasLt.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_emu/control.h"

namespace strata::cuda_emu::cublaslt_test {

inline size_t bytes_of(cudaDataType_t t) {
  return t == CUDA_R_32F ? 4 : 2;
}

// Host values <-> device bytes of type t.
inline std::vector<unsigned char> encode(const std::vector<float>& v, cudaDataType_t t) {
  std::vector<unsigned char> b(v.size() * bytes_of(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == CUDA_R_32F) {
      std::memcpy(&b[i * 4], &v[i], 4);
    } else if (t == CUDA_R_16BF) {
      const __nv_bfloat16 h = __float2bfloat16_rn(v[i]);
      std::memcpy(&b[i * 2], &h, 2);
    } else {
      const __half h = __float2half_rn(v[i]);
      std::memcpy(&b[i * 2], &h, 2);
    }
  }
  return b;
}

inline std::vector<float> decode(const std::vector<unsigned char>& b, cudaDataType_t t) {
  std::vector<float> v(b.size() / bytes_of(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == CUDA_R_32F) {
      std::memcpy(&v[i], &b[i * 4], 4);
    } else if (t == CUDA_R_16BF) {
      __nv_bfloat16 h;
      std::memcpy(&h, &b[i * 2], 2);
      v[i] = __bfloat162float(h);
    } else {
      __half h;
      std::memcpy(&h, &b[i * 2], 2);
      v[i] = __half2float(h);
    }
  }
  return v;
}

inline float round_to(float x, cudaDataType_t t) {
  return decode(encode({x}, t), t)[0];
}

// A device buffer of `n` elements of type t holding `v` (or poison when v is empty).
struct DevBuf {
  void* p = nullptr;
  size_t n = 0;
  cudaDataType_t t = CUDA_R_32F;
  DevBuf(size_t count, cudaDataType_t type, const std::vector<float>& v = {}) : n(count), t(type) {
    EXPECT_EQ(cudaMalloc(&p, n * bytes_of(t)), cudaSuccess);
    if (!v.empty()) {
      const auto b = encode(v, t);
      EXPECT_EQ(cudaMemcpy(p, b.data(), b.size(), cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~DevBuf() { cudaFree(p); }
  std::vector<float> host() const {
    std::vector<unsigned char> b(n * bytes_of(t));
    EXPECT_EQ(cudaMemcpy(b.data(), p, b.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return decode(b, t);
  }
};

// Small values that every format holds exactly and whose products and sums f32 holds exactly.
inline std::vector<float> values(size_t n, int seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 7 + seed * 13) % 11) / 4.f - 1.25f;
  return v;
}

struct Lt {
  cublasLtHandle_t h = nullptr;
  Lt() { EXPECT_EQ(cublasLtCreate(&h), CUBLAS_STATUS_SUCCESS); }
  ~Lt() { cublasLtDestroy(h); }
};

inline cublasLtMatrixLayout_t layout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld,
                                     int32_t batch = 1, int64_t stride = 0) {
  cublasLtMatrixLayout_t l;
  EXPECT_EQ(cublasLtMatrixLayoutCreate(&l, t, rows, cols, ld), CUBLAS_STATUS_SUCCESS);
  if (batch > 1) {
    EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                               sizeof(batch)),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                               &stride, sizeof(stride)),
              CUBLAS_STATUS_SUCCESS);
  }
  return l;
}

template <typename T>
inline void set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, T v) {
  ASSERT_EQ(cublasLtMatmulDescSetAttribute(d, a, &v, sizeof(v)), CUBLAS_STATUS_SUCCESS);
}

// Heuristic then matmul, as tensor/cuda/matmul.cpp does; returns the first failing status.
inline cublasStatus_t run(const Lt& lt, cublasLtMatmulDesc_t op, float alpha, const void* a,
                          cublasLtMatrixLayout_t la, const void* b, cublasLtMatrixLayout_t lb,
                          float beta, const void* c, cublasLtMatrixLayout_t lc, void* d,
                          cublasLtMatrixLayout_t ld, uint32_t align = 256) {
  cublasLtMatmulPreference_t pref;
  EXPECT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  uint64_t ws = 1 << 20;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof(ws));
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align));
  cublasLtMatmulHeuristicResult_t r{};
  int found = 0;
  cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(lt.h, op, la, lb, lc, ld, pref, 1, &r, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  EXPECT_EQ(found, 1);
  EXPECT_EQ(r.workspaceSize, 0u);
  return cublasLtMatmul(lt.h, op, &alpha, a, la, b, lb, &beta, c, lc, d, ld, &r.algo, nullptr, 0,
                        nullptr);
}

// Element (i, j) of op(X) for a column-major X with leading dimension ld, batch offset off.
inline float at(const std::vector<float>& x, bool trans, int64_t ld, int64_t off, int64_t i,
                int64_t j) {
  return trans ? x[off + j + i * ld] : x[off + i + j * ld];
}

inline double gelu_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
inline double gelu_grad_ref(double x) {
  const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  const double t = std::tanh(u);
  return 0.5 * (1.0 + t) +
         0.5 * x * (1.0 - t * t) * std::sqrt(2.0 / M_PI) * (1.0 + 3.0 * 0.044715 * x * x);
}

}  // namespace strata::cuda_emu::cublaslt_test
