// CUDA backend vs the CPU backend (the reference): every op, forward and backward, on the same
// inputs (the op table's CUDA samples), and the kernels' paths one by one. Skips itself when no GPU
// is visible (CTest label `cuda`); the no-GPU error path is checked everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "tensor/backend.h"
#include "tensor/cuda.h"
#include "tensor/cuda/kernels.h"
#include "tensor/ops.h"
#include "tests/support/norm_into_check.h"
#include "tests/support/op_table.h"

#if defined(STRATA_CUDA_EMULATION)
#include "cuda_emu/control.h"
#endif

namespace strata::tensor {
namespace {

const Device kGpu = Device::cuda(0);

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible"

Tensor rnd(const Shape& s, uint64_t stream, float lo = -2.f, float hi = 2.f) {
  return uniform(s, {42, stream}, lo, hi);
}

// The tolerance of a BF16/F16 output against the CPU backend's BF16/F16 output on the same
// inputs: both round the f32 result once, so they differ by at most one ulp of the output dtype
// (rel 2^-7 for bf16, 2^-10 for f16) plus the f32 rounding noise of a different summation order,
// which only shows near 0 (atol).
struct Tol {
  double rtol, atol;
};
Tol lowp_tol(DType dt) {
  return dt == DType::BF16 ? Tol{1.0 / 128, 1e-3} : Tol{1.0 / 1024, 1e-4};
}

std::string dtype_tag(DType dt) {
  return dt == DType::F32 ? "f32" : dt == DType::BF16 ? "bf16" : "f16";
}

constexpr DType kDtypes[] = {DType::F32, DType::BF16, DType::F16};

// These tests hold Strata's own kernels to the CPU at one rounding of tolerance. cuDNN's flash
// attention (taken for bf16/f16 by default) rounds intermediate values to the compute dtype, so
// it is tested on its own, with its own tolerance, in cudnn_attention_test.cpp.
struct OwnAttentionKernel {
  OwnAttentionKernel() { ::setenv("STRATA_ATTENTION", "own", 1); }
  ~OwnAttentionKernel() { ::unsetenv("STRATA_ATTENTION"); }
};

// Every op: the CUDA samples of the op table (tests/support/op_table.h), one test per entry,
// e.g. OpTable/CudaOps.AgreeWithTheCpuBackend/matmul.
using strata::testing::DeviceSample;
using strata::testing::OpInfo;

class CudaOps : public ::testing::TestWithParam<OpInfo> {};

TEST_P(CudaOps, AgreeWithTheCpuBackend) {
  SKIP_WITHOUT_GPU();
  OwnAttentionKernel own;
  for (DType dt : kDtypes) {
    if (!GetParam().supports(dt)) continue;
    for (const DeviceSample& c : GetParam().cuda(dt)) {
      SCOPED_TRACE(c.name + " " + dtype_tag(dt));
      std::vector<Tensor> want = c.run(Device::cpu());
      std::vector<Tensor> got = c.run(kGpu);
      ASSERT_EQ(want.size(), got.size());
      double rtol = c.rtol, atol = c.atol;
      if (dt != DType::F32) {
        const Tol t = lowp_tol(dt);
        rtol = c.exact_lowp ? 0.0 : t.rtol;
        atol = c.exact_lowp ? 0.0 : t.atol;
      }
      for (size_t i = 0; i < want.size(); ++i) {
        SCOPED_TRACE("output " + std::to_string(i));
        EXPECT_EQ(got[i].device(), kGpu);
        EXPECT_EQ(got[i].dtype(), want[i].dtype());
        Tensor g = got[i].to(Device::cpu()).to(DType::F32), w = want[i].to(DType::F32);
        EXPECT_TRUE(allclose(g, w, rtol, atol)) << "max |diff| " << max_abs_diff(g, w);
      }
    }
  }
}

TEST_P(CudaOps, SameInputsGiveTheSameBits) {
  SKIP_WITHOUT_GPU();
  OwnAttentionKernel own;
  for (DType dt : kDtypes) {
    if (!GetParam().supports(dt)) continue;
    for (const DeviceSample& c : GetParam().cuda(dt)) {
      SCOPED_TRACE(c.name + " " + dtype_tag(dt));
      std::vector<Tensor> r1 = c.run(kGpu), r2 = c.run(kGpu);
      for (size_t i = 0; i < r1.size(); ++i) EXPECT_EQ(max_abs_diff(r1[i], r2[i]), 0.0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(OpTable, CudaOps,
                         ::testing::ValuesIn(strata::testing::op_entries([](const OpInfo& e) {
                           return static_cast<bool>(e.cuda);
                         })),
                         [](const ::testing::TestParamInfo<OpInfo>& info) {
                           return info.param.name;
                         });

// Contiguous elementwise kernels move 8 bf16/f16 (4 f32) per load when every pointer is 16-byte
// aligned and fall back to one element per thread otherwise: both paths and the tail must agree.
TEST(CudaOps, PackedAndScalarPathsAgree) {
  SKIP_WITHOUT_GPU();
  for (DType dt : kDtypes) {
    SCOPED_TRACE(dtype_tag(dt));
    const Tensor x = rnd({1003}, 30).to(dt), y = rnd({1003}, 31).to(dt);
    // The same values one element into a GPU buffer: a view that is not 16-byte aligned.
    auto unaligned = [](const Tensor& t) {
      return concat({t.narrow(0, 0, 1), t}, 0).to(kGpu).narrow(0, 1, t.numel());
    };
    const Tensor xa = x.to(kGpu), ya = y.to(kGpu), xg = unaligned(x), yg = unaligned(y);
    auto same = [](const Tensor& p, const Tensor& q) {
      return max_abs_diff(p.to(Device::cpu()).to(DType::F32), q.to(Device::cpu()).to(DType::F32));
    };
    EXPECT_EQ(same(mul(xa, ya), mul(xg, yg)), 0.0);
    EXPECT_EQ(same(gelu(xa), gelu(xg)), 0.0);
    EXPECT_EQ(same(unary_backward(UnaryOp::Tanh, xa, ya), unary_backward(UnaryOp::Tanh, xg, yg)),
              0.0);
    Tensor acc_a = ya.clone(), acc_u = unaligned(y);
    axpy_(0.25f, xa, acc_a);
    axpy_(0.25f, xg, acc_u);
    EXPECT_EQ(same(acc_a, acc_u), 0.0);
    EXPECT_EQ(same(bias_add(xa.reshape({17, 59}), ya.narrow(0, 0, 59)),
                   bias_add(xg.reshape({17, 59}), yg.narrow(0, 0, 59))),
              0.0);
  }
}

// The same values one element into a GPU buffer, in t's shape: every stride as in a contiguous
// tensor, but the start (and so every row) not 16-byte aligned.
Tensor shifted_on_gpu(const Tensor& t) {
  const Tensor flat = t.reshape({t.numel()});
  Tensor v =
      concat({flat.narrow(0, 0, 1), flat}, 0).to(kGpu).narrow(0, 1, t.numel()).view(t.shape());
  EXPECT_NE(reinterpret_cast<uintptr_t>(v.data_ptr()) % 16, 0u);
  return v;
}

// The row kernels that read 128-bit packs when every row is aligned (softmax, Note [CUDA softmax];
// the embedding's 16-byte row copies) must take their one-element paths for rows that are not:
// on the GPU a pack load from such a row stops the kernel ("misaligned address"), and so does the
// emulator's alignment check (STRATA_EMULATED_CUDA_OPTIONS). The embedding copies bits; softmax
// splits a row among its threads differently in the two paths, so it agrees within tolerance.
TEST(CudaOps, UnalignedRowsTakeTheOneElementPaths) {
  SKIP_WITHOUT_GPU();
  for (DType dt : kDtypes) {
    SCOPED_TRACE(dtype_tag(dt));
    const Tensor x = rnd({37, 96}, 60).to(dt), dy = rnd({37, 96}, 61).to(dt);
    const Tensor y = softmax(x.to(kGpu));
    const Tensor y_u = softmax(shifted_on_gpu(x));
    // Softmax values and their gradients here are below 1 in size: rtol bounds them absolutely.
    const Tol tol = dt == DType::F32 ? Tol{1e-6, 1e-7} : lowp_tol(dt);
    EXPECT_LE(
        max_abs_diff(y.to(Device::cpu()).to(DType::F32), y_u.to(Device::cpu()).to(DType::F32)),
        tol.atol + tol.rtol);
    const Tensor dx = softmax_backward(y, dy.to(kGpu));
    const Tensor dx_u = softmax_backward(shifted_on_gpu(y.to(Device::cpu())), shifted_on_gpu(dy));
    EXPECT_LE(
        max_abs_diff(dx.to(Device::cpu()).to(DType::F32), dx_u.to(Device::cpu()).to(DType::F32)),
        tol.atol + tol.rtol);

    // Rows of 24 f32 (96 bytes) or 32 bf16/f16 (64 bytes): whole 16-byte words when aligned.
    const Tensor w = rnd({50, dt == DType::F32 ? 24 : 32}, 62).to(dt);
    const Tensor ids = from_ints({3, 7, 3, 49, 0}, {5}, DType::I32).to(kGpu);
    EXPECT_EQ(max_abs_diff(embedding(w.to(kGpu), ids).to(Device::cpu()).to(DType::F32),
                           embedding(shifted_on_gpu(w), ids).to(Device::cpu()).to(DType::F32)),
              0.0);
  }
}

// Note [CUDA element groups]: the kernels that give each thread K consecutive elements (or
// columns) read and write them as 128-bit words when every pointer is 16-byte aligned, and one
// element at a time otherwise, each combining them in the same order: the same values one element
// into a buffer (shifted_on_gpu) must give the same bits. Sizes leave a group cut short at the end,
// and the row counts several row chunks and a partial last one.
TEST(CudaOps, GroupedKernelsGiveTheSameBitsPackedOrNot) {
  SKIP_WITHOUT_GPU();
  auto bits_equal = [](const Tensor& p, const Tensor& q) {
    const Tensor a = p.to(Device::cpu()), b = q.to(Device::cpu());
    return a.dtype() == b.dtype() && a.shape() == b.shape() &&
           std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.nbytes()) == 0;
  };
  for (DType dt : kDtypes) {
    SCOPED_TRACE(dtype_tag(dt));
    const Tensor x = rnd({1003}, 70).to(dt);
    const Tensor xa = x.to(kGpu), xu = shifted_on_gpu(x);
    EXPECT_EQ(sum_squares(xa), sum_squares(xu));  // f64 sums of the same terms in the same order
    // Gradient clipping's in-place scale, and the pass-through when g equals expected.
    const Tensor g = from_vector({0.375f}, {1}).to(kGpu);
    Tensor sa = xa.clone(), su = shifted_on_gpu(x);
    scale_unless_equal_(sa, g, 1.5f);
    scale_unless_equal_(su, g, 1.5f);
    EXPECT_TRUE(bits_equal(sa, su));
    EXPECT_FALSE(bits_equal(sa, xa));
    scale_unless_equal_(sa, g, 0.375f);
    EXPECT_TRUE(bits_equal(sa, su));
    // Contiguous casts into every float dtype.
    for (DType to : kDtypes) {
      SCOPED_TRACE(std::string("to ") + dtype_tag(to));
      EXPECT_TRUE(bits_equal(xa.to(to), xu.to(to)));
    }
    EXPECT_TRUE(bits_equal(dropout(xa, 0.3f, {9, 1}), dropout(xu, 0.3f, {9, 1})));
    {  // random draws: each element's value depends on its index alone
      Tensor na = Tensor::empty({1003}, dt, kGpu), nu = shifted_on_gpu(zeros({1003}, dt));
      Tensor ua = Tensor::empty({1003}, dt, kGpu), uu = shifted_on_gpu(zeros({1003}, dt));
      backend_for(kGpu).random_normal(na, {7, 8}, 0.5f, 2.f);
      backend_for(kGpu).random_normal(nu, {7, 8}, 0.5f, 2.f);
      backend_for(kGpu).random_uniform(ua, {7, 9}, -1.f, 3.f);
      backend_for(kGpu).random_uniform(uu, {7, 9}, -1.f, 3.f);
      EXPECT_TRUE(bits_equal(na, nu));
      EXPECT_TRUE(bits_equal(ua, uu));
    }
    {  // rotary of [B, T, H, D] = [2, 5, 3, 16]: 8 pairs a row, whole groups in every dtype
      const Tensor rx = rnd({2, 5, 3, 16}, 77).to(dt);
      auto [cs, sn] = rotary_tables(5, 16, 10000.0, 0, kGpu);
      for (bool inverse : {false, true})
        EXPECT_TRUE(bits_equal(rotary(rx.to(kGpu), cs, sn, inverse),
                               rotary(shifted_on_gpu(rx), cs, sn, inverse)));
    }
    // Gradient accumulation: x of dtype dt added into a y of every float dtype.
    for (DType to : kDtypes) {
      SCOPED_TRACE(std::string("axpy into ") + dtype_tag(to));
      const Tensor y = rnd({1003}, 76).to(to);
      Tensor ya = y.to(kGpu), yu = shifted_on_gpu(y);
      axpy_(-0.75f, xa, ya);
      axpy_(-0.75f, xu, yu);
      EXPECT_TRUE(bits_equal(ya, yu));
    }

    // Column kernels: 300 rows (two whole chunks of 128 and a partial one), 96 columns.
    const Tensor dy = rnd({300, 96}, 71).to(dt), xr = rnd({300, 96}, 72).to(dt);
    const Tensor w = rnd({96}, 73).to(dt);
    const NormResult ln = layernorm(xr, w, rnd({96}, 74).to(dt), 1e-5f);
    const Tensor mean = ln.mean.to(kGpu), rstd = ln.rstd.to(kGpu), wg = w.to(kGpu);
    const LayerNormGrads la = layernorm_backward(dy.to(kGpu), xr.to(kGpu), wg, mean, rstd);
    const LayerNormGrads lu =
        layernorm_backward(shifted_on_gpu(dy), shifted_on_gpu(xr), wg, mean, rstd);
    EXPECT_TRUE(bits_equal(la.dweight, lu.dweight));
    EXPECT_TRUE(bits_equal(la.dbias, lu.dbias));
    const RmsNormGrads ra = rmsnorm_backward(dy.to(kGpu), xr.to(kGpu), wg, rstd);
    const RmsNormGrads ru = rmsnorm_backward(shifted_on_gpu(dy), shifted_on_gpu(xr), wg, rstd);
    EXPECT_TRUE(bits_equal(ra.dweight, ru.dweight));
    // Bias gradients (Note [CUDA column sums]).
    EXPECT_TRUE(bits_equal(sum_to(dy.to(kGpu), {96}), sum_to(shifted_on_gpu(dy), {96})));
    // Embedding backward into a zero and a non-zero table, 40 of 300 rows per id.
    std::vector<int64_t> id_values(300);
    for (size_t i = 0; i < id_values.size(); ++i) id_values[i] = static_cast<int64_t>(i * 7 % 40);
    const Tensor ids = from_ints(id_values, {300}, DType::I32).to(kGpu);
    for (bool zero : {true, false}) {
      const Tensor start = zero ? zeros({40, 96}, dt) : rnd({40, 96}, 75).to(dt);
      Tensor ea = start.to(kGpu), eu = start.to(kGpu);
      embedding_backward(ids, dy.to(kGpu), ea);
      embedding_backward(ids, shifted_on_gpu(dy), eu);
      EXPECT_TRUE(bits_equal(ea, eu)) << (zero ? "into zeros" : "into a table");
    }
  }
}

// sum_squares_many: one total per tensor, copied back alone (an empty tensor's is 0), from
// launches that share one region of block partials in stream order; a large tensor takes many
// blocks, a small one one.
TEST(CudaOps, SumSquaresManyGivesEachTensorItsTotal) {
  SKIP_WITHOUT_GPU();
  const std::vector<Tensor> cpu = {rnd({600001}, 80), Tensor::empty({0}, DType::F32),
                                   rnd({3, 5}, 81).to(DType::BF16),
                                   rnd({300000}, 82).to(DType::F16), rnd({7}, 83)};
  std::vector<Tensor> gpu;
  for (const Tensor& t : cpu) gpu.push_back(t.to(kGpu));
  const std::vector<double> got = sum_squares_many(gpu);
  ASSERT_EQ(got.size(), cpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double want = sum_squares(cpu[i]);
    EXPECT_NEAR(got[i], want, 1e-12 * want) << "tensor " << i;
    EXPECT_EQ(got[i], sum_squares(gpu[i])) << "tensor " << i;  // alone: the same blocks, bits
  }
  EXPECT_EQ(got[1], 0.0);
  // More tensors than one group of rows holds (64): three groups, empty tensors at their edges.
  std::vector<Tensor> many_cpu, many_gpu;
  for (int i = 0; i < 150; ++i) {
    const int64_t len = i == 63 || i == 64 || i == 128 ? 0 : 1 + (i * 7919) % 5000;
    many_cpu.push_back(rnd({len}, 100 + static_cast<uint64_t>(i)));
    many_gpu.push_back(many_cpu.back().to(kGpu));
  }
  const std::vector<double> many = sum_squares_many(many_gpu);
  ASSERT_EQ(many.size(), many_cpu.size());
  for (size_t i = 0; i < many.size(); ++i) {
    const double want = sum_squares(many_cpu[i]);
    EXPECT_NEAR(many[i], want, 1e-12 * want) << "tensor " << i;
    EXPECT_EQ(many[i], sum_squares(many_gpu[i])) << "tensor " << i;
  }
}

// A non-zero fill of a contiguous range that starts and ends off a 16-byte boundary (the elements
// before the first whole word and after the last are stored one at a time), and of a strided
// view, in every dtype: the CPU's bytes.
TEST(CudaOps, FillsMatchTheCpuAtEveryAlignment) {
  SKIP_WITHOUT_GPU();
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U8}) {
    SCOPED_TRACE(dtype_name(dt));
    for (int64_t start : {0, 1, 3, 5}) {
      for (int64_t len : {0, 1, 7, 33, 100}) {
        SCOPED_TRACE("start " + std::to_string(start) + " len " + std::to_string(len));
        Tensor c = zeros({120}, dt), gpu = zeros({120}, dt, kGpu);
        c.narrow(0, start, len).fill_(-2.75);
        Tensor v = gpu.narrow(0, start, len);
        v.fill_(-2.75);
        const Tensor back = gpu.to(Device::cpu());
        EXPECT_EQ(std::memcmp(back.data_ptr(), c.data_ptr(), c.nbytes()), 0);
      }
    }
    Tensor c = zeros({6, 10}, dt), gpu = zeros({6, 10}, dt, kGpu);
    c.narrow(1, 2, 5).fill_(3.0);
    Tensor v = gpu.narrow(1, 2, 5);
    v.fill_(3.0);
    const Tensor back = gpu.to(Device::cpu());
    EXPECT_EQ(std::memcmp(back.data_ptr(), c.data_ptr(), c.nbytes()), 0);
  }
}

// Note [Logits gradient in place]: the cross-entropy backward written over the logits gives the
// out-of-place kernel's bits, on aligned rows (128-bit packs read and written in place) and on
// rows one element off (the one-element path), with padding columns and an ignored row.
TEST(CudaOps, CrossEntropyBackwardInPlaceGivesTheOutOfPlaceBits) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 13, ld = 264, classes = 250;
  std::vector<int64_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = i == 4 ? -100 : (i * 37) % classes;
  const Tensor targets = from_ints(t, {n}).to(kGpu);
  const Tensor dloss = rnd({n}, 71).to(kGpu);
  for (DType dt : kDtypes) {
    SCOPED_TRACE(dtype_tag(dt));
    const Tensor x = rnd({n, ld}, 70, -6.f, 6.f).to(dt);
    const CrossEntropyResult r = cross_entropy(x.to(kGpu), targets, -100, classes);
    const Tensor want =
        cross_entropy_backward(x.to(kGpu), targets, r.lse, dloss, -100, classes).to(Device::cpu());
    for (bool aligned : {true, false}) {
      SCOPED_TRACE(aligned ? "aligned" : "shifted");
      Tensor g = aligned ? x.to(kGpu) : shifted_on_gpu(x);
      const void* at = g.data_ptr();
      cross_entropy_backward_(g, targets, r.lse, dloss, -100, classes);
      EXPECT_EQ(g.data_ptr(), at);
      EXPECT_EQ(max_abs_diff(g.to(Device::cpu()).to(DType::F32), want.to(DType::F32)), 0.0);
    }
  }
}

// Note [CUDA fused cross-entropy]: one kernel gives the forward's losses and lse and leaves the
// backward's gradient (dloss = grad / m) in the logits, with the two kernels' bits, on aligned
// rows and on rows one element off, with padding columns and an ignored row; a bad target is a
// UserError at the next wait. scale_unless_equal_ decides on the device: equal leaves the bits,
// different rescales them as affine does.
TEST(CudaOps, FusedCrossEntropyGivesTheTwoKernelsBits) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 13, ld = 264, classes = 250;
  std::vector<int64_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = i == 4 ? -100 : (i * 37) % classes;
  const Tensor targets = from_ints(t, {n}).to(kGpu);
  auto host = [](const Tensor& v) { return v.to(Device::cpu()).to(DType::F32); };
  for (DType dt : kDtypes) {
    for (float grad : {1.f, 1024.f / 3.f}) {
      const Tensor x = rnd({n, ld}, 72, -6.f, 6.f).to(dt);
      const Tensor g = full({}, grad, DType::F32, kGpu);
      // The row's split among threads differs between the 128-bit and one-element paths, so
      // each layout is compared with the unfused kernels on the same layout.
      for (bool aligned : {true, false}) {
        SCOPED_TRACE(dtype_tag(dt) + " grad " + std::to_string(grad) +
                     (aligned ? " aligned" : " shifted"));
        auto layout = [&] { return aligned ? x.to(kGpu) : shifted_on_gpu(x); };
        const Tensor xl = layout();
        const CrossEntropyResult want = cross_entropy(xl, targets, -100, classes);
        const Tensor dloss = div(g, want.norm.narrow(0, 0, 1).reshape({})).reshape({1}).expand({n});
        const Tensor dx = cross_entropy_backward(xl, targets, want.lse, dloss, -100, classes);
        Tensor l = layout();
        const CrossEntropyResult got = cross_entropy_fused_(l, targets, grad, -100, classes);
        EXPECT_EQ(max_abs_diff(host(got.losses), host(want.losses)), 0.0);
        EXPECT_EQ(max_abs_diff(host(got.lse), host(want.lse)), 0.0);
        EXPECT_EQ(max_abs_diff(host(got.norm), host(want.norm)), 0.0);
        EXPECT_EQ(max_abs_diff(host(l), host(dx)), 0.0);
        Tensor same = dx.clone(), other = dx.clone();
        scale_unless_equal_(same, g, grad);
        scale_unless_equal_(other, g, 2.f * grad + 1.f);
        EXPECT_EQ(max_abs_diff(host(same), host(dx)), 0.0);
        EXPECT_EQ(max_abs_diff(host(other), host(affine(dx, grad / (2.f * grad + 1.f), 0.f))), 0.0);
      }
    }
  }
  Tensor bad = rnd({2, 10}, 73).to(kGpu);
  EXPECT_THROW(
      {
        cross_entropy_fused_(bad, from_ints({1, 12}, {2}).to(kGpu), 1.f, -100, 10);
        (void)bad.to(Device::cpu());
      },
      UserError);
}

// Note [CUDA embedding backward]: the device sort (tiles of 2048 keys, global merge passes above
// that) must give each id its rows in row order, so the sums are the CPU's bits: f32, and bf16
// rounded once from the same f32 sums. Sizes around the tile and past two merge stages, ids from
// a small vocabulary (runs of hundreds of rows: the unrolled walk), I32 and I64 ids, a dweight
// that is not zero, and widths of one and two column blocks.
TEST(CudaOps, EmbeddingBackwardSortsOnTheDeviceWithTheCpusBits) {
  SKIP_WITHOUT_GPU();
  for (int64_t n : {1, 3, 2047, 2048, 2049, 5000}) {
    for (int64_t c : {24, 200}) {
      for (DType dt : {DType::F32, DType::BF16}) {
        for (DType it : {DType::I64, DType::I32}) {
          SCOPED_TRACE(::testing::Message() << "n " << n << " c " << c << " " << dtype_tag(dt)
                                            << (it == DType::I32 ? " i32" : " i64"));
          const int64_t vocab = 37;
          std::vector<int64_t> ids(static_cast<size_t>(n));
          uint64_t x = 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(n * 131 + c);
          for (int64_t& id : ids) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            // Skewed: id 5 about half the time (one long run), the rest spread.
            id = (x >> 40) % 2 == 0 ? 5 : static_cast<int64_t>((x >> 33) % vocab);
          }
          const Tensor cpu_ids = from_ints(ids, {n}, it);
          const Tensor dout = rnd({n, c}, 40).to(dt);
          const Tensor start = rnd({vocab, c}, 41).to(dt);
          Tensor want = start.clone();
          embedding_backward(cpu_ids, dout, want);
          Tensor got = start.to(kGpu);
          embedding_backward(cpu_ids.to(kGpu), dout.to(kGpu), got);
          EXPECT_EQ(max_abs_diff(got.to(Device::cpu()).to(DType::F32), want.to(DType::F32)), 0.0);
        }
      }
    }
  }
}

