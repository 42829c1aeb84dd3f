// Hugging Face LLaMA interop (models/hf_interop.h through models/llama/hf_interop.h): the rotary
// row permutation against a hand-worked example and against HF's rotate_half written out, the
// PyTorch reference weights written in HF's layout (by this test's own index formula) loading to
// the reference logits, Strata -> HF -> Strata round trips (tied and untied heads, grouped-query
// attention, padded vocabulary, half precision), the config.json export writes, and errors that
// name the file and leave the model untouched. Shards, config.json checks and mutated files are
// in llama_hf_files_test.cpp.
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

// As tests/models/llama_reference_test.cpp: the reference logits are float64 rounded to fp32.
constexpr double kRtol = 1e-4, kAtol = 1e-5;

class LlamaHf : public LlamaHfTest {};

// Note [HF LLaMA layout] on 2 heads of D = 6 (pairs (i, i + 3) in HF, (2i, 2i + 1) in Strata),
// worked by hand: Strata's head rows are HF's rows 0, 3, 1, 4, 2, 5.
TEST_F(LlamaHf, RotaryRowPermutationMatchesAHandWorkedExample) {
  std::vector<float> hf;
  for (int r = 0; r < 12; ++r)
    for (int c = 0; c < 2; ++c) hf.push_back(static_cast<float>(10 * r + c));
  const Tensor w = tensor::from_vector(hf, {12, 2});
  const std::vector<int> want_rows = {0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11};
  std::vector<float> want;
  for (int r : want_rows)
    for (int c = 0; c < 2; ++c) want.push_back(static_cast<float>(10 * r + c));
  const Tensor strata = llama::rotary_rows_from_hf(w, 2);
  EXPECT_EQ(tensor::to_float_vector(strata), want);
  EXPECT_EQ(tensor::to_float_vector(llama::rotary_rows_to_hf(strata, 2)), hf);
  // The test's own formula agrees with the example.
  EXPECT_EQ(tensor::to_float_vector(strata_rows_to_hf_by_hand(strata, 6)), hf);
  // The head count matters: one head of D = 12 pairs rows differently.
  EXPECT_NE(tensor::to_float_vector(llama::rotary_rows_from_hf(w, 1)), want);
  // Any float dtype goes through unchanged in value.
  EXPECT_EQ(tensor::to_float_vector(llama::rotary_rows_from_hf(w.to(DType::BF16), 2)), want);
}

// Why the permutation: HF's rotate_half rotary (pairs (i, i + D/2), written out here) on the
// projection by HF-ordered rows gives, feature for feature, Strata's interleaved rotary
// (tensor::rotary, pairs (2i, 2i + 1)) on the projection by Strata's rows, so every attention
// score q.k is the same.
TEST_F(LlamaHf, RotateHalfOnHfRowsIsStratasRotaryOnStratasRows) {
  const int64_t n = 2, D = 8, C = 5, T = 6;
  const double theta = 10000.0;
  const Tensor w = tensor::randn({n * D, C}, RngKey{3, 1});  // Strata's rows
  const Tensor x = tensor::randn({T, C}, RngKey{3, 2});
  // Strata: [1, T, n, D] through the kernel the model uses.
  auto [cos, sin] = tensor::rotary_tables(T, D, theta);
  const Tensor ours = tensor::rotary(
      tensor::matmul(x, w, false, true).reshape({1, T, n, D}).contiguous(), cos, sin);
  const std::vector<float> s = tensor::to_float_vector(ours);
  // HF: rotate_half on x @ W_hf^T, in double.
  const std::vector<float> q =
      tensor::to_float_vector(tensor::matmul(x, llama::rotary_rows_to_hf(w, n), false, true));
  double worst = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < n; ++h)
      for (int64_t i = 0; i < D / 2; ++i) {
        const double angle = static_cast<double>(t) * std::pow(theta, -2.0 * i / D);
        const double a = q[t * n * D + h * D + i], b = q[t * n * D + h * D + i + D / 2];
        const double hf0 = a * std::cos(angle) - b * std::sin(angle);  // feature i
        const double hf1 = b * std::cos(angle) + a * std::sin(angle);  // feature i + D/2
        worst = std::max(worst, std::fabs(hf0 - s[t * n * D + h * D + 2 * i]));
        worst = std::max(worst, std::fabs(hf1 - s[t * n * D + h * D + 2 * i + 1]));
      }
  EXPECT_LT(worst, 1e-5);
  // Without the permutation the features do not line up.
  const std::vector<float> unpermuted = tensor::to_float_vector(tensor::matmul(x, w, false, true));
  double off = 0;
  for (int64_t k = 0; k < T * n * D; ++k)
    off = std::max(off, static_cast<double>(std::fabs(unpermuted[k] - q[k])));
  EXPECT_GT(off, 0.1);
}

