// GPT-2 behaviour: activation checkpointing, dropout, padded vocabulary, hooks on a real model,
// and overfitting one batch.
#include <gtest/gtest.h>

#include <chrono>

#include "autograd/rng_context.h"
#include "models/gpt2/gpt2.h"
#include "optim/adamw.h"
#include "tensor/ops.h"

namespace strata::models {
namespace {

using gpt2::GPT2;
using gpt2::GPT2Config;

GPT2Config tiny(float dropout = 0.f) {
  GPT2Config c = gpt2::preset("gpt2-tiny");
  c.dropout = dropout;
  return c;
}

tensor::Tensor random_ids(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  std::vector<float> u(static_cast<size_t>(B * T));
  rng_uniform(u.data(), u.size(), {seed, 1}, 0.f, static_cast<float>(vocab));
  std::vector<int64_t> ids;
  for (float x : u) ids.push_back(std::min<int64_t>(static_cast<int64_t>(x), vocab - 1));
  return tensor::from_ints(ids, {B, T});
}

std::vector<std::vector<float>> all_grads(CausalLM& m) {
  std::vector<std::vector<float>> out;
  for (auto& p : m.parameters()) out.push_back(tensor::to_float_vector(p.grad()));
  return out;
}

// Loss and gradients of one step with the thread's generator at `gen_seed`.
float step(CausalLM& m, const tensor::Tensor& ids, const tensor::Tensor& targets,
           uint64_t gen_seed) {
  Generator gen(gen_seed);
  autograd::GeneratorScope scope(gen);
  m.zero_grad();
  autograd::Variable loss = m.loss(ids, targets);
  loss.backward();
  return loss.item();
}

TEST(Gpt2, ActivationCheckpointingGivesTheSameGradients) {
  for (float dropout : {0.f, 0.1f}) {
    SCOPED_TRACE(dropout);
    GPT2Config c = tiny(dropout);
    GPT2 plain(c, 11);
    c.activation_checkpointing = true;
    GPT2 ckpt(c, 11);
    tensor::Tensor ids = random_ids(2, 24, c.vocab_size, 1),
                   targets = random_ids(2, 24, c.vocab_size, 2);
    EXPECT_EQ(step(plain, ids, targets, 99), step(ckpt, ids, targets, 99));
    // The recompute replays the same ops on the same inputs, dropout masks included: bitwise.
    EXPECT_EQ(all_grads(plain), all_grads(ckpt));
  }
}

TEST(Gpt2, DropoutUsesTheGeneratorAndIsOffInEval) {
  GPT2 m(tiny(0.2f), 3);
  tensor::Tensor ids = random_ids(2, 16, 256, 4), targets = random_ids(2, 16, 256, 5);
  EXPECT_EQ(step(m, ids, targets, 1), step(m, ids, targets, 1)) << "same generator, same masks";
  EXPECT_NE(step(m, ids, targets, 1), step(m, ids, targets, 2));
  Generator gen(1);
  autograd::GeneratorScope scope(gen);
  m.eval();
  autograd::NoGradGuard no_grad;
  float a = m.loss(ids, targets).item(), b = m.loss(ids, targets).item();
  EXPECT_EQ(a, b);
  EXPECT_EQ(gen.offset(), 0u) << "eval draws no dropout keys";
  GPT2 no_dropout(tiny(0.f), 3);
  no_dropout.eval();
  EXPECT_EQ(a, no_dropout.loss(ids, targets).item());
}

TEST(Gpt2, PaddedVocabularyColumnsDoNotAffectTheLoss) {
  GPT2Config c = tiny();
  c.vocab_size = 250;  // padded_vocab_size stays 256
  GPT2 m(c, 5);
  tensor::Tensor ids = random_ids(2, 16, c.vocab_size, 6),
                 targets = random_ids(2, 16, c.vocab_size, 7);
  const float before = step(m, ids, targets, 0);
  tensor::Tensor pad = m.wte().weight().data().narrow(0, 250, 6);
  EXPECT_EQ(tensor::l2_norm(pad), 0.0) << "padded rows start at zero";
  pad.copy_(tensor::randn({6, c.n_embd}, {1, 1}));
  EXPECT_EQ(step(m, ids, targets, 0), before);
  EXPECT_EQ(tensor::l2_norm(m.wte().weight().grad().narrow(0, 250, 6)), 0.0);
  EXPECT_EQ(m.forward(ids).shape(), (tensor::Shape{2, 16, 256}));
}

TEST(Gpt2, IgnoreIndexTargetsDoNotCount) {
  GPT2 m(tiny(), 5);
  tensor::Tensor ids = random_ids(1, 8, 256, 6);
  std::vector<int64_t> t = tensor::to_int_vector(random_ids(1, 8, 256, 7));
  tensor::Tensor targets = tensor::from_ints(t, {1, 8});
  t[7] = -100;
  tensor::Tensor ignored = tensor::from_ints(t, {1, 8});
  tensor::Tensor first7_ids = ids.narrow(1, 0, 7).contiguous();
  tensor::Tensor first7_targets = targets.narrow(1, 0, 7).contiguous();
  autograd::NoGradGuard no_grad;
  // Causal: the first 7 positions do not see the 8th, so dropping its target equals truncating.
  EXPECT_NEAR(m.loss(ids, ignored).item(), m.loss(first7_ids, first7_targets).item(), 1e-6);
}

TEST(Gpt2, BlockHooksFireOncePerPassWithAndWithoutCheckpointing) {
  for (bool ckpt : {false, true}) {
    SCOPED_TRACE(ckpt);
    GPT2Config c = tiny();
    c.activation_checkpointing = ckpt;
    GPT2 m(c, 1);
    std::vector<std::string> log;
    for (std::string name : {"h.0", "h.1", "wte"}) {
      nn::Module& mod = m.module(name);
      mod.register_backward_pre_hook([&log, name](nn::Module&) { log.push_back("pre:" + name); });
      mod.register_backward_hook([&log, name](nn::Module&) { log.push_back("post:" + name); });
    }
    tensor::Tensor ids = random_ids(2, 8, 256, 1);
    for (int pass = 0; pass < 2; ++pass) {
      log.clear();
      step(m, ids, ids, 0);
      EXPECT_EQ(log, (std::vector<std::string>{"pre:h.1", "post:h.1", "pre:h.0", "post:h.0",
                                               "pre:wte", "post:wte"}));
    }
  }
}

TEST(Gpt2, AcceptsI32AndI64Ids) {
  GPT2 m(tiny(), 1);
  std::vector<int64_t> ids = tensor::to_int_vector(random_ids(2, 8, 256, 3));
  autograd::NoGradGuard no_grad;
  tensor::Tensor a = m.forward(tensor::from_ints(ids, {2, 8}, DType::I64)).data();
  tensor::Tensor b = m.forward(tensor::from_ints(ids, {2, 8}, DType::I32)).data();
  EXPECT_EQ(a.shape(), (tensor::Shape{2, 8, 256}));
  EXPECT_EQ(tensor::to_float_vector(a), tensor::to_float_vector(b));
}

TEST(Gpt2, RejectsBadInputs) {
  GPT2 m(tiny(), 1);
  EXPECT_THROW(m.forward(tensor::zeros({2, 65}, DType::I64)), UserError);  // context is 64
  EXPECT_THROW(m.forward(tensor::zeros({2, 8}, DType::F32)), UserError);
  EXPECT_THROW(m.forward(tensor::zeros({16}, DType::I64)), UserError);
  EXPECT_THROW(m.loss(tensor::zeros({2, 8}, DType::I64), tensor::zeros({2, 7}, DType::I64)),
               UserError);
}

TEST(Gpt2, OverfitsAFixedBatch) {
  const auto start = std::chrono::steady_clock::now();
  GPT2Config c = tiny();
  GPT2 m(c, 2024);
  tensor::Tensor seq = random_ids(4, 33, c.vocab_size, 77);
  tensor::Tensor ids = seq.narrow(1, 0, 32).contiguous(),
                 targets = seq.narrow(1, 1, 32).contiguous();
  std::vector<optim::ParamGroup> groups;
  for (FlatUnit& u : m.flat_units()) {
    optim::ParamGroup g;
    g.param = u.params;
    g.grad = u.grads;
    for (size_t k = 0; k < u.names.size(); ++k)
      g.segments.push_back({u.names[k], u.offsets[k], u.numels[k], u.shapes[k].ndim() >= 2});
    groups.push_back(std::move(g));
  }
  optim::AdamWConfig cfg;
  cfg.lr = 1e-2;
  cfg.beta2 = 0.99;
  cfg.weight_decay = 0.0;
  optim::AdamW opt(std::move(groups), cfg);
  float first = 0, loss = 0;
  int steps = 0;
  for (; steps < 400; ++steps) {
    m.zero_grad();
    autograd::Variable l = m.loss(ids, targets);
    loss = l.item();
    if (steps == 0) first = loss;
    if (loss < 0.05f) break;
    l.backward();
    opt.step();
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "[ overfit ] loss " << first << " -> " << loss << " in " << steps << " steps, "
            << secs << " s\n";
  EXPECT_GT(first, 5.0f);
  EXPECT_LT(loss, 0.05f);
}

}  // namespace
}  // namespace strata::models
