// LLaMA presets in the registry, config overrides and parameter counts (Note [LLaMA presets]).
#include <gtest/gtest.h>

#include "models/config_limits.h"
#include "models/llama/llama.h"
#include "models/registry.h"

namespace strata::models {
namespace {

using llama::LlamaConfig;

TEST(LlamaRegistry, KnowsEveryPreset) {
  const ModelRegistry& r = ModelRegistry::global();
  for (const char* name : {"llama-tiny", "llama-7b", "llama-13b", "llama-33b", "llama-65b",
                           "llama2-7b", "llama2-13b", "llama2-70b"}) {
    EXPECT_TRUE(r.contains(name)) << name;
    EXPECT_EQ(r.get(name).family, "llama");
    EXPECT_FALSE(r.get(name).description.empty());
  }
  EXPECT_TRUE(r.contains("gpt2")) << "the zoo still has GPT-2";
  EXPECT_EQ(llama::preset_names().size(), 8u);
}

TEST(LlamaRegistry, CreatesModelsWithOverridesAndAliases) {
  ModelOptions o;
  o.seed = 5;
  o.overrides = {{"n_layer", "3"},
                 {"vocab_size", "100"},
                 {"block_size", "16"},
                 {"num_key_value_heads", "1"},
                 {"intermediate_size", "96"},
                 {"tie_word_embeddings", "true"}};
  std::unique_ptr<CausalLM> m = ModelRegistry::global().create("llama-tiny", o);
  EXPECT_EQ(m->family(), "llama");
  EXPECT_EQ(m->vocab_size(), 100);
  EXPECT_EQ(m->padded_vocab_size(), 128) << "re-padded to a multiple of 64";
  EXPECT_EQ(m->max_seq_len(), 16);
  EXPECT_EQ(m->flat_units().size(), 5u);  // embeddings, 3 layers, head
  EXPECT_EQ(m->parameter("layers.2.self_attn.k_proj.weight").shape(), (tensor::Shape{16, 64}));
  EXPECT_EQ(m->parameter("layers.2.mlp.up_proj.weight").shape(), (tensor::Shape{96, 64}));
  EXPECT_THROW(m->parameter("lm_head.weight"), UserError) << "tied: no lm_head";
  ModelShape s = ModelRegistry::global().shape("llama-tiny", o);
  EXPECT_EQ(s.family, "llama");
  EXPECT_EQ(s.num_parameters, m->num_parameters());
  EXPECT_EQ(s.n_layer, 3);
  EXPECT_EQ(s.n_embd, 64);
  EXPECT_EQ(s.n_head, 4);
  EXPECT_EQ(s.max_seq_len, 16);
  EXPECT_EQ(s.padded_vocab_size, 128);

  // The HF names and the GPT-2 spellings set the same fields.
  LlamaConfig a =
      llama::with_overrides(llama::preset("llama-tiny"), {{"hidden_size", "96"},
                                                          {"num_attention_heads", "6"},
                                                          {"num_key_value_heads", "3"},
                                                          {"max_position_embeddings", "40"}});
  LlamaConfig b = llama::with_overrides(
      llama::preset("llama-tiny"),
      {{"n_embd", "96"}, {"n_head", "6"}, {"n_kv_head", "3"}, {"block_size", "40"}});
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.head_dim(), 16);
}

TEST(LlamaRegistry, BadOverridesAreUserErrors) {
  const ModelRegistry& r = ModelRegistry::global();
  auto create = [&](std::map<std::string, std::string> ov) {
    ModelOptions o;
    o.overrides = std::move(ov);
    return r.create("llama-tiny", o);
  };
  try {
    create({{"n_kv_heads", "2"}});  // typo of n_kv_head
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("n_kv_heads"), std::string::npos) << msg;
    EXPECT_NE(msg.find("num_key_value_heads"), std::string::npos) << msg;
  }
  EXPECT_THROW(create({{"n_layer", "two"}}), UserError);
  EXPECT_THROW(create({{"num_key_value_heads", "3"}}), UserError);  // 4 % 3 != 0
  EXPECT_THROW(create({{"num_attention_heads", "5"}}), UserError);  // 64 % 5 != 0
  EXPECT_THROW(create({{"num_attention_heads", "64"}, {"num_key_value_heads", "64"}}),
               UserError);  // head size 1 is odd: no rotary pairs
  EXPECT_THROW(create({{"rms_norm_eps", "0"}}), UserError);
  EXPECT_THROW(create({{"rope_theta", "-1"}}), UserError);
  EXPECT_THROW(create({{"tie_word_embeddings", "maybe"}}), UserError);
  EXPECT_THROW(create({{"vocab_size", "300"}, {"padded_vocab_size", "256"}}), UserError);
  EXPECT_THROW(create({{"rope_theta", "inf"}}), UserError);
  EXPECT_THROW(create({{"rms_norm_eps", "inf"}}), UserError);
  EXPECT_THROW(llama::preset("llama-3b"), UserError);
  EXPECT_NO_THROW(create({{"activation_checkpointing", "true"}, {"rope_theta", "500000"}}));
}

