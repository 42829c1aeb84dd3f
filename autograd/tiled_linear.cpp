// Memory-centric tiling of a linear layer (ZeRO-Infinity section 5.1.3): Note [Tiled linear].
#include <algorithm>

#include "autograd/functions.h"
#include "autograd/grad_sink.h"
#include "autograd/node.h"
#include "core/error.h"
#include "offload/memory_stats.h"
#include "tensor/storage.h"

namespace strata::autograd {

namespace tops = ::strata::tensor;

namespace {

// Tile k of `tiles` over `n` features: [start, start + length), the first n % tiles one longer.
std::pair<int64_t, int64_t> tile_range(int64_t n, int64_t tiles, int64_t k) {
  const int64_t base = n / tiles, extra = n % tiles;
  const int64_t start = k * base + std::min(k, extra);
  return {start, base + (k < extra ? 1 : 0)};
}

bool needs(const Variable& v) {
  return v.defined() && v.requires_grad();
}

// Note [Tiled linear]: the bound gradient of leaf `v` that the tiles' gradients are added into,
// row block by row block, or undefined (then the whole gradient is returned). The add is
// tensor::axpy_(1, tile, rows), AccumulateGrad's own add element for element, so the buffer
// ends with the bits AccumulateGrad would give it. On the GPU gradient_sink decides (it knows
// when a buffer may be added into and records it as written).
Tensor tile_sink(const Variable& v, DType dtype) {
  if (!v.defined() || !v.requires_grad() || !v.is_leaf()) return {};
  const Tensor& g = v.grad();
  if (!g.defined()) return {};
  if (g.device().is_cuda()) return gradient_sink(v, dtype);
  if (g.dtype() != dtype || !g.is_contiguous() || g.shape() != v.data().shape() ||
      g.storage()->is_released())
    return {};
  return g;
}

}  // namespace

Variable tiled_linear(const Variable& x, const Variable& weight, const Variable& bias,
                      int64_t tiles) {
  const Tensor xd = x.data(), wd = weight.data();
  const int64_t in = xd.size(-1), out = wd.size(0);
  STRATA_CHECK(wd.ndim() == 2 && wd.size(1) == in, "tiled_linear: weight {} for input {}", wd.str(),
               xd.str());
  STRATA_CHECK(tiles >= 1, "tiled_linear: {} tiles", tiles);
  tiles = std::min(tiles, std::min(in, out));
  if (tiles <= 1) return linear(x, weight, bias);
  const Tensor x2 = xd.reshape({-1, in});
  const int64_t rows = x2.size(0);
  const Tensor bd = bias.defined() ? bias.data() : Tensor();
  // Note [Tiled linear]: output features tile k = rows [o, o + n) of the weight.
  Tensor y = Tensor::empty({rows, out}, xd.dtype(), xd.device());
  for (int64_t k = 0; k < tiles; ++k) {
    const auto [o, n] = tile_range(out, tiles, k);
    Tensor yk;
    {
      offload::CategoryScope ws(offload::Category::Workspace);
      yk = tops::linear(x2, wd.narrow(0, o, n), bd.defined() ? bd.narrow(0, o, n) : Tensor()).y;
    }
    y.narrow(1, o, n).copy_(yk);
  }
  Shape ys = xd.shape();
  ys[ys.ndim() - 1] = out;
  const bool nx = needs(x), nw = needs(weight), nb = needs(bias);
  const Variable w_leaf = nw ? weight : Variable(), b_leaf = nb ? bias : Variable();
  std::vector<Variable> inputs{x, weight};
  if (bias.defined()) inputs.push_back(bias);
  return make_output("TiledLinear", y.view(ys), inputs, [=](const std::vector<Tensor>& gs) {
    const Tensor g2 = gs[0].reshape({-1, out});
    Tensor dx, dw, db;
    if (nx) {
      // Input features tile k = columns [i, i + n) of the weight: dx[:, i + j] sums over every
      // output feature, as the untiled dx does.
      dx = Tensor::empty({rows, in}, g2.dtype(), g2.device());
      for (int64_t k = 0; k < tiles; ++k) {
        const auto [i, n] = tile_range(in, tiles, k);
        Tensor dxk;
        {
          offload::CategoryScope ws(offload::Category::Workspace);
          dxk = tops::matmul(g2, wd.narrow(1, i, n).contiguous());
        }
        dx.narrow(1, i, n).copy_(dxk);
      }
      dx = dx.view(xd.shape());
    }
    if (nw || nb) {
      // Into the bound gradients where they can take it: no weight-sized gradient then exists
      // beside the buffer, only a tile of it.
      Tensor w_sink = tile_sink(w_leaf, g2.dtype()), b_sink = tile_sink(b_leaf, g2.dtype());
      if (nw && !w_sink.defined()) dw = Tensor::empty({out, in}, g2.dtype(), g2.device());
      if (nb && !b_sink.defined()) db = Tensor::empty({out}, g2.dtype(), g2.device());
      auto put = [](const Tensor& tile, const Tensor& sink, Tensor& whole, int64_t o, int64_t n) {
        if (sink.defined()) {
          Tensor rows = sink.narrow(0, o, n);
          tops::axpy_(1.f, tile, rows);
        } else {
          whole.narrow(0, o, n).copy_(tile);
        }
      };
      for (int64_t k = 0; k < tiles; ++k) {
        const auto [o, n] = tile_range(out, tiles, k);
        offload::CategoryScope ws(offload::Category::Workspace);
        const Tensor gk = g2.narrow(1, o, n).contiguous();
        if (nw) {
          tops::LinearWeightGrads d = tops::linear_backward_weight(gk, x2, nb);
          put(d.dweight, w_sink, dw, o, n);
          if (nb) put(d.dbias, b_sink, db, o, n);
        } else {
          put(tops::sum_to(gk, {n}), b_sink, db, o, n);
        }
      }
    }
    std::vector<Tensor> grads{dx, dw};
    if (bias.defined()) grads.push_back(db);
    return grads;
  });
}

}  // namespace strata::autograd