// The PyTorch reference weights (tests/reference/gen_llama_tiny.py, whose check_hf_equivalence
// proves a rotate_half forward on rows permuted this way gives the same logits) written as
// LlamaForCausalLM saves them: "model." names, q/k rows in HF order, vocab_size rows, a tied head
// left out or written as a copy. Loaded through load_hf, they give the reference logits.
TEST_F(LlamaHf, ReferenceWeightsInHfLayoutLoadToTheReferenceLogits) {
  for (const char* file : {"llama_tiny.safetensors", "llama_tiny_tied.safetensors"}) {
    SCOPED_TRACE(file);
    tensor::SafetensorsReader ref(reference_path(file));
    const llama::LlamaConfig cfg = testing::llama_config_from_metadata(ref);
    const int64_t D = cfg.head_dim();
    Tensors hf;
    Llama shape_source(cfg, 0);
    for (auto& [name, p] : shape_source.named_parameters()) {
      Tensor t = ref.read(name);
      if (name.ends_with("q_proj.weight") || name.ends_with("k_proj.weight"))
        t = strata_rows_to_hf_by_hand(t, D);
      if (name == "embed_tokens.weight" || name == "lm_head.weight")
        t = t.narrow(0, 0, cfg.vocab_size).contiguous();
      hf.emplace_back(name == "lm_head.weight" ? name : "model." + name, t);
    }
    std::vector<Tensors> files = {hf};
    if (cfg.tie_word_embeddings) {  // save_pretrained may also write the tied head
      files.push_back(hf);
      files.back().emplace_back("lm_head.weight", hf.front().second.clone());
    }
    for (size_t f = 0; f < files.size(); ++f) {
      const std::string path = write(fmt::format("hf_{}_{}", f, file), files[f]);
      Llama m(cfg, 99);
      for (FlatUnit& u : m.flat_units()) u.params.fill_(3.0);  // the load must overwrite all
      load_hf(m, path);
      for (auto& [name, p] : m.named_parameters()) {
        SCOPED_TRACE(name);
        EXPECT_EQ(tensor::max_abs_diff(p.data(), ref.read(name)), 0.0);
      }
      double diff = 0;
      EXPECT_TRUE(
          all_close(logits_of(m, ref.read("tokens")), ref.read("logits"), kRtol, kAtol, &diff));
      std::cout << "[ " << file << " ] HF layout -> load_hf: max |logit diff| vs PyTorch " << diff
                << "\n";
    }
  }
}

TEST_F(LlamaHf, ExportThenLoadIsBitwiseWithTiedAndUntiedHeadsAndGroupedKv) {
  const Tensor ids = testing::random_token_ids(2, 12, 61, 5);
  for (bool tied : {false, true})
    for (int64_t kv : {2, 4}) {
      SCOPED_TRACE(fmt::format("tied {} kv heads {}", tied, kv));
      auto a = make_model(small(tied, kv));
      const fs::path out = dir_ / fmt::format("export_{}_{}", tied, kv);
      export_hf(*a, out.string());
      for (const auto& entry : fs::directory_iterator(out))
        EXPECT_EQ(entry.path().string().find(".tmp"), std::string::npos) << entry.path();

      // The file: LlamaForCausalLM's names, vocab_size rows, q/k rows in HF's order, fp32.
      tensor::SafetensorsReader r((out / "model.safetensors").string());
      const auto params = a->named_parameters();
      EXPECT_EQ(r.entries().size(), params.size());
      EXPECT_EQ(r.contains("lm_head.weight"), !tied);
      for (const auto& [name, p] : params) {
        SCOPED_TRACE(name);
        const std::string hf = name == "lm_head.weight" ? name : "model." + name;
        ASSERT_TRUE(r.contains(hf));
        EXPECT_EQ(r.entry(hf).dtype, DType::F32);
        Tensor want = p.data();
        if (name == "embed_tokens.weight" || name == "lm_head.weight") want = want.narrow(0, 0, 61);
        if (name.ends_with("q_proj.weight") || name.ends_with("k_proj.weight")) {
          want = strata_rows_to_hf_by_hand(want, 8);
          EXPECT_NE(tensor::max_abs_diff(r.read(hf), p.data()), 0.0) << "rows not permuted";
        }
        EXPECT_EQ(tensor::max_abs_diff(r.read(hf), want), 0.0);
      }
      EXPECT_EQ(r.read("model.layers.1.self_attn.k_proj.weight").size(0), kv * 8);

      // Into a differently initialised model: every byte of the flat buffers, and the logits.
      auto b = make_model(small(tied, kv), 12345);
      ASSERT_FALSE(snapshot(*a) == snapshot(*b));
      load_hf(*b, out.string());  // the directory: model.safetensors, config.json checked
      EXPECT_TRUE(snapshot(*a) == snapshot(*b));
      EXPECT_EQ(tensor::max_abs_diff(logits_of(*a, ids), logits_of(*b, ids)), 0.0);
    }
}

