// The fused CUDA ops against the CPU backend (the reference) and against the unfused ops on the
// GPU: residual add + layernorm / rmsnorm (Note [CUDA fused residual norm]) on the packed and the
// scalar paths, and linear with cuBLASLt epilogues (Note [CUDA linear epilogues]) on the epilogue
// path and on the fallback kernels. Skips itself when no GPU is visible (CTest label `cuda`).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "tensor/cuda.h"
#include "tensor/cuda/kernels.h"
#include "tensor/ops.h"

#if defined(STRATA_CUDA_EMULATION)
#include "cuda_emu/control.h"
#endif

namespace strata::tensor {
namespace {

const Device kGpu = Device::cuda(0);
const Device kCpu = Device::cpu();

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible"

constexpr DType kDtypes[] = {DType::F32, DType::BF16, DType::F16};

// The tolerances of tests/cuda/cuda_ops_test.cpp: f32 kernels within rtol 1e-4 / atol 1e-5 of
// the CPU; a BF16/F16 output within one ulp of the output dtype (rel 2^-7, 2^-10) plus the
// rounding noise of a different summation order near 0.
struct Tol {
  double rtol, atol;
};
Tol tol(DType dt) {
  return dt == DType::BF16  ? Tol{1.0 / 128, 1e-3}
         : dt == DType::F16 ? Tol{1.0 / 1024, 1e-4}
                            : Tol{1e-4, 1e-5};
}

// A compute-dtype copy of an f32 CPU tensor on device d.
Tensor on(const Tensor& t, DType dt, Device d) {
  return t.to(dt).to(d);
}

Tensor rnd(const Shape& s, uint64_t stream, float lo = -2.f, float hi = 2.f) {
  return uniform(s, {77, stream}, lo, hi);
}

// The same values at an address 2 elements past a 16-byte boundary: the kernels' scalar path.
Tensor unaligned(const Tensor& t) {
  Tensor flat = t.reshape({t.numel()});
  Tensor buf = concat({flat.narrow(0, 0, 2), flat}, 0);
  return buf.narrow(0, 2, t.numel()).view(t.shape());
}

::testing::AssertionResult close(const Tensor& got, const Tensor& want, Tol t) {
  if (!(got.shape() == want.shape())) return ::testing::AssertionFailure() << "shapes differ";
  if (got.dtype() != want.dtype()) return ::testing::AssertionFailure() << "dtypes differ";
  const Tensor g = got.to(kCpu).to(DType::F32), w = want.to(kCpu).to(DType::F32);
  if (allclose(g, w, t.rtol, t.atol)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max |diff| " << max_abs_diff(g, w);
}

// dsum = ds + round(dx) compared where ds and dx may cancel: a one-ulp difference of dx between
// two kernels is allowed at dx's magnitude, |dx| <= |dsum| + |ds|.
::testing::AssertionResult close_sum(const Tensor& got, const Tensor& want, const Tensor& ds,
                                     Tol t) {
  if (!ds.defined()) return close(got, want, t);
  if (!(got.shape() == want.shape())) return ::testing::AssertionFailure() << "shapes differ";
  const std::vector<float> g = to_float_vector(got.to(kCpu)), w = to_float_vector(want.to(kCpu)),
                           d = to_float_vector(ds.to(kCpu));
  for (size_t i = 0; i < g.size(); ++i) {
    const double bound = t.rtol * (std::fabs(w[i]) + std::fabs(d[i])) + t.atol;
    if (!(std::fabs(static_cast<double>(g[i]) - w[i]) <= bound))
      return ::testing::AssertionFailure()
             << "element " << i << ": " << g[i] << " vs " << w[i] << " (ds " << d[i] << ")";
  }
  return ::testing::AssertionSuccess();
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return max_abs_diff(a.to(kCpu).to(DType::F32), b.to(kCpu).to(DType::F32)) == 0.0;
}

// ---- residual add + norm ----

struct NormCase {
  int64_t rows, c;
  bool misalign;  // operands 2 elements off a 16-byte boundary
};
// c = 96: 128-bit packs in every dtype; c = 17: the scalar path; c = 2048: 256 or 512 threads;
// c = 1600 (GPT-2 1558M): 200 bf16 packs on 7 warps, so blocks that are not a power of two;
// c = 2500 unaligned: 2500 single elements on 864 threads, three passes, the last one partial.
const NormCase kNormCases[] = {{37, 96, false},  {37, 96, true},   {5, 17, false},
                               {3, 2048, false}, {2, 1600, false}, {2, 2500, true}};

TEST(CudaFusedNorm, AddLayerNormMatchesTheCpuAndTheUnfusedGpuOps) {
  SKIP_WITHOUT_GPU();
  for (DType dt : kDtypes)
    for (const NormCase& nc : kNormCases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " c=" + std::to_string(nc.c) +
                   (nc.misalign ? " unaligned" : ""));
      const Shape s{nc.rows, nc.c};
      const Tensor x = rnd(s, 1, 1.f, 3.f), r = rnd(s, 2), w = rnd({nc.c}, 3), b = rnd({nc.c}, 4),
                   dy = rnd(s, 5), ds = rnd(s, 6);
      auto dev = [&](const Tensor& t) {
        Tensor g = on(t, dt, kGpu);
        return nc.misalign ? unaligned(g) : g;
      };
      const Tol t = tol(dt);
      AddNormResult cpu =
          add_layernorm(on(x, dt, kCpu), on(r, dt, kCpu), on(w, dt, kCpu), on(b, dt, kCpu), 1e-5f);
      AddNormResult gpu = add_layernorm(dev(x), dev(r), dev(w), dev(b), 1e-5f);
      EXPECT_TRUE(close(gpu.s, cpu.s, Tol{0, 0})) << "s = x + r rounds once, exactly";
      EXPECT_TRUE(close(gpu.y, cpu.y, t));
      EXPECT_TRUE(close(gpu.mean, cpu.mean, tol(DType::F32)));
      EXPECT_TRUE(close(gpu.rstd, cpu.rstd, tol(DType::F32)));
      // Backward from the CPU's forward outputs on both devices: the same inputs.
      for (bool with_ds : {true, false}) {
        SCOPED_TRACE(with_ds ? "with ds" : "without ds");
        const Tensor dsc = with_ds ? on(ds, dt, kCpu) : Tensor();
        const Tensor dsg = with_ds ? dev(ds) : Tensor();
        LayerNormGrads gc = add_layernorm_backward(on(dy, dt, kCpu), dsc, cpu.s, on(w, dt, kCpu),
                                                   cpu.mean, cpu.rstd);
        LayerNormGrads gg = add_layernorm_backward(dev(dy), dsg, cpu.s.to(kGpu), dev(w),
                                                   cpu.mean.to(kGpu), cpu.rstd.to(kGpu));
        EXPECT_TRUE(close_sum(gg.dx, gc.dx, dsc, t));
        EXPECT_TRUE(close(gg.dweight, gc.dweight, t));
        EXPECT_TRUE(close(gg.dbias, gc.dbias, t));
        // The unfused ops on the GPU: layernorm_backward's dx, then the engine's ds + dx.
        LayerNormGrads u = layernorm_backward(dev(dy), cpu.s.to(kGpu), dev(w), cpu.mean.to(kGpu),
                                              cpu.rstd.to(kGpu));
        EXPECT_TRUE(close_sum(gg.dx, with_ds ? add(dsg, u.dx) : u.dx, dsc, t));
        EXPECT_TRUE(close(gg.dweight, u.dweight, t));
        EXPECT_TRUE(close(gg.dbias, u.dbias, t));
      }
      NormResult u = layernorm(add(dev(x), dev(r)), dev(w), dev(b), 1e-5f);
      EXPECT_TRUE(close(gpu.y, u.y, t));
    }
}

TEST(CudaFusedNorm, AddRmsNormMatchesTheCpuAndTheUnfusedGpuOps) {
  SKIP_WITHOUT_GPU();
  for (DType dt : kDtypes)
    for (const NormCase& nc : kNormCases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " c=" + std::to_string(nc.c) +
                   (nc.misalign ? " unaligned" : ""));
      const Shape s{nc.rows, nc.c};
      const Tensor x = rnd(s, 11), r = rnd(s, 12), w = rnd({nc.c}, 13), dy = rnd(s, 15),
                   ds = rnd(s, 16);
      auto dev = [&](const Tensor& t) {
        Tensor g = on(t, dt, kGpu);
        return nc.misalign ? unaligned(g) : g;
      };
      const Tol t = tol(dt);
      AddNormResult cpu = add_rmsnorm(on(x, dt, kCpu), on(r, dt, kCpu), on(w, dt, kCpu), 1e-6f);
      AddNormResult gpu = add_rmsnorm(dev(x), dev(r), dev(w), 1e-6f);
      EXPECT_TRUE(close(gpu.s, cpu.s, Tol{0, 0}));
      EXPECT_TRUE(close(gpu.y, cpu.y, t));
      EXPECT_TRUE(close(gpu.rstd, cpu.rstd, tol(DType::F32)));
      RmsNormGrads gc = add_rmsnorm_backward(on(dy, dt, kCpu), on(ds, dt, kCpu), cpu.s,
                                             on(w, dt, kCpu), cpu.rstd);
      RmsNormGrads gg =
          add_rmsnorm_backward(dev(dy), dev(ds), cpu.s.to(kGpu), dev(w), cpu.rstd.to(kGpu));
      EXPECT_TRUE(close_sum(gg.dx, gc.dx, on(ds, dt, kCpu), t));
      EXPECT_TRUE(close(gg.dweight, gc.dweight, t));
      RmsNormGrads u = rmsnorm_backward(dev(dy), cpu.s.to(kGpu), dev(w), cpu.rstd.to(kGpu));
      EXPECT_TRUE(close_sum(gg.dx, add(dev(ds), u.dx), on(ds, dt, kCpu), t));
      EXPECT_TRUE(close(gpu.y, rmsnorm(add(dev(x), dev(r)), dev(w), 1e-6f).y, t));
    }
}

TEST(CudaFusedNorm, SameInputsGiveTheSameBits) {
  SKIP_WITHOUT_GPU();
  for (DType dt : kDtypes) {
    const Tensor x = on(rnd({64, 96}, 21), dt, kGpu), r = on(rnd({64, 96}, 22), dt, kGpu),
                 w = on(rnd({96}, 23), dt, kGpu), b = on(rnd({96}, 24), dt, kGpu),
                 dy = on(rnd({64, 96}, 25), dt, kGpu);
    auto run = [&] {
      AddNormResult f = add_layernorm(x, r, w, b, 1e-5f);
      LayerNormGrads g = add_layernorm_backward(dy, x, f.s, w, f.mean, f.rstd);
      return std::vector<Tensor>{f.s, f.y, g.dx, g.dweight, g.dbias};
    };
    std::vector<Tensor> a = run(), c = run();
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bits(a[i], c[i])) << i;
  }
}

