// Hugging Face GPT-2 interop (models/hf_interop.h through models/gpt2/hf_interop.h) against a
// file written by transformers' save_pretrained (tests/reference/gen_gpt2_hf.py): logits,
// name/dtype variants, errors that leave the model untouched, config.json checks, and export ->
// load round trips. LLaMA's are in llama_hf_interop_test.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "autograd/variable.h"
#include "model_test_util.h"
#include "models/hf_interop.h"
#include "models/registry.h"
#include "tensor/ops.h"
#include "tests/models/hf_test_util.h"
#include "tests/support/mutate.h"

namespace strata::models {
namespace {

namespace fs = std::filesystem;
using hf_test::expect_load_error;
using hf_test::snapshot;
using testing::all_close;
using testing::reference_path;

// As tests/models/gpt2_reference_test.cpp: the reference logits are float64 rounded to fp32.
constexpr double kRtol = 1e-4, kAtol = 1e-5;

const std::string kHfFile = "gpt2_hf_tiny/model.safetensors";

std::map<std::string, std::string> tiny_overrides() {
  return {{"vocab_size", "96"},
          {"n_positions", "32"},
          {"n_embd", "32"},
          {"n_layer", "2"},
          {"n_head", "4"}};
}

std::unique_ptr<CausalLM> make_model(
    std::map<std::string, std::string> overrides = tiny_overrides(), uint64_t seed = 7,
    const std::string& name = "gpt2-tiny") {
  ModelOptions o;
  o.seed = seed;
  o.overrides = std::move(overrides);
  return ModelRegistry::global().create(name, o);
}

class HfInterop : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("strata_hf_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The HF file rewritten by `edit` (names -> tensors, in file order).
  std::string rewritten(
      const std::string& name,
      const std::function<void(std::vector<std::pair<std::string, tensor::Tensor>>&)>& edit) {
    tensor::SafetensorsReader r(reference_path(kHfFile));
    std::vector<std::pair<std::string, tensor::Tensor>> ts;
    for (const auto& e : r.entries()) ts.emplace_back(e.name, r.read(e.name));
    edit(ts);
    std::string path = (dir_ / name).string();
    tensor::save_safetensors(path, ts, {{"format", "pt"}});
    return path;
  }

  fs::path dir_;
};

TEST_F(HfInterop, LoadedModelMatchesTransformersLogits) {
  auto m = make_model();
  ASSERT_EQ(m->padded_vocab_size(), 128);  // 96 padded: the padding must stay out of the way
  // Fill everything with garbage first: the load must overwrite every parameter and zero the pad.
  for (FlatUnit& u : m->flat_units()) u.params.fill_(3.0);
  load_hf(*m, reference_path(kHfFile));

  tensor::SafetensorsReader ref(reference_path("gpt2_hf_tiny/logits.safetensors"));
  tensor::Tensor logits;
  {
    autograd::NoGradGuard no_grad;
    m->eval();
    logits = m->forward(ref.read("ids")).data();
  }
  ASSERT_EQ(logits.shape(), (tensor::Shape{2, 20, 128}));
  double diff = 0;
  EXPECT_TRUE(all_close(logits.narrow(2, 0, 96), ref.read("logits"), kRtol, kAtol, &diff));
  std::cout << "[ hf ] max |logit diff| vs transformers " << diff << "\n";
  // Padding rows of wte are zero, so their logits are exactly zero.
  tensor::Tensor pad = m->parameter("wte.weight").data().narrow(0, 96, 32);
  EXPECT_EQ(tensor::max_abs_diff(pad, tensor::zeros(pad.shape())), 0.0);
  EXPECT_EQ(tensor::max_abs_diff(logits.narrow(2, 96, 32), tensor::zeros({2, 20, 32})), 0.0);
}

TEST_F(HfInterop, LoadWritesIntoTheFlatBuffersAndTransposesConv1D) {
  auto m = make_model();
  load_hf(*m, reference_path(kHfFile));
  for (const FlatUnit& u : m->flat_units())
    for (size_t k = 0; k < u.names.size(); ++k) {
      SCOPED_TRACE(u.names[k]);
      EXPECT_EQ(u.variables[k].data().data_ptr(), u.params.data<float>() + u.offsets[k]);
    }
  tensor::SafetensorsReader r(reference_path(kHfFile));
  tensor::Tensor hf = r.read("transformer.h.1.mlp.c_fc.weight");  // [in 32, out 128]
  tensor::Tensor ours = m->parameter("h.1.mlp.c_fc.weight").data();
  ASSERT_EQ(ours.shape(), (tensor::Shape{128, 32}));
  EXPECT_EQ(tensor::max_abs_diff(ours, hf.transpose(0, 1)), 0.0);
}

TEST_F(HfInterop, AcceptsNamesWithoutPrefixATiedLmHeadAndHalfPrecision) {
  auto reference = make_model();
  load_hf(*reference, reference_path(kHfFile));
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    std::string path =
        rewritten(fmt::format("plain_{}.safetensors", dtype_name(dt)), [&](auto& ts) {
          tensor::Tensor wte;
          for (auto& [name, t] : ts) {
            name = name.substr(std::string("transformer.").size());
            t = t.to(dt);
            if (name == "wte.weight") wte = t;
          }
          ts.emplace_back("lm_head.weight", wte.clone());
          ts.emplace_back("h.0.attn.bias", tensor::ones({1, 1, 32, 32}));  // old HF mask buffer
        });
    auto m = make_model(tiny_overrides(), 99);
    load_hf(*m, path);
    for (auto& [name, p] : reference->named_parameters()) {
      SCOPED_TRACE(name);
      // The expected value is the fp32 reference rounded through `dt`, exactly.
      tensor::Tensor want = p.data().to(dt).to(DType::F32);
      EXPECT_EQ(tensor::max_abs_diff(m->parameter(name).data(), want), 0.0);
    }
  }
}

TEST_F(HfInterop, MissingUnexpectedAndUntiedTensorsAreNamed) {
  auto m = make_model();
  expect_load_error(*m,
                    rewritten("missing.safetensors",
                              [](auto& ts) {
                                std::erase_if(ts, [](auto& p) {
                                  return p.first == "transformer.h.1.mlp.c_fc.bias";
                                });
                              }),
                    {"missing tensor", "h.1.mlp.c_fc.bias"});
  expect_load_error(*m,
                    rewritten("extra.safetensors",
                              [](auto& ts) {
                                ts.emplace_back("transformer.h.0.attn.rotary", tensor::zeros({4}));
                              }),
                    {"unexpected tensor", "transformer.h.0.attn.rotary"});
  expect_load_error(*m,
                    rewritten("untied.safetensors",
                              [](auto& ts) {
                                ts.emplace_back("lm_head.weight", tensor::ones({96, 32}));
                              }),
                    {"lm_head.weight", "untied"});
  expect_load_error(*m,
                    rewritten("llama.safetensors",
                              [](auto& ts) {
                                ts = {{"model.embed_tokens.weight", tensor::zeros({96, 32})}};
                              }),
                    {"not a Hugging Face GPT-2 checkpoint", "model.embed_tokens.weight"});
  expect_load_error(*m,
                    rewritten("ints.safetensors",
                              [](auto& ts) {
                                for (auto& [name, t] : ts)
                                  if (name == "transformer.ln_f.bias")
                                    t = tensor::zeros({32}, DType::I32);
                              }),
                    {"transformer.ln_f.bias", "F32, F16 or BF16"});
}

TEST_F(HfInterop, ShapeMismatchNamesBothShapesAndTheConfigKey) {
  const std::string path = reference_path(kHfFile);
  struct Case {
    const char* key;
    const char* value;
    std::vector<std::string> needles;
  };
  for (const Case& c : std::vector<Case>{
           {"n_embd", "48", {"transformer.wte.weight", "[96, 32]", "[96, 48]", "n_embd"}},
           {"vocab_size", "100", {"transformer.wte.weight", "[96, 32]", "[100, 32]", "vocab_size"}},
           {"n_positions", "16", {"transformer.wpe.weight", "[32, 32]", "[16, 32]", "n_positions"}},
           {"n_layer", "3", {"missing tensor", "h.2.", "n_layer"}},
           {"n_layer", "1", {"unexpected tensor", "transformer.h.1.", "n_layer"}}}) {
    SCOPED_TRACE(c.key);
    auto overrides = tiny_overrides();
    overrides[c.key] = c.value;
    if (std::string(c.key) == "n_embd") overrides["n_head"] = "4";
    auto m = make_model(overrides);
    expect_load_error(*m, path, c.needles);
  }
  // A Conv1D weight stored [out, in] (as torch.nn.Linear would) is reported in HF's layout.
  auto m = make_model();
  expect_load_error(*m,
                    rewritten("linear_layout.safetensors",
                              [](auto& ts) {
                                for (auto& [name, t] : ts)
                                  if (name == "transformer.h.0.attn.c_attn.weight")
                                    t = t.transpose(0, 1).contiguous();
                              }),
                    {"transformer.h.0.attn.c_attn.weight", "[96, 32]", "[32, 96]", "Conv1D"});
}

TEST_F(HfInterop, CorruptFilesAndOtherFamiliesAreUserErrors) {
  auto m = make_model();
  // Truncated: the header promises more data than the file has.
  std::string truncated = (dir_ / "truncated.safetensors").string();
  fs::copy_file(reference_path(kHfFile), truncated);
  fs::resize_file(truncated, fs::file_size(truncated) - 100);
  expect_load_error(*m, truncated, {"not a valid safetensors file"});
  // Garbage header.
  std::string garbage = (dir_ / "garbage.safetensors").string();
  std::ofstream(garbage) << "this is not a safetensors file at all";
  expect_load_error(*m, garbage, {"not a valid safetensors file"});
  expect_load_error(*m, (dir_ / "absent.safetensors").string(), {"cannot open"});

  auto llama = make_model({}, 0, "llama-tiny");
  expect_load_error(*llama, reference_path(kHfFile),
                    {"not a Hugging Face LLaMA checkpoint", "model.embed_tokens.weight",
                     "a GPT-2 checkpoint", "transformer.wte.weight", "choose a gpt2-family"});
}

// Note [Hostile input tests] (tests/support/mutate.h): mutants of the transformers-written file
// load or are refused with a UserError, and a refusal leaves the model as it was.
TEST_F(HfInterop, MutatedFilesLoadOrAreRefusedWithoutTouchingTheModel) {
  std::ifstream in(reference_path(kHfFile), std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), {});
  ASSERT_FALSE(good.empty());
  const fs::path path = dir_ / "mutant.safetensors";
  auto m = make_model();
  const int n = ::strata::testing::hostile_iterations(300);
  const auto tally =
      ::strata::testing::check_hostile("HF model.safetensors", path, good, n, 31, [&] {
        const auto before = snapshot(*m);
        try {
          load_hf(*m, path.string());
        } catch (const UserError&) {
          EXPECT_TRUE(snapshot(*m) == before) << "a refused load touched the model";
          throw;
        }
      });
  std::printf("HF model.safetensors: %d mutants taken, %d refused\n", tally.accepted,
              tally.refused);
  EXPECT_GT(tally.refused, 0);
}