// Note [Model size limits].
TEST(LlamaConfig, SizesAboveTheLimitsAreUserErrorsNamingTheKey) {
  const ModelRegistry& r = ModelRegistry::global();
  for (const auto& [key, limit] :
       std::vector<std::pair<std::string, int64_t>>{{"vocab_size", kMaxVocab},
                                                    {"padded_vocab_size", kMaxPaddedVocab},
                                                    {"max_position_embeddings", kMaxContext},
                                                    {"hidden_size", kMaxWidth},
                                                    {"intermediate_size", kMaxFfnWidth},
                                                    {"num_hidden_layers", kMaxLayers}}) {
    ModelOptions o;
    o.overrides = {{key, std::to_string(limit + 1)}};
    try {
      r.shape("llama-tiny", o);
      ADD_FAILURE() << key << " above its limit was accepted";
    } catch (const UserError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(key + " " + std::to_string(limit + 1) + " is above the limit"),
                std::string::npos)
          << msg;
    }
  }
}

TEST(LlamaConfig, ParameterCountsMatchTheModelForSmallConfigs) {
  struct Case {
    int64_t layers, hidden, heads, kv_heads, ffn, vocab, padded;
    bool tie;
  };
  for (const Case& k : std::vector<Case>{{1, 32, 4, 4, 88, 64, 64, false},
                                         {2, 64, 4, 2, 176, 256, 256, false},
                                         {3, 48, 6, 1, 128, 100, 128, true},
                                         {2, 96, 6, 3, 250, 77, 80, false},
                                         {1, 32, 2, 2, 64, 61, 64, true}}) {
    LlamaConfig c = llama::preset("llama-tiny");
    c.num_hidden_layers = k.layers;
    c.hidden_size = k.hidden;
    c.num_attention_heads = k.heads;
    c.num_key_value_heads = k.kv_heads;
    c.intermediate_size = k.ffn;
    c.vocab_size = k.vocab;
    c.padded_vocab_size = k.padded;
    c.tie_word_embeddings = k.tie;
    llama::Llama model(c);
    EXPECT_EQ(llama::num_parameters(c), model.num_parameters())
        << k.layers << " layers, width " << k.hidden << ", kv heads " << k.kv_heads;
  }
}

TEST(LlamaConfig, ParameterCountsOfThePublishedModels) {
  auto count = [](const char* name) { return llama::num_parameters(llama::preset(name)); };
  // Meta's LLaMA 1 and Llama 2 checkpoints (untied head, vocab 32000), as HF counts them.
  EXPECT_EQ(count("llama-7b"), 6'738'415'616);
  EXPECT_EQ(count("llama-13b"), 13'015'864'320);
  EXPECT_EQ(count("llama-33b"), 32'528'943'616);
  EXPECT_EQ(count("llama-65b"), 65'285'660'672);
  EXPECT_EQ(count("llama2-7b"), 6'738'415'616);
  EXPECT_EQ(count("llama2-13b"), 13'015'864'320);
  EXPECT_EQ(count("llama2-70b"), 68'976'648'192);  // grouped-query attention, 8 k/v heads
  LlamaConfig l1 = llama::preset("llama-7b"), l2 = llama::preset("llama2-7b");
  EXPECT_EQ(l1.max_position_embeddings, 2048);
  EXPECT_EQ(l2.max_position_embeddings, 4096);
  EXPECT_EQ(l1.rms_norm_eps, 1e-6f);
  EXPECT_EQ(l2.rms_norm_eps, 1e-5f);
  EXPECT_EQ(llama::preset("llama2-70b").num_key_value_heads, 8);
  // shape() answers without allocating 70B parameters.
  ModelShape s = ModelRegistry::global().shape("llama2-70b");
  EXPECT_EQ(s.n_layer, 80);
  EXPECT_EQ(s.n_embd, 8192);
  EXPECT_EQ(s.n_head, 64);
  EXPECT_EQ(s.max_seq_len, 4096);
  EXPECT_EQ(s.vocab_size, 32000);
  EXPECT_EQ(s.num_parameters, 68'976'648'192);
}

}  // namespace
}  // namespace strata::models