// Note [CUDA top-k]: the kernel's elements and order are the CPU backend's (Note [Top-k]), bit
// for bit, on rows without ties (f32) and with ties straddling the cut (rounded values, and bf16's
// coarse grid), a strided slice of padded rows (a sampler's logits), signed zeros, infinities and
// NaN, k = 1 (greedy) to the kernel's limit, and past it (the host path).
TEST(CudaOps, TopKSelectsTheCpusElementsInTheCpusOrder) {
  SKIP_WITHOUT_GPU();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> special(300);
  for (size_t i = 0; i < special.size(); ++i) special[i] = static_cast<float>(i % 7) - 3.f;
  for (size_t i : {5u, 77u, 200u}) special[i] = nan;
  for (size_t i : {9u, 150u}) special[i] = INFINITY;
  for (size_t i : {10u, 11u, 299u}) special[i] = -INFINITY;
  for (size_t i : {20u, 40u, 60u}) special[i] = -0.f;
  std::vector<float> coarse = to_float_vector(rnd({4, 777}, 60, -5.f, 5.f));
  for (float& v : coarse) v = std::round(v);
  std::vector<float> coarse_wide = to_float_vector(rnd({2, 20000}, 66));
  for (float& v : coarse_wide) v = std::round(v * 8.f) / 8.f;
  const Tensor padded = rnd({3, 1100}, 61);
  // Rows of one value: all -inf, all NaN, zeros of both signs (ties everywhere).
  std::vector<float> flat(3 * 70, -INFINITY);
  for (size_t i = 70; i < 140; ++i) flat[i] = nan;
  for (size_t i = 140; i < 210; ++i) flat[i] = i % 3 == 0 ? -0.f : 0.f;
  // Each case's rows in dtype dt on device d (cast on the host, so a NaN's bits are the same on
  // both devices).
  struct Rows {
    std::function<Tensor(Device, DType)> on;
    std::vector<int64_t> ks;
  };
  const auto plain = [](Tensor x) { return [x](Device d, DType dt) { return x.to(dt).to(d); }; };
  const std::vector<Rows> cases = {
      {plain(rnd({3, 5000}, 62)), {1, 40, 1024}},
      {plain(from_vector(coarse, {4, 777})), {1, 5, 300, 777}},
      // The sampler's view: padded rows, the vocabulary's columns.
      {[padded](Device d, DType dt) { return padded.to(dt).to(d).narrow(1, 0, 1037); }, {40}},
      {plain(from_vector(special, {1, 300})), {1, 3, 12, 300}},
      {plain(from_vector(flat, {3, 70})), {1, 2}},
      {plain(rnd({2, 2000}, 63)), {1500}},  // past kTopKMax: the host path
      // GPT-2's vocabulary: several tiles of the kernel's passes.
      {plain(rnd({2, 50257}, 65)), {1, 40}},
      // Ties across several tiles of the in-order walk.
      {plain(from_vector(coarse_wide, {2, 20000})), {3, 1000}},
  };
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    for (const Rows& c : cases) {
      for (int64_t k : c.ks) {
        const Tensor x = c.on(Device::cpu(), dt);
        SCOPED_TRACE(x.str() + " k " + std::to_string(k));
        const TopKResult want = top_k(x, k);
        const Tensor xd = c.on(kGpu, dt);
#if defined(STRATA_CUDA_EMULATION)
        const uint64_t before = cuda_emu::launches_of("top_k_kernel"),
                       before_1 = cuda_emu::launches_of("top_1_kernel");
#endif
        const TopKResult got = top_k(xd, k);
#if defined(STRATA_CUDA_EMULATION)
        // k = 1 reads the row once (Note [CUDA top-k]); k above kTopKMax goes to the host.
        EXPECT_EQ(cuda_emu::launches_of("top_k_kernel") - before,
                  k > 1 && k <= cuda::kTopKMax ? 1u : 0u);
        EXPECT_EQ(cuda_emu::launches_of("top_1_kernel") - before_1, k == 1 ? 1u : 0u);
#endif
        EXPECT_EQ(to_int_vector(got.indices), to_int_vector(want.indices));
        const Tensor gv = got.values.to(Device::cpu());
        ASSERT_EQ(gv.dtype(), dt);
        EXPECT_EQ(std::memcmp(gv.data_ptr(), want.values.data_ptr(), want.values.nbytes()), 0);
      }
    }
  }
  // Greedy: k = 1 is max's argmax on rows without NaN.
  const Tensor y = rnd({5, 3000}, 64).to(kGpu);
  EXPECT_EQ(to_int_vector(top_k(y, 1).indices.view({5})), to_int_vector(max(y, 1).indices));
}