// hf_shard_reader (a tensor- or pipeline-parallel init_from) gives each rank's slice of what
// load_hf writes, bit for bit: tensors in the parameter's layout read a slice at a time, the
// transposed (GPT-2's Conv1D), permuted (LLaMA's rotary rows) and padded (wte) ones whole and cut.
TEST_F(HfInterop, ShardReaderGivesTheSlicesOfWhatLoadHfWrites) {
  auto llama = make_model({}, 3, "llama-tiny");
  export_hf(*llama, (dir_ / "llama").string());
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"gpt2-tiny", reference_path(kHfFile)}, {"llama-tiny", (dir_ / "llama").string()}};
  for (const auto& [name, file] : cases) {
    SCOPED_TRACE(name);
    auto want = name == "gpt2-tiny" ? make_model() : make_model({}, 0, name);
    load_hf(*want, file);
    std::unique_ptr<CausalLM> layout;
    {
      nn::DeferredInitScope layout_only;
      layout = name == "gpt2-tiny" ? make_model() : make_model({}, 0, name);
    }
    const HfShardReader read = hf_shard_reader(*layout, file);
    int checked = 0;
    for (auto& [pname, p] : want->named_parameters()) {
      const tensor::Tensor whole = p.data();
      std::vector<nn::ShardSpec> specs = {{-1, 1}};
      for (int dim = 0; dim < whole.ndim(); ++dim)
        for (int64_t blocks : {1, 3})
          if (whole.size(dim) % (2 * blocks) == 0) specs.push_back({dim, blocks});
      for (const nn::ShardSpec& spec : specs)
        for (int rank = 0; rank < 2; ++rank) {
          const tensor::Tensor slice = nn::shard_of(whole, spec, rank, 2).contiguous();
          tensor::Tensor got = tensor::Tensor::empty({slice.numel()});
          read(pname, spec, rank, 2, got);
          EXPECT_EQ(std::memcmp(got.data_ptr(), slice.data_ptr(), slice.nbytes()), 0)
              << pname << " dim " << spec.dim << " blocks " << spec.blocks << " rank " << rank;
          ++checked;
        }
    }
    EXPECT_GT(checked, 0);
  }
}

