// TF32 for f32 GEMMs (Note [TF32] in tensor/cuda.h): with set_cuda_tf32(true) every f32 GEMM
// (matmul, linear with its epilogues, their gradients) rounds its inputs to TF32 and sums in f32,
// so it stays within TF32's rounding bound of the CPU's f32 product, moves off the f32 GEMM's
// bits, and still gives the same bits for the same inputs; bf16/f16 GEMMs do not change; the
// tuning of TF32 problems is kept apart from f32 ones (Note [cuBLASLt tuning]). Skips itself when
// no GPU is visible (CTest label `cuda`).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "tensor/cuda.h"
#include "tensor/ops.h"
#include "tests/support/tool_test_util.h"

namespace strata::tensor {
namespace {

const Device kGpu = Device::cuda(0);
const Device kCpu = Device::cpu();

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible"

// TF32 off again after each test, whatever it failed at, and matmul tuning too.
class CudaTf32 : public ::testing::Test {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPU(); }
  void TearDown() override {
    if (!cuda_available()) return;
    set_cuda_tf32(false);
    set_cuda_matmul_tuning(false);
  }
};

Tensor rnd(const Shape& s, uint64_t stream, float lo = -2.f, float hi = 2.f) {
  return uniform(s, {53, stream}, lo, hi);
}

// The f32 CPU operands of gemms().
struct Inputs {
  Tensor a, b, x, w, bias, dy, old, dz, w2, pre;
};
Inputs inputs() {
  // Small weights keep the GELU inputs where GELU bends, as tests/cuda/fused_ops_test.cpp does.
  return {rnd({37, 64}, 1), rnd({64, 48}, 2),
          rnd({37, 64}, 3), rnd({96, 64}, 4, -0.3f, 0.3f),
          rnd({96}, 5),     rnd({37, 96}, 6),
          rnd({96, 64}, 7), rnd({37, 48}, 8),
          rnd({48, 96}, 9), rnd({37, 96}, 10, -3.f, 3.f)};
}

// Each GEMM of a linear layer on `d` in `dt` (the operands cast and moved), as CPU f32: a
// matmul, the forward linear with a bias (BIAS) and with GELU and its saved input
// (GELU_AUX_BIAS), the weight gradient with the bias gradient (BGRADB), added into an old value,
// and the GELU gradient with its bias gradient (DGELU_BGRAD).
std::vector<Tensor> gemms(const Inputs& in, DType dt, Device d) {
  auto on = [&](const Tensor& t) { return t.to(dt).to(d); };
  std::vector<Tensor> out;
  out.push_back(matmul(on(in.a), on(in.b)));
  out.push_back(linear(on(in.x), on(in.w), on(in.bias)).y);
  LinearResult g = linear(on(in.x), on(in.w), on(in.bias), Activation::Gelu, /*save_pre=*/true);
  out.push_back(g.y);
  out.push_back(g.pre);
  Tensor dweight = on(in.old).clone();  // on() may hand back in.old itself (f32 on the CPU)
  out.push_back(linear_backward_weight_into(on(in.dy), on(in.x), dweight, /*with_bias=*/true));
  out.push_back(dweight);
  LinearGeluGrads gg = linear_backward_gelu(on(in.dz), on(in.w2), on(in.pre), /*with_bias=*/true);
  out.push_back(gg.dpre);
  out.push_back(gg.dbias);
  for (Tensor& t : out) t = t.to(kCpu).to(DType::F32);
  return out;
}

// Per element of each of gemms()'s outputs, the most a TF32 GEMM may differ from the f32 one:
// each input rounded with a relative error up to u = 2^-10 (truncation; 2^-11 if rounded to
// nearest), so a product a*b by up to (2u + u^2)|a||b|, a sum over k by that times sum |a||b|
// (the same matmul on |a| and |b|), plus f32's own rounding of both sums (k 2^-24 sum |a||b|
// each). Through GELU the error grows by at most max |gelu'| < 1.13, and the GELU gradient's by
// |gelu'(pre)| <= 1.13; a bias gradient sums its column's bounds, or, where the epilogue sums
// the rounded dy (BGRADB), u |dy|. 1e-6 absolute covers the f32 roundings of the bias adds.
// sum_q |A[i, q]| |B[q, j]| for op(A) [m, k] and op(B) [k, n] (transposed when ta / tb), in double.
std::vector<double> abs_matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  const std::vector<float> av = to_float_vector(a), bv = to_float_vector(b);
  const int64_t m = ta ? a.size(1) : a.size(0), k = ta ? a.size(0) : a.size(1),
                n = tb ? b.size(0) : b.size(1);
  std::vector<double> out(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t q = 0; q < k; ++q) {
        const float x = ta ? av[q * a.size(1) + i] : av[i * k + q];
        const float y = tb ? bv[j * k + q] : bv[q * n + j];
        s += std::fabs(static_cast<double>(x)) * std::fabs(static_cast<double>(y));
      }
      out[i * n + j] = s;
    }
  return out;
}