// Note [Deferred device checks]: a bad id or target is reported at the next wait for the device
// (here a copy to the host) with the message of the op that met it, the kernels stay in bounds,
// and the next wait after the error is clean.
TEST(CudaOps, BadTokenIdsAreUserErrorsAtTheNextWait) {
  SKIP_WITHOUT_GPU();
  const auto message = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const UserError& e) {
      return e.what();
    }
    return "(no UserError)";
  };
  const auto has = [](const std::string& text, const char* part) {
    return text.find(part) != std::string::npos;
  };
  const Tensor cpu_w = arange(40).reshape({10, 4});
  const Tensor w = cpu_w.to(kGpu);
  const Tensor bad_ids = from_ints({1, 10}, {2}).to(kGpu);
  Tensor looked_up;
  EXPECT_PRED2(has, message([&] {
                 looked_up = embedding(w, bad_ids);
                 looked_up.to(Device::cpu());
               }),
               "embedding: a token id is outside [0, 10)");
  // The good row is still looked up, the bad one reads 0.
  const Tensor host = looked_up.to(Device::cpu());
  for (int64_t c = 0; c < 4; ++c) {
    EXPECT_EQ(host.data<float>()[c], cpu_w.data<float>()[4 + c]);
    EXPECT_EQ(host.data<float>()[4 + c], 0.f);
  }
  EXPECT_PRED2(has, message([&] {
                 cross_entropy(zeros({2, 10}, DType::F32, kGpu), from_ints({1, 12}, {2}).to(kGpu),
                               -100)
                     .losses.to(Device::cpu());
               }),
               "cross_entropy: a target is outside [0, 10)");
  Tensor dw = zeros({10, 4}, DType::F32, kGpu);
  EXPECT_PRED2(has, message([&] {
                 embedding_backward(bad_ids, ones({2, 4}, DType::F32, kGpu), dw);
                 dw.to(Device::cpu());
               }),
               "embedding_backward: a token id is outside [0, 10)");
  const Tensor dw_host = dw.to(Device::cpu());  // the good id's row was added, nothing else
  for (int64_t i = 0; i < 40; ++i) EXPECT_EQ(dw_host.data<float>()[i], i / 4 == 1 ? 1.f : 0.f);
  // Two bad launches before one wait: the first one's message.
  EXPECT_PRED2(has, message([&] {
                 embedding(w, bad_ids);
                 cross_entropy(zeros({2, 10}, DType::F32, kGpu), from_ints({1, 12}, {2}).to(kGpu),
                               -100)
                     .losses.to(Device::cpu());
               }),
               "embedding: a token id");
  // Nothing is left over for the next wait.
  EXPECT_NO_THROW(embedding(w, from_ints({3, 9}, {2}).to(kGpu)).to(Device::cpu()));
  // Flags for 64 launches: with a bad one among them and no wait, the 65th launch waits first
  // and raises.
  const Tensor good_ids = from_ints({3, 9}, {2}).to(kGpu);
  int launches = 0;
  EXPECT_PRED2(has, message([&] {
                 embedding(w, bad_ids);
                 for (launches = 1; launches < 100; ++launches) embedding(w, good_ids);
               }),
               "embedding: a token id is outside [0, 10)");
  EXPECT_EQ(launches, 64);
  EXPECT_NO_THROW(embedding(w, good_ids).to(Device::cpu()));
}