TEST_F(HfInterop, ExportThenLoadIsBitwiseAndWritesAnHfConfig) {
  auto a = make_model();
  load_hf(*a, reference_path(kHfFile));
  export_hf(*a, (dir_ / "export").string());
  for (const auto& entry : fs::directory_iterator(dir_ / "export"))
    EXPECT_EQ(entry.path().string().find(".tmp"), std::string::npos) << entry.path();

  // The exported tensors are exactly the HF file's (names without prefix, [in, out], wte cut).
  tensor::SafetensorsReader hf(reference_path(kHfFile));
  tensor::SafetensorsReader out((dir_ / "export" / "model.safetensors").string());
  EXPECT_EQ(out.entries().size(), hf.entries().size());
  for (const auto& e : hf.entries()) {
    SCOPED_TRACE(e.name);
    std::string plain = e.name.substr(std::string("transformer.").size());
    ASSERT_TRUE(out.contains(plain));
    EXPECT_EQ(out.entry(plain).dtype, DType::F32);
    EXPECT_EQ(tensor::max_abs_diff(out.read(plain), hf.read(e.name)), 0.0);
  }
  EXPECT_EQ(out.metadata().at("format"), "pt");

  // Round trip into a differently initialised model: every byte of the flat buffers matches.
  auto b = make_model(tiny_overrides(), 12345);
  ASSERT_FALSE(snapshot(*a) == snapshot(*b));
  load_hf(*b, (dir_ / "export").string());  // a directory means its model.safetensors
  EXPECT_TRUE(snapshot(*a) == snapshot(*b));

  std::ifstream in(dir_ / "export" / "config.json");
  nlohmann::json c = nlohmann::json::parse(in);
  EXPECT_EQ(c.at("model_type"), "gpt2");
  EXPECT_EQ(c.at("architectures").at(0), "GPT2LMHeadModel");
  EXPECT_EQ(c.at("vocab_size"), 96);
  EXPECT_EQ(c.at("n_positions"), 32);
  EXPECT_EQ(c.at("n_ctx"), 32);
  EXPECT_EQ(c.at("n_embd"), 32);
  EXPECT_EQ(c.at("n_layer"), 2);
  EXPECT_EQ(c.at("n_head"), 4);
  EXPECT_EQ(c.at("activation_function"), "gelu_new");
  EXPECT_EQ(c.at("tie_word_embeddings"), true);
  EXPECT_DOUBLE_EQ(c.at("layer_norm_epsilon").get<double>(), 1e-5);
}