// Each column's sum of the [rows, cols] row-major values v.
std::vector<double> column_sums(const std::vector<double>& v, int64_t cols) {
  std::vector<double> out(static_cast<size_t>(cols), 0.0);
  for (size_t e = 0; e < v.size(); ++e) out[e % cols] += v[e];
  return out;
}

std::vector<std::vector<double>> bounds(const Inputs& in) {
  const double u = std::ldexp(1.0, -10);
  auto bound = [&](std::vector<double> mag, int64_t k, double factor = 1.0) {
    for (double& x : mag)
      x = factor * x * (2 * u + u * u + 2.0 * static_cast<double>(k) * 0x1p-24) + 1e-6;
    return mag;
  };
  std::vector<std::vector<double>> out;
  out.push_back(bound(abs_matmul(in.a, in.b, false, false), 64));
  const std::vector<double> lin = bound(abs_matmul(in.x, in.w, false, true), 64);
  out.push_back(lin);
  out.push_back(bound(abs_matmul(in.x, in.w, false, true), 64, 1.13));
  out.push_back(lin);
  std::vector<double> dy(static_cast<size_t>(in.dy.numel()));
  const std::vector<float> dyv = to_float_vector(in.dy);
  for (size_t e = 0; e < dy.size(); ++e) dy[e] = u * std::fabs(static_cast<double>(dyv[e]));
  std::vector<double> db = column_sums(dy, 96);
  for (double& x : db) x += 1e-6;
  out.push_back(db);
  out.push_back(bound(abs_matmul(in.dy, in.x, true, false), 37));
  const std::vector<double> dpre = bound(abs_matmul(in.dz, in.w2, false, false), 48, 1.13);
  out.push_back(dpre);
  std::vector<double> dpre_b = column_sums(dpre, 96);
  for (double& x : dpre_b) x += 1e-6;
  out.push_back(dpre_b);
  return out;
}

TEST_F(CudaTf32, F32GemmsStayWithinTf32sBoundOfTheCpuAndLeaveF32sBits) {
  const Inputs in = inputs();
  const std::vector<Tensor> cpu = gemms(in, DType::F32, kCpu);
  ASSERT_FALSE(cuda_tf32());
  const std::vector<Tensor> f32 = gemms(in, DType::F32, kGpu);
  set_cuda_tf32(true);
  EXPECT_TRUE(cuda_tf32());
  const std::vector<Tensor> tf32 = gemms(in, DType::F32, kGpu);
  const std::vector<Tensor> again = gemms(in, DType::F32, kGpu);
  const std::vector<std::vector<double>> bound = bounds(in);
  ASSERT_EQ(tf32.size(), cpu.size());
  ASSERT_EQ(bound.size(), cpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    SCOPED_TRACE("output " + std::to_string(i));
    // Off: f32's tolerance of tests/cuda/cuda_ops_test.cpp.
    EXPECT_TRUE(allclose(f32[i], cpu[i], 1e-4, 1e-5)) << max_abs_diff(f32[i], cpu[i]);
    const std::vector<float> got = to_float_vector(tf32[i]), want = to_float_vector(cpu[i]);
    const std::vector<double>& lim = bound[i];
    ASSERT_EQ(got.size(), lim.size());
    int over = 0;
    for (size_t e = 0; e < got.size(); ++e)
      over += std::fabs(static_cast<double>(got[e]) - want[e]) <= lim[e] ? 0 : 1;
    EXPECT_EQ(over, 0) << "elements past the TF32 bound; max |diff| "
                       << max_abs_diff(tf32[i], cpu[i]);
    EXPECT_EQ(max_abs_diff(tf32[i], again[i]), 0.0) << "the same inputs, other bits";
  }
  // The GEMMs' outputs moved off the f32 GEMM's bits, each by more than f32 rounding could: the
  // inputs' low 13 fraction bits are not all zero. (Output 4, the bias gradient, is summed in
  // f32 where cuBLASLt's epilogue does not take it.)
  for (size_t i : {0, 1, 2, 3, 5, 6}) {
    SCOPED_TRACE("output " + std::to_string(i));
    EXPECT_GT(max_abs_diff(tf32[i], f32[i]), 1e-4);
  }

  // Off again: the f32 bits come back.
  set_cuda_tf32(false);
  const std::vector<Tensor> back = gemms(in, DType::F32, kGpu);
  for (size_t i = 0; i < back.size(); ++i) EXPECT_EQ(max_abs_diff(back[i], f32[i]), 0.0) << i;
}

