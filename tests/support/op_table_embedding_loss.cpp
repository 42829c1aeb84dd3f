// Op table entries: embedding and cross-entropy (separate, in place and fused).
#include <string>
#include <tuple>

#include "autograd/functions.h"
#include "tests/support/op_table.h"

namespace strata::testing {

namespace {

using autograd::Variable;
using V = const std::vector<Variable>&;
using Ts = std::vector<Tensor>;
constexpr Layout T = Layout::Transposed;

OpInfo embedding() {
  OpInfo e;
  e.name = "embedding";
  e.backend = {"embedding_forward", "embedding_backward"};
  e.api = {"embedding", "embedding_backward"};
  e.functions = {"embedding"};
  e.gradcheck = {{"embedding", {{{7, 5}}}, [](V x) {
                    return autograd::embedding(x[0], tensor::from_ints({3, 0, 6, 3, 3, 1}, {2, 3}));
                  }}};
  e.lowp.push_back({"embedding_forward",
                    [](DType dt) {
                      return Ts{lp({11, 20}, 37, dt),
                                tensor::from_ints({3, 0, 10, 3, 7, 3}, {2, 3}, DType::I32)};
                    },
                    [](const Ts& x) { return Ts{tensor::embedding(x[0], x[1])}; },
                    {LowpOut::Compute},
                    /*exact=*/true});
  e.lowp.push_back({"embedding_backward",
                    [](DType dt) {
                      // Repeated ids: several positions sum into one row, on top of its old
                      // value.
                      return Ts{tensor::from_ints({3, 0, 10, 3, 7, 3, 3, 1}, {8}),
                                lp({8, 70}, 38, dt), lp({11, 70}, 39, dt)};
                    },
                    [](const Ts& x) {
                      Tensor dw = x[2].clone();
                      tensor::embedding_backward(x[0], x[1], dw);
                      return Ts{dw};
                    },
                    {LowpOut::Compute}});
  e.cuda = [](DType dt) {
    const Tensor emb = rnd({50, 24}, 15),
                 ids = tensor::from_ints({3, 7, 3, 49, 0, 3, 12}, {7}, DType::I32);
    const Tensor demb = rnd({7, 24}, 19), emb_grad0 = rnd({50, 24}, 20);
    const Tensor logits = rnd({7, 50}, 16, -5.f, 5.f);
    const Tensor targets = tensor::from_ints({1, -100, 49, 0, 3, 3, 20}, {7});
    const Tensor dloss = rnd({7}, 17);
    const Device cpu = Device::cpu();
    std::vector<DeviceSample> c;
    c.push_back({"embedding_backward_cross_entropy", [=](Device d) {
                   Tensor dw = tensor::zeros({50, 24}, dt, d);
                   tensor::embedding_backward(ids.to(d), on(demb, dt, d), dw);
                   // Accumulating into a non-zero dweight: f32 sums added to the old value.
                   Tensor dw2 = on(emb_grad0, dt, d).clone();
                   tensor::embedding_backward(ids.to(d), on(demb, dt, d), dw2);
                   tensor::CrossEntropyResult ce =
                       tensor::cross_entropy(on(logits, dt, d), targets.to(d), -100);
                   tensor::CrossEntropyResult cc =
                       tensor::cross_entropy(on(logits, dt, cpu), targets, -100);
                   return Ts{dw,
                             dw2,
                             ce.losses,
                             ce.lse,
                             ce.norm,
                             tensor::cross_entropy_backward(on(logits, dt, d), targets.to(d),
                                                            cc.lse.to(d), on(dloss, DType::F32, d),
                                                            -100)};
                 }});
    c.push_back({"embedding_forward",
                 [=](Device d) { return Ts{tensor::embedding(on(emb, dt, d), ids.to(d))}; }, 0.0,
                 0.0, /*exact_lowp=*/true});
    return c;
  };
  e.empty = [](DType dt) {
    std::vector<DeviceSample> c;
    c.push_back({"embedding", [=](Device d) {
                   auto r = [dt, d](const Shape& s, uint64_t stream) {
                     return tensor::uniform(s, {7, stream}, -1.f, 1.f).to(dt).to(d);
                   };
                   const Tensor ids = tensor::zeros({0}, DType::I32, d);
                   Tensor dw = r({10, 4}, 14);
                   tensor::embedding_backward(ids, tensor::zeros({0, 4}, dt, d), dw);
                   return Ts{
                       tensor::embedding(r({10, 4}, 15), ids),
                       tensor::embedding(r({10, 4}, 15), tensor::zeros({2, 0}, DType::I64, d)), dw};
                 }});
    return c;
  };
  // Random shapes: with rotary (the rotary entry's family).
  using MV = std::vector<Tensor>;
  e.mixed = {{"embedding",
              [](Device d) {
                return MV{mixed_operand({10, 4}, 1, d), mixed_ids({6}, 10, d)};
              },
              [](MV& t) { tensor::embedding(t[0], t[1]); }},
             {"embedding_backward",
              [](Device d) {
                return MV{mixed_ids({6}, 10, d), mixed_operand({6, 4}, 1, d),
                          mixed_operand({10, 4}, 2, d)};
              },
              [](MV& t) { tensor::embedding_backward(t[0], t[1], t[2]); }}};
  return e;
}

OpInfo cross_entropy() {
  OpInfo e;
  e.name = "cross_entropy";
  e.backend = {"cross_entropy_forward", "cross_entropy_norm", "cross_entropy_backward",
               "cross_entropy_fused"};
  e.api = {"cross_entropy", "cross_entropy_backward", "cross_entropy_backward_",
           "cross_entropy_fused_"};
  e.functions = {"cross_entropy", "cross_entropy_consuming"};
  e.gradcheck = {
      {"cross_entropy",
       {{{2, 3, 7}, T}},
       [](V x) {
         return autograd::cross_entropy(x[0], tensor::from_ints({1, -100, 6, 0, 2, 2}, {2, 3}));
       }},
      // Without a LossGradientScope: the unfused path, on logits handed over.
      {"cross_entropy_consuming", {{{5, 6}}}, [](V x) {
         Variable logits = x[0];
         return autograd::cross_entropy_consuming(
             std::move(logits), tensor::from_ints({1, 4, -100, 0, 3}, {5}), -100, 5);
       }}};
  e.lowp.push_back(
      {"cross_entropy",
       [](DType dt) {
         Tensor logits = lp({6, 29}, 40, dt, -5.f, 5.f);
         Tensor targets = tensor::from_ints({3, -100, 28, 0, 5, 5}, {6});
         tensor::CrossEntropyResult r = tensor::cross_entropy(logits, targets);
         Tensor dloss = lowp_rand({6}, 41, 0.1f, 1.f);  // F32 whatever the dtype
         return Ts{logits, targets, r.lse, dloss};
       },
       [](const Ts& x) {
         tensor::CrossEntropyResult r = tensor::cross_entropy(x[0], x[1]);
         return Ts{r.losses, r.lse, tensor::cross_entropy_backward(x[0], x[1], x[2], x[3])};
       },
       {LowpOut::F32, LowpOut::F32, LowpOut::Compute}});
  e.cuda = [](DType dt) {
    // Cross-entropy over the first `classes` columns (Note [CUDA cross-entropy]): a row length
    // that takes 128-bit packs (136: 272 bytes in bf16) and one that does not (75).
    const Tensor wide = rnd({6, 136}, 21, -6.f, 6.f), odd = rnd({5, 75}, 22, -6.f, 6.f);
    const Tensor wide_t = tensor::from_ints({130, 0, -100, 7, 77, 129}, {6});
    const Tensor odd_t = tensor::from_ints({69, -100, 0, 33, 12}, {5});
    const Tensor wide_dl = rnd({6}, 23), odd_dl = rnd({5}, 24);
    const Device cpu = Device::cpu();
    std::vector<DeviceSample> c;
    for (auto [x, t, dl, classes] : {std::tuple{wide, wide_t, wide_dl, int64_t{131}},
                                     std::tuple{odd, odd_t, odd_dl, int64_t{70}}})
      c.push_back({"cross_entropy_classes_" + std::to_string(x.size(1)), [=](Device d) {
                     tensor::CrossEntropyResult ce =
                         tensor::cross_entropy(on(x, dt, d), t.to(d), -100, classes);
                     tensor::CrossEntropyResult cc =
                         tensor::cross_entropy(on(x, dt, cpu), t, -100, classes);
                     return Ts{
                         ce.losses, ce.lse,
                         tensor::cross_entropy_backward(on(x, dt, d), t.to(d), cc.lse.to(d),
                                                        on(dl, DType::F32, d), -100, classes)};
                   }});
    return c;
  };
  e.empty = [](DType dt) {
    std::vector<DeviceSample> c;
    c.push_back({"cross_entropy", [=](Device d) {
                   auto z = [dt, d](const Shape& s) { return tensor::zeros(s, dt, d); };
                   const Tensor f32 = tensor::ones({0}, DType::F32, d);
                   const Tensor logits = z({0, 10}), t = tensor::zeros({0}, DType::I64, d);
                   tensor::CrossEntropyResult ce = tensor::cross_entropy(logits, t);
                   Tensor in_place = z({0, 10});
                   tensor::cross_entropy_backward_(in_place, t, ce.lse, f32);
                   Tensor fused = z({0, 10});
                   tensor::CrossEntropyResult fr = tensor::cross_entropy_fused_(fused, t, 1.f);
                   return Ts{ce.losses, ce.lse,
                             ce.norm,   tensor::cross_entropy_backward(logits, t, ce.lse, f32),
                             in_place,  fused,
                             fr.losses, fr.norm};
                 }});
    return c;
  };
  // Over a narrowed vocabulary, separate and fused.
  e.random = {8, [](Draw& r) -> RandomSample {
                const int64_t rows = r.size(1, 100), vocab = r.size(1, 3000);
                const int64_t classes = r.coin() ? vocab : r.size(1, vocab);
                const Tensor x = r.values({rows, vocab}, -6.f, 6.f), t = r.ids(rows, classes, true),
                             dloss = r.values({rows});
                const Device cpu = Device::cpu();
                return {"cross_entropy rows=" + std::to_string(rows) +
                            " V=" + std::to_string(vocab) + " classes=" + std::to_string(classes),
                        [=](DType dt, Device d) {
                          tensor::CrossEntropyResult ce =
                              tensor::cross_entropy(on(x, dt, d), t.to(d), -100, classes);
                          tensor::CrossEntropyResult cc =
                              tensor::cross_entropy(on(x, dt, cpu), t, -100, classes);
                          Tensor fused = on(x, dt, d).clone();
                          tensor::CrossEntropyResult fr =
                              tensor::cross_entropy_fused_(fused, t.to(d), 0.75f, -100, classes);
                          return Ts{
                              ce.losses,
                              ce.lse,
                              ce.norm,
                              tensor::cross_entropy_backward(on(x, dt, d), t.to(d), cc.lse.to(d),
                                                             dloss.to(d), -100, classes),
                              fused,
                              fr.losses};
                        }};
              }};
  using MV = std::vector<Tensor>;
  const auto ce_in = [](Device d) {
    return MV{mixed_operand({6, 10}, 1, d), mixed_ids({6}, 10, d)};
  };
  const auto ce_bwd_in = [](Device d) {
    const Tensor logits = mixed_operand({6, 10}, 1, d), t = mixed_ids({6}, 10, d);
    return MV{logits, t, tensor::cross_entropy(logits, t).lse, tensor::ones({6}, DType::F32, d)};
  };
  e.mixed = {{"cross_entropy", ce_in, [](MV& t) { tensor::cross_entropy(t[0], t[1]); }},
             {"cross_entropy_backward", ce_bwd_in,
              [](MV& t) { tensor::cross_entropy_backward(t[0], t[1], t[2], t[3]); }},
             {"cross_entropy_backward_", ce_bwd_in,
              [](MV& t) { tensor::cross_entropy_backward_(t[0], t[1], t[2], t[3]); }},
             {"cross_entropy_fused_", ce_in,
              [](MV& t) { tensor::cross_entropy_fused_(t[0], t[1], 1.f); }}};
  return e;
}

}  // namespace

void add_embedding_loss_ops(std::vector<OpInfo>& table) {
  table.push_back(embedding());
  table.push_back(cross_entropy());
}

}  // namespace strata::testing