// Note [HF mapping]: the mapping is found by family in the registry; a family without one is a
// UserError naming the path, and nothing is written or loaded.
TEST_F(HfInterop, FamiliesFindTheirMappingInTheRegistry) {
  const ModelRegistry& global = ModelRegistry::global();
  ASSERT_NE(global.find_hf_mapping("gpt2"), nullptr);
  ASSERT_NE(global.find_hf_mapping("llama"), nullptr);
  EXPECT_EQ(global.find_hf_mapping("gpt2")->architecture(), "GPT2LMHeadModel");
  EXPECT_EQ(global.find_hf_mapping("llama")->architecture(), "LlamaForCausalLM");
  EXPECT_EQ(global.find_hf_mapping("mamba"), nullptr);

  ModelRegistry bare;  // presets only, no mappings
  auto m = make_model();
  const std::string out = (dir_ / "bare").string();
  try {
    export_hf(*m, out, &bare);
    ADD_FAILURE() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(out), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("family 'gpt2' has no Hugging Face mapping"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(out));
  auto before = snapshot(*m);
  EXPECT_THROW(load_hf(*m, reference_path(kHfFile), &bare), UserError);
  EXPECT_TRUE(snapshot(*m) == before);
}

// A config.json beside the file is checked against the model: n_head cannot be seen in any
// tensor's shape, so only the config can tell a 4-head file from an 8-head model.
TEST_F(HfInterop, ConfigJsonBesideTheFileMustDescribeTheModel) {
  auto a = make_model();
  load_hf(*a, reference_path(kHfFile));
  const fs::path out = dir_ / "export";
  export_hf(*a, out.string());
  auto b = make_model(tiny_overrides(), 3);
  load_hf(*b, out.string());  // its own config.json: accepted
  EXPECT_TRUE(snapshot(*a) == snapshot(*b));

  auto heads = tiny_overrides();
  heads["n_head"] = "8";
  auto c = make_model(heads);
  const std::string config = (out / "config.json").string();
  expect_load_error(*c, out.string(), {config, "n_head = 4", "model.config.n_head: 4"});

  auto rewrite = [&](const std::function<void(nlohmann::json&)>& edit) {
    std::ifstream in(config);
    nlohmann::json j = nlohmann::json::parse(in);
    edit(j);
    std::ofstream(config, std::ios::trunc) << j.dump(2);
  };
  auto d = make_model();
  rewrite([](nlohmann::json& j) { j["activation_function"] = "relu"; });
  expect_load_error(*d, out.string(), {config, "activation_function", "relu", "tanh GELU"});
  rewrite([](nlohmann::json& j) {
    j["activation_function"] = "gelu_new";
    j["n_layer"] = "2";
  });
  expect_load_error(*d, out.string(), {config, "'n_layer'", "an integer"});
  rewrite([](nlohmann::json& j) {
    j["n_layer"] = 2;
    j["model_type"] = "llama";
  });
  expect_load_error(*d, out.string(),
                    {config, "model_type is \"llama\"", "a LLaMA checkpoint", "llama-family"});
  rewrite([](nlohmann::json& j) {
    j["model_type"] = "gpt2";
    j.erase("n_positions");  // transformers' default 1024 then
  });
  expect_load_error(*d, out.string(), {config, "n_positions = 1024", "absent", "32"});
  std::ofstream(config, std::ios::trunc) << "{\"n_embd\": 32,";
  expect_load_error(*d, out.string(), {config, "not valid JSON"});
}

}  // namespace
}  // namespace strata::models