// The precision itself, free of summation order: every input holds 10 fraction bits that TF32
// keeps and one (2^-12) that it drops, under rounding to nearest and under truncation alike (a
// quarter of TF32's step), so each product and every partial sum of the rounded inputs is exact
// in f32 and the TF32 GEMM must give 8 (1 + 2^-10)(1 + 2^-9) = 8 + 3 2^-7 + 2^-16 exactly. A GEMM
// keeping fewer fraction bits loses the 2^-10 or 2^-9; one keeping 12 or more keeps the 2^-12s.
// In f32 the exact sum S = 8 a b is not an f32 value (its last term is 2^-21, half an ulp at 8),
// and two f32 GEMMs (the linear's W^T is another layout, so another algorithm) may round it
// differently: the H100 gave the matmul and the linear one ulp apart. Whatever the order, FMA or
// accumulator width, an f32 GEMM of 8 products is within 8 half-ulps of the products (2^-24 each,
// |ab| < 2) plus 7 of the partial sums (2^-21 each, below 8) of S, under 2^-18; a TF32 GEMM is
// S - want > 2^-8 away, so both results are held to the f32 bound, not to each other's bits.
TEST_F(CudaTf32, KeepsTenFractionBitsOfEachInput) {
  const float a_val = 1.f + std::ldexp(1.f, -10) + std::ldexp(1.f, -12);
  const float b_val = 1.f + std::ldexp(1.f, -9) + std::ldexp(1.f, -12);
  const float want = 8.f + 3.f * std::ldexp(1.f, -7) + std::ldexp(1.f, -16);
  const Tensor a = full({4, 8}, a_val).to(kGpu), b = full({8, 4}, b_val).to(kGpu),
               w = full({4, 8}, b_val).to(kGpu), bias = full({4}, 0.5f).to(kGpu);
  for (const bool tf32 : {true, false}) {
    SCOPED_TRACE(tf32 ? "tf32" : "f32");
    set_cuda_tf32(tf32);
    const std::vector<float> mm = to_float_vector(matmul(a, b)),
                             lin = to_float_vector(linear(a, w, Tensor()).y),
                             biased = to_float_vector(linear(a, w, bias).y);
    ASSERT_EQ(mm.size(), 16u);
    ASSERT_EQ(lin.size(), 16u);
    ASSERT_EQ(biased.size(), 16u);
    for (size_t e = 0; e < 16; ++e) {
      if (tf32) {
        EXPECT_EQ(mm[e], want) << e;
        EXPECT_EQ(lin[e], want) << e;
        EXPECT_EQ(biased[e], want + 0.5f) << e;
      } else {
        const double exact = 8.0 * static_cast<double>(a_val) * static_cast<double>(b_val);
        EXPECT_GT(mm[e], want) << e << ": the f32 GEMM keeps the 2^-12s";
        EXPECT_LE(std::fabs(mm[e] - exact), std::ldexp(1.0, -18)) << e;
        EXPECT_LE(std::fabs(lin[e] - exact), std::ldexp(1.0, -18)) << e;
        EXPECT_LE(std::fabs(biased[e] - (exact + 0.5)), std::ldexp(1.0, -18) + std::ldexp(1.0, -21))
            << e << ": plus the bias add's rounding";
      }
    }
  }
}