// Note [Row chunks on grid.y] (tensor/cuda/common.cuh): the column reductions give a chunk of
// rows a blockIdx.y, which holds at most 65535. One column of more rows than 65535 chunks (plus a
// partial last chunk) through each of them: the bias-gradient sum (sum_to), the linear
// epilogue's column sums and the norm weight/bias gradients. Values 0 and 1 make every partial
// and total an integer below 2^24, exact in f32 in any order, so the sums must be exact.
TEST(CudaOps, ColumnReductionsTakeMoreRowChunksThanGridYHolds) {
  SKIP_WITHOUT_GPU();
  const auto column = [](int64_t n, int64_t& ones_count) {
    std::vector<float> v(static_cast<size_t>(n));
    ones_count = 0;
    for (int64_t r = 0; r < n; ++r) {
      v[static_cast<size_t>(r)] = (r * 7 + r / 3) % 5 < 2 ? 1.f : 0.f;
      ones_count += v[static_cast<size_t>(r)] == 1.f;
    }
    return from_vector(v, {n, 1}).to(kGpu);
  };
  const auto stream = static_cast<cuda::Stream>(cuda_current_stream());
  const auto f32 = static_cast<int>(DType::F32);
  {
    int64_t want = 0;
    const int64_t n = 65537 * cuda::kColumnSumRows + 5;
    const Tensor x = column(n, want);
    EXPECT_EQ(sum_to(x, {1}).to(Device::cpu()).data<float>()[0], static_cast<float>(want));
  }
  int64_t want = 0;
  const int64_t n = 65537 * cuda::kNormRowChunk + 5;
  const int64_t chunks = (n + cuda::kNormRowChunk - 1) / cuda::kNormRowChunk;
  const Tensor x = column(n, want);
  Tensor scratch = zeros({2 * chunks}, DType::F32, kGpu);
  Tensor out = zeros({1}, DType::F32, kGpu);
  ASSERT_TRUE(cuda::launch_column_sums(f32, x.data_ptr(), f32, out.data_ptr(),
                                       scratch.data<float>(), n, 1, stream));
  EXPECT_EQ(out.to(Device::cpu()).data<float>()[0], static_cast<float>(want));
  // dweight = sum dy * (x - mean) * rstd with dy = 1, mean = 0, rstd = 1: the count of ones;
  // dbias = sum dy = n.
  const Tensor dy = ones({n, 1}, DType::F32, kGpu);
  const Tensor mean = zeros({n}, DType::F32, kGpu);
  const Tensor rstd = ones({n}, DType::F32, kGpu);
  Tensor dw = zeros({1}, DType::F32, kGpu), db = zeros({1}, DType::F32, kGpu);
  ASSERT_TRUE(cuda::launch_norm_param_grads(f32, dy.data_ptr(), x.data_ptr(), mean.data<float>(),
                                            rstd.data<float>(), dw.data_ptr(), db.data_ptr(),
                                            scratch.data<float>(), n, 1, false, stream));
  EXPECT_EQ(dw.to(Device::cpu()).data<float>()[0], static_cast<float>(want));
  EXPECT_EQ(db.to(Device::cpu()).data<float>()[0], static_cast<float>(n));
}

