// The emulated cuBLASLt (Note [Emulated cuBLASLt] in cublaslt.cpp) against a naive loop:
// transposes, leading dimensions, strided batches, every supported epilogue, and the
// configurations it refuses.
#include <gtest/gtest.h>

#include <cublasLt.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_emu/control.h"

namespace strata::cuda_emu {
namespace {

size_t bytes_of(cudaDataType_t t) {
  return t == CUDA_R_32F ? 4 : 2;
}

// Host values <-> device bytes of type t.
std::vector<unsigned char> encode(const std::vector<float>& v, cudaDataType_t t) {
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

std::vector<float> decode(const std::vector<unsigned char>& b, cudaDataType_t t) {
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

float round_to(float x, cudaDataType_t t) {
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
std::vector<float> values(size_t n, int seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 7 + seed * 13) % 11) / 4.f - 1.25f;
  return v;
}

struct Lt {
  cublasLtHandle_t h = nullptr;
  Lt() { EXPECT_EQ(cublasLtCreate(&h), CUBLAS_STATUS_SUCCESS); }
  ~Lt() { cublasLtDestroy(h); }
};

cublasLtMatrixLayout_t layout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld,
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
void set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, T v) {
  ASSERT_EQ(cublasLtMatmulDescSetAttribute(d, a, &v, sizeof(v)), CUBLAS_STATUS_SUCCESS);
}

// Heuristic then matmul, as tensor/cuda/matmul.cpp does; returns the first failing status.
cublasStatus_t run(const Lt& lt, cublasLtMatmulDesc_t op, float alpha, const void* a,
                   cublasLtMatrixLayout_t la, const void* b, cublasLtMatrixLayout_t lb, float beta,
                   const void* c, cublasLtMatrixLayout_t lc, void* d, cublasLtMatrixLayout_t ld,
                   uint32_t align = 256) {
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
float at(const std::vector<float>& x, bool trans, int64_t ld, int64_t off, int64_t i, int64_t j) {
  return trans ? x[off + j + i * ld] : x[off + i + j * ld];
}

double gelu_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
double gelu_grad_ref(double x) {
  const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  const double t = std::tanh(u);
  return 0.5 * (1.0 + t) +
         0.5 * x * (1.0 - t * t) * std::sqrt(2.0 / M_PI) * (1.0 + 3.0 * 0.044715 * x * x);
}

struct Case {
  bool ta, tb;
  cudaDataType_t in, out;
  int32_t batch;
  bool shared_b;  // B's batch stride 0
  float beta;
  bool in_place;  // C and D the same buffer
};

TEST(CudaEmuCublasLt, TransposesBatchesAndTypesMatchANaiveLoop) {
  Lt lt;
  const int64_t m = 5, n = 7, k = 4;
  std::vector<Case> cases;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (auto [in, out] : {std::pair{CUDA_R_32F, CUDA_R_32F}, std::pair{CUDA_R_16BF, CUDA_R_16BF},
                             std::pair{CUDA_R_16BF, CUDA_R_32F}, std::pair{CUDA_R_16F, CUDA_R_16F}})
        cases.push_back({ta, tb, in, out, 1, false, 0.f, false});
  cases.push_back({false, true, CUDA_R_32F, CUDA_R_32F, 3, false, 0.5f, false});
  cases.push_back({true, false, CUDA_R_16BF, CUDA_R_16BF, 3, true, 0.f, false});
  cases.push_back({true, true, CUDA_R_32F, CUDA_R_32F, 2, true, -2.f, true});
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.ta) + std::to_string(c.tb) + " in " + std::to_string(c.in) +
                 " out " + std::to_string(c.out) + " batch " + std::to_string(c.batch) + " beta " +
                 std::to_string(c.beta));
    // Stored shapes (column-major) with padded leading dimensions.
    const int64_t ar = c.ta ? k : m, ac = c.ta ? m : k, br = c.tb ? n : k, bc = c.tb ? k : n;
    const int64_t lda = ar + 2, ldb = br + 1, ldc = m + 3;
    const int64_t sa = lda * ac + 5, sb = c.shared_b ? 0 : ldb * bc + 3, sc = ldc * n + 1;
    const std::vector<float> a = values(sa * c.batch, 1), b = values(ldb * bc + sb * c.batch, 2),
                             cv = values(sc * c.batch, 3);
    DevBuf da(a.size(), c.in, a), db(b.size(), c.in, b), dc(cv.size(), c.out, cv);
    DevBuf dd(cv.size(), c.out, cv);
    cublasLtMatrixLayout_t la = layout(c.in, ar, ac, lda, c.batch, sa),
                           lb = layout(c.in, br, bc, ldb, c.batch, sb),
                           lc = layout(c.out, m, n, ldc, c.batch, sc);
    cublasLtMatmulDesc_t op;
    ASSERT_EQ(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
    set<int32_t>(op, CUBLASLT_MATMUL_DESC_TRANSA, c.ta ? CUBLAS_OP_T : CUBLAS_OP_N);
    set<int32_t>(op, CUBLASLT_MATMUL_DESC_TRANSB, c.tb ? CUBLAS_OP_T : CUBLAS_OP_N);
    const float alpha = 1.5f;
    void* dptr = c.in_place ? dc.p : dd.p;
    ASSERT_EQ(run(lt, op, alpha, da.p, la, db.p, lb, c.beta, dc.p, lc, dptr, lc),
              CUBLAS_STATUS_SUCCESS);
    const std::vector<float> got = c.in_place ? dc.host() : dd.host();
    const std::vector<float> ar_ = decode(encode(a, c.in), c.in);
    const std::vector<float> br_ = decode(encode(b, c.in), c.in);
    const std::vector<float> cr_ = decode(encode(cv, c.out), c.out);
    for (int32_t bt = 0; bt < c.batch; ++bt)
      for (int64_t j = 0; j < n; ++j)
        for (int64_t i = 0; i < ldc; ++i) {
          const int64_t idx = bt * sc + i + j * ldc;
          if (i >= m) {  // padding rows are never written
            EXPECT_EQ(got[idx], cr_[idx]) << "padding at " << idx;
            continue;
          }
          float acc = 0.f;
          for (int64_t q = 0; q < k; ++q)
            acc += at(ar_, c.ta, lda, bt * sa, i, q) * at(br_, c.tb, ldb, bt * sb, q, j);
          float want = alpha * acc;
          if (c.beta != 0.f) want += c.beta * cr_[idx];
          ASSERT_EQ(got[idx], round_to(want, c.out))
              << "batch " << bt << " (" << i << ", " << j << ")";
        }
    cublasLtMatmulDescDestroy(op);
    for (auto l : {la, lb, lc}) cublasLtMatrixLayoutDestroy(l);
  }
}

// One problem D[m, n] = A[m, k] B[k, n] (no transposes, no padding) with an epilogue.
struct EpilogueRun {
  int64_t m = 6, n = 5, k = 3;
  cudaDataType_t t = CUDA_R_32F;
  std::vector<float> a = values(m * k, 4), b = values(k * n, 5);
  std::vector<float> ab() const {
    std::vector<float> r(m * n);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) {
        float acc = 0.f;
        for (int64_t q = 0; q < k; ++q) acc += a[i + q * m] * b[q + j * k];
        r[i + j * m] = acc;
      }
    return r;
  }
};

