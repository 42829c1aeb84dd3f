// Op table entries: layernorm, rmsnorm and their fused residual forms; softmax.
#include <string>

#include "autograd/functions.h"
#include "tests/support/op_table.h"

namespace strata::testing {

namespace {

using autograd::Variable;
using V = const std::vector<Variable>&;
using Ts = std::vector<Tensor>;
constexpr Layout T = Layout::Transposed, S = Layout::Strided;

// Every norm, forward and backward (dy = ds = x), with all its outputs and statistics.
Ts all_norms(const Tensor& x, const Tensor& w, const Tensor& b) {
  using namespace tensor;
  NormResult ln = layernorm(x, w, b, 1e-5f);
  LayerNormGrads lg = layernorm_backward(x, x, w, ln.mean, ln.rstd);
  NormResult rn = rmsnorm(x, w, 1e-5f);
  RmsNormGrads rg = rmsnorm_backward(x, x, w, rn.rstd);
  AddNormResult al = add_layernorm(x, x, w, b, 1e-5f);
  LayerNormGrads alg = add_layernorm_backward(x, x, al.s, w, al.mean, al.rstd);
  AddNormResult ar = add_rmsnorm(x, x, w, 1e-5f);
  RmsNormGrads arg = add_rmsnorm_backward(x, Tensor(), ar.s, w, ar.rstd);
  return {ln.y,      ln.mean,    ln.rstd, lg.dx,   lg.dweight, lg.dbias,   rn.y,   rn.rstd,
          rg.dx,     rg.dweight, al.s,    al.y,    al.mean,    al.rstd,    alg.dx, alg.dweight,
          alg.dbias, ar.s,       ar.y,    ar.rstd, arg.dx,     arg.dweight};
}

OpInfo norms() {
  OpInfo e;
  e.name = "norms";
  e.backend = {"layernorm_forward",   "layernorm_backward",    "rmsnorm_forward",
               "rmsnorm_backward",    "add_layernorm_forward", "add_layernorm_backward",
               "add_rmsnorm_forward", "add_rmsnorm_backward"};
  e.api = {"layernorm",     "layernorm_backward",     "rmsnorm",     "rmsnorm_backward",
           "add_layernorm", "add_layernorm_backward", "add_rmsnorm", "add_rmsnorm_backward"};
  e.functions = {"layernorm", "rmsnorm", "add_layernorm", "add_rmsnorm"};
  e.gradcheck = {
      {"layernorm",
       {{{3, 4, 7}, T}, {{7}}, {{7}}},
       [](V x) { return autograd::layernorm(x[0], x[1], x[2], 1e-5f); }},
      {"rmsnorm", {{{5, 9}, S}, {{9}}}, [](V x) { return autograd::rmsnorm(x[0], x[1], 1e-6f); }},
      // Both outputs reach the objective: backward adds ds to the norm's dx.
      {"add_layernorm",
       {{{3, 7}, T}, {{3, 7}}, {{7}}, {{7}}},
       [](V x) {
         auto [s, y] = autograd::add_layernorm(x[0], x[1], x[2], x[3], 1e-5f);
         return autograd::add(autograd::square(s), y);
       }},
      {"add_layernorm_no_sum",
       {{{4, 6}}, {{4, 6}, S}, {{6}}, {{6}}},
       [](V x) { return autograd::add_layernorm(x[0], x[1], x[2], x[3], 1e-5f, false).second; }},
      {"add_rmsnorm",
       {{{4, 7}, S}, {{4, 7}}, {{7}}},
       [](V x) {
         auto [s, y] = autograd::add_rmsnorm(x[0], x[1], x[2], 1e-6f);
         return autograd::add(autograd::square(s), y);
       }},
      {"add_rmsnorm_no_sum", {{{3, 5}}, {{3, 5}, T}, {{5}}}, [](V x) {
         return autograd::add_rmsnorm(x[0], x[1], x[2], 1e-6f, false).second;
       }}};
  e.lowp.push_back({"layernorm",
                    [](DType dt) {
                      Tensor x = lp({3, 5, 48}, 23, dt, -2.f, 3.f),
                             w = lp({48}, 24, dt, 0.5f, 1.5f), b = lp({48}, 25, dt);
                      // mean, rstd: F32 from the lp run
                      tensor::NormResult r = tensor::layernorm(x, w, b, 1e-5f);
                      return Ts{x, w, b, lp({3, 5, 48}, 26, dt), r.mean, r.rstd};
                    },
                    [](const Ts& x) {
                      tensor::NormResult r = tensor::layernorm(x[0], x[1], x[2], 1e-5f);
                      tensor::LayerNormGrads g =
                          tensor::layernorm_backward(x[3], x[0], x[1], x[4], x[5]);
                      return Ts{r.y, r.mean, r.rstd, g.dx, g.dweight, g.dbias};
                    },
                    {LowpOut::Compute, LowpOut::F32, LowpOut::F32, LowpOut::Compute,
                     LowpOut::Compute, LowpOut::Compute}});
  e.lowp.push_back({"rmsnorm",
                    [](DType dt) {
                      Tensor x = lp({70, 40}, 27, dt, -2.f, 3.f), w = lp({40}, 28, dt, 0.5f, 1.5f);
                      tensor::NormResult r = tensor::rmsnorm(x, w, 1e-6f);
                      return Ts{x, w, lp({70, 40}, 29, dt), r.rstd};
                    },
                    [](const Ts& x) {
                      tensor::NormResult r = tensor::rmsnorm(x[0], x[1], 1e-6f);
                      tensor::RmsNormGrads g = tensor::rmsnorm_backward(x[2], x[0], x[1], x[3]);
                      return Ts{r.y, r.rstd, g.dx, g.dweight};
                    },
                    {LowpOut::Compute, LowpOut::F32, LowpOut::Compute, LowpOut::Compute}});
  e.cuda = [](DType dt) {
    using namespace tensor;
    const Tensor a = rnd({4, 33, 17}, 1), b = rnd({33, 17}, 2),
                 pos = rnd({4, 33, 17}, 3, 0.1f, 3.f);
    const Tensor x2 = rnd({37, 96}, 7), w = rnd({96}, 8), bias = rnd({96}, 9),
                 dy = rnd({37, 96}, 10);
    const Device cpu = Device::cpu();
    std::vector<DeviceSample> c;
    c.push_back({"layernorm", [=](Device d) {
                   NormResult r = layernorm(on(x2, dt, d), on(w, dt, d), on(bias, dt, d), 1e-5f);
                   NormResult rc =
                       layernorm(on(x2, dt, cpu), on(w, dt, cpu), on(bias, dt, cpu), 1e-5f);
                   LayerNormGrads g = layernorm_backward(on(dy, dt, d), on(x2, dt, d), on(w, dt, d),
                                                         rc.mean.to(d), rc.rstd.to(d));
                   return Ts{r.y, r.mean, r.rstd, g.dx, g.dweight, g.dbias};
                 }});
    c.push_back({"rmsnorm_softmax", [=](Device d) {
                   NormResult r = rmsnorm(on(x2, dt, d), on(w, dt, d), 1e-6f);
                   NormResult rc = rmsnorm(on(x2, dt, cpu), on(w, dt, cpu), 1e-6f);
                   RmsNormGrads g =
                       rmsnorm_backward(on(dy, dt, d), on(x2, dt, d), on(w, dt, d), rc.rstd.to(d));
                   Tensor s = softmax(on(x2, dt, d));
                   Tensor sc = softmax(on(x2, dt, cpu)).to(d);
                   return Ts{r.y, r.rstd, g.dx, g.dweight, s, softmax_backward(sc, on(dy, dt, d))};
                 }});
    // The norms and softmax on rows of 17 (no 128-bit packs: the one-element path of the same
    // kernels, Note [CUDA fused residual norm], Note [CUDA softmax]); the 96-wide rows above
    // take the packed one.
    c.push_back(
        {"norms_odd_width", [=](Device d) {
           const Tensor xo = on(a, dt, d).reshape({-1, 17}), go = on(pos, dt, d).reshape({-1, 17});
           const Tensor wo = on(b.select(0, 1), dt, d), bo = on(b.select(0, 2), dt, d);
           NormResult l = layernorm(xo, wo, bo, 1e-5f);
           const Tensor xc = on(a, dt, cpu).reshape({-1, 17});
           NormResult lc =
               layernorm(xc, on(b.select(0, 1), dt, cpu), on(b.select(0, 2), dt, cpu), 1e-5f);
           LayerNormGrads lg = layernorm_backward(go, xo, wo, lc.mean.to(d), lc.rstd.to(d));
           NormResult r = rmsnorm(xo, wo, 1e-6f);
           NormResult rc = rmsnorm(xc, on(b.select(0, 1), dt, cpu), 1e-6f);
           RmsNormGrads rg = rmsnorm_backward(go, xo, wo, rc.rstd.to(d));
           // Softmax on the same rows: its one-element path (Note [CUDA softmax]).
           const Tensor so = softmax(xo), sg = softmax_backward(softmax(xc).to(d), go);
           return Ts{l.y, l.mean, l.rstd, lg.dx,      lg.dweight, lg.dbias,
                     r.y, r.rstd, rg.dx,  rg.dweight, so,         sg};
         }});
    return c;
  };
  e.empty = [](DType dt) {
    auto z = [dt](const Shape& s, Device d) { return tensor::zeros(s, dt, d); };
    auto r = [dt](const Shape& s, uint64_t stream, Device d) {
      return tensor::uniform(s, {7, stream}, -1.f, 1.f).to(dt).to(d);
    };
    std::vector<DeviceSample> c;
    c.push_back({"norms", [=](Device d) {
                   return all_norms(z({0, 8}, d), r({8}, 12, d), r({8}, 13, d));
                 }});
    // No features: empty outputs, [0] weight gradients, NaN statistics (the mean of nothing),
    // and no kernel called (Note [Norms over no features] in tensor/ops_norm.cpp).
    c.push_back({"norms_no_features", [=](Device d) {
                   return all_norms(z({3, 0}, d), z({0}, d), z({0}, d));
                 }});
    return c;
  };
  // The four norms, forward and backward (output 12: ds + round(dx)).
  e.random = {
      4, [](Draw& r) -> RandomSample {
        using namespace tensor;
        const int64_t rows = r.size(1, 300), c = r.size(1, 700);
        const Tensor x = r.values({rows, c}), res = r.values({rows, c}), w = r.values({c}),
                     b = r.values({c}), dy = r.values({rows, c}), ds = r.values({rows, c});
        const Device cpu = Device::cpu();
        return {"norms rows=" + std::to_string(rows) + " c=" + std::to_string(c),
                [=, &r](DType dt, Device d) {
                  const Tensor xd = some_layout(r, on(x, dt, d)), wd = on(w, dt, d),
                               bd = on(b, dt, d), dyd = on(dy, dt, d);
                  NormResult ln = layernorm(xd, wd, bd, 1e-5f);
                  NormResult lc = layernorm(on(x, dt, cpu), on(w, dt, cpu), on(b, dt, cpu), 1e-5f);
                  LayerNormGrads lg = layernorm_backward(dyd, xd, wd, lc.mean.to(d), lc.rstd.to(d));
                  NormResult rn = rmsnorm(xd, wd, 1e-6f);
                  NormResult rc = rmsnorm(on(x, dt, cpu), on(w, dt, cpu), 1e-6f);
                  RmsNormGrads rg = rmsnorm_backward(dyd, xd, wd, rc.rstd.to(d));
                  AddNormResult al = add_layernorm(xd, on(res, dt, d), wd, bd, 1e-5f);
                  AddNormResult ac = add_layernorm(on(x, dt, cpu), on(res, dt, cpu), on(w, dt, cpu),
                                                   on(b, dt, cpu), 1e-5f);
                  LayerNormGrads alg = add_layernorm_backward(dyd, on(ds, dt, d), ac.s.to(d), wd,
                                                              ac.mean.to(d), ac.rstd.to(d));
                  AddNormResult ar = add_rmsnorm(xd, on(res, dt, d), wd, 1e-6f);
                  AddNormResult arc =
                      add_rmsnorm(on(x, dt, cpu), on(res, dt, cpu), on(w, dt, cpu), 1e-6f);
                  RmsNormGrads arg =
                      add_rmsnorm_backward(dyd, Tensor(), arc.s.to(d), wd, arc.rstd.to(d));
                  return Ts{ln.y,     ln.mean, ln.rstd, lg.dx,       lg.dweight,
                            lg.dbias, rn.y,    rn.rstd, rg.dx,       rg.dweight,
                            al.s,     al.y,    alg.dx,  alg.dweight, alg.dbias,
                            ar.y,     ar.rstd, arg.dx,  arg.dweight};
                },
                1e-4,
                1e-4,
                {{12, ds}}};
      }};
  using MV = std::vector<Tensor>;
  const auto r = [](const Shape& s, uint64_t stream, Device d) {
    return mixed_operand(s, stream, d);
  };
  e.mixed = {
      {"layernorm",
       [=](Device d) {
         return MV{r({3, 8}, 1, d), r({8}, 2, d), r({8}, 3, d)};
       },
       [](MV& t) { tensor::layernorm(t[0], t[1], t[2], 1e-5f); }},
      {"rmsnorm",
       [=](Device d) {
         return MV{r({3, 8}, 1, d), r({8}, 2, d)};
       },
       [](MV& t) { tensor::rmsnorm(t[0], t[1], 1e-5f); }},
      // Backward operands: dy, x, weight, then the statistics the forward gave (made on d).
      {"layernorm_backward",
       [=](Device d) {
         const Tensor x = r({3, 8}, 1, d), w = r({8}, 2, d);
         tensor::NormResult n = tensor::layernorm(x, w, r({8}, 3, d), 1e-5f);
         return MV{r({3, 8}, 4, d), x, w, n.mean, n.rstd};
       },
       [](MV& t) { tensor::layernorm_backward(t[0], t[1], t[2], t[3], t[4]); }},
      {"rmsnorm_backward",
       [=](Device d) {
         const Tensor x = r({3, 8}, 1, d), w = r({8}, 2, d);
         return MV{r({3, 8}, 4, d), x, w, tensor::rmsnorm(x, w, 1e-5f).rstd};
       },
       [](MV& t) { tensor::rmsnorm_backward(t[0], t[1], t[2], t[3]); }},
      {"add_layernorm",
       [=](Device d) {
         return MV{r({3, 8}, 1, d), r({3, 8}, 5, d), r({8}, 2, d), r({8}, 3, d)};
       },
       [](MV& t) { tensor::add_layernorm(t[0], t[1], t[2], t[3], 1e-5f); }},
      {"add_rmsnorm",
       [=](Device d) {
         return MV{r({3, 8}, 1, d), r({3, 8}, 5, d), r({8}, 2, d)};
       },
       [](MV& t) { tensor::add_rmsnorm(t[0], t[1], t[2], 1e-5f); }},
      {"add_layernorm_backward",
       [=](Device d) {
         const Tensor w = r({8}, 2, d);
         tensor::AddNormResult n =
             tensor::add_layernorm(r({3, 8}, 1, d), r({3, 8}, 5, d), w, r({8}, 3, d), 1e-5f);
         return MV{r({3, 8}, 4, d), r({3, 8}, 6, d), n.s, w, n.mean, n.rstd};
       },
       [](MV& t) { tensor::add_layernorm_backward(t[0], t[1], t[2], t[3], t[4], t[5]); }},
      {"add_rmsnorm_backward",
       [=](Device d) {
         const Tensor w = r({8}, 2, d);
         tensor::AddNormResult n = tensor::add_rmsnorm(r({3, 8}, 1, d), r({3, 8}, 5, d), w, 1e-5f);
         return MV{r({3, 8}, 4, d), r({3, 8}, 6, d), n.s, w, n.rstd};
       },
       [](MV& t) { tensor::add_rmsnorm_backward(t[0], t[1], t[2], t[3], t[4]); }}};
  return e;
}

OpInfo softmax() {
  OpInfo e;
  e.name = "softmax";
  e.backend = {"softmax_forward", "softmax_backward"};
  e.api = {"softmax", "softmax_backward"};
  e.functions = {"softmax"};
  e.gradcheck = {{"softmax", {{{3, 2, 7}, T}}, [](V x) { return autograd::softmax(x[0]); }}};
  e.lowp.push_back({"softmax",
                    [](DType dt) {
                      Tensor x = lp({9, 33}, 30, dt, -4.f, 4.f);
                      return Ts{x, tensor::softmax(x), lp({9, 33}, 31, dt)};
                    },
                    [](const Ts& x) {
                      return Ts{tensor::softmax(x[0]), tensor::softmax_backward(x[1], x[2])};
                    },
                    {LowpOut::Compute, LowpOut::Compute}});
  // CUDA agreement on hand-picked shapes: the norms entry's rmsnorm_softmax and norms_odd_width.
  e.empty = [](DType dt) {
    auto z = [dt](const Shape& s, Device d) { return tensor::zeros(s, dt, d); };
    std::vector<DeviceSample> c;
    c.push_back({"softmax_no_features", [=](Device d) {
                   const Tensor y = tensor::softmax(z({3, 0}, d));
                   return Ts{y, tensor::softmax_backward(y, z({3, 0}, d))};
                 }});
    c.push_back({"softmax", [=](Device d) {
                   const Tensor y = tensor::softmax(z({0, 5}, d));
                   return Ts{y, tensor::softmax_backward(y, z({0, 5}, d))};
                 }});
    return c;
  };
  // Forward and backward.
  e.random = {5, [](Draw& r) -> RandomSample {
                const int64_t rows = r.size(1, 200), c = r.size(1, 1500);
                const Tensor x = r.values({rows, c}, -8.f, 8.f), dy = r.values({rows, c});
                return {"softmax rows=" + std::to_string(rows) + " c=" + std::to_string(c),
                        [=, &r](DType dt, Device d) {
                          const Tensor y = tensor::softmax(on(x, dt, Device::cpu()));
                          return Ts{tensor::softmax(some_layout(r, on(x, dt, d))),
                                    tensor::softmax_backward(y.to(d), on(dy, dt, d))};
                        }};
              }};
  using MV = std::vector<Tensor>;
  e.mixed = {{"softmax_backward",
              [](Device d) {
                return MV{mixed_operand({3, 4}, 1, d), mixed_operand({3, 4}, 2, d)};
              },
              [](MV& t) { tensor::softmax_backward(t[0], t[1]); }}};
  return e;
}

}  // namespace

void add_norm_ops(std::vector<OpInfo>& table) {
  table.push_back(norms());
  table.push_back(softmax());
}

}  // namespace strata::testing