// Note [Chunk partial sums] (tensor/cuda/common.cuh): the column sums add each chunk's rows in
// row order, the chunks in 32 contiguous runs of ceil(chunks / 32), and the runs in order, all in
// f32. Values of many magnitudes make the order show in the bits; the host adds in that order and
// the GPU must give the same bits, for a chunk count that leaves the last runs short or empty.
TEST(CudaOps, ColumnSumsAddChunkPartialsInTheirNotedOrder) {
  SKIP_WITHOUT_GPU();
  const int64_t c = 37, chunks = 32 * 3 + 7, n = (chunks - 1) * cuda::kNormRowChunk + 5;
  std::vector<float> x(static_cast<size_t>(n * c));
  uint64_t state = 12345;
  for (float& v : x) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const auto bits = static_cast<uint32_t>(state >> 33);
    v = static_cast<float>(static_cast<int>(bits % 2001) - 1000) *
        std::ldexp(1.f, static_cast<int>(bits >> 20) % 24 - 12);
  }
  std::vector<float> want(static_cast<size_t>(c));
  const int64_t per_run = (chunks + 31) / 32;
  // The chunks one after another differ somewhere, or the test could not tell the orders apart.
  bool order_shows = false;
  for (int64_t j = 0; j < c; ++j) {
    std::vector<float> partial(static_cast<size_t>(chunks));
    for (int64_t k = 0; k < chunks; ++k) {
      float p = 0;
      for (int64_t r = k * cuda::kNormRowChunk; r < std::min(n, (k + 1) * cuda::kNormRowChunk); ++r)
        p += x[static_cast<size_t>(r * c + j)];
      partial[static_cast<size_t>(k)] = p;
    }
    float total = 0, chunk_by_chunk = 0;
    for (int64_t y = 0; y < 32; ++y) {
      float run = 0;
      for (int64_t k = y * per_run; k < std::min(chunks, (y + 1) * per_run); ++k)
        run += partial[static_cast<size_t>(k)];
      total += run;
    }
    for (float p : partial) chunk_by_chunk += p;
    want[static_cast<size_t>(j)] = total;
    order_shows = order_shows || chunk_by_chunk != total;
  }
  ASSERT_TRUE(order_shows);
  const Tensor xg = from_vector(x, {n, c}).to(kGpu);
  Tensor scratch = zeros({chunks * c}, DType::F32, kGpu);
  Tensor out = zeros({c}, DType::F32, kGpu);
  const auto f32 = static_cast<int>(DType::F32);
  ASSERT_TRUE(cuda::launch_column_sums(f32, xg.data_ptr(), f32, out.data_ptr(),
                                       scratch.data<float>(), n, c,
                                       static_cast<cuda::Stream>(cuda_current_stream())));
  const Tensor got = out.to(Device::cpu());
  for (int64_t j = 0; j < c; ++j)
    EXPECT_EQ(got.data<float>()[j], want[static_cast<size_t>(j)]) << "column " << j;
}

