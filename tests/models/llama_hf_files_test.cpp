// Hugging Face LLaMA checkpoints as files (models/hf_interop.h): sharded checkpoints through
// model.safetensors.index.json, the config.json beside a checkpoint checked against the model,
// and mutated safetensors, config.json and index files (Note [Hostile input tests]).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "llama_hf_test_util.h"
#include "llama_test_util.h"
#include "models/hf_interop.h"
#include "models/llama/hf_interop.h"
#include "models/registry.h"
#include "tensor/ops.h"
#include "tests/support/mutate.h"

namespace strata::models {
namespace {

namespace fs = std::filesystem;
using namespace hf_test;  // NOLINT: the shared helpers of these tests
using llama::Llama;
using tensor::Shape;
using tensor::Tensor;
using testing::all_close;
using testing::reference_path;

class LlamaHfFiles : public LlamaHfTest {};

// save_pretrained's sharded form: model.safetensors.index.json maps each tensor to a shard file
// beside it. The directory (or the index itself) loads like one file; a wrong index is named.
TEST_F(LlamaHfFiles, ShardedCheckpointsLoadThroughTheirIndex) {
  auto a = make_model(small(false, 2));
  export_hf(*a, (dir_ / "one").string());
  const Tensors ts = read_all((dir_ / "one" / "model.safetensors").string());
  const fs::path sharded = dir_ / "sharded";
  fs::create_directories(sharded);
  fs::copy_file(dir_ / "one" / "config.json", sharded / "config.json");
  const size_t half = ts.size() / 2;
  const std::string f1 = "model-00001-of-00002.safetensors",
                    f2 = "model-00002-of-00002.safetensors";
  tensor::save_safetensors((sharded / f1).string(), Tensors(ts.begin(), ts.begin() + half));
  tensor::save_safetensors((sharded / f2).string(), Tensors(ts.begin() + half, ts.end()));
  nlohmann::json index;
  index["metadata"] = {{"total_size", 0}};
  for (size_t k = 0; k < ts.size(); ++k) index["weight_map"][ts[k].first] = k < half ? f1 : f2;
  const fs::path index_path = sharded / "model.safetensors.index.json";
  std::ofstream(index_path) << index.dump(2);

  for (const fs::path& p : {sharded, index_path}) {
    auto b = make_model(small(false, 2), 77);
    load_hf(*b, p.string());
    EXPECT_TRUE(snapshot(*a) == snapshot(*b)) << p;
  }

  auto b = make_model(small(false, 2), 77);
  auto with_index = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = index;
    edit(j);
    std::ofstream(index_path, std::ios::trunc) << j.dump(2);
    return index_path.string();
  };
  const std::string moved = ts[0].first;
  expect_load_error(*b, with_index([&](nlohmann::json& j) { j["weight_map"][moved] = f2; }),
                    {"weight_map puts '" + moved + "' in " + f2, "no such tensor"});
  expect_load_error(*b, with_index([&](nlohmann::json& j) { j["weight_map"].erase(moved); }),
                    {(sharded / f1).string(), moved, "not in"});
  expect_load_error(*b, with_index([&](nlohmann::json& j) {
    j["weight_map"][moved] = "../one/model.safetensors";
  }),
                    {"../one/model.safetensors", "beside the index"});
  expect_load_error(*b, with_index([&](nlohmann::json& j) {
    j["weight_map"][moved] = "model-00003-of-00002.safetensors";
  }),
                    {"model-00003-of-00002.safetensors", "not a file"});
  expect_load_error(*b, with_index([](nlohmann::json& j) { j.erase("weight_map"); }),
                    {"weight_map"});