// ---- linear with epilogues ----

// Forces the fallback kernels (Note [CUDA linear epilogues]) for a scope.
struct EpiloguesOff {
  EpiloguesOff() { ::setenv("STRATA_LINEAR_EPILOGUE", "off", 1); }
  ~EpiloguesOff() { ::unsetenv("STRATA_LINEAR_EPILOGUE"); }
};

struct LinearCase {
  int64_t m, k, n, p;  // x [m, k], w [n, k]; backward: dz [m, p], w2 [p, n]
};
// n = 96: the GELU AUX leading dimension is a multiple of 8 (every epilogue runs); n = 20: it is
// not, so the GELU epilogues with AUX fall back while BIAS and BGRADB still run.
const LinearCase kLinearCases[] = {{37, 64, 96, 48}, {5, 24, 20, 16}};

// Every output of linear and its backward pieces for inputs in dt on device d.
std::vector<Tensor> linear_outputs(const LinearCase& lc, DType dt, Device d) {
  // Small weights keep the GELU inputs where GELU bends (|x| < 3), where tanh and erf GELU differ.
  const Tensor x = on(rnd({lc.m, lc.k}, 31), dt, d),
               w = on(rnd({lc.n, lc.k}, 32, -0.3f, 0.3f), dt, d), b = on(rnd({lc.n}, 33), dt, d),
               dy = on(rnd({lc.m, lc.n}, 34), dt, d), dz = on(rnd({lc.m, lc.p}, 35), dt, d),
               w2 = on(rnd({lc.p, lc.n}, 36), dt, d),
               pre = on(rnd({lc.m, lc.n}, 37, -3.f, 3.f), dt, d);
  LinearResult g = linear(x, w, b, Activation::Gelu, true);
  LinearWeightGrads wg = linear_backward_weight(dy, x, true);
  LinearGeluGrads gg = linear_backward_gelu(dz, w2, pre, true);
  // Note [Weight gradients into their buffer]: added to an old value (beta = 1, C = D).
  Tensor into = on(rnd({lc.n, lc.k}, 38), dt, d);
  const Tensor into_db = linear_backward_weight_into(dy, x, into, true);
  Tensor into_nb = on(rnd({lc.n, lc.k}, 39), dt, d);
  linear_backward_weight_into(dy, x, into_nb, false);
  return {into,
          into_db,
          into_nb,
          g.y,
          g.pre,
          linear(x, w, b, Activation::Gelu).y,  // GELU_BIAS: no AUX
          linear(x, w, b).y,                    // BIAS
          linear(x, w, Tensor(), Activation::Gelu, true).y,
          wg.dweight,
          wg.dbias,
          gg.dpre,
          gg.dbias,
          linear_backward_gelu(dz, w2, pre, false).dpre};  // DGELU
}