// Note [Fused norm weight gradients] (tensor/cuda/norm.cu): the norm backward's one-kernel
// path (dsum and the weight/bias partials in one pass) gives the bits of the two-kernel path, for
// layernorm and rmsnorm, with and without the residual's ds, in every float dtype: rows of packs
// with a short last chunk, rows that take no packs, a single row, and rows of 512 packs (the
// largest block the fused path takes). In the emulator it also checks which kernels ran.
// Note [Norm gradients into their buffer] (tensor/ops.h): with `accumulate`, both paths add
// dweight and dbias into buffers that already hold gradients, with the bits tensor::axpy_ (what
// AccumulateGrad runs) gives adding the returned gradients into the same buffers.
TEST(CudaOps, FusedNormBackwardGivesTheSeparatePathsBits) {
  SKIP_WITHOUT_GPU();
  const auto stream = static_cast<cuda::Stream>(cuda_current_stream());
  auto bytes = [](const Tensor& t) {
    const Tensor h = t.to(Device::cpu());
    const auto* p = static_cast<const unsigned char*>(h.data_ptr());
    return std::vector<unsigned char>(p,
                                      p + h.numel() * static_cast<int64_t>(dtype_size(h.dtype())));
  };
  uint64_t draw = 900;
  for (const DType dt : {DType::F32, DType::BF16, DType::F16}) {
    const auto pack = static_cast<int64_t>(16 / dtype_size(dt));
    const std::vector<std::pair<int64_t, int64_t>> shapes = {
        {75, 8 * pack}, {70, 37}, {1, pack}, {40, 512 * pack}};
    for (const auto& [n, c] : shapes)
      for (const bool layer : {true, false})
        for (const bool with_ds : {false, true}) {
          SCOPED_TRACE(dtype_tag(dt) + " n=" + std::to_string(n) + " c=" + std::to_string(c) +
                       (layer ? " layernorm" : " rmsnorm") + (with_ds ? " with ds" : ""));
          const Tensor dy = rnd({n, c}, ++draw).to(dt).to(kGpu);
          const Tensor x = rnd({n, c}, ++draw).to(dt).to(kGpu);
          const Tensor ds = rnd({n, c}, ++draw).to(dt).to(kGpu);
          const Tensor w = rnd({c}, ++draw).to(dt).to(kGpu);
          const Tensor mean = rnd({n}, ++draw, -0.5f, 0.5f).to(kGpu);
          const Tensor rstd = rnd({n}, ++draw, 0.5f, 2.f).to(kGpu);
          const int64_t chunks = (n + cuda::kNormRowChunk - 1) / cuda::kNormRowChunk;
          std::vector<std::vector<unsigned char>> got[2];
          for (const bool fused : {false, true}) {
            Tensor dsum = zeros({n, c}, dt, kGpu), dw = zeros({c}, dt, kGpu),
                   db = zeros({c}, dt, kGpu);
            Tensor scratch = zeros({2 * chunks * c}, DType::F32, kGpu);
#if defined(STRATA_CUDA_EMULATION)
            cuda_emu::reset_launch_sites();
#endif
            ASSERT_TRUE(cuda::launch_norm_backward(
                static_cast<int>(dt), dy.data_ptr(), with_ds ? ds.data_ptr() : nullptr,
                x.data_ptr(), w.data_ptr(), layer ? mean.data<float>() : nullptr,
                rstd.data<float>(), dsum.data_ptr(), dw.data_ptr(), layer ? db.data_ptr() : nullptr,
                scratch.data<float>(), n, c, fused, false, stream));
#if defined(STRATA_CUDA_EMULATION)
            uint64_t fused_launches = 0, partial_launches = 0;
            for (const cuda_emu::LaunchSite& site : cuda_emu::launch_sites()) {
              if (site.kernel.find("add_norm_bwd_fused") != std::string::npos)
                fused_launches += site.launches;
              if (site.kernel.find("norm_bwd_partials") != std::string::npos)
                partial_launches += site.launches;
            }
            EXPECT_EQ(fused_launches, fused ? 1u : 0u);
            EXPECT_EQ(partial_launches, fused ? 0u : 1u);
#endif
            got[fused] = {bytes(dsum), bytes(dw), bytes(db)};
            // The same backward adding into buffers holding earlier gradients.
            const Tensor old_w = rnd({c}, draw + 100).to(dt).to(kGpu);
            const Tensor old_b = rnd({c}, draw + 200).to(dt).to(kGpu);
            Tensor want_w = old_w.clone(), want_b = old_b.clone();
            axpy_(1.f, dw, want_w);
            axpy_(1.f, db, want_b);
            Tensor acc_w = old_w.clone(), acc_b = old_b.clone(), acc_sum = zeros({n, c}, dt, kGpu);
            ASSERT_TRUE(cuda::launch_norm_backward(
                static_cast<int>(dt), dy.data_ptr(), with_ds ? ds.data_ptr() : nullptr,
                x.data_ptr(), w.data_ptr(), layer ? mean.data<float>() : nullptr,
                rstd.data<float>(), acc_sum.data_ptr(), acc_w.data_ptr(),
                layer ? acc_b.data_ptr() : nullptr, scratch.data<float>(), n, c, fused, true,
                stream));
            EXPECT_TRUE(bytes(acc_sum) == bytes(dsum)) << "dsum with accumulate";
            EXPECT_TRUE(bytes(acc_w) == bytes(want_w)) << "dweight added into a buffer";
            EXPECT_TRUE(bytes(acc_b) == bytes(layer ? want_b : old_b))
                << (layer ? "dbias added into a buffer" : "rmsnorm left dbias's buffer alone");
            EXPECT_TRUE(bytes(acc_w) != bytes(old_w)) << "nothing was added";
          }
          const char* names[] = {"dsum", "dweight", "dbias"};
          for (int i = 0; i < 3; ++i) EXPECT_TRUE(got[0][i] == got[1][i]) << names[i];
        }
  }
}