TEST(CudaEmuCublasLt, BiasAndGeluEpilogues) {
  Lt lt;
  for (cudaDataType_t t : {CUDA_R_32F, CUDA_R_16BF}) {
    for (cudaDataType_t bias_t : {t, CUDA_R_32F}) {
      for (uint32_t epi :
           {CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_GELU, CUBLASLT_EPILOGUE_GELU_BIAS,
            CUBLASLT_EPILOGUE_GELU_AUX, CUBLASLT_EPILOGUE_GELU_AUX_BIAS}) {
        SCOPED_TRACE("type " + std::to_string(t) + " bias " + std::to_string(bias_t) +
                     " epilogue " + std::to_string(epi));
        EpilogueRun e;
        const std::vector<float> bias = values(e.m, 6);
        const int64_t aux_ld = 8;  // >= m, a multiple of 8
        DevBuf da(e.a.size(), t, e.a), db(e.b.size(), t, e.b), dd(e.m * e.n, t),
            dbias(e.m, bias_t, bias), daux(aux_ld * e.n, t);
        auto la = layout(t, e.m, e.k, e.m), lb = layout(t, e.k, e.n, e.k),
             ld = layout(t, e.m, e.n, e.m);
        cublasLtMatmulDesc_t op;
        cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
        set<uint32_t>(op, CUBLASLT_MATMUL_DESC_EPILOGUE, epi);
        const bool has_bias = epi & CUBLASLT_EPILOGUE_BIAS;
        const bool has_aux = epi & 128;
        if (has_bias) {
          set<void*>(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, dbias.p);
          if (bias_t != t) set<int32_t>(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_t);
        }
        if (has_aux) {
          set<void*>(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, daux.p);
          set<int64_t>(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld);
        }
        ASSERT_EQ(run(lt, op, 1.f, da.p, la, db.p, lb, 0.f, dd.p, ld, dd.p, ld),
                  CUBLAS_STATUS_SUCCESS);
        const std::vector<float> ab = e.ab(), got = dd.host(), aux = daux.host();
        const double tol = t == CUDA_R_32F ? 1e-6 : 1.0 / 128;
        for (int64_t j = 0; j < e.n; ++j)
          for (int64_t i = 0; i < e.m; ++i) {
            double pre = ab[i + j * e.m] + (has_bias ? bias[i] : 0.0);
            const double want = (epi & CUBLASLT_EPILOGUE_GELU) ? gelu_ref(pre) : pre;
            EXPECT_NEAR(got[i + j * e.m], want, tol * (1 + std::fabs(want))) << i << "," << j;
            if (has_aux) {
              EXPECT_EQ(aux[i + j * aux_ld], round_to(static_cast<float>(pre), t));
            }
          }
        cublasLtMatmulDescDestroy(op);
        for (auto l : {la, lb, ld}) cublasLtMatrixLayoutDestroy(l);
      }
    }
  }
}

