// Op table entries: matmul, linear with its epilogues (and the fused MLPs built on it), and
// activation checkpointing.
#include <fmt/format.h>

#include <string>

#include "autograd/checkpoint.h"
#include "autograd/functions.h"
#include "tests/support/op_table.h"

namespace strata::testing {

namespace {

using autograd::Variable;
using tensor::Activation;
using V = const std::vector<Variable>&;
using Ts = std::vector<Tensor>;
constexpr Layout T = Layout::Transposed, S = Layout::Strided;

OpInfo matmul() {
  OpInfo e;
  e.name = "matmul";
  e.backend = {"matmul"};
  e.api = {"matmul", "matmul_out"};
  e.functions = {"matmul"};
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      Shape sa = ta ? Shape{5, 3} : Shape{3, 5};
      Shape sb = tb ? Shape{7, 5} : Shape{5, 7};
      e.gradcheck.push_back({fmt::format("matmul_{}{}", ta ? "T" : "N", tb ? "T" : "N"),
                             {{sa, S}, {sb, T}},
                             [ta, tb](V x) { return autograd::matmul(x[0], x[1], ta, tb); }});
      Shape ba = ta ? Shape{2, 5, 3} : Shape{2, 3, 5};
      e.gradcheck.push_back({fmt::format("matmul_shared_b_{}{}", ta ? "T" : "N", tb ? "T" : "N"),
                             {{ba}, {sb}},
                             [ta, tb](V x) { return autograd::matmul(x[0], x[1], ta, tb); }});
    }
  e.gradcheck.push_back({"matmul_batched", {{{2, 3, 4, 5}, T}, {{2, 3, 5, 3}}}, [](V x) {
                           return autograd::matmul(x[0], x[1]);
                         }});
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      e.lowp.push_back({"matmul ta=" + std::to_string(ta) + " tb=" + std::to_string(tb),
                        [ta, tb](DType dt) {
                          return Ts{lp(ta ? Shape{2, 45, 30} : Shape{2, 30, 45}, 19, dt),
                                    lp(tb ? Shape{27, 45} : Shape{45, 27}, 20, dt),
                                    lp(tb ? Shape{2, 27, 45} : Shape{2, 45, 27}, 21, dt),
                                    lp({2, 30, 27}, 22, dt)};
                        },
                        [ta, tb](const Ts& x) {
                          Tensor accum = x[3].clone();  // beta != 0 reads the old output
                          tensor::matmul_out(x[0], x[1], accum, ta, tb, 0.5f, 0.75f);
                          Tensor mixed = Tensor::empty({2, 30, 27}, DType::F32);
                          tensor::matmul_out(x[0], x[2], mixed, ta, tb);
                          return Ts{tensor::matmul(x[0], x[1], ta, tb),
                                    tensor::matmul(x[0], x[2], ta, tb), accum, mixed};
                        },
                        {LowpOut::Compute, LowpOut::Compute, LowpOut::Compute, LowpOut::F32},
                        /*exact=*/false,
                        /*adapter_exact=*/false,
                        /*every_matmul_engine=*/true});
    }
  e.cuda = [](DType dt) {
    const Tensor m1 = rnd({3, 40, 24}, 4), m2 = rnd({24, 56}, 5), m3 = rnd({3, 56, 24}, 6);
    const bool lowp = dt != DType::F32;
    const Device cpu = Device::cpu();
    std::vector<DeviceSample> c;
    c.push_back({"matmul", [=](Device d) {
                   // beta != 0 reads `o`: start both devices from the CPU's product.
                   Tensor o = tensor::matmul(on(m1, dt, cpu), on(m2, dt, cpu)).to(d);
                   tensor::matmul_out(on(m1, dt, d), on(m3, dt, d), o, false, true, 0.5f, 2.f);
                   Ts r{tensor::matmul(on(m1, dt, d), on(m2, dt, d)), o,
                        tensor::matmul(on(m1, dt, d), on(m1, dt, d), true, false)};
                   if (lowp) {  // mixed output: low-precision inputs into an F32 out
                     Tensor o32 = tensor::zeros({3, 40, 56}, DType::F32, d);
                     tensor::matmul_out(on(m1, dt, d), on(m2, dt, d), o32, false, false, 1.f, 0.f);
                     r.push_back(o32);
                   }
                   return r;
                 }});
    if (!lowp) {
      c.push_back({"matmul_bf16_inputs",
                   [=](Device d) {
                     return Ts{tensor::matmul(on(m1, dt, d).to(DType::BF16),
                                              on(m2, dt, d).to(DType::BF16))};
                   },
                   2e-2, 2e-2});
    }
    return c;
  };
  e.empty = [](DType dt) {
    auto z = [dt](const Shape& s, Device d) { return tensor::zeros(s, dt, d); };
    auto r = [dt](const Shape& s, uint64_t stream, Device d) {
      return tensor::uniform(s, {7, stream}, -1.f, 1.f).to(dt).to(d);
    };
    std::vector<DeviceSample> c;
    c.push_back({"matmul", [=](Device d) {
                   Tensor o = r({3, 5}, 4, d);
                   tensor::matmul_out(z({3, 0}, d), z({0, 5}, d), o, false, false, 1.f, 0.5f);
                   return Ts{tensor::matmul(z({0, 4}, d), r({4, 5}, 5, d)),
                             tensor::matmul(z({3, 0}, d), z({0, 5}, d)),
                             tensor::matmul(r({3, 4}, 6, d), z({4, 0}, d)),
                             tensor::matmul(z({2, 0, 4}, d), r({4, 5}, 7, d)), o};
                 }});
    return c;
  };
  // Batched or not, either operand transposed, beta reading out.
  e.random = {2, [](Draw& r) -> RandomSample {
                const int64_t m = r.size(1, 150), n = r.size(1, 150), k = r.size(1, 150);
                const int64_t batch = r.size(1, 3);
                const bool ta = r.coin(), tb = r.coin(), batched_b = r.coin();
                const Tensor a = r.values(ta ? Shape{batch, k, m} : Shape{batch, m, k});
                const Shape bs = tb ? Shape{n, k} : Shape{k, n};
                const Tensor b = batched_b ? r.values({batch, bs[0], bs[1]}) : r.values(bs);
                const Tensor o = r.values({batch, m, n});
                return {"matmul m=" + std::to_string(m) + " n=" + std::to_string(n) +
                            " k=" + std::to_string(k) + (ta ? " a^T" : "") + (tb ? " b^T" : ""),
                        [=](DType dt, Device d) {
                          Tensor out = on(o, dt, d).clone();  // written in place: not an alias
                          tensor::matmul_out(on(a, dt, d), on(b, dt, d), out, ta, tb, 0.5f, 1.5f);
                          return Ts{tensor::matmul(on(a, dt, d), on(b, dt, d), ta, tb), out};
                        },
                        1e-4, 1e-4};
              }};
  using MV = std::vector<Tensor>;
  e.mixed = {{"matmul",
              [](Device d) {
                return MV{mixed_operand({3, 4}, 1, d), mixed_operand({4, 5}, 2, d)};
              },
              [](MV& t) { tensor::matmul(t[0], t[1]); }},
             {"matmul_out",
              [](Device d) {
                return MV{mixed_operand({3, 4}, 1, d), mixed_operand({4, 5}, 2, d),
                          mixed_operand({3, 5}, 3, d)};
              },
              [](MV& t) { tensor::matmul_out(t[0], t[1], t[2], false, false, 1.f, 1.f); }}};
  return e;
}