// Note [Norm gradients into their buffer] through the ops, as autograd's norms call them: the
// buffers end with the bits AccumulateGrad's axpy of the returned gradients gives (the launcher
// test above covers the separate path too).
TEST(CudaOps, NormGradientsAddIntoGivenBuffersWithTheAxpysBits) {
  SKIP_WITHOUT_GPU();
  for (const DType dt : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    strata::testing::expect_norm_grads_added_into(kGpu, dt);
  }
}

// Note [CUDA column sums]: sum_to over a few leading rows of many columns (GPT-2 1558M's
// position-embedding gradient: 16 rows of 1.6M) takes the column kernels too, where the generic
// reduce gave each column a block. The values (22-bit integers / 4096) add exactly in f64, so
// every column must be its exact sum rounded once; which kernels ran, bench_gpt2_cuda --launches
// shows (no reduce_kernel of 1.6M blocks in a 1558M step).
TEST(CudaOps, SumToOverFewRowsOfManyColumnsIsTheRowOrderSum) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 5, c = 40000;
  std::vector<float> x(static_cast<size_t>(n * c));
  uint64_t state = 777;
  for (float& v : x) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<float>(static_cast<int64_t>(state >> 40) - (int64_t{1} << 23)) / 4096.f;
  }
  const Tensor got = sum_to(from_vector(x, {n, c}).to(kGpu), {c}).to(Device::cpu());
  for (int64_t j = 0; j < c; ++j) {
    double want = 0;
    for (int64_t r = 0; r < n; ++r) want += x[static_cast<size_t>(r * c + j)];
    ASSERT_EQ(got.data<float>()[j], static_cast<float>(want)) << "column " << j;
  }
}

TEST(CudaOps, WithoutADeviceInitFailsClearly) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is visible";
  EXPECT_EQ(cuda_device_count(), 0);
  try {
    init_cuda(0);
    FAIL() << "init_cuda succeeded without a device";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("device: cuda requested"), std::string::npos) << e.what();
  }
  // The op layer reaches the same error instead of crashing.
  EXPECT_THROW(zeros({2}, DType::F32, kGpu), UserError);
}

}  // namespace
}  // namespace strata::tensor
