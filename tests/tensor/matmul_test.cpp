// matmul: all transpose combinations, batched and shared-b, alpha/beta, odd sizes, oneDNN vs Eigen
// vs a naive triple loop in double, bf16, determinism.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>

#include "tensor/cpu/matmul.h"
#include "tensor/ops.h"
#include "tests/tensor/tensor_test_util.h"

namespace strata::tensor {
namespace {

using cpu::MatmulEngine;
using cpu::MatmulEngineScope;
using testing::at;
using testing::rand;
using testing::values;

std::vector<MatmulEngine> engines() {
  std::vector<MatmulEngine> e = {MatmulEngine::Eigen};
  if (cpu::have_onednn()) e.push_back(MatmulEngine::OneDnn);
  return e;
}

const char* name(MatmulEngine e) {
  return e == MatmulEngine::Eigen ? "eigen" : "onednn";
}

struct Ref {
  std::vector<double> value;  // alpha * op(a) op(b) + beta * out0, in double
  std::vector<double> mag;    // |alpha| * sum_k |a_ik b_kj|: the scale of the rounding error
};

// Naive triple loop over logical elements (a, b any f32 layout; batch dims flattened).
Ref naive(const Tensor& a, const Tensor& b, bool ta, bool tb, float alpha, float beta,
          const std::vector<float>& out0) {
  const int64_t m = ta ? a.size(-1) : a.size(-2), k = ta ? a.size(-2) : a.size(-1);
  const int64_t n = tb ? b.size(-2) : b.size(-1);
  const int64_t batch = a.numel() / (m * k);
  const std::vector<float> av = values(a), bv = values(b);
  const bool shared = b.ndim() == 2;
  Ref r;
  r.value.resize(batch * m * n);
  r.mag.resize(batch * m * n);
  for (int64_t bi = 0; bi < batch; ++bi)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0, g = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double x = av[bi * m * k + (ta ? p * m + i : i * k + p)];
          const double y = bv[(shared ? 0 : bi * k * n) + (tb ? j * k + p : p * n + j)];
          s += x * y;
          g += std::fabs(x * y);
        }
        const int64_t o = (bi * m + i) * n + j;
        r.value[o] = alpha * s + (beta == 0.f ? 0.0 : beta * static_cast<double>(out0[o]));
        r.mag[o] = std::fabs(alpha) * g + std::fabs(beta * static_cast<double>(out0[o]));
      }
  return r;
}

// f32 GEMM error bound used throughout, in units u = 2^-24 of the magnitude sum |a||b|:
// 2 u for rounding the result (and alpha/beta), plus 2 sqrt(K) u for the K-term sum. The rigorous
// worst case of the sum is K u; random inputs stay near sqrt(K) u. Both engines measure below
// half of this bound on this file's inputs (worst at small K, where the sum's error is
// closest to its worst case): 0.45 at K = 7.
double f32_tol(int64_t k, double mag) {
  const double u = 5.9604644775390625e-8;
  return (2.0 + 2.0 * std::sqrt(static_cast<double>(std::max<int64_t>(k, 1)))) * u * mag + 1e-30;
}

// Runs matmul_out on the current engine and checks it against the naive reference.
// Returns the worst error / tolerance ratio.
double check(const Tensor& a, const Tensor& b, bool ta, bool tb, float alpha, float beta,
             const std::string& what) {
  const int64_t m = ta ? a.size(-1) : a.size(-2), n = tb ? b.size(-2) : b.size(-1);
  const int64_t k = ta ? a.size(-2) : a.size(-1);
  Shape s = a.shape();
  s[s.ndim() - 2] = m;
  s[s.ndim() - 1] = n;
  Tensor out = rand(s, 999, -2.f, 2.f);
  std::vector<float> out0 = values(out);
  matmul_out(a, b, out, ta, tb, alpha, beta);
  Ref r = naive(a, b, ta, tb, alpha, beta, out0);
  std::vector<float> got = values(out);
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = f32_tol(k, r.mag[i]);
    const double err = std::fabs(got[i] - r.value[i]);
    worst = std::max(worst, err / tol);
    if (!(err <= tol)) {
      ADD_FAILURE() << what << " element " << i << ": got " << got[i] << " want " << r.value[i]
                    << " (tol " << tol << ")";
      return worst;
    }
  }
  return worst;
}

