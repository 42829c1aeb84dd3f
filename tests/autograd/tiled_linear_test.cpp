// Note [Tiled linear]: a linear run as tiles gives the untiled linear's bits, forward and
// backward, for any tile count (even or not), f32 and bf16, with and without a bias.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "autograd/functions.h"
#include "offload/memory_stats.h"
#include "tensor/ops.h"

namespace strata::autograd {
namespace {

namespace tops = ::strata::tensor;

std::vector<uint8_t> bytes(const Tensor& t) {
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return {p, p + c.nbytes()};
}

struct Result {
  std::vector<uint8_t> y, dx, dw, db;
};

Result run(const Shape& xs, int64_t out, DType dtype, bool with_bias, int64_t tiles) {
  const int64_t in = xs[xs.ndim() - 1];
  Variable x(tops::randn(xs, {11, 1}).to(dtype), true);
  Variable w(tops::randn({out, in}, {11, 2}, 0.f, 0.2f).to(dtype), true);
  Variable b = with_bias ? Variable(tops::randn({out}, {11, 3}).to(dtype), true) : Variable();
  Shape ys = xs;
  ys[ys.ndim() - 1] = out;
  const Tensor dy = tops::randn(ys, {11, 4}).to(dtype);
  Variable y = tiles == 0 ? linear(x, w, b) : tiled_linear(x, w, b, tiles);
  y.backward(dy);
  Result r{bytes(y.data()), bytes(x.grad()), bytes(w.grad()), {}};
  if (with_bias) r.db = bytes(b.grad());
  return r;
}

TEST(TiledLinear, AnyTileCountGivesTheUntiledBits) {
  struct Case {
    Shape x;
    int64_t out;
  };
  const Case cases[] = {{{2, 9, 48}, 40}, {{37, 29}, 53}, {{1, 64}, 256}, {{3, 4, 130}, 7}};
  for (const Case& c : cases)
    for (DType dtype : {DType::F32, DType::BF16})
      for (bool bias : {true, false}) {
        const Result ref = run(c.x, c.out, dtype, bias, 0);
        for (int64_t tiles : {1, 2, 3, 5, 8, 1000}) {
          SCOPED_TRACE(::testing::Message()
                       << c.x.str() << " -> " << c.out << " " << dtype_name(dtype)
                       << (bias ? " bias" : "") << " tiles " << tiles);
          const Result t = run(c.x, c.out, dtype, bias, tiles);
          EXPECT_TRUE(t.y == ref.y) << "forward";
          EXPECT_TRUE(t.dx == ref.dx) << "input gradient";
          EXPECT_TRUE(t.dw == ref.dw) << "weight gradient";
          EXPECT_TRUE(t.db == ref.db) << "bias gradient";
        }
      }
}

// The working memory of one large linear (M = 128 rows, 512 -> 2048 features, f32), forward and
// backward, its weight and bias gradients bound to buffers as the Engine binds them to the flat
// units: host bytes at the peak beyond what exists before the call (x, weight, bias, their
// gradient buffers, dy) and after it (y while backward runs, dx). Untiled, the weight gradient
// exists whole beside its buffer until AccumulateGrad adds it; tiled, each tile's is added into
// the buffer's rows (Note [Tiled linear]) and the peak is one tile's buffers: forward y_k
// [M, out/N]; input gradient weight columns [out, in/N] + dx_k [M, in/N]; weight gradient dy_k
// [M, out/N] + dw_k [out/N, in] + db_k [out/N].
TEST(TiledLinear, WorkingMemoryIsBoundedByOneTile) {
  const int64_t M = 128, in = 512, out = 2048;
  auto& stats = offload::MemoryStats::global();
  auto measure = [&](int64_t tiles, std::vector<uint8_t>* dw) {
    Variable x(tops::randn({M, in}, {5, 1}), true);
    Variable w(tops::randn({out, in}, {5, 2}, 0.f, 0.02f), true);
    Variable b(tops::zeros({out}), true);
    w.set_grad(tops::zeros({out, in}));
    b.set_grad(tops::zeros({out}));
    const Tensor dy = tops::randn({M, out}, {5, 3});
    const int64_t before = stats.tier_usage(offload::Tier::Host).current;
    stats.reset_peaks();
    {
      Variable y = tiles == 0 ? linear(x, w, b) : tiled_linear(x, w, b, tiles);
      y.backward(dy);
    }
    *dw = bytes(w.grad());
    const int64_t results = (M * out + M * in) * 4;  // y and dx
    return stats.tier_usage(offload::Tier::Host).peak - before - results;
  };
  std::vector<uint8_t> untiled_dw;
  const int64_t untiled = measure(0, &untiled_dw);
  EXPECT_GE(untiled, out * in * 4) << "the untiled weight gradient beside its buffer";
  for (int64_t tiles : {4, 16}) {
    std::vector<uint8_t> dw;
    const int64_t tiled = measure(tiles, &dw);
    EXPECT_TRUE(dw == untiled_dw) << "the buffer's bits, " << tiles << " tiles";
    const int64_t t_out = out / tiles, t_in = in / tiles;
    const int64_t bound =
        4 * std::max({M * t_out, out * t_in + M * t_in, M * t_out + t_out * in + t_out});
    EXPECT_LE(tiled, bound) << tiles << " tiles";
    std::printf(
        "linear [%lld, %lld] -> %lld f32, gradients into buffers: working memory peak "
        "untiled %.3f MiB, %lld tiles %.3f MiB (one tile's buffers: %.3f MiB)\n",
        static_cast<long long>(M), static_cast<long long>(in), static_cast<long long>(out),
        untiled / 1048576.0, static_cast<long long>(tiles), tiled / 1048576.0, bound / 1048576.0);
  }
}

}  // namespace
}  // namespace strata::autograd
