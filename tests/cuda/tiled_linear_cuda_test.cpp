// Note [Tiled linear] on the GPU: a tiled linear against the untiled one on the device, forward
// and backward, f32 and bf16 (the CUDA emulator where there is no GPU).
#include "tests/cuda/train_gpu_test_util.h"

namespace strata {
namespace {

using namespace train_gpu_test;

struct LinearBits {
  std::vector<uint8_t> y, dx, dw, db;
};

LinearBits run_linear(DType dtype, int64_t tiles, bool bound) {
  const int64_t M = 24, in = 96, out = 160;
  autograd::Variable x(tensor::randn({M, in}, {9, 1}).to(dtype).to(kGpu), true);
  autograd::Variable w(tensor::randn({out, in}, {9, 2}, 0.f, 0.1f).to(dtype).to(kGpu), true);
  autograd::Variable b(tensor::randn({out}, {9, 3}).to(dtype).to(kGpu), true);
  if (bound) {  // gradients bound to buffers, as the Engine binds them
    w.set_grad(tensor::zeros({out, in}, dtype, kGpu));
    b.set_grad(tensor::zeros({out}, dtype, kGpu));
  }
  const Tensor dy = tensor::randn({M, out}, {9, 4}).to(dtype).to(kGpu);
  autograd::Variable y =
      tiles == 0 ? autograd::linear(x, w, b) : autograd::tiled_linear(x, w, b, tiles);
  y.backward(dy);
  return {host_bytes(y.data()), host_bytes(x.grad()), host_bytes(w.grad()), host_bytes(b.grad())};
}

TEST(TiledLinearCuda, TilesGiveTheUntiledBits) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::F32, DType::BF16})
    for (bool bound : {false, true}) {
      const LinearBits ref = run_linear(dtype, 0, bound);
      for (int64_t tiles : {2, 3, 7}) {
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(dtype) << " tiles " << tiles << (bound ? " into buffers" : ""));
        const LinearBits t = run_linear(dtype, tiles, bound);
        EXPECT_TRUE(t.y == ref.y) << "forward";
        EXPECT_TRUE(t.dx == ref.dx) << "input gradient";
        EXPECT_TRUE(t.dw == ref.dw) << "weight gradient";
        EXPECT_TRUE(t.db == ref.db) << "bias gradient";
      }
    }
}

}  // namespace
}  // namespace strata
