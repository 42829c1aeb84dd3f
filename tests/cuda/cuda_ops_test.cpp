// CUDA backend vs the CPU backend (the reference): every op, forward and backward, on the same
// inputs (the op table's CUDA samples), and the kernels' paths one by one. Skips itself when no GPU
// is visible (CTest label `cuda`); the no-GPU error path is checked everywhere.
// Reductions and norms are in cuda_ops_reduce_norm_test.cpp, the embedding, cross-entropy and
// device checks of bad ids in cuda_ops_embedding_loss_test.cpp.
#include "tests/cuda/cuda_ops_test_util.h"

namespace strata::tensor {
namespace {

using namespace cuda_ops_test;

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
