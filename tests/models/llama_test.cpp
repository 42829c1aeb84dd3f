// LLaMA behaviour: HF parameter names, flat units, init, grouped-query attention, tied and padded
// heads, activation checkpointing, hooks, and overfitting one batch.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

#include "autograd/functions.h"
#include "llama_test_util.h"
#include "models/llama/llama.h"
#include "optim/adamw.h"
#include "tensor/ops.h"

namespace strata::models {
namespace {

using llama::Llama;
using llama::LlamaConfig;
using testing::random_token_ids;

LlamaConfig tiny() {
  return llama::preset("llama-tiny");
}

std::vector<std::vector<float>> all_grads(CausalLM& m) {
  std::vector<std::vector<float>> out;
  for (auto& p : m.parameters()) out.push_back(tensor::to_float_vector(p.grad()));
  return out;
}

float step(CausalLM& m, const tensor::Tensor& ids, const tensor::Tensor& targets) {
  m.zero_grad();
  autograd::Variable loss = m.loss(ids, targets);
  loss.backward();
  return loss.item();
}

TEST(Llama, ParameterNamesFollowHfLlama) {
  Llama m(tiny(), 1);
  std::vector<std::string> names;
  for (auto& [n, p] : m.named_parameters()) names.push_back(n);
  const std::vector<std::string> layer0{
      "layers.0.input_layernorm.weight",  "layers.0.self_attn.q_proj.weight",
      "layers.0.self_attn.k_proj.weight", "layers.0.self_attn.v_proj.weight",
      "layers.0.self_attn.o_proj.weight", "layers.0.post_attention_layernorm.weight",
      "layers.0.mlp.gate_proj.weight",    "layers.0.mlp.up_proj.weight",
      "layers.0.mlp.down_proj.weight"};
  ASSERT_EQ(names.size(), 1 + 2 * layer0.size() + 2);
  EXPECT_EQ(names.front(), "embed_tokens.weight");
  EXPECT_EQ(std::vector<std::string>(names.begin() + 1, names.begin() + 10), layer0);
  EXPECT_EQ(names[names.size() - 2], "norm.weight");
  EXPECT_EQ(names.back(), "lm_head.weight");
  // [out, in] layouts; k/v project to num_key_value_heads * head_dim = 2 * 16.
  EXPECT_EQ(m.parameter("layers.1.self_attn.q_proj.weight").shape(), (tensor::Shape{64, 64}));
  EXPECT_EQ(m.parameter("layers.1.self_attn.k_proj.weight").shape(), (tensor::Shape{32, 64}));
  EXPECT_EQ(m.parameter("layers.1.self_attn.v_proj.weight").shape(), (tensor::Shape{32, 64}));
  EXPECT_EQ(m.parameter("layers.1.mlp.gate_proj.weight").shape(), (tensor::Shape{176, 64}));
  EXPECT_EQ(m.parameter("layers.1.mlp.down_proj.weight").shape(), (tensor::Shape{64, 176}));
  EXPECT_EQ(m.parameter("lm_head.weight").shape(), (tensor::Shape{256, 64}));
  EXPECT_EQ(m.family(), "llama");
}

TEST(Llama, FlatUnitsAreEmbeddingsLayersAndHead) {
  for (bool tie : {false, true}) {
    SCOPED_TRACE(tie);
    LlamaConfig c = tiny();
    c.tie_word_embeddings = tie;
    Llama m(c, 1);
    const auto& units = m.flat_units();
    std::vector<std::string> unit_names;
    for (const FlatUnit& u : units) unit_names.push_back(u.name);
    EXPECT_EQ(unit_names, (std::vector<std::string>{"embeddings", "layers.0", "layers.1", "head"}));
    EXPECT_EQ(units[0].names, (std::vector<std::string>{"embed_tokens.weight"}));
    EXPECT_EQ(units[3].names, tie ? (std::vector<std::string>{"norm.weight"})
                                  : (std::vector<std::string>{"lm_head.weight", "norm.weight"}));
    EXPECT_EQ(units[1].names.size(), 9u);
    int64_t numel = 0;
    for (const FlatUnit& u : units) {
      EXPECT_TRUE(std::is_sorted(u.names.begin(), u.names.end()));
      numel += u.num_parameters();
      for (size_t k = 0; k < u.names.size(); ++k) {
        const autograd::Variable p = m.parameter(u.names[k]);
        EXPECT_EQ(p.data().storage(), u.params.storage()) << u.names[k];
        EXPECT_EQ(p.data().offset(), u.params.offset() + u.offsets[k]) << u.names[k];
        EXPECT_EQ(p.grad().storage(), u.grads.storage()) << u.names[k];
      }
    }
    EXPECT_EQ(numel, m.num_parameters());
    EXPECT_EQ(numel, llama::num_parameters(c));
  }
}

TEST(Llama, InitFollowsHf) {
  LlamaConfig c = tiny();
  c.vocab_size = 250;  // padded_vocab_size stays 256
  Llama a(c, 42), b(c, 42), other(c, 43);
  for (auto& [name, p] : a.named_parameters()) {
    SCOPED_TRACE(name);
    std::vector<float> v = tensor::to_float_vector(p.data());
    EXPECT_EQ(v, tensor::to_float_vector(b.parameter(name).data())) << "same seed, same values";
    if (name.ends_with("norm.weight")) {
      EXPECT_EQ(v, std::vector<float>(v.size(), 1.f));
      continue;
    }
    EXPECT_NE(v, tensor::to_float_vector(other.parameter(name).data()));
    // Rows beyond vocab_size of embed_tokens and lm_head are zero (Note [Padded vocabulary]).
    const bool vocab_rows = name == "embed_tokens.weight" || name == "lm_head.weight";
    const size_t n = vocab_rows ? static_cast<size_t>(250 * c.hidden_size) : v.size();
    for (size_t i = n; i < v.size(); ++i) ASSERT_EQ(v[i], 0.f) << i;
    double s = 0, ss = 0;
    for (size_t i = 0; i < n; ++i) s += v[i], ss += static_cast<double>(v[i]) * v[i];
    const double mean = s / static_cast<double>(n), std = std::sqrt(ss / static_cast<double>(n));
    EXPECT_NEAR(mean, 0.0, 5 * 0.02 / std::sqrt(static_cast<double>(n)));
    EXPECT_NEAR(std, 0.02, 5 * 0.02 / std::sqrt(2.0 * static_cast<double>(n)));
  }
}

// Note [Grouped-query attention]: a GQA model equals the multi-head model whose k/v heads are
// the GQA heads repeated in place, and its k/v gradients are the sums over each group.
TEST(Llama, GroupedQueryAttentionEqualsRepeatedHeads) {
  LlamaConfig gc = tiny();      // 4 heads, 2 k/v heads, head_dim 16
  gc.initializer_range = 0.2f;  // attention far from uniform, so k/v gradients are not tiny
  LlamaConfig mc = gc;
  mc.num_key_value_heads = gc.num_attention_heads;
  Llama gqa(gc, 3), mha(mc, 4);
  const int64_t D = gc.head_dim(), C = gc.hidden_size, rep = 2;
  for (auto& [name, p] : mha.named_parameters()) {
    tensor::Tensor dst = p.data();
    tensor::Tensor src = gqa.parameter(name).data();
    if (name.ends_with("k_proj.weight") || name.ends_with("v_proj.weight")) {
      for (int64_t h = 0; h < gc.num_attention_heads; ++h) {
        tensor::Tensor rows = dst.narrow(0, h * D, D);
        rows.copy_(src.narrow(0, (h / rep) * D, D));
      }
    } else {
      dst.copy_(src);
    }
  }
  tensor::Tensor ids = random_token_ids(2, 20, gc.vocab_size, 1),
                 targets = random_token_ids(2, 20, gc.vocab_size, 2);
  const float lg = step(gqa, ids, targets), lm = step(mha, ids, targets);
  EXPECT_NEAR(lg, lm, 1e-6 * std::fabs(lm));
  for (auto& [name, p] : gqa.named_parameters()) {
    SCOPED_TRACE(name);
    tensor::Tensor expected = mha.parameter(name).grad();
    if (name.ends_with("k_proj.weight") || name.ends_with("v_proj.weight")) {
      std::vector<tensor::Tensor> sums;
      for (int64_t j = 0; j < gc.num_key_value_heads; ++j)
        sums.push_back(tensor::add(expected.narrow(0, (j * rep) * D, D),
                                   expected.narrow(0, (j * rep + 1) * D, D)));
      expected = tensor::concat(sums, 0);
      EXPECT_EQ(expected.shape(), (tensor::Shape{gc.num_key_value_heads * D, C}));
    }
    EXPECT_TRUE(testing::all_close(p.grad(), expected, 1e-4, 1e-6));
  }
}

TEST(Llama, ActivationCheckpointingGivesTheSameGradients) {
  LlamaConfig c = tiny();
  Llama plain(c, 11);
  c.activation_checkpointing = true;
  Llama ckpt(c, 11);
  tensor::Tensor ids = random_token_ids(2, 24, c.vocab_size, 1),
                 targets = random_token_ids(2, 24, c.vocab_size, 2);
  EXPECT_EQ(step(plain, ids, targets), step(ckpt, ids, targets));
  // The recompute replays the same ops on the same inputs: bitwise.
  EXPECT_EQ(all_grads(plain), all_grads(ckpt));
  // And switching it on after construction does the same.
  plain.set_activation_checkpointing(true);
  std::vector<std::vector<float>> before = all_grads(ckpt);
  step(plain, ids, targets);
  EXPECT_EQ(all_grads(plain), before);
}

TEST(Llama, PaddedVocabularyRowsDoNotAffectTheLoss) {
  for (bool tie : {false, true}) {
    SCOPED_TRACE(tie);
    LlamaConfig c = tiny();
    c.vocab_size = 250;  // padded_vocab_size stays 256
    c.tie_word_embeddings = tie;
    Llama m(c, 5);
    tensor::Tensor ids = random_token_ids(2, 16, c.vocab_size, 6),
                   targets = random_token_ids(2, 16, c.vocab_size, 7);
    const float before = step(m, ids, targets);
    std::vector<autograd::Variable> vocab;
    for (nn::Module* mod :
         {static_cast<nn::Module*>(&m.embed_tokens()), static_cast<nn::Module*>(m.lm_head())})
      if (mod) vocab.push_back(mod->parameter("weight"));
    for (const autograd::Variable& w : vocab) {
      tensor::Tensor pad = w.data().narrow(0, 250, 6);
      pad.copy_(tensor::randn({6, c.hidden_size}, {1, 1}));
    }
    EXPECT_EQ(step(m, ids, targets), before);
    for (const autograd::Variable& w : vocab)
      EXPECT_EQ(tensor::l2_norm(w.grad().narrow(0, 250, 6)), 0.0);
    EXPECT_EQ(m.forward(ids).shape(), (tensor::Shape{2, 16, 256}));
  }
}

TEST(Llama, TiedHeadIsTheEmbedding) {
  LlamaConfig c = tiny();
  c.tie_word_embeddings = true;
  Llama m(c, 9);
  EXPECT_EQ(m.lm_head(), nullptr);
  EXPECT_EQ(m.num_parameters(), llama::num_parameters(tiny()) - 256 * 64);
  // Perturbing one embedding row changes that token's logit column even where it is not input.
  tensor::Tensor ids = tensor::from_ints({1, 2, 3, 4}, {1, 4});
  autograd::NoGradGuard no_grad;
  std::vector<float> a = tensor::to_float_vector(m.forward(ids).data());
  tensor::Tensor row = m.embed_tokens().weight().data().narrow(0, 200, 1);
  row.fill_(0.5f);
  std::vector<float> b = tensor::to_float_vector(m.forward(ids).data());
  for (int64_t t = 0; t < 4; ++t)
    for (int64_t v = 0; v < 256; ++v) {
      const size_t i = static_cast<size_t>(t * 256 + v);
      if (v == 200)
        EXPECT_NE(a[i], b[i]);
      else
        EXPECT_EQ(a[i], b[i]);
    }
}

TEST(Llama, IgnoreIndexTargetsDoNotCount) {
  Llama m(tiny(), 5);
  tensor::Tensor ids = random_token_ids(1, 8, 256, 6);
  std::vector<int64_t> t = tensor::to_int_vector(random_token_ids(1, 8, 256, 7));
  tensor::Tensor targets = tensor::from_ints(t, {1, 8});
  t[7] = -100;
  tensor::Tensor ignored = tensor::from_ints(t, {1, 8});
  autograd::NoGradGuard no_grad;
  // Causal: the first 7 positions do not see the 8th, so dropping its target equals truncating.
  EXPECT_NEAR(m.loss(ids, ignored).item(),
              m.loss(ids.narrow(1, 0, 7).contiguous(), targets.narrow(1, 0, 7).contiguous()).item(),
              1e-6);
}

TEST(Llama, LayerHooksFireOncePerPassWithAndWithoutCheckpointing) {
  for (bool ckpt : {false, true}) {
    SCOPED_TRACE(ckpt);
    LlamaConfig c = tiny();
    c.activation_checkpointing = ckpt;
    Llama m(c, 1);
    std::vector<std::string> log;
    for (std::string name : {"layers.0", "layers.1", "embed_tokens"}) {
      nn::Module& mod = m.module(name);
      mod.register_backward_pre_hook([&log, name](nn::Module&) { log.push_back("pre:" + name); });
      mod.register_backward_hook([&log, name](nn::Module&) { log.push_back("post:" + name); });
    }
    tensor::Tensor ids = random_token_ids(2, 8, 256, 1);
    for (int pass = 0; pass < 2; ++pass) {
      log.clear();
      step(m, ids, ids);
      EXPECT_EQ(log, (std::vector<std::string>{"pre:layers.1", "post:layers.1", "pre:layers.0",
                                               "post:layers.0", "pre:embed_tokens",
                                               "post:embed_tokens"}));
    }
  }
}

TEST(Llama, RejectsBadInputs) {
  Llama m(tiny(), 1);
  EXPECT_THROW(m.forward(tensor::zeros({2, 65}, DType::I64)), UserError);  // context is 64
  EXPECT_THROW(m.forward(tensor::zeros({2, 8}, DType::F32)), UserError);
  EXPECT_NO_THROW(m.forward(tensor::zeros({1, 64}, DType::I32)));
}

TEST(Llama, OverfitsAFixedBatch) {
  const auto start = std::chrono::steady_clock::now();
  LlamaConfig c = tiny();
  Llama m(c, 2024);
  tensor::Tensor seq = random_token_ids(4, 33, c.vocab_size, 77);
  tensor::Tensor ids = seq.narrow(1, 0, 32).contiguous(),
                 targets = seq.narrow(1, 1, 32).contiguous();
  optim::AdamWConfig cfg;
  cfg.lr = 1e-2;
  cfg.beta2 = 0.99;
  cfg.weight_decay = 0.0;
  optim::AdamW opt(testing::unit_param_groups(m), cfg);
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
  EXPECT_NEAR(first, std::log(256.0), 0.1) << "small init: close to uniform";
  EXPECT_LT(loss, 0.05f);
}

}  // namespace
}  // namespace strata::models