TEST_F(LlamaHf, WritesTheConfigTransformersNeeds) {
  auto m = make_model(small(false, 2));
  export_hf(*m, (dir_ / "out").string());
  std::ifstream in(dir_ / "out" / "config.json");
  nlohmann::json c = nlohmann::json::parse(in);
  EXPECT_EQ(c.at("architectures"), nlohmann::json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(c.at("model_type"), "llama");
  EXPECT_EQ(c.at("vocab_size"), 61);
  EXPECT_EQ(c.at("hidden_size"), 32);
  EXPECT_EQ(c.at("intermediate_size"), 48);
  EXPECT_EQ(c.at("num_hidden_layers"), 2);
  EXPECT_EQ(c.at("num_attention_heads"), 4);
  EXPECT_EQ(c.at("num_key_value_heads"), 2);
  EXPECT_EQ(c.at("head_dim"), 8);
  EXPECT_EQ(c.at("max_position_embeddings"), 32);
  EXPECT_EQ(c.at("hidden_act"), "silu");
  EXPECT_DOUBLE_EQ(c.at("rms_norm_eps").get<double>(), 1e-5);
  EXPECT_DOUBLE_EQ(c.at("rope_theta").get<double>(), 10000.0);
  EXPECT_TRUE(c.at("rope_scaling").is_null());
  EXPECT_EQ(c.at("tie_word_embeddings"), false);
  EXPECT_EQ(c.at("torch_dtype"), "float32");

  auto t = make_model(small(true, 4));
  export_hf(*t, (dir_ / "tied").string());
  std::ifstream tin(dir_ / "tied" / "config.json");
  EXPECT_EQ(nlohmann::json::parse(tin).at("tie_word_embeddings"), true);
}

TEST_F(LlamaHf, HalfPrecisionFilesAndNamesWithoutPrefixLoad) {
  auto a = make_model(small(false, 2));
  export_hf(*a, (dir_ / "out").string());
  const Tensors exported = read_all((dir_ / "out" / "model.safetensors").string());
  for (DType dt : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    Tensors ts = exported;
    for (auto& [name, t] : ts) {
      t = t.to(dt);
      if (name.starts_with("model.")) name = name.substr(6);  // LlamaModel's names
    }
    ts.emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq", tensor::ones({4}));
    auto b = make_model(small(false, 2), 3);
    load_hf(*b, write(fmt::format("half_{}.safetensors", dtype_name(dt)), ts));
    for (auto& [name, p] : a->named_parameters()) {
      SCOPED_TRACE(name);
      // The parameter rounded through `dt`, exactly (the permutation moves rows, not values).
      EXPECT_EQ(tensor::max_abs_diff(b->parameter(name).data(), p.data().to(dt).to(DType::F32)),
                0.0);
    }
  }
}

TEST_F(LlamaHf, WrongFamilyMissingAndMisshapenTensorsAreNamed) {
  auto m = make_model(small(false, 2));
  export_hf(*m, (dir_ / "export").string());
  // The tensors alone (no config.json beside them): the tensor checks speak.
  const Tensors ts = read_all((dir_ / "export" / "model.safetensors").string());
  const std::string good = write("good.safetensors", ts);
  auto edited = [&](const std::string& name, const std::function<void(Tensors&)>& edit) {
    Tensors t = ts;
    edit(t);
    return write(name, t);
  };

  // GPT-2 weights into a LLaMA model, and LLaMA weights into a GPT-2 model.
  expect_load_error(*m, reference_path("gpt2_hf_tiny/model.safetensors"),
                    {"not a Hugging Face LLaMA checkpoint", "model.embed_tokens.weight",
                     "GPT-2 checkpoint", "transformer.wte.weight", "gpt2-family"});
  {
    ModelOptions o;
    o.overrides = {{"vocab_size", "61"}, {"n_embd", "32"}, {"n_layer", "2"}, {"n_head", "4"}};
    auto gpt2 = ModelRegistry::global().create("gpt2-tiny", o);
    expect_load_error(*gpt2, good,
                      {"not a Hugging Face GPT-2 checkpoint", "wte.weight", "LLaMA checkpoint",
                       "model.embed_tokens.weight", "llama-family"});
    // With its config.json, that says so first.
    expect_load_error(*gpt2, (dir_ / "export").string(),
                      {"config.json", "model_type is \"llama\"", "a LLaMA checkpoint",
                       "choose a llama-family model.name"});
  }
  expect_load_error(*m,
                    edited("missing.safetensors",
                           [](Tensors& t) {
                             std::erase_if(t, [](auto& p) {
                               return p.first == "model.layers.1.mlp.up_proj.weight";
                             });
                           }),
                    {"missing tensor", "model.layers.1.mlp.up_proj.weight"});
  expect_load_error(*m,
                    edited("no_head.safetensors",
                           [](Tensors& t) {
                             std::erase_if(t, [](auto& p) { return p.first == "lm_head.weight"; });
                           }),
                    {"missing tensor", "lm_head.weight", "tie_word_embeddings: true"});
  expect_load_error(*m,
                    edited("extra.safetensors",
                           [](Tensors& t) {
                             t.emplace_back("model.layers.0.self_attn.q_proj.bias",
                                            tensor::zeros({32}));
                           }),
                    {"unexpected tensor", "model.layers.0.self_attn.q_proj.bias"});
  expect_load_error(*m,
                    edited("both.safetensors",
                           [](Tensors& t) { t.emplace_back("norm.weight", tensor::ones({32})); }),
                    {"'model.norm.weight'", "'norm.weight'", "prefix"});
  expect_load_error(*m,
                    edited("ints.safetensors",
                           [](Tensors& t) {
                             for (auto& [name, x] : t)
                               if (name == "model.norm.weight") x = tensor::zeros({32}, DType::I32);
                           }),
                    {"model.norm.weight", "F32, F16 or BF16"});

  // Strata's own checkpoint files (Strata's layouts under the same names) are not HF files.
  {
    const std::string path = (dir_ / "strata_checkpoint.safetensors").string();
    Tensors params;
    for (auto& [name, p] : m->named_parameters()) params.emplace_back(name, p.data());
    tensor::save_safetensors(path, params, {{"format", "strata"}, {"family", "llama"}});
    expect_load_error(*m, path, {"a Strata checkpoint file", "convert --checkpoint DIR --to-hf"});
  }

  // Shapes (no config.json beside these files): the key that probably differs.
  struct Case {
    std::string key, value;
    std::vector<std::string> needles;
  };
  for (const Case& c : std::vector<Case>{
           {"num_key_value_heads",
            "4",
            {"model.layers.0.self_attn.k_proj.weight", "[16, 32]", "[32, 32]",
             "num_key_value_heads"}},
           {"intermediate_size",
            "64",
            {"model.layers.0.mlp.gate_proj.weight", "[48, 32]", "[64, 32]", "intermediate_size"}},
           {"vocab_size",
            "64",
            {"model.embed_tokens.weight", "[61, 32]", "[64, 32]", "vocab_size"}},
           {"num_hidden_layers", "3", {"missing tensor", "model.layers.2.", "num_hidden_layers"}},
           {"num_hidden_layers",
            "1",
            {"unexpected tensor", "model.layers.1.", "num_hidden_layers"}},
       }) {
    SCOPED_TRACE(c.key);
    auto overrides = small(false, 2);
    overrides[c.key] = c.value;
    auto other = make_model(overrides);
    expect_load_error(*other, good, c.needles);
  }

  // A tied model takes lm_head.weight only as embed_tokens' copy.
  auto tied = make_model(small(true, 2));
  expect_load_error(*tied, good, {"lm_head.weight", "tie_word_embeddings: false"});
}

}  // namespace
}  // namespace strata::models