struct Dims3 {
  int64_t m, k, n;
};
const Dims3 kSizes[] = {{1, 1, 1}, {7, 13, 5}, {33, 65, 17}, {2, 3, 300}, {130, 7, 515}};

TEST(Matmul, AllTransposesOddSizesBothEngines) {
  double worst = 0;
  uint64_t seed = 1;
  for (MatmulEngine e : engines()) {
    MatmulEngineScope scope(e);
    for (const Dims3& d : kSizes)
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          Tensor a = rand(ta ? Shape{d.k, d.m} : Shape{d.m, d.k}, seed++);
          Tensor b = rand(tb ? Shape{d.n, d.k} : Shape{d.k, d.n}, seed++);
          worst = std::max(
              worst, check(a, b, ta, tb, 1.f, 0.f,
                           fmt::format("{} {}x{}x{} ta={} tb={}", name(e), d.m, d.k, d.n, ta, tb)));
        }
  }
  RecordProperty("worst_err_over_tol", std::to_string(worst));
}

TEST(Matmul, BatchedAndSharedB) {
  for (MatmulEngine e : engines()) {
    MatmulEngineScope scope(e);
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        // 4-d batch [2, 3], b batched.
        Tensor a = rand(ta ? Shape{2, 3, 9, 6} : Shape{2, 3, 6, 9}, 10 + ta);
        Tensor b = rand(tb ? Shape{2, 3, 11, 9} : Shape{2, 3, 9, 11}, 20 + tb);
        check(a, b, ta, tb, 1.f, 0.f, fmt::format("{} batched ta={} tb={}", name(e), ta, tb));
        // b 2-d, shared across a batch of 5.
        Tensor a3 = rand(ta ? Shape{5, 9, 6} : Shape{5, 6, 9}, 30 + ta);
        Tensor b2 = rand(tb ? Shape{11, 9} : Shape{9, 11}, 40 + tb);
        check(a3, b2, ta, tb, 1.f, 0.f, fmt::format("{} shared ta={} tb={}", name(e), ta, tb));
      }
  }
}

TEST(Matmul, AlphaBeta) {
  for (MatmulEngine e : engines()) {
    MatmulEngineScope scope(e);
    Tensor a = rand({3, 37, 21}, 1), b = rand({3, 21, 19}, 2);
    for (auto [alpha, beta] :
         {std::pair{0.5f, 2.f}, {1.f, 1.f}, {-1.25f, 0.f}, {0.f, 0.5f}, {0.125f, -1.f}})
      check(a, b, false, false, alpha, beta,
            fmt::format("{} alpha={} beta={}", name(e), alpha, beta));
    // beta = 0 ignores whatever out held, NaN included.
    Tensor out = full({3, 37, 19}, std::nan(""));
    matmul_out(a, b, out, false, false, 1.f, 0.f);
    for (float v : values(out)) ASSERT_FALSE(std::isnan(v)) << name(e);
  }
}

TEST(Matmul, EmptyInnerDimScalesOut) {
  for (MatmulEngine e : engines()) {
    MatmulEngineScope scope(e);
    Tensor a = Tensor::empty({4, 0}), b = Tensor::empty({0, 3});
    Tensor out = full({4, 3}, 2.0);
    matmul_out(a, b, out, false, false, 1.f, 0.5f);
    EXPECT_EQ(values(out), std::vector<float>(12, 1.f));
    EXPECT_EQ(values(matmul(a, b)), std::vector<float>(12, 0.f));
    Tensor none = matmul(Tensor::empty({0, 5}), rand({5, 3}, 1));
    EXPECT_EQ(none.shape(), Shape({0, 3}));
  }
}