TEST(CudaEmuCublasLt, GradientEpilogues) {
  Lt lt;
  EpilogueRun e;
  const int64_t aux_ld = 8;
  const std::vector<float> pre = values(aux_ld * e.n, 7);
  DevBuf da(e.a.size(), e.t, e.a), db(e.b.size(), e.t, e.b), dd(e.m * e.n, e.t),
      daux(pre.size(), e.t, pre), dbias(e.m, e.t), dbias_n(e.n, e.t);
  auto la = layout(e.t, e.m, e.k, e.m), lb = layout(e.t, e.k, e.n, e.k),
       ld = layout(e.t, e.m, e.n, e.m);
  const std::vector<float> ab = e.ab();
  for (uint32_t epi : {CUBLASLT_EPILOGUE_DGELU, CUBLASLT_EPILOGUE_DGELU_BGRAD,
                       CUBLASLT_EPILOGUE_BGRADA, CUBLASLT_EPILOGUE_BGRADB}) {
    SCOPED_TRACE("epilogue " + std::to_string(epi));
    cublasLtMatmulDesc_t op;
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    set<uint32_t>(op, CUBLASLT_MATMUL_DESC_EPILOGUE, epi);
    const bool dgelu = epi == CUBLASLT_EPILOGUE_DGELU || epi == CUBLASLT_EPILOGUE_DGELU_BGRAD;
    if (dgelu) {
      set<void*>(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, daux.p);
      set<int64_t>(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld);
    }
    if (epi != CUBLASLT_EPILOGUE_DGELU)
      set<void*>(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                 epi == CUBLASLT_EPILOGUE_BGRADB ? dbias_n.p : dbias.p);
    ASSERT_EQ(run(lt, op, 1.f, da.p, la, db.p, lb, 0.f, dd.p, ld, dd.p, ld), CUBLAS_STATUS_SUCCESS);
    const std::vector<float> got = dd.host();
    // Note [Emulated heuristic]: DGELU's tanh t keeps 10 fraction bits, |dt| <= 2^-11 |t|, and
    // d gelu' / dt = 0.5 - x t du (du = sqrt(2/pi) (1 + 3 0.044715 x^2)), so D may be off the
    // exact product by |ab| 2^-11 |t| |0.5 - x t du|, plus f32's rounding (1e-6 relative).
    std::vector<double> row_sum(e.m, 0.0), row_bound(e.m, 0.0);
    for (int64_t j = 0; j < e.n; ++j)
      for (int64_t i = 0; i < e.m; ++i) {
        const double x = pre[i + j * aux_ld];
        const double t = std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x));
        const double du = std::sqrt(2.0 / M_PI) * (1.0 + 3.0 * 0.044715 * x * x);
        const double ab_ij = ab[i + j * e.m];
        const double want = dgelu ? ab_ij * gelu_grad_ref(x) : ab_ij;
        const double approx = dgelu ? std::fabs(ab_ij) * std::ldexp(1.0, -11) * std::fabs(t) *
                                          std::fabs(0.5 - x * t * du)
                                    : 0.0;
        const double bound = approx + 1e-6 * (1 + std::fabs(want));
        row_sum[i] += want;
        row_bound[i] += bound;
        EXPECT_NEAR(got[i + j * e.m], want, bound);
      }
    if (epi == CUBLASLT_EPILOGUE_DGELU_BGRAD) {
      const std::vector<float> bg = dbias.host();
      for (int64_t i = 0; i < e.m; ++i) EXPECT_NEAR(bg[i], row_sum[i], row_bound[i] + 1e-5);
    }
    if (epi == CUBLASLT_EPILOGUE_BGRADA) {  // sum over k of A's rows
      const std::vector<float> bg = dbias.host();
      for (int64_t i = 0; i < e.m; ++i) {
        float s = 0.f;
        for (int64_t q = 0; q < e.k; ++q) s += e.a[i + q * e.m];
        EXPECT_EQ(bg[i], s);
      }
    }
    if (epi == CUBLASLT_EPILOGUE_BGRADB) {  // sum over k of B's columns
      const std::vector<float> bg = dbias_n.host();
      for (int64_t j = 0; j < e.n; ++j) {
        float s = 0.f;
        for (int64_t q = 0; q < e.k; ++q) s += e.b[q + j * e.k];
        EXPECT_EQ(bg[j], s);
      }
    }
    // What the emulator cannot vouch for is refused, not guessed.
    if (epi != CUBLASLT_EPILOGUE_DGELU) {
      EXPECT_EQ(run(lt, op, 2.f, da.p, la, db.p, lb, 0.f, dd.p, ld, dd.p, ld),
                CUBLAS_STATUS_NOT_SUPPORTED);
    }
    if (dgelu) {
      EXPECT_EQ(run(lt, op, 1.f, da.p, la, db.p, lb, 1.f, dd.p, ld, dd.p, ld),
                CUBLAS_STATUS_NOT_SUPPORTED);
    }
    cublasLtMatmulDescDestroy(op);
  }
  for (auto l : {la, lb, ld}) cublasLtMatrixLayoutDestroy(l);
}

