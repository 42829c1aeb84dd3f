// The emulated cuBLASLt (Note [Emulated cuBLASLt] in cublaslt.cpp) against a naive loop:
// transposes, leading dimensions, strided batches, every supported epilogue, and the
// configurations it refuses.
// The algorithms (alignment, summation orders, TF32, the heuristic's first choice) and the
// bounds check are in cublaslt_algo_test.cpp.
#include "tests/emulator/cublaslt_test_util.h"

namespace strata::cuda_emu {
namespace {

using namespace cublaslt_test;

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

}  // namespace
}  // namespace strata::cuda_emu