TEST(CudaLinear, EpiloguesAndFallbackMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (DType dt : kDtypes)
    for (const LinearCase& lc : kLinearCases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " n=" + std::to_string(lc.n));
      const std::vector<Tensor> want = linear_outputs(lc, dt, kCpu);
      const std::vector<Tensor> got = linear_outputs(lc, dt, kGpu);
      std::vector<Tensor> fallback;
      {
        EpiloguesOff off;
        fallback = linear_outputs(lc, dt, kGpu);
      }
      for (size_t i = 0; i < want.size(); ++i) {
        SCOPED_TRACE("output " + std::to_string(i));
        EXPECT_TRUE(close(got[i], want[i], tol(dt)));
        EXPECT_TRUE(close(fallback[i], want[i], tol(dt)));
        EXPECT_TRUE(close(got[i], fallback[i], tol(dt)));
      }
    }
}

// The epilogues against the unfused GPU ops (matmul, bias_add, gelu, unary_backward, sum_to): f32,
// where both round only once.
TEST(CudaLinear, EpiloguesMatchTheUnfusedGpuOpsInF32) {
  SKIP_WITHOUT_GPU();
  const LinearCase lc = kLinearCases[0];
  const Tensor x = rnd({lc.m, lc.k}, 41).to(kGpu), w = rnd({lc.n, lc.k}, 42, -0.3f, 0.3f).to(kGpu),
               b = rnd({lc.n}, 43).to(kGpu), dy = rnd({lc.m, lc.n}, 44).to(kGpu),
               dz = rnd({lc.m, lc.p}, 45).to(kGpu), w2 = rnd({lc.p, lc.n}, 46).to(kGpu);
  const Tol t = tol(DType::F32);
  const Tensor pre = bias_add(matmul(x, w, false, true), b);
  LinearResult f = linear(x, w, b, Activation::Gelu, true);
  EXPECT_TRUE(close(f.pre, pre, t));
  EXPECT_TRUE(close(f.y, gelu(pre), t));
  LinearWeightGrads g = linear_backward_weight(dy, x, true);
  EXPECT_TRUE(close(g.dweight, matmul(dy, x, true, false), t));
  EXPECT_TRUE(close(g.dbias, sum_to(dy, {lc.n}), t));
  LinearGeluGrads d = linear_backward_gelu(dz, w2, f.pre, true);
  const Tensor dpre = unary_backward(UnaryOp::Gelu, f.pre, matmul(dz, w2));
  EXPECT_TRUE(close(d.dpre, dpre, t));
  EXPECT_TRUE(close(d.dbias, sum_to(dpre, {lc.n}), t));
}