TEST(CudaEmuCublasLt, UnsupportedOrInvalidConfigurationsAreRefused) {
  Lt lt;
  DevBuf a(64, CUDA_R_32F), b(64, CUDA_R_32F), d(64, CUDA_R_32F);
  auto l4 = layout(CUDA_R_32F, 4, 4, 4);
  auto status = [&](auto tweak, cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                    cublasLtMatrixLayout_t ld, cublasComputeType_t compute = CUBLAS_COMPUTE_32F) {
    cublasLtMatmulDesc_t op;
    cublasLtMatmulDescCreate(&op, compute, CUDA_R_32F);
    tweak(op);
    const cublasStatus_t s = run(lt, op, 1.f, a.p, la, b.p, lb, 0.f, d.p, ld, d.p, ld);
    cublasLtMatmulDescDestroy(op);
    return s;
  };
  auto none = [](cublasLtMatmulDesc_t) {};
  EXPECT_EQ(status(none, l4, l4, l4), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(
      status(
          [](auto op) { set<uint32_t>(op, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_RELU); },
          l4, l4, l4),
      CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(status(none, l4, l4, l4, CUBLAS_COMPUTE_32F_FAST_TF32), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(status(none, l4, l4, l4, CUBLAS_COMPUTE_16F), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(status(
                [](auto op) {
                  set<int32_t>(op, CUBLASLT_MATMUL_DESC_POINTER_MODE, CUBLASLT_POINTER_MODE_DEVICE);
                },
                l4, l4, l4),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(
      status(
          [](auto op) { set<uint32_t>(op, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS); },
          l4, l4, l4),
      CUBLAS_STATUS_INVALID_VALUE)
      << "BIAS without a bias pointer";
  auto row = layout(CUDA_R_32F, 4, 4, 4);
  int32_t order = CUBLASLT_ORDER_ROW;
  cublasLtMatrixLayoutSetAttribute(row, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof(order));
  EXPECT_EQ(status(none, row, l4, l4), CUBLAS_STATUS_NOT_SUPPORTED);
  auto h4 = layout(CUDA_R_16F, 4, 4, 4);
  EXPECT_EQ(status(none, h4, l4, l4), CUBLAS_STATUS_NOT_SUPPORTED) << "A and B types differ";
  auto l3 = layout(CUDA_R_32F, 3, 4, 3);
  EXPECT_EQ(status(none, l4, l3, l4), CUBLAS_STATUS_INVALID_VALUE) << "k of A != k of B";
  auto short_ld = layout(CUDA_R_32F, 4, 4, 3);
  EXPECT_EQ(status(none, short_ld, l4, l4), CUBLAS_STATUS_INVALID_VALUE) << "ld < rows";
  int32_t two = 2;
  EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(l3, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &two, 2),
            CUBLAS_STATUS_INVALID_VALUE)
      << "attribute of the wrong size";
  for (auto l : {l4, row, h4, l3, short_ld}) cublasLtMatrixLayoutDestroy(l);
}

TEST(CudaEmuCublasLt, AnAlgorithmChosenForAlignedDataRefusesUnalignedData) {
  Lt lt;
  DevBuf a(68, CUDA_R_32F, values(68, 1)), b(64, CUDA_R_32F, values(64, 2)), d(64, CUDA_R_32F);
  auto l4 = layout(CUDA_R_32F, 4, 4, 4);
  cublasLtMatmulDesc_t op;
  cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  const float* a1 = static_cast<const float*>(a.p) + 1;  // 4-byte aligned only
  EXPECT_EQ(run(lt, op, 1.f, a1, l4, b.p, l4, 0.f, d.p, l4, d.p, l4, 256),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(run(lt, op, 1.f, a1, l4, b.p, l4, 0.f, d.p, l4, d.p, l4, 4), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulDescDestroy(op);
  cublasLtMatrixLayoutDestroy(l4);
}

// Note [Emulated cuBLASLt]: the heuristic's algorithms sum k in their own orders (in order,
// reversed, two halves), so they differ in the last bits as a real library's can; each matches a
// loop in its order exactly, cublasLtMatmulAlgoCheck takes them back, and
// STRATA_CUDA_EMU_CUBLASLT_FASTEST slows every other algorithm down.
TEST(CudaEmuCublasLt, TheHeuristicsAlgorithmsSumInTheirOwnOrders) {
  Lt lt;
  const int64_t m = 3, n = 4, k = 64;
  std::vector<float> a(m * k), b(k * n);
  for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.37f * static_cast<float>(i) + 0.1f);
  for (size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.23f * static_cast<float>(i) + 0.2f);
  DevBuf da(a.size(), CUDA_R_32F, a), db(b.size(), CUDA_R_32F, b), dd(m * n, CUDA_R_32F);
  auto la = layout(CUDA_R_32F, m, k, m), lb = layout(CUDA_R_32F, k, n, k),
       ld = layout(CUDA_R_32F, m, n, m);
  cublasLtMatmulDesc_t op;
  ASSERT_EQ(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulPreference_t pref;
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t r[8] = {};
  int found = 0;
  ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(lt.h, op, la, lb, ld, ld, pref, 8, r, &found),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(found, 3);
  auto sum = [&](int64_t i, int64_t j, int64_t q0, int64_t q1, bool reverse) {
    float acc = 0.f;
    for (int64_t s = 0; s < q1 - q0; ++s) {
      const int64_t q = reverse ? q1 - 1 - s : q0 + s;
      acc += a[i + q * m] * b[q + j * k];
    }
    return acc;
  };
  std::vector<std::vector<float>> got;
  for (int v = 0; v < found; ++v) {
    SCOPED_TRACE("algorithm " + std::to_string(v));
    cublasLtMatmulHeuristicResult_t check{};
    EXPECT_EQ(cublasLtMatmulAlgoCheck(lt.h, op, la, lb, ld, ld, &r[v].algo, &check),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(std::memcmp(&check.algo, &r[v].algo, sizeof(check.algo)), 0);
    const float one = 1.f, zero = 0.f;
    ASSERT_EQ(cublasLtMatmul(lt.h, op, &one, da.p, la, db.p, lb, &zero, dd.p, ld, dd.p, ld,
                             &r[v].algo, nullptr, 0, nullptr),
              CUBLAS_STATUS_SUCCESS);
    got.push_back(dd.host());
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) {
        const float want = v == 2 ? sum(i, j, 0, k / 2, false) + sum(i, j, k / 2, k, false)
                                  : sum(i, j, 0, k, v == 1);
        ASSERT_EQ(got.back()[i + j * m], want) << "(" << i << ", " << j << ")";
      }
  }
  EXPECT_NE(got[0], got[1]) << "these values should round differently in the two orders";
  EXPECT_NE(got[0], got[2]);

  cublasLtMatmulAlgo_t forged = r[0].algo;
  forged.data[6] = 4;
  cublasLtMatmulHeuristicResult_t check{};
  EXPECT_EQ(cublasLtMatmulAlgoCheck(lt.h, op, la, lb, ld, ld, &forged, &check),
            CUBLAS_STATUS_INVALID_VALUE);
  auto lha = layout(CUDA_R_16BF, m, k, m), lhb = layout(CUDA_R_16BF, k, n, k),
       lhd = layout(CUDA_R_16BF, m, n, m);
  EXPECT_EQ(cublasLtMatmulAlgoCheck(lt.h, op, lha, lhb, lhd, lhd, &r[0].algo, &check),
            CUBLAS_STATUS_INVALID_VALUE)
      << "an algorithm for f32 on bf16 data";

  // Every algorithm but the one named takes 2 ms more of device time.
  ASSERT_EQ(setenv("STRATA_CUDA_EMU_CUBLASLT_FASTEST", "1", 1), 0);
  for (int v = 0; v < found; ++v) {
    cudaEvent_t e0, e1;
    ASSERT_EQ(cudaEventCreate(&e0), cudaSuccess);
    ASSERT_EQ(cudaEventCreate(&e1), cudaSuccess);
    const float one = 1.f, zero = 0.f;
    ASSERT_EQ(cudaEventRecord(e0, nullptr), cudaSuccess);
    ASSERT_EQ(cublasLtMatmul(lt.h, op, &one, da.p, la, db.p, lb, &zero, dd.p, ld, dd.p, ld,
                             &r[v].algo, nullptr, 0, nullptr),
              CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cudaEventRecord(e1, nullptr), cudaSuccess);
    ASSERT_EQ(cudaEventSynchronize(e1), cudaSuccess);
    float ms = 0;
    ASSERT_EQ(cudaEventElapsedTime(&ms, e0, e1), cudaSuccess);
    if (v == 1)
      EXPECT_LT(ms, 2.f);
    else
      EXPECT_GE(ms, 2.f) << "algorithm " << v;
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
  unsetenv("STRATA_CUDA_EMU_CUBLASLT_FASTEST");
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatmulDescDestroy(op);
  for (auto l : {la, lb, ld, lha, lhb, lhd}) cublasLtMatrixLayoutDestroy(l);
}

// Note [Emulated cuBLASLt]: CUBLAS_COMPUTE_32F_FAST_TF32 rounds each f32 element of A and B to
// TF32 (10 fraction bits, to nearest, ties away from zero) and sums in f32; it takes f32 data
// only, no bias-gradient epilogue over A or B, and an algorithm keeps its compute type.
TEST(CudaEmuCublasLt, FastTf32RoundsTheInputsToTenFractionBits) {
  Lt lt;
  // 1 x k times k x 1: D = sum_q a_q b_q with b = 1 (exact in TF32), so D shows a's rounding.
  const float ulp = std::ldexp(1.f, -10);  // TF32's unit in the last place at 1
  const std::vector<float> a = {
      1.f + ulp / 4,      // below half an ulp: down to 1
      1.f + ulp / 2,      // a tie: away from zero, up to 1 + ulp
      -(1.f + ulp / 2),   // a tie below zero: away from zero, down to -(1 + ulp)
      1.f + 3 * ulp / 4,  // above half: up to 1 + ulp
      3.f - ulp / 2,      // TF32's step at 3 is 2 ulp: a quarter step below 3, up to 3
  };
  const std::vector<float> tf32 = {1.f, 1.f + ulp, -(1.f + ulp), 1.f + ulp, 3.f};
  const int64_t k = static_cast<int64_t>(a.size());
  DevBuf b(k, CUDA_R_32F, std::vector<float>(k, 1.f)), d(1, CUDA_R_32F);
  // Each element alone (k = 1 views of a), so each rounding is checked without a sum.
  for (int64_t q = 0; q < k; ++q) {
    SCOPED_TRACE("element " + std::to_string(q));
    DevBuf da(1, CUDA_R_32F, {a[q]});
    auto l1 = layout(CUDA_R_32F, 1, 1, 1);
    for (const cublasComputeType_t compute : {CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32}) {
      cublasLtMatmulDesc_t op;
      ASSERT_EQ(cublasLtMatmulDescCreate(&op, compute, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
      ASSERT_EQ(run(lt, op, 1.f, da.p, l1, b.p, l1, 0.f, d.p, l1, d.p, l1), CUBLAS_STATUS_SUCCESS);
      EXPECT_EQ(d.host()[0], compute == CUBLAS_COMPUTE_32F ? a[q] : tf32[q]);
      cublasLtMatmulDescDestroy(op);
    }
    cublasLtMatrixLayoutDestroy(l1);
  }
  // Both operands are rounded, then summed in f32: a 2 x 3 by 3 x 2 product against a loop.
  const int64_t m = 2, n = 2, kk = 3;
  std::vector<float> x(m * kk), y(kk * n);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.7f * static_cast<float>(i) + 0.3f);
  for (size_t i = 0; i < y.size(); ++i) y[i] = std::cos(0.9f * static_cast<float>(i) + 0.1f);
  auto rna = [](float v) {  // the rounding, from its definition: the nearest, ties away
    const int e = std::ilogb(v);
    const float step = std::ldexp(1.f, e - 10);
    const float down = std::trunc(v / step) * step;  // toward zero
    const float rest = std::fabs(v - down);
    return rest * 2 >= step ? down + std::copysign(step, v) : down;
  };
  DevBuf dx(x.size(), CUDA_R_32F, x), dy(y.size(), CUDA_R_32F, y), dd(m * n, CUDA_R_32F);
  auto lx = layout(CUDA_R_32F, m, kk, m), ly = layout(CUDA_R_32F, kk, n, kk),
       ld = layout(CUDA_R_32F, m, n, m);
  cublasLtMatmulDesc_t op;
  ASSERT_EQ(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(run(lt, op, 1.f, dx.p, lx, dy.p, ly, 0.f, dd.p, ld, dd.p, ld), CUBLAS_STATUS_SUCCESS);
  const std::vector<float> got = dd.host();
  bool differs = false;
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      float want = 0.f, full = 0.f;
      for (int64_t q = 0; q < kk; ++q) {
        want += rna(x[i + q * m]) * rna(y[q + j * kk]);
        full += x[i + q * m] * y[q + j * kk];
      }
      EXPECT_EQ(got[i + j * m], want) << "(" << i << ", " << j << ")";
      differs |= got[i + j * m] != full;
    }
  EXPECT_TRUE(differs) << "these values have bits below TF32's, so the f32 product differs";

  // What FAST_TF32 refuses: 16-bit data, and the bias gradients of A or B.
  DevBuf h(4, CUDA_R_16BF, {1, 2, 3, 4}), hd(4, CUDA_R_16BF), bias(2, CUDA_R_32F);
  auto lh = layout(CUDA_R_16BF, 2, 2, 2);
  EXPECT_EQ(run(lt, op, 1.f, h.p, lh, h.p, lh, 0.f, hd.p, lh, hd.p, lh),
            CUBLAS_STATUS_NOT_SUPPORTED);
  auto l2 = layout(CUDA_R_32F, 2, 2, 2);
  set<void*>(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias.p);
  for (const auto e : {CUBLASLT_EPILOGUE_BGRADA, CUBLASLT_EPILOGUE_BGRADB}) {
    set<uint32_t>(op, CUBLASLT_MATMUL_DESC_EPILOGUE, e);
    EXPECT_EQ(run(lt, op, 1.f, dx.p, l2, dx.p, l2, 0.f, dd.p, l2, dd.p, l2),
              CUBLAS_STATUS_NOT_SUPPORTED)
        << "epilogue " << e;
  }
  set<uint32_t>(op, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
  EXPECT_EQ(run(lt, op, 1.f, dx.p, l2, dx.p, l2, 0.f, dd.p, l2, dd.p, l2), CUBLAS_STATUS_SUCCESS);

  // An algorithm the heuristic chose under FAST_TF32 is refused under COMPUTE_32F, and back.
  cublasLtMatmulDesc_t f32;
  ASSERT_EQ(cublasLtMatmulDescCreate(&f32, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulPreference_t pref;
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t r_tf32{}, r_f32{}, check{};
  int found = 0;
  cublasLtMatmulDesc_t tf32_op;
  ASSERT_EQ(cublasLtMatmulDescCreate(&tf32_op, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(lt.h, tf32_op, lx, ly, ld, ld, pref, 1, &r_tf32, &found),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(lt.h, f32, lx, ly, ld, ld, pref, 1, &r_f32, &found),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulAlgoCheck(lt.h, tf32_op, lx, ly, ld, ld, &r_tf32.algo, &check),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulAlgoCheck(lt.h, f32, lx, ly, ld, ld, &r_tf32.algo, &check),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulAlgoCheck(lt.h, tf32_op, lx, ly, ld, ld, &r_f32.algo, &check),
            CUBLAS_STATUS_INVALID_VALUE);
  const float one = 1.f, zero = 0.f;
  EXPECT_EQ(cublasLtMatmul(lt.h, f32, &one, dx.p, lx, dy.p, ly, &zero, dd.p, ld, dd.p, ld,
                           &r_tf32.algo, nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  cublasLtMatmulPreferenceDestroy(pref);
  for (auto o : {op, f32, tf32_op}) cublasLtMatmulDescDestroy(o);
  for (auto l : {lx, ly, ld, lh, l2}) cublasLtMatrixLayoutDestroy(l);
}

using CudaEmuCublasLtDeathTest = ::testing::Test;

TEST(CudaEmuCublasLtDeathTest, AnOperandOutsideDeviceMemoryAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Lt lt;
  DevBuf b(64, CUDA_R_32F), d(64, CUDA_R_32F), small(8, CUDA_R_32F);
  std::vector<float> host(64, 1.f);
  auto l4 = layout(CUDA_R_32F, 4, 4, 4);
  cublasLtMatmulDesc_t op;
  cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  EXPECT_DEATH((run(lt, op, 1.f, host.data(), l4, b.p, l4, 0.f, d.p, l4, d.p, l4, 4),
                cudaDeviceSynchronize()),
               "cublasLtMatmul: A: \\[0x[0-9a-f]+, \\+64 bytes\\) is not inside one device "
               "allocation");
  EXPECT_DEATH(
      (run(lt, op, 1.f, small.p, l4, b.p, l4, 0.f, d.p, l4, d.p, l4, 4), cudaDeviceSynchronize()),
      "cublasLtMatmul: A: .* is not inside one device allocation");
  cublasLtMatmulDescDestroy(op);
  cublasLtMatrixLayoutDestroy(l4);
}

}  // namespace
}  // namespace strata::cuda_emu

namespace strata::cuda_emu {
namespace {

// Note [Emulated heuristic]: a small problem with a workspace gets a split-K first; with a 16-bit
// D and OUTPUT_TYPE allowed, one whose halves are rounded to D's type (so its result is two
// roundings off the one-rounding product), with only COMPUTE_TYPE allowed, one that adds the f32
// halves; a large problem, or one without a workspace, gets the plain order first. The reduction
// scheme is reported as the real library's algorithm configuration reports it.
TEST(CudaEmuCublasLt, TheFirstAlgorithmDependsOnTheProblemAndThePreference) {
  Lt lt;
  const int64_t m = 8, n = 8, k = 64;
  std::vector<float> a(m * k), b(k * n);
  for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.37f * static_cast<float>(i) + 0.1f) * 9;
  for (size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.23f * static_cast<float>(i) + 0.2f);
  DevBuf da(a.size(), CUDA_R_16BF, a), db(b.size(), CUDA_R_16BF, b), dd(m * n, CUDA_R_16BF);
  auto la = layout(CUDA_R_16BF, m, k, m), lb = layout(CUDA_R_16BF, k, n, k),
       ld = layout(CUDA_R_16BF, m, n, m);
  cublasLtMatmulDesc_t op;
  ASSERT_EQ(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  auto first = [&](uint64_t workspace, uint32_t mask) {
    cublasLtMatmulPreference_t pref;
    EXPECT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                         sizeof(workspace));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask,
                                         sizeof(mask));
    cublasLtMatmulHeuristicResult_t r[8] = {};
    int found = 0;
    EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(lt.h, op, la, lb, ld, ld, pref, 8, r, &found),
              CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulPreferenceDestroy(pref);
    EXPECT_GE(found, 2);
    uint32_t scheme = 99;
    size_t written = 0;
    EXPECT_EQ(
        cublasLtMatmulAlgoConfigGetAttribute(&r[0].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                             &scheme, sizeof(scheme), &written),
        CUBLAS_STATUS_SUCCESS);
    const float one = 1.f, zero = 0.f;
    EXPECT_EQ(cublasLtMatmul(lt.h, op, &one, da.p, la, db.p, lb, &zero, dd.p, ld, dd.p, ld,
                             &r[0].algo, nullptr, 0, nullptr),
              CUBLAS_STATUS_SUCCESS);
    return std::make_pair(scheme, dd.host());
  };
  const uint32_t all = CUBLASLT_REDUCTION_SCHEME_MASK;
  const auto [none_scheme, none] = first(0, all);
  EXPECT_EQ(none_scheme, static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_NONE)) << "no workspace";
  const auto [out_scheme, out] = first(1 << 20, all);
  EXPECT_EQ(out_scheme, static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE));
  const auto [f32_scheme, f32] = first(1 << 20, CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
  EXPECT_EQ(f32_scheme, static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE));
  // The bf16-rounded halves move some outputs off the f32 sums' one rounding.
  EXPECT_NE(out, f32);
  // A large output takes the plain order first even with a workspace.
  auto lbig = layout(CUDA_R_16BF, 256, k, 256), lbd = layout(CUDA_R_16BF, 256, 128, 256),
       lbb = layout(CUDA_R_16BF, k, 128, k);
  cublasLtMatmulPreference_t pref;
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  const uint64_t ws = 64 << 20;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof(ws));
  cublasLtMatmulHeuristicResult_t r[8] = {};
  int found = 0;
  ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(lt.h, op, lbig, lbb, lbd, lbd, pref, 8, r, &found),
            CUBLAS_STATUS_SUCCESS);
  uint32_t scheme = 99;
  size_t written = 0;
  ASSERT_EQ(cublasLtMatmulAlgoConfigGetAttribute(&r[0].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                                 &scheme, sizeof(scheme), &written),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(scheme, static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_NONE));
  cublasLtMatmulPreferenceDestroy(pref);
  for (auto l : {la, lb, ld, lbig, lbd, lbb}) cublasLtMatrixLayoutDestroy(l);
  cublasLtMatmulDescDestroy(op);
}

}  // namespace
}  // namespace strata::cuda_emu
