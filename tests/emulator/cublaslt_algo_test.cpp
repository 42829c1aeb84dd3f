// The emulated cuBLASLt's algorithms (Note [Emulated heuristic] in cuda_emu/cublaslt.cpp): an
// algorithm chosen for aligned data refuses unaligned data, each sums in its own order, TF32
// rounds the inputs, the first algorithm depends on the problem and the preference, and an
// operand outside device memory aborts.
#include "tests/emulator/cublaslt_test_util.h"

namespace strata::cuda_emu {
namespace {

using namespace cublaslt_test;

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
