// Op table entries: scaled-dot-product attention (and the packed-qkv function on it), rotary
// embedding.
#include <string>

#include "autograd/functions.h"
#include "tests/support/op_table.h"

namespace strata::testing {

namespace {

using autograd::Variable;
using V = const std::vector<Variable>&;
using Ts = std::vector<Tensor>;
constexpr Layout T = Layout::Transposed, S = Layout::Strided;

OpInfo attention() {
  OpInfo e;
  e.name = "attention";
  e.backend = {"attention_forward", "attention_backward"};
  e.api = {"attention", "attention_backward", "attention_backward_into"};
  e.functions = {"attention", "attention_qkv"};
  e.gradcheck = {{"attention_causal",
                  {{{2, 3, 5, 4}}, {{2, 3, 5, 4}, T}, {{2, 3, 5, 4}, S}},
                  [](V x) { return autograd::attention(x[0], x[1], x[2], true); }},
                 {"attention_full_tq_ne_tk",
                  {{{1, 2, 3, 4}}, {{1, 2, 6, 4}}, {{1, 2, 6, 4}}},
                  [](V x) { return autograd::attention(x[0], x[1], x[2], false, 0.7f); }},
                 {"attention_causal_tq_lt_tk",
                  {{{1, 2, 3, 4}}, {{1, 2, 7, 4}}, {{1, 2, 7, 4}}},
                  [](V x) { return autograd::attention(x[0], x[1], x[2], true); }},
                 {"attention_qkv_causal",
                  {{{2, 5, 24}}},
                  [](V x) { return autograd::attention_qkv(x[0], 2, true); }},
                 {"attention_qkv_full", {{{1, 4, 18}, T}}, [](V x) {
                    return autograd::attention_qkv(x[0], 3, false, 0.6f);
                  }}};
  for (bool causal : {true, false}) {
    e.lowp.push_back(
        {std::string("attention causal=") + (causal ? "1" : "0"),
         [](DType dt) {
           Tensor q = lp({2, 3, 13, 16}, 32, dt), k = lp({2, 3, 21, 16}, 33, dt),
                  v = lp({2, 3, 21, 16}, 34, dt);
           tensor::AttentionResult r = tensor::attention(q, k, v, true);
           tensor::AttentionResult r2 = tensor::attention(q, k, v, false);
           return Ts{q, k, v, r.out, r.lse, r2.out, r2.lse, lp({2, 3, 13, 16}, 35, dt)};
         },
         [causal](const Ts& x) {
           tensor::AttentionResult r = tensor::attention(x[0], x[1], x[2], causal);
           const Tensor& out = causal ? x[3] : x[5];
           const Tensor& lse = causal ? x[4] : x[6];
           tensor::AttentionGrads g =
               tensor::attention_backward(x[0], x[1], x[2], out, lse, x[7], causal);
           return Ts{r.out, r.lse, g.dq, g.dk, g.dv};
         },
         {LowpOut::Compute, LowpOut::F32, LowpOut::Compute, LowpOut::Compute, LowpOut::Compute}});
  }
  e.cuda = [](DType dt) {
    const Tensor q = rnd({2, 3, 29, 40}, 11), k = rnd({2, 3, 29, 40}, 12),
                 v = rnd({2, 3, 29, 40}, 13);
    const Tensor dout = rnd({2, 3, 29, 40}, 14);
    const Device cpu = Device::cpu();
    std::vector<DeviceSample> c;
    for (bool causal : {false, true}) {
      c.push_back({std::string("attention_") + (causal ? "causal" : "full"), [=](Device d) {
                     tensor::AttentionResult r =
                         tensor::attention(on(q, dt, d), on(k, dt, d), on(v, dt, d), causal, 0.f);
                     tensor::AttentionResult rc = tensor::attention(on(q, dt, cpu), on(k, dt, cpu),
                                                                    on(v, dt, cpu), causal, 0.f);
                     tensor::AttentionGrads g = tensor::attention_backward(
                         on(q, dt, d), on(k, dt, d), on(v, dt, d), rc.out.to(d), rc.lse.to(d),
                         on(dout, dt, d), causal, 0.f);
                     return Ts{r.out, r.lse, g.dq, g.dk, g.dv};
                   }});
    }
    return c;
  };
  e.empty = [](DType dt) {
    auto z = [dt](const Shape& s, Device d) { return tensor::zeros(s, dt, d); };
    auto r = [dt](const Shape& s, uint64_t stream, Device d) {
      return tensor::uniform(s, {7, stream}, -1.f, 1.f).to(dt).to(d);
    };
    std::vector<DeviceSample> c;
    for (const Shape& s : {Shape{0, 2, 4, 64}, Shape{1, 0, 4, 64}, Shape{1, 2, 0, 64}})
      c.push_back({"attention " + s.str(), [=](Device d) {
                     const Tensor q = z(s, d);
                     tensor::AttentionResult a = tensor::attention(q, q, q, true);
                     tensor::AttentionGrads g =
                         tensor::attention_backward(q, q, q, a.out, a.lse, q, true);
                     return Ts{a.out, a.lse, g.dq, g.dk, g.dv};
                   }});
    c.push_back({"attention_no_keys", [=](Device d) {  // queries, but no key to attend to
                   const Tensor q = r({1, 2, 3, 64}, 21, d), kv = z({1, 2, 0, 64}, d);
                   tensor::AttentionResult a = tensor::attention(q, kv, kv, false);
                   tensor::AttentionGrads g = tensor::attention_backward(
                       q, kv, kv, a.out, a.lse, r({1, 2, 3, 64}, 22, d), false);
                   return Ts{a.out, a.lse, g.dq, g.dk, g.dv};
                 }});
    return c;
  };
  // Forward and backward, with the tensor-core head dims and others.
  e.random = {6, [](Draw& r) -> RandomSample {
                const int64_t b = r.size(1, 2), h = r.size(1, 3), tq = r.size(1, 80);
                const bool causal = r.coin();
                const int64_t tk = r.coin() ? tq : r.size(1, 80);
                const int64_t dh = r.pick<int64_t>({8, 16, 24, 32, 40, 64, 80, 96, 128});
                const Tensor q = r.values({b, h, tq, dh}), k = r.values({b, h, tk, dh}),
                             v = r.values({b, h, tk, dh}), dout = r.values({b, h, tq, dh});
                const Device cpu = Device::cpu();
                return {"attention B=" + std::to_string(b) + " H=" + std::to_string(h) +
                            " Tq=" + std::to_string(tq) + " Tk=" + std::to_string(tk) +
                            " D=" + std::to_string(dh) + (causal ? " causal" : ""),
                        [=](DType dt, Device d) {
                          tensor::AttentionResult a =
                              tensor::attention(on(q, dt, d), on(k, dt, d), on(v, dt, d), causal);
                          tensor::AttentionResult ac = tensor::attention(
                              on(q, dt, cpu), on(k, dt, cpu), on(v, dt, cpu), causal);
                          tensor::AttentionGrads g = tensor::attention_backward(
                              on(q, dt, d), on(k, dt, d), on(v, dt, d), ac.out.to(d), ac.lse.to(d),
                              on(dout, dt, d), causal);
                          return Ts{a.out, a.lse, g.dq, g.dk, g.dv};
                        },
                        1e-4,
                        1e-4,
                        {},
                        dh == 64 || dh == 128};
              }};
  using MV = std::vector<Tensor>;
  const auto qkv = [](Device d) {
    return MV{mixed_operand({1, 2, 4, 8}, 1, d), mixed_operand({1, 2, 4, 8}, 2, d),
              mixed_operand({1, 2, 4, 8}, 3, d)};
  };
  const auto attn_bwd_in = [qkv](Device d) {
    MV t = qkv(d);
    tensor::AttentionResult a = tensor::attention(t[0], t[1], t[2], true);
    t.insert(t.end(), {a.out, a.lse, mixed_operand({1, 2, 4, 8}, 4, d)});
    return t;
  };
  e.mixed = {{"attention", qkv, [](MV& t) { tensor::attention(t[0], t[1], t[2], true); }},
             {"attention_backward", attn_bwd_in,
              [](MV& t) { tensor::attention_backward(t[0], t[1], t[2], t[3], t[4], t[5], true); }},
             {"attention_backward_into",
              [=](Device d) {
                MV t = attn_bwd_in(d);
                for (int i = 0; i < 3; ++i) t.push_back(Tensor::empty({1, 2, 4, 8}, DType::F32, d));
                return t;
              },
              [](MV& t) {
                tensor::attention_backward_into(t[0], t[1], t[2], t[3], t[4], t[5], true, 0.f, t[6],
                                                t[7], t[8]);
              }}};
  return e;
}

OpInfo rotary() {
  OpInfo e;
  e.name = "rotary";
  e.backend = {"rotary"};
  e.api = {"rotary", "rotary_tables"};
  e.functions = {"rotary"};
  e.gradcheck = {{"rotary", {{{2, 5, 3, 6}, S}}, [](V x) {
                    auto [cs, sn] = tensor::rotary_tables(5, 6);
                    return autograd::rotary(x[0], cs, sn);
                  }}};
  e.lowp.push_back({"rotary",
                    [](DType dt) {
                      auto [c, s] = tensor::rotary_tables(6, 8);
                      return Ts{lp({2, 6, 3, 8}, 36, dt), c, s, c.to(dt), s.to(dt)};
                    },
                    [](const Ts& x) {
                      // F32 tables (as rotary_tables makes them) and tables in the compute dtype.
                      return Ts{tensor::rotary(x[0], x[1], x[2]),
                                tensor::rotary(x[0], x[1], x[2], true),
                                tensor::rotary(x[0], x[3], x[4])};
                    },
                    {LowpOut::Compute, LowpOut::Compute, LowpOut::Compute}});
  e.cuda = [](DType dt) {
    const Tensor rx = rnd({2, 5, 3, 8}, 18), rx6 = rnd({2, 5, 3, 6}, 27);
    const bool lowp = dt != DType::F32;
    std::vector<DeviceSample> c;
    c.push_back({"rotary", [=](Device d) {
                   auto [cs, sn] = tensor::rotary_tables(5, 8, 10000.0, 0, d);
                   Ts r{tensor::rotary(on(rx, dt, d), cs, sn, false),
                        tensor::rotary(on(rx, dt, d), cs, sn, true)};
                   if (lowp)
                     r.push_back(tensor::rotary(on(rx, dt, d), cs.to(dt), sn.to(dt), false));
                   // Head dim 6 (3 pairs): groups of 2 or 4 pairs (Note [CUDA element groups])
                   // straddle rows, so the one-element path, carrying the position from row to
                   // row.
                   auto [cs6, sn6] = tensor::rotary_tables(5, 6, 10000.0, 0, d);
                   r.push_back(tensor::rotary(on(rx6, dt, d), cs6, sn6, false));
                   return r;
                 }});
    return c;
  };
  e.empty = [](DType dt) {
    std::vector<DeviceSample> c;
    c.push_back(
        {"rotary", [=](Device d) {
           auto [cos, sin] = tensor::rotary_tables(4, 8, 10000.0, 0, d);
           return Ts{tensor::rotary(tensor::zeros({0, 4, 2, 8}, dt, d), cos.to(dt), sin.to(dt))};
         }});
    return c;
  };
  // Rotary, embedding forward and backward.
  e.random = {
      7, [](Draw& r) -> RandomSample {
        const int64_t b = r.size(1, 3), t = r.size(1, 40), h = r.size(1, 4), dh = 2 * r.size(1, 40);
        const int64_t vocab = r.size(1, 200), c = r.size(1, 100), n = r.size(0, 300);
        const Tensor x = r.values({b, t, h, dh}), table = r.values({vocab, c}),
                     ids = r.ids(n, vocab), dout = r.values({n, c}), dw0 = r.values({vocab, c});
        const bool inverse = r.coin();
        return {"rotary " + Shape{b, t, h, dh}.str() + ", embedding V=" + std::to_string(vocab) +
                    " C=" + std::to_string(c) + " ids=" + std::to_string(n),
                [=](DType dt, Device d) {
                  auto [cs, sn] = tensor::rotary_tables(t, dh, 10000.0, 3, d);
                  Tensor dw = on(dw0, dt, d).clone();
                  tensor::embedding_backward(ids.to(d), on(dout, dt, d), dw);
                  return Ts{tensor::rotary(on(x, dt, d), cs, sn, inverse),
                            tensor::embedding(on(table, dt, d), ids.to(d)), dw};
                }};
      }};
  using MV = std::vector<Tensor>;
  e.mixed = {{"rotary",
              [](Device d) {
                auto [cos, sin] = tensor::rotary_tables(4, 8, 10000.0, 0, d);
                return MV{mixed_operand({1, 4, 2, 8}, 1, d), cos, sin};
              },
              [](MV& t) { tensor::rotary(t[0], t[1], t[2]); }}};
  return e;
}

}  // namespace

void add_attention_ops(std::vector<OpInfo>& table) {
  table.push_back(attention());
  table.push_back(rotary());
}

}  // namespace strata::testing
