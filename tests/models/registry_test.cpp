// The model registry (Note [Model registry]) and GPT-2 configs and parameter counts.
#include <gtest/gtest.h>

#include "models/config_limits.h"
#include "models/gpt2/gpt2.h"
#include "models/registry.h"

namespace strata::models {
namespace {

using gpt2::GPT2Config;

TEST(Registry, KnowsEveryPreset) {
  const ModelRegistry& r = ModelRegistry::global();
  for (const char* name :
       {"gpt2-tiny", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt3-125m", "gpt3-350m",
        "gpt3-760m", "gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "gpt3-13b", "gpt3-175b"}) {
    EXPECT_TRUE(r.contains(name)) << name;
    EXPECT_EQ(r.get(name).family, "gpt2");
    EXPECT_FALSE(r.get(name).description.empty());
  }
  std::vector<std::string> names = r.names();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
}

TEST(Registry, UnknownNameIsAUserErrorListingKnownNames) {
  try {
    ModelRegistry::global().create("gpt5");
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("gpt5"), std::string::npos) << msg;
    EXPECT_NE(msg.find("gpt2-medium"), std::string::npos) << msg;
    EXPECT_NE(msg.find("gpt3-175b"), std::string::npos) << msg;
  }
}

TEST(Registry, CreatesModelsWithOverrides) {
  ModelOptions o;
  o.seed = 5;
  o.overrides = {{"n_layer", "3"}, {"vocab_size", "100"}, {"block_size", "16"}};
  std::unique_ptr<CausalLM> m = ModelRegistry::global().create("gpt2-tiny", o);
  EXPECT_EQ(m->family(), "gpt2");
  EXPECT_EQ(m->vocab_size(), 100);
  EXPECT_EQ(m->padded_vocab_size(), 128) << "re-padded to a multiple of 64";
  EXPECT_EQ(m->max_seq_len(), 16);
  EXPECT_EQ(m->flat_units().size(), 5u);  // embeddings, 3 blocks, head
  ModelShape s = ModelRegistry::global().shape("gpt2-tiny", o);
  EXPECT_EQ(s.num_parameters, m->num_parameters());
  EXPECT_EQ(s.n_layer, 3);
  EXPECT_EQ(s.padded_vocab_size, 128);
  EXPECT_EQ(m->parameter("h.2.mlp.c_fc.weight").shape(), (tensor::Shape{256, 64}));
}

TEST(Registry, BadOverridesAreUserErrors) {
  const ModelRegistry& r = ModelRegistry::global();
  auto create = [&](std::map<std::string, std::string> ov) {
    ModelOptions o;
    o.overrides = std::move(ov);
    return r.create("gpt2-tiny", o);
  };
  EXPECT_THROW(create({{"n_layers", "3"}}), UserError);  // typo of n_layer
  EXPECT_THROW(create({{"n_layer", "three"}}), UserError);
  EXPECT_THROW(create({{"n_head", "5"}}), UserError);  // 64 % 5 != 0
  EXPECT_THROW(create({{"activation_checkpointing", "maybe"}}), UserError);
  EXPECT_THROW(create({{"vocab_size", "300"}, {"padded_vocab_size", "256"}}), UserError);
  EXPECT_NO_THROW(create({{"dropout", "0.1"}, {"activation_checkpointing", "true"}}));
}

TEST(Gpt2Config, ParameterCountsMatchTheModelForSmallConfigs) {
  for (auto [layers, embd, heads, vocab, padded] : std::vector<std::tuple<int, int, int, int, int>>{
           {1, 32, 4, 64, 64}, {2, 64, 4, 256, 256}, {3, 48, 6, 100, 128}, {2, 96, 3, 77, 80}}) {
    GPT2Config c = gpt2::preset("gpt2-tiny");
    c.n_layer = layers;
    c.n_embd = embd;
    c.n_head = heads;
    c.vocab_size = vocab;
    c.padded_vocab_size = padded;
    gpt2::GPT2 model(c);
    EXPECT_EQ(gpt2::num_parameters(c), model.num_parameters())
        << layers << " layers, width " << embd;
  }
}

TEST(Gpt2Config, ParameterCountsOfThePublishedModels) {
  auto count = [](const char* name, bool pad) {
    GPT2Config c = gpt2::preset(name);
    if (!pad) c.padded_vocab_size = c.vocab_size;
    return gpt2::num_parameters(c);
  };
  // HF's GPT-2 checkpoints (tied head, vocab 50257).
  EXPECT_EQ(count("gpt2", false), 124'439'808);
  EXPECT_EQ(count("gpt2-medium", false), 354'823'168);
  EXPECT_EQ(count("gpt2-large", false), 774'030'080);
  EXPECT_EQ(count("gpt2-xl", false), 1'557'611'200);
  // Padding to 50304 adds 47 rows of wte.
  EXPECT_EQ(count("gpt2", true), 124'439'808 + 47 * 768);
  // GPT-3 table 2.1 sizes, to the precision the paper names them.
  auto near = [](int64_t n, double expected, double tol) {
    return std::abs(static_cast<double>(n) - expected) <= tol * expected;
  };
  EXPECT_TRUE(near(count("gpt3-125m", false), 125e6, 0.01));
  EXPECT_TRUE(near(count("gpt3-350m", false), 350e6, 0.02));
  EXPECT_TRUE(near(count("gpt3-760m", false), 760e6, 0.02));
  EXPECT_TRUE(near(count("gpt3-1.3b", false), 1.3e9, 0.02));
  EXPECT_TRUE(near(count("gpt3-2.7b", false), 2.7e9, 0.02));
  EXPECT_TRUE(near(count("gpt3-6.7b", false), 6.7e9, 0.02));
  EXPECT_TRUE(near(count("gpt3-13b", false), 13e9, 0.02));
  EXPECT_TRUE(near(count("gpt3-175b", false), 175e9, 0.01));
  // shape() answers without allocating 175B parameters.
  ModelShape s = ModelRegistry::global().shape("gpt3-175b");
  EXPECT_EQ(s.n_layer, 96);
  EXPECT_EQ(s.n_embd, 12288);
  EXPECT_EQ(s.max_seq_len, 2048);
  EXPECT_EQ(s.num_parameters, count("gpt3-175b", true));
}

// Note [Model size limits]: sizes far beyond any model are refused by name, through shape() (no
// allocation) as through create(); a count computed from them used to overflow int64
// (n_embd 2^62: a signed overflow in num_parameters, found by UBSan on a mutated config).
TEST(Gpt2Config, SizesAboveTheLimitsAreUserErrorsNamingTheKey) {
  const ModelRegistry& r = ModelRegistry::global();
  auto shape_error = [&](std::map<std::string, std::string> ov) -> std::string {
    ModelOptions o;
    o.overrides = std::move(ov);
    try {
      r.shape("gpt2-tiny", o);
    } catch (const UserError& e) {
      return e.what();
    }
    return "(no error)";
  };
  for (const auto& [key, limit] :
       std::vector<std::pair<std::string, int64_t>>{{"vocab_size", kMaxVocab},
                                                    {"padded_vocab_size", kMaxPaddedVocab},
                                                    {"n_positions", kMaxContext},
                                                    {"n_embd", kMaxWidth},
                                                    {"n_layer", kMaxLayers}}) {
    const std::string msg = shape_error({{key, std::to_string(limit + 1)}});
    EXPECT_NE(msg.find(key + " " + std::to_string(limit + 1) + " is above the limit"),
              std::string::npos)
        << msg;
  }
  EXPECT_NE(shape_error({{"n_embd", "4611686018427387904"}}).find("n_embd"), std::string::npos);
  EXPECT_NE(shape_error({{"vocab_size", "9223372036854775807"}}).find("vocab_size"),
            std::string::npos);
  EXPECT_NE(shape_error({{"layer_norm_epsilon", "inf"}}).find("finite"), std::string::npos);
  // At the limits the count is exact and fits int64 (n_head 1 keeps n_embd divisible).
  ModelOptions o;
  o.overrides = {{"vocab_size", std::to_string(kMaxVocab)},
                 {"padded_vocab_size", std::to_string(kMaxPaddedVocab)},
                 {"n_positions", std::to_string(kMaxContext)},
                 {"n_embd", std::to_string(kMaxWidth)},
                 {"n_layer", std::to_string(kMaxLayers)},
                 {"n_head", "1"}};
  const int64_t C = kMaxWidth;
  EXPECT_EQ(r.shape("gpt2-tiny", o).num_parameters,
            kMaxPaddedVocab * C + kMaxContext * C + kMaxLayers * (12 * C * C + 13 * C) + 2 * C);
}

TEST(Gpt2Config, PadVocab) {
  EXPECT_EQ(gpt2::pad_vocab(50257), 50304);
  EXPECT_EQ(gpt2::pad_vocab(50257, 128), 50304);
  EXPECT_EQ(gpt2::pad_vocab(256), 256);
  EXPECT_THROW(gpt2::preset("gpt2-huge"), UserError);
}

}  // namespace
}  // namespace strata::models