  // Mutated indexes load or are refused (Note [Hostile input tests]).
  const std::string good = index.dump(2);
  std::ofstream(index_path, std::ios::trunc) << good;
  load_hf(*b, sharded.string());  // the unmutated index loads
  const auto tally = ::strata::testing::check_hostile(
      "HF model.safetensors.index.json", index_path, good,
      ::strata::testing::hostile_iterations(100), 41, [&] {
        const auto before = snapshot(*b);
        try {
          load_hf(*b, sharded.string());
        } catch (const UserError&) {
          EXPECT_TRUE(snapshot(*b) == before) << "a refused load touched the model";
          throw;
        }
      });
  std::printf("HF model.safetensors.index.json: %d mutants taken, %d refused\n", tally.accepted,
              tally.refused);
  EXPECT_GT(tally.refused, 0);
}

// With config.json beside the file, what shapes cannot show (the number of heads, at an equal
// width) is checked too, before any tensor is read.
TEST_F(LlamaHfFiles, ConfigJsonBesideTheFileMustDescribeTheModel) {
  auto m = make_model(small(false, 4));
  const fs::path out = dir_ / "out";
  export_hf(*m, out.string());
  const std::string config = (out / "config.json").string();

  auto heads = small(false, 4);
  heads["num_attention_heads"] = "8";  // head_dim 4 instead of 8: every tensor the same shape
  heads["num_key_value_heads"] = "8";
  auto h = make_model(heads);
  expect_load_error(*h, out.string(),
                    {config, "num_attention_heads = 4", "model.config.num_attention_heads: 4"});
  fs::path bare = dir_ / "bare";  // the same weights without config.json: nothing to tell
  fs::create_directories(bare);
  fs::copy_file(out / "model.safetensors", bare / "model.safetensors");
  EXPECT_NO_THROW(load_hf(*h, bare.string()));

  auto rewrite = [&](const std::function<void(nlohmann::json&)>& edit) {
    std::ifstream in(config);
    nlohmann::json j = nlohmann::json::parse(in);
    edit(j);
    std::ofstream(config, std::ios::trunc) << j.dump(2);
  };
  auto d = make_model(small(false, 4));
  rewrite([](nlohmann::json& j) { j.erase("num_key_value_heads"); });  // = num_attention_heads
  EXPECT_NO_THROW(load_hf(*d, out.string()));
  rewrite([](nlohmann::json& j) { j["num_key_value_heads"] = 2; });
  expect_load_error(*d, out.string(),
                    {config, "num_key_value_heads = 2", "model.config.num_key_value_heads: 2"});
  rewrite([](nlohmann::json& j) {
    j["num_key_value_heads"] = 4;
    j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  });
  expect_load_error(*d, out.string(), {config, "rope_scaling", "llama3"});
  rewrite([](nlohmann::json& j) {
    j["rope_scaling"] = nullptr;
    j["rope_theta"] = 500000.0;
  });
  expect_load_error(*d, out.string(), {config, "rope_theta = 500000", "model.config.rope_theta"});
  rewrite([](nlohmann::json& j) {
    j["rope_theta"] = 10000.0;
    j["tie_word_embeddings"] = true;
  });
  expect_load_error(*d, out.string(), {config, "tie_word_embeddings = true"});
  rewrite([](nlohmann::json& j) {
    j["tie_word_embeddings"] = false;
    j.erase("rms_norm_eps");  // LlamaConfig's default is 1e-6
  });
  expect_load_error(*d, out.string(), {config, "rms_norm_eps = 1e-06", "absent"});
  rewrite([](nlohmann::json& j) {
    j["rms_norm_eps"] = 1e-5;
    j["hidden_act"] = "gelu";
  });
  expect_load_error(*d, out.string(), {config, "hidden_act", "gelu", "silu"});
  rewrite([](nlohmann::json& j) {
    j["hidden_act"] = "silu";
    j["model_type"] = "gpt2";
  });
  expect_load_error(*d, out.string(), {config, "model_type is \"gpt2\"", "a GPT-2 checkpoint"});
  rewrite([](nlohmann::json& j) { j["model_type"] = "mistral"; });
  expect_load_error(*d, out.string(), {config, "\"mistral\"", "not a LLaMA checkpoint"});
  rewrite([](nlohmann::json& j) {
    j["model_type"] = "llama";
    j["hidden_size"] = 32.5;
  });
  expect_load_error(*d, out.string(), {config, "'hidden_size'", "an integer"});
  std::ofstream(config, std::ios::trunc) << "[1, 2]";
  expect_load_error(*d, out.string(), {config, "JSON object"});
}

// The same safetensors bytes without Strata's digests (Note [Safetensors digests]), as another
// writer would leave them: mutants then reach the structural checks instead of the digest check.
std::string without_digests(const std::string& bytes) {
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  nlohmann::ordered_json header = nlohmann::ordered_json::parse(bytes.substr(8, n));
  nlohmann::ordered_json& meta = header["__metadata__"];
  for (auto it = meta.begin(); it != meta.end();)
    it = it.key().starts_with("strata.") ? meta.erase(it) : std::next(it);
  std::string text = header.dump();
  const uint64_t m = text.size();
  std::string out(reinterpret_cast<const char*>(&m), 8);
  return out + text + bytes.substr(8 + n);
}

// Note [Hostile input tests] (tests/support/mutate.h): mutants of an exported model.safetensors
// (with Strata's digests and without) and config.json load or are refused with a UserError, and a
// refusal leaves the model as it was.
TEST_F(LlamaHfFiles, MutatedFilesLoadOrAreRefusedWithoutTouchingTheModel) {
  auto source = make_model(small(false, 2));
  const fs::path out = dir_ / "out";
  export_hf(*source, out.string());
  auto m = make_model(small(false, 2), 4);
  auto slurp = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  };
  const std::string weights = slurp(out / "model.safetensors");
  const std::string plain = without_digests(weights);
  ASSERT_NE(plain, weights);
  const std::string config = slurp(out / "config.json");
  struct Case {
    const char* what;
    const char* file;
    const std::string* good;
    int iterations;
  };
  for (const Case& c : {Case{"model.safetensors with digests", "model.safetensors", &weights, 50},
                        Case{"model.safetensors", "model.safetensors", &plain, 150},
                        Case{"config.json", "config.json", &config, 150}}) {
    std::ofstream(out / "model.safetensors", std::ios::binary | std::ios::trunc)
        << (c.good == &config ? weights : *c.good);
    std::ofstream(out / "config.json", std::ios::binary | std::ios::trunc) << config;
    auto fresh = make_model(small(false, 2), 4);
    load_hf(*fresh, out.string());  // the unmutated pair loads
    const int n = ::strata::testing::hostile_iterations(c.iterations);
    const auto tally = ::strata::testing::check_hostile(
        std::string("HF LLaMA ") + c.what, out / c.file, *c.good, n, 37, [&] {
          const auto before = snapshot(*m);
          try {
            load_hf(*m, out.string());
          } catch (const UserError&) {
            EXPECT_TRUE(snapshot(*m) == before) << "a refused load touched the model";
            throw;
          }
        });
    std::printf("HF LLaMA %s: %d mutants taken, %d refused\n", c.what, tally.accepted,
                tally.refused);
    EXPECT_GT(tally.refused, 0);
  }
}

}  // namespace
}  // namespace strata::models