TEST_F(CudaTf32, SixteenBitGemmsAreTheSameEitherWay) {
  const Inputs in = inputs();
  for (DType dt : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    set_cuda_tf32(false);
    const std::vector<Tensor> off = gemms(in, dt, kGpu);
    set_cuda_tf32(true);
    const std::vector<Tensor> on = gemms(in, dt, kGpu);
    for (size_t i = 0; i < off.size(); ++i) EXPECT_EQ(max_abs_diff(on[i], off[i]), 0.0) << i;
  }
}

// Note [cuBLASLt tuning]: an f32 problem run with TF32 is its own problem, with its own line in
// the tuning file (the key's last field), so neither takes the other's algorithm.
TEST_F(CudaTf32, TuningKeepsTf32ProblemsApartFromF32Ones) {
  strata::testing::ScratchDir tmp;
  const std::string file = tmp / "tuning.tsv";
  set_cuda_matmul_tuning(true, file);
  const Tensor a = rnd({32, 48}, 21).to(kGpu), b = rnd({48, 40}, 22).to(kGpu);
  const Tensor f32 = matmul(a, b);
  set_cuda_tf32(true);
  const Tensor tf32 = matmul(a, b);
  const Tensor tf32_again = matmul(a, b);  // the same problem: no third choice
  EXPECT_EQ(max_abs_diff(tf32, tf32_again), 0.0);
  const std::vector<CudaMatmulChoice> choices = cuda_matmul_choices();
  ASSERT_EQ(choices.size(), 2u);
  EXPECT_EQ(choices[0].problem.find("tf32"), std::string::npos) << choices[0].problem;
  EXPECT_NE(choices[1].problem.find("f32 (tf32) -> f32"), std::string::npos) << choices[1].problem;
  // The file: the v2 header, the origin, then the two problems, the key's last field saying which.
  std::ifstream f(file);
  std::vector<std::string> lines;
  for (std::string l; std::getline(f, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0], "# strata matmul tuning v2");
  for (size_t i : {2, 3}) {
    std::istringstream ls(lines[i]);
    std::vector<std::string> words;
    for (std::string w; ls >> w;) words.push_back(w);
    ASSERT_EQ(words.size(), 16u + 1 + 8 + 2) << lines[i];
    EXPECT_EQ(words[15], i == 2 ? "0" : "1") << lines[i];
  }
  // A later process reads both back and takes them.
  set_cuda_matmul_tuning(true, file);
  set_cuda_tf32(false);
  EXPECT_EQ(max_abs_diff(matmul(a, b), f32), 0.0);
  set_cuda_tf32(true);
  EXPECT_EQ(max_abs_diff(matmul(a, b), tf32), 0.0);
  for (const CudaMatmulChoice& c : cuda_matmul_choices()) EXPECT_TRUE(c.from_file) << c.problem;
}

// A tuning file of the v1 format (problems without the TF32 field) is set aside, not misread.
TEST_F(CudaTf32, AVersionOneTuningFileIsSetAside) {
  strata::testing::ScratchDir tmp;
  const std::string file = tmp / "tuning.tsv";
  const std::string v1 =
      "# strata matmul tuning v1\n# cublasLt 1 sm_90 Some GPU\n"
      "40 32 48 1 0 0 0 0 0 0 256 1 0 0 0 0 5353545241544c47 0000000000000100 "
      "0000000000000100 0000000000000100 0000000000000100 0000000000000000 0000000000000000 "
      "0000000000000000 0.010000 0.010000\n";
  strata::testing::write_text(file, v1);
  set_cuda_matmul_tuning(true, file);
  const Tensor a = rnd({32, 48}, 21).to(kGpu), b = rnd({48, 40}, 22).to(kGpu);
  const Tensor c = matmul(a, b);
  EXPECT_TRUE(allclose(c.to(kCpu), matmul(a.to(kCpu), b.to(kCpu)), 1e-4, 1e-5));
  ASSERT_TRUE(strata::testing::fs::exists(file + ".old"));
  std::ifstream old(file + ".old");
  const std::string kept((std::istreambuf_iterator<char>(old)), std::istreambuf_iterator<char>());
  EXPECT_EQ(kept, v1);
  std::ifstream fresh(file);
  std::string first;
  std::getline(fresh, first);
  EXPECT_EQ(first, "# strata matmul tuning v2");
  for (const CudaMatmulChoice& ch : cuda_matmul_choices()) EXPECT_FALSE(ch.from_file) << ch.problem;
}

}  // namespace
}  // namespace strata::tensor