TEST(CudaLinear, SameInputsGiveTheSameBits) {
  SKIP_WITHOUT_GPU();
  for (DType dt : kDtypes)
    for (bool off : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (off ? " fallback" : " epilogues"));
      if (off) ::setenv("STRATA_LINEAR_EPILOGUE", "off", 1);
      const std::vector<Tensor> a = linear_outputs(kLinearCases[0], dt, kGpu),
                                c = linear_outputs(kLinearCases[0], dt, kGpu);
      ::unsetenv("STRATA_LINEAR_EPILOGUE");
      for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bits(a[i], c[i])) << i;
    }
}

// Note [CUDA element groups]: the fallback kernels read and write 128-bit words when the row
// length and every pointer allow, one element at a time otherwise, combining the elements in the
// same order: a bias, a GELU input or an output gradient 2 elements off a 16-byte boundary gives
// the same bits as the aligned one.
TEST(CudaLinear, FallbackKernelsGiveTheSameBitsPackedOrNot) {
  SKIP_WITHOUT_GPU();
  EpiloguesOff off;
  const LinearCase lc = kLinearCases[0];  // n = 96: whole 128-bit words in every dtype
  for (DType dt : kDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = on(rnd({lc.m, lc.k}, 51), dt, kGpu),
                 w = on(rnd({lc.n, lc.k}, 52, -0.3f, 0.3f), dt, kGpu),
                 b = on(rnd({lc.n}, 53), dt, kGpu), dy = on(rnd({lc.m, lc.n}, 54), dt, kGpu),
                 dz = on(rnd({lc.m, lc.p}, 55), dt, kGpu), w2 = on(rnd({lc.p, lc.n}, 56), dt, kGpu),
                 pre = on(rnd({lc.m, lc.n}, 57, -3.f, 3.f), dt, kGpu);
    const LinearResult ya = linear(x, w, b, Activation::Gelu, true),
                       yu = linear(x, w, unaligned(b), Activation::Gelu, true);
    EXPECT_TRUE(same_bits(ya.y, yu.y));
    EXPECT_TRUE(same_bits(ya.pre, yu.pre));
    const LinearGeluGrads ga = linear_backward_gelu(dz, w2, pre, true),
                          gu = linear_backward_gelu(dz, w2, unaligned(pre), true);
    EXPECT_TRUE(same_bits(ga.dpre, gu.dpre));
    EXPECT_TRUE(same_bits(ga.dbias, gu.dbias));
    EXPECT_TRUE(same_bits(linear_backward_weight(dy, x, true).dbias,
                          linear_backward_weight(unaligned(dy), x, true).dbias));
  }
}