TEST(Matmul, EnginesAgreeOnGptShapes) {
  if (!cpu::have_onednn()) GTEST_SKIP() << "built without oneDNN";
  // Forward (x @ W), input grad (dy @ W^T) and weight grad (x^T @ dy) at reduced GPT-2 shapes.
  Tensor x = rand({96, 192}, 1), w = rand({192, 160}, 2), dy = rand({96, 160}, 3);
  struct Case {
    Tensor a, b;
    bool ta, tb;
  };
  for (const Case& c :
       {Case{x, w, false, false}, Case{dy, w, false, true}, Case{x, dy, true, false}}) {
    Tensor r1, r2;
    {
      MatmulEngineScope s(MatmulEngine::OneDnn);
      r1 = matmul(c.a, c.b, c.ta, c.tb);
      check(c.a, c.b, c.ta, c.tb, 1.f, 0.f, "onednn gpt");
    }
    {
      MatmulEngineScope s(MatmulEngine::Eigen);
      r2 = matmul(c.a, c.b, c.ta, c.tb);
      check(c.a, c.b, c.ta, c.tb, 1.f, 0.f, "eigen gpt");
    }
    // The engines sum in different orders, so they differ, but by no more than one tolerance.
    const int64_t k = c.ta ? c.a.size(0) : c.a.size(1);
    Ref r = naive(c.a, c.b, c.ta, c.tb, 1.f, 0.f, std::vector<float>(r1.numel(), 0.f));
    std::vector<float> v1 = values(r1), v2 = values(r2);
    int64_t differ = 0;
    for (size_t i = 0; i < v1.size(); ++i) {
      ASSERT_LE(std::fabs(v1[i] - v2[i]), f32_tol(k, r.mag[i])) << i;
      differ += v1[i] != v2[i];
    }
    RecordProperty("elements_that_differ", std::to_string(differ));
  }
}

TEST(Matmul, DeterministicRunToRunAndEigenAcrossThreadCounts) {
  Tensor a = rand({300, 260}, 1), b = rand({260, 530}, 2);
  for (MatmulEngine e : engines()) {
    MatmulEngineScope scope(e);
    Tensor ref = matmul(a, b, false, false);
    for (int rep = 0; rep < 3; ++rep) EXPECT_TRUE(testing::same_bits(matmul(a, b), ref)) << name(e);
  }
  // The Eigen engine cuts work into fixed tiles: the thread count cannot change the bits.
  MatmulEngineScope scope(MatmulEngine::Eigen);
  Tensor x = rand({260, 300}, 3);
  Tensor r1 = matmul(x, b, true, false);
  testing::for_thread_counts({1, 2, 3, 4}, [&](int n) {
    EXPECT_TRUE(testing::same_bits(matmul(x, b, true, false), r1)) << "threads " << n;
    EXPECT_TRUE(testing::same_bits(matmul(a, b), matmul(a, b))) << "threads " << n;
  });
}

TEST(Matmul, CalledInsideAParallelRegionMatchesEigen) {
  Tensor a = rand({4, 50, 70}, 1), b = rand({70, 90}, 2);
  Tensor ref;
  {
    MatmulEngineScope s(MatmulEngine::Eigen);
    ref = matmul(a, b);
  }
  std::vector<Tensor> outs(4);
  for (int i = 0; i < 4; ++i) outs[i] = Tensor::empty({50, 90});
#pragma omp parallel for num_threads(2)
  for (int i = 0; i < 4; ++i) matmul_out(a.select(0, i), b, outs[i], false, false);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(testing::same_bits(outs[i], ref.select(0, i))) << i;
}