OpInfo linear() {
  OpInfo e;
  e.name = "linear";
  e.backend = {"linear_forward", "linear_backward_weight", "linear_backward_gelu"};
  e.api = {"linear", "linear_backward_weight", "linear_backward_weight_into",
           "linear_backward_gelu"};
  e.functions = {"linear", "tiled_linear", "mlp_gelu", "mlp_swiglu"};
  e.gradcheck = {{"linear",
                  {{{2, 3, 5}, T}, {{7, 5}}, {{7}}},
                  [](V x) { return autograd::linear(x[0], x[1], x[2]); }},
                 {"linear_no_bias",
                  {{{4, 5}}, {{3, 5}, T}},
                  [](V x) { return autograd::linear(x[0], x[1], Variable()); }},
                 {"tiled_linear",  // Note [Tiled linear]: 3 tiles of 7 outputs and of 5 inputs
                  {{{2, 3, 5}, T}, {{7, 5}}, {{7}}},
                  [](V x) { return autograd::tiled_linear(x[0], x[1], x[2], 3); }},
                 {"tiled_linear_no_bias",
                  {{{4, 5}}, {{3, 5}, T}},
                  [](V x) { return autograd::tiled_linear(x[0], x[1], Variable(), 2); }},
                 {"mlp_gelu",
                  {{{2, 3, 5}, T}, {{6, 5}}, {{6}}, {{4, 6}, S}, {{4}}},
                  [](V x) { return autograd::mlp_gelu(x[0], x[1], x[2], x[3], x[4]); }},
                 {"mlp_gelu_recompute",
                  {{{3, 5}}, {{6, 5}}, {{6}}, {{4, 6}}, {{4}}},
                  [](V x) { return autograd::mlp_gelu(x[0], x[1], x[2], x[3], x[4], true); }},
                 {"mlp_swiglu",
                  {{{2, 3, 5}, S}, {{6, 5}}, {{6, 5}, T}, {{4, 6}}},
                  [](V x) { return autograd::mlp_swiglu(x[0], x[1], x[2], x[3]); }},
                 {"mlp_swiglu_recompute", {{{3, 5}}, {{6, 5}}, {{6, 5}}, {{4, 6}}}, [](V x) {
                    return autograd::mlp_swiglu(x[0], x[1], x[2], x[3], true);
                  }}};
  e.empty = [](DType dt) {
    auto z = [dt](const Shape& s, Device d) { return tensor::zeros(s, dt, d); };
    auto r = [dt](const Shape& s, uint64_t stream, Device d) {
      return tensor::uniform(s, {7, stream}, -1.f, 1.f).to(dt).to(d);
    };
    const auto w = [=](Device d) { return r({5, 4}, 8, d); };
    const auto b = [=](Device d) { return r({5}, 9, d); };
    std::vector<DeviceSample> c;
    c.push_back({"linear", [=](Device d) {
                   return Ts{tensor::linear(z({0, 4}, d), w(d), b(d)).y,
                             tensor::linear(z({2, 0, 4}, d), w(d), Tensor()).y};
                 }});
    c.push_back({"linear_gelu", [=](Device d) {
                   tensor::LinearResult g =
                       tensor::linear(z({0, 4}, d), w(d), b(d), Activation::Gelu, true);
                   return Ts{g.y, g.pre};
                 }});
    c.push_back({"linear_no_features", [=](Device d) {  // K = 0: y = bias; N = 0: no outputs
                   tensor::LinearResult g =
                       tensor::linear(z({3, 0}, d), z({5, 0}, d), b(d), Activation::Gelu, true);
                   return Ts{tensor::linear(z({3, 0}, d), z({5, 0}, d), b(d)).y,
                             tensor::linear(z({3, 0}, d), z({5, 0}, d), Tensor()).y, g.y, g.pre,
                             tensor::linear(r({3, 4}, 11, d), z({0, 4}, d), z({0}, d)).y};
                 }});
    c.push_back({"linear_backward_no_features", [=](Device d) {
                   tensor::LinearWeightGrads k0 =
                       tensor::linear_backward_weight(r({3, 5}, 17, d), z({3, 0}, d), true);
                   tensor::LinearWeightGrads n0 =
                       tensor::linear_backward_weight(z({3, 0}, d), r({3, 4}, 18, d), true);
                   tensor::LinearGeluGrads gg = tensor::linear_backward_gelu(
                       r({3, 5}, 19, d), z({5, 0}, d), z({3, 0}, d), true);
                   tensor::LinearGeluGrads p0 = tensor::linear_backward_gelu(
                       z({3, 0}, d), z({0, 4}, d), r({3, 4}, 20, d), true);
                   return Ts{k0.dweight, k0.dbias, n0.dweight, n0.dbias,
                             gg.dpre,    gg.dbias, p0.dpre,    p0.dbias};
                 }});
    c.push_back({"linear_backward_weight", [=](Device d) {
                   tensor::LinearWeightGrads wg =
                       tensor::linear_backward_weight(z({0, 5}, d), z({0, 4}, d), true);
                   return Ts{wg.dweight, wg.dbias};
                 }});
    c.push_back(
        {"linear_backward_weight_into", [=](Device d) {
           Tensor into = r({5, 4}, 10, d);
           Tensor db = tensor::linear_backward_weight_into(z({0, 5}, d), z({0, 4}, d), into, true);
           return Ts{into, db};
         }});
    c.push_back({"linear_backward_gelu", [=](Device d) {
                   tensor::LinearGeluGrads gg =
                       tensor::linear_backward_gelu(z({0, 5}, d), w(d), z({0, 4}, d), true);
                   return Ts{gg.dpre, gg.dbias};
                 }});
    return c;
  };
  // Linear with its epilogues, and its backward pieces.
  e.random = {
      3, [](Draw& r) -> RandomSample {
        const int64_t rows = r.size(1, 200), kin = r.size(1, 150), nout = r.size(1, 150);
        const bool gelu = r.coin(), with_bias = r.coin();
        const Tensor x = r.values({rows, kin}), w = r.values({nout, kin}), b = r.values({nout});
        const Tensor dz = r.values({rows, nout}), dw0 = r.values({nout, kin});
        const Device cpu = Device::cpu();
        return {
            "linear rows=" + std::to_string(rows) + " k=" + std::to_string(kin) +
                " n=" + std::to_string(nout) + (gelu ? " gelu" : "") + (with_bias ? " bias" : ""),
            [=](DType dt, Device d) {
              const Tensor xd = on(x, dt, d), wd = on(w, dt, d);
              tensor::LinearResult y =
                  tensor::linear(xd, wd, with_bias ? on(b, dt, d) : Tensor(),
                                 gelu ? Activation::Gelu : Activation::None, gelu);
              Ts out{y.y};
              // The backward pieces on the CPU's pre, so each kernel sees the same
              // input.
              const Tensor pre = gelu ? tensor::linear(on(x, dt, cpu), on(w, dt, cpu),
                                                       with_bias ? on(b, dt, cpu) : Tensor(),
                                                       Activation::Gelu, true)
                                            .pre.to(d)
                                      : Tensor();
              if (gelu) out.push_back(y.pre);
              tensor::LinearWeightGrads wg =
                  tensor::linear_backward_weight(on(dz, dt, d), xd, true);
              Tensor into = on(dw0, dt, d).clone();
              Tensor db = tensor::linear_backward_weight_into(on(dz, dt, d), xd, into, with_bias);
              out.insert(out.end(), {wg.dweight, wg.dbias, into});
              if (with_bias) out.push_back(db);
              if (gelu) {
                // dz here is the gradient of y [rows, nout]; linear_backward_gelu
                // takes the gradient of the next layer's output through a weight
                // [P, nout].
                const Tensor w2 = on(w, dt, d).transpose(0, 1).contiguous();
                tensor::LinearGeluGrads gg = tensor::linear_backward_gelu(xd, w2, pre, true);
                out.insert(out.end(), {gg.dpre, gg.dbias});
              }
              return out;
            },
            1e-4, 1e-4};
      }};
  using MV = std::vector<Tensor>;
  e.mixed = {{"linear",
              [](Device d) {
                return MV{mixed_operand({3, 4}, 1, d), mixed_operand({5, 4}, 2, d),
                          mixed_operand({5}, 3, d)};
              },
              [](MV& t) { tensor::linear(t[0], t[1], t[2], Activation::Gelu, true); }},
             {"linear_backward_weight",
              [](Device d) {
                return MV{mixed_operand({3, 5}, 1, d), mixed_operand({3, 4}, 2, d)};
              },
              [](MV& t) { tensor::linear_backward_weight(t[0], t[1], true); }},
             {"linear_backward_weight_into",
              [](Device d) {
                return MV{mixed_operand({3, 5}, 1, d), mixed_operand({3, 4}, 2, d),
                          mixed_operand({5, 4}, 3, d)};
              },
              [](MV& t) { tensor::linear_backward_weight_into(t[0], t[1], t[2], true); }},
             {"linear_backward_gelu",
              [](Device d) {
                return MV{mixed_operand({3, 5}, 1, d), mixed_operand({5, 4}, 2, d),
                          mixed_operand({3, 4}, 3, d)};
              },
              [](MV& t) { tensor::linear_backward_gelu(t[0], t[1], t[2], true); }}};
  return e;
}

// autograd/checkpoint.h: recomputation in backward gives the gradients of the plain graph.
OpInfo checkpoint() {
  OpInfo e;
  e.name = "checkpoint";
  e.gradcheck = {{"checkpoint", {{{3, 5}}, {{4, 5}}}, [](V x) {
                    Variable w = x[1];
                    auto f = [w](const std::vector<Variable>& in) {
                      return std::vector<Variable>{
                          autograd::gelu(autograd::linear(in[0], w, Variable()))};
                    };
                    return autograd::checkpoint(f, {x[0]})[0];
                  }}};
  return e;
}

}  // namespace

void add_linalg_ops(std::vector<OpInfo>& table) {
  table.push_back(matmul());
  table.push_back(linear());
  table.push_back(checkpoint());
}

}  // namespace strata::testing