// Note [Linear GELU gradient kernel]: the one-pass kernel gives the bits of the GELU-gradient
// kernel followed by the column sums over its f32 output, in every dtype, on whole 128-bit
// groups (cols 96) and on single elements (cols 37, an unaligned pre), over row counts that end
// inside a chunk of rows and that span several.
TEST(CudaLinear, GeluGradientKernelGivesTheTwoKernelsBits) {
  SKIP_WITHOUT_GPU();
  const auto stream = static_cast<cuda::Stream>(cuda_current_stream());
  const int64_t chunk = cuda::kNormRowChunk;
  for (DType dt : kDtypes)
    for (const auto& [rows, cols, misalign] :
         {std::tuple<int64_t, int64_t, bool>{3 * chunk + 5, 96, false}, {chunk - 1, 37, true}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " rows=" + std::to_string(rows) +
                   " cols=" + std::to_string(cols));
      const Tensor dh = rnd({rows, cols}, 61, -8.f, 8.f).to(kGpu);
      Tensor pre = on(rnd({rows, cols}, 62, -3.f, 3.f), dt, kGpu);
      if (misalign) pre = unaligned(pre);
      const int d = static_cast<int>(dt);
      const int64_t chunks = (rows + chunk - 1) / chunk;
      Tensor scratch = zeros({chunks * cols}, DType::F32, kGpu);
      const Tensor dh_before = dh.clone();
      Tensor dpre1 = zeros({rows, cols}, dt, kGpu), db1 = zeros({cols}, dt, kGpu);
      ASSERT_TRUE(cuda::launch_gelu_backward_bias(d, dh.data<float>(), pre.data_ptr(),
                                                  dpre1.data_ptr(), db1.data_ptr(),
                                                  scratch.data<float>(), rows, cols, stream));
      Tensor dh2 = dh.clone(), dpre2 = zeros({rows, cols}, dt, kGpu), db2 = zeros({cols}, dt, kGpu);
      ASSERT_TRUE(cuda::launch_gelu_backward_f32(d, dh2.data<float>(), pre.data_ptr(),
                                                 dpre2.data_ptr(), rows, cols, stream));
      ASSERT_TRUE(cuda::launch_column_sums(static_cast<int>(DType::F32), dh2.data_ptr(), d,
                                           db2.data_ptr(), scratch.data<float>(), rows, cols,
                                           stream));
      EXPECT_TRUE(same_bits(dpre1, dpre2));
      EXPECT_TRUE(same_bits(db1, db2));
      EXPECT_TRUE(same_bits(dh, dh_before)) << "dh is left as it was";
    }
}