TEST(Matmul, Bf16InputsF32AndBf16Outputs) {
  for (MatmulEngine e : engines()) {
    MatmulEngineScope scope(e);
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        Tensor a = rand(ta ? Shape{2, 45, 30} : Shape{2, 30, 45}, 1 + ta).to(DType::BF16);
        Tensor b = rand(tb ? Shape{27, 45} : Shape{45, 27}, 3 + tb).to(DType::BF16);
        // The f32 reference on the (exactly widened) bf16 values.
        const Tensor af = a.to(DType::F32), bf = b.to(DType::F32);
        // Note [Low-precision ops]: matmul returns bf16; matmul_out may write f32 (mixed).
        ASSERT_EQ(matmul(a, b, ta, tb).dtype(), DType::BF16);
        Tensor out = Tensor::empty({2, 30, 27}, DType::F32);
        matmul_out(a, b, out, ta, tb);
        std::vector<float> out0(out.numel(), 0.f);
        Ref r = naive(af, bf, ta, tb, 1.f, 0.f, out0);
        std::vector<float> got = values(out);
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_LE(std::fabs(got[i] - r.value[i]), f32_tol(45, r.mag[i])) << name(e) << " " << i;
        // BF16 output with beta: bf16(alpha * ab + beta * out) within half a bf16 ulp of the
        // exact value (plus the f32 error).
        Tensor ob = rand({2, 30, 27}, 7).to(DType::BF16);
        std::vector<float> ob0 = to_float_vector(ob);
        matmul_out(a, b, ob, ta, tb, 0.5f, 1.f);
        Ref rb = naive(af, bf, ta, tb, 0.5f, 1.f, ob0);
        std::vector<float> gb = to_float_vector(ob);
        for (size_t i = 0; i < gb.size(); ++i) {
          const double half_ulp = std::ldexp(std::fabs(rb.value[i]), -8);
          ASSERT_LE(std::fabs(gb[i] - rb.value[i]), half_ulp + f32_tol(45, rb.mag[i]))
              << name(e) << " bf16 out " << i;
        }
      }
  }
}

// Every output width from 1 to 130 (each tail of a 16-, 32- and 64-wide block), all transposes,
// both engines: oneDNN 2.6's AMX kernel gave wrong sums for widths 49 to 63 (Note [No AMX for
// bf16 matmul] in tensor/cpu/matmul.cpp), which the shapes above never reached.
TEST(Matmul, Bf16EveryOutputWidthMatchesTheF32Product) {
  for (MatmulEngine e : engines()) {
    MatmulEngineScope scope(e);
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (int64_t m : {1, 28})
          for (int64_t k : {64, 128})
            for (int64_t n = 1; n <= 130; ++n) {
              const Tensor a = rand(ta ? Shape{k, m} : Shape{m, k}, 11 + n).to(DType::BF16);
              const Tensor b = rand(tb ? Shape{n, k} : Shape{k, n}, 12 + n).to(DType::BF16);
              Tensor out = Tensor::empty({m, n}, DType::F32);
              matmul_out(a, b, out, ta, tb);
              std::vector<float> zero(static_cast<size_t>(m * n), 0.f);
              const Ref r = naive(a.to(DType::F32), b.to(DType::F32), ta, tb, 1.f, 0.f, zero);
              const std::vector<float> got = values(out);
              for (size_t i = 0; i < got.size(); ++i)
                ASSERT_LE(std::fabs(got[i] - r.value[i]), f32_tol(k, r.mag[i]))
                    << name(e) << " ta=" << ta << " tb=" << tb << " m=" << m << " n=" << n
                    << " k=" << k << " element " << i;
            }
  }
}

TEST(Matmul, OpLayerAcceptsNonContiguousInputs) {
  Tensor a = rand({20, 30}, 1).transpose(0, 1);  // [30, 20]
  Tensor b = rand({20, 10}, 2);
  Tensor out = matmul(a, b);
  ASSERT_EQ(out.shape(), Shape({30, 10}));
  Ref r = naive(a.contiguous(), b, false, false, 1.f, 0.f, std::vector<float>(300, 0.f));
  std::vector<float> got = values(out);
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::fabs(got[i] - r.value[i]), f32_tol(20, r.mag[i]));
}

TEST(Matmul, EngineSwitch) {
  const MatmulEngine before = cpu::matmul_engine();
  {
    MatmulEngineScope s(MatmulEngine::Eigen);
    EXPECT_EQ(cpu::matmul_engine(), MatmulEngine::Eigen);
  }
  EXPECT_EQ(cpu::matmul_engine(), before);
  if (!cpu::have_onednn()) {
    EXPECT_THROW(cpu::set_matmul_engine(MatmulEngine::OneDnn), UserError);
  }
}

}  // namespace
}  // namespace strata::tensor