// STRATA_LINEAR_DGELU picks linear_backward_gelu's path (Note [CUDA linear epilogues]): by
// default a plain GEMM and the one-pass kernel, whose results are the fallback's bits (the same
// operations); `epilogue` runs cuBLASLt's DGELU_BGRAD in bf16/f16 (on the emulator: no
// GELU-gradient kernel launched) and changes nothing in f32; any other value is a UserError
// naming the variable.
TEST(CudaLinear, TheGeluGradientPathIsChosenByStrataLinearDgelu) {
  SKIP_WITHOUT_GPU();
  const LinearCase lc = kLinearCases[0];  // n = 96: the epilogue can run
  const Tensor dz = on(rnd({lc.m, lc.p}, 71), DType::BF16, kGpu),
               w2 = on(rnd({lc.p, lc.n}, 72), DType::BF16, kGpu),
               pre = on(rnd({lc.m, lc.n}, 73, -3.f, 3.f), DType::BF16, kGpu);
  auto kernel_launches = [&](const char* setting) {
    if (setting)
      ::setenv("STRATA_LINEAR_DGELU", setting, 1);
    else
      ::unsetenv("STRATA_LINEAR_DGELU");
#if defined(STRATA_CUDA_EMULATION)
    cuda_emu::reset_launch_sites();
#endif
    LinearGeluGrads g = linear_backward_gelu(dz, w2, pre, true);
    ::unsetenv("STRATA_LINEAR_DGELU");
    uint64_t n = 0;
#if defined(STRATA_CUDA_EMULATION)
    for (const cuda_emu::LaunchSite& site : cuda_emu::launch_sites())
      if (site.kernel.find("gelu_backward") != std::string::npos) n += site.launches;
#endif
    return std::make_pair(n, g);
  };
  [[maybe_unused]] const auto [n_default, by_default] = kernel_launches(nullptr);
  [[maybe_unused]] const auto [n_kernels, kernels] = kernel_launches("kernels");
  [[maybe_unused]] const auto [n_epilogue, epilogue] = kernel_launches("epilogue");
  LinearGeluGrads fallback;
  {
    EpiloguesOff off;
    fallback = linear_backward_gelu(dz, w2, pre, true);
  }
  EXPECT_TRUE(same_bits(by_default.dpre, fallback.dpre));
  EXPECT_TRUE(same_bits(by_default.dbias, fallback.dbias));
  EXPECT_TRUE(same_bits(kernels.dpre, fallback.dpre));
  EXPECT_TRUE(same_bits(kernels.dbias, fallback.dbias));
#if defined(STRATA_CUDA_EMULATION)
  EXPECT_EQ(n_default, 1u);
  EXPECT_EQ(n_kernels, 1u);
  EXPECT_EQ(n_epilogue, 0u) << "DGELU_BGRAD ran as a kernel of Strata's";
#endif
  EXPECT_EQ(epilogue.dpre.shape(), fallback.dpre.shape());
  // f32 never takes the epilogue: run.tf32 off means f32 everywhere.
  ::setenv("STRATA_LINEAR_DGELU", "epilogue", 1);
  const Tensor dz32 = dz.to(DType::F32), w32 = w2.to(DType::F32), pre32 = pre.to(DType::F32);
  const LinearGeluGrads f32 = linear_backward_gelu(dz32, w32, pre32, true);
  ::unsetenv("STRATA_LINEAR_DGELU");
  const LinearGeluGrads f32_kernels = linear_backward_gelu(dz32, w32, pre32, true);
  EXPECT_TRUE(same_bits(f32.dpre, f32_kernels.dpre));
  EXPECT_TRUE(same_bits(f32.dbias, f32_kernels.dbias));
  ::setenv("STRATA_LINEAR_DGELU", "fused", 1);
  try {
    linear_backward_gelu(dz, w2, pre, true);
    ADD_FAILURE() << "STRATA_LINEAR_DGELU=fused was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("STRATA_LINEAR_DGELU"), std::string::npos) << e.what();
  }
  ::unsetenv("STRATA_LINEAR_DGELU");
}

}  // namespace
}  // namespace strata::tensor
