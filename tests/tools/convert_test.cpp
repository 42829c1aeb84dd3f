// The `convert` and `generate` binaries on a checkpoint written by save_checkpoint: convert's
// HF export (GPT-2 and LLaMA) loaded by transformers (tests/reference/check_hf_export.py) gives
// Strata's logits, and a LLaMA export loads back through model.init_from exactly;
// generate prints exactly prompt + sample() (and sample_batch()'s rows for --num-samples); bad
// input is `<tool>: error: ...` and exit 1.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "autograd/variable.h"
#include "models/hf_interop.h"
#include "models/registry.h"
#include "runtime/checkpoint.h"
#include "runtime/train_config.h"
#include "runtime/trainer.h"
#include "sampling/sampler.h"
#include "tensor/cuda.h"
#include "tensor/ops.h"
#include "tensor/safetensors.h"
#include "tests/support/tool_test_util.h"

namespace strata::tools {
using namespace strata::runtime;
using namespace strata::sampling;
namespace {

namespace fs = std::filesystem;

struct Result {
  int rc = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `command` through the shell, capturing stdout and stderr.
Result run(const std::string& command, const fs::path& scratch) {
  const fs::path out = scratch / "stdout.txt", err = scratch / "stderr.txt";
  const int status = std::system((command + " >" + out.string() + " 2>" + err.string()).c_str());
  Result r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

std::string tool(const std::string& name) {
  return std::string(STRATA_BINARY_DIR) + "/" + name;
}

class ToolsOnCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("strata_convert_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A gpt2-tiny variant with weights scaled up from GPT-2's init (so every term shows in the
  // logits), checkpointed under dir_/run with a config.yaml that load_train_config accepts.
  std::unique_ptr<models::CausalLM> make_checkpoint(const std::string& vocab) {
    return make_checkpoint("gpt2-tiny", {{"vocab_size", vocab},
                                         {"n_positions", "32"},
                                         {"n_embd", "32"},
                                         {"n_layer", "2"},
                                         {"n_head", "4"}});
  }
  std::unique_ptr<models::CausalLM> make_checkpoint(
      const std::string& name, const std::map<std::string, std::string>& overrides) {
    TrainConfig cfg = train_config(name, overrides);
    models::ModelOptions o;
    o.seed = cfg.run.seed;
    o.overrides = cfg.model.config;
    auto model = models::ModelRegistry::global().create(cfg.model.name, o);
    uint64_t k = 0;
    for (auto& [pname, p] : model->named_parameters()) {
      tensor::Tensor d = p.data();
      const bool norm =
          pname.find("ln_") != std::string::npos || pname.find("norm") != std::string::npos;
      const bool bias = pname.ends_with(".bias");
      d.copy_(tensor::randn(d.shape(), RngKey{77, ++k}, norm && !bias ? 1.f : 0.f,
                            norm || bias ? 0.1f : 0.15f));
      // Note [Padded vocabulary]: the padding rows stay zero.
      if (d.ndim() == 2 && d.size(0) == model->padded_vocab_size())
        d.narrow(0, model->vocab_size(), d.size(0) - model->vocab_size()).zero_();
    }
    TrainerState st;
    st.step = 3;
    st.model_name = cfg.model.name;
    save_checkpoint(cfg.run.dir, *model, nullptr, st, to_yaml(cfg), 0);
    return model;
  }
  TrainConfig train_config(const std::string& name,
                           const std::map<std::string, std::string>& overrides) {
    TrainConfig cfg;
    cfg.model.name = name;
    cfg.model.config = overrides;
    cfg.data.train = "unused/*.bin";
    cfg.batch.seq_len = 16;
    cfg.run.dir = (dir_ / "run").string();
    cfg.run.seed = 5;
    return cfg;
  }

  fs::path dir_;
};

TEST_F(ToolsOnCheckpoint, ConvertedModelLoadsInTransformersWithTheSameLogits) {
  if (std::system("python3 -c 'import transformers, safetensors' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 with transformers and safetensors is not available";
  auto model = make_checkpoint("300");  // padded to 320: export must cut the padding
  const fs::path out = dir_ / "hf";
  Result r =
      run(tool("convert") + " --checkpoint " + (dir_ / "run").string() + " --to-hf " + out.string(),
          dir_);
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_TRUE(fs::exists(out / "model.safetensors"));
  EXPECT_TRUE(fs::exists(out / "config.json"));

  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 2 * 16; ++i) ids.push_back((i * 37 + 11) % 300);
  tensor::Tensor ids_t = tensor::from_ints(ids, {2, 16});
  tensor::Tensor logits;
  {
    autograd::NoGradGuard no_grad;
    model->eval();
    logits = model->forward(ids_t).data().narrow(2, 0, 300);
  }
  const fs::path expected = dir_ / "expected.safetensors";
  tensor::save_safetensors(expected.string(), {{"ids", ids_t}, {"logits", logits}});
  Result check =
      run("python3 " + std::string(STRATA_SOURCE_DIR) + "/tests/reference/check_hf_export.py " +
              out.string() + " " + expected.string(),
          dir_);
  std::cout << check.out;
  EXPECT_EQ(check.rc, 0) << check.out << check.err;
}

// A LLaMA run (grouped-query attention, untied head) through `convert --to-hf`: the directory
// holds LlamaForCausalLM's names and config.json, loads back (load_hf, and a Trainer's
// model.init_from) to the checkpoint's exact weights and logits, and, where python3 has
// transformers, loads there with the same logits.
TEST_F(ToolsOnCheckpoint, ConvertedLlamaLoadsBackAndInTransformersWithTheSameLogits) {
  const std::map<std::string, std::string> overrides = {{"hidden_size", "32"},
                                                        {"intermediate_size", "48"},
                                                        {"num_attention_heads", "4"},
                                                        {"num_key_value_heads", "2"},
                                                        {"max_position_embeddings", "32"}};
  auto model = make_checkpoint("llama-tiny", overrides);  // vocab 256: the byte tokenizer's
  const fs::path out = dir_ / "hf";
  Result r =
      run(tool("convert") + " --checkpoint " + (dir_ / "run").string() + " --to-hf " + out.string(),
          dir_);
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  std::ifstream in(out / "config.json");
  const nlohmann::json config = nlohmann::json::parse(in);
  EXPECT_EQ(config.at("architectures").at(0), "LlamaForCausalLM");
  EXPECT_EQ(config.at("num_key_value_heads"), 2);
  tensor::SafetensorsReader file((out / "model.safetensors").string());
  EXPECT_TRUE(file.contains("model.layers.1.self_attn.k_proj.weight"));
  EXPECT_TRUE(file.contains("lm_head.weight"));

  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 2 * 16; ++i) ids.push_back((i * 37 + 11) % 256);
  const tensor::Tensor ids_t = tensor::from_ints(ids, {2, 16});
  auto logits_of = [&](models::CausalLM& m) {
    autograd::NoGradGuard no_grad;
    m.eval();
    return m.forward(ids_t).data();
  };
  const tensor::Tensor logits = logits_of(*model);
  models::ModelOptions o;
  o.seed = 1234;
  o.overrides = overrides;
  auto loaded = models::ModelRegistry::global().create("llama-tiny", o);
  models::load_hf(*loaded, out.string());
  EXPECT_EQ(tensor::max_abs_diff(logits_of(*loaded), logits), 0.0);

  // model.init_from in a training run starts from exactly these weights.
  const fs::path data = dir_ / "data";
  testing::write_raw_shard((data / "train_000000.bin").string(),
                           {testing::pattern_tokens(2000, 200, 1)});
  TrainConfig cfg = train_config("llama-tiny", overrides);
  cfg.run.dir = (dir_ / "run_init").string();
  cfg.data.train = (data / "train_*.bin").string();
  cfg.data.tokenizer = "byte";
  cfg.model.init_from = out.string();
  cfg.training.steps = 1;
  {
    Trainer trainer(cfg);
    for (auto& [name, p] : model->named_parameters()) {
      SCOPED_TRACE(name);
      EXPECT_EQ(tensor::max_abs_diff(trainer.model().parameter(name).data(), p.data()), 0.0);
    }
  }

  if (std::system("python3 -c 'import transformers, safetensors' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 with transformers and safetensors is not available: the export "
                    "loaded back into Strata exactly, but transformers could not check it";
  const fs::path expected = dir_ / "expected.safetensors";
  tensor::save_safetensors(expected.string(), {{"ids", ids_t}, {"logits", logits}});
  Result check =
      run("python3 " + std::string(STRATA_SOURCE_DIR) + "/tests/reference/check_hf_export.py " +
              out.string() + " " + expected.string(),
          dir_);
  std::cout << check.out;
  EXPECT_EQ(check.rc, 0) << check.out << check.err;
}

TEST_F(ToolsOnCheckpoint, ConvertAndGenerateReportBadInputAndExit1) {
  const std::string missing = (dir_ / "nothing").string();
  Result c = run(
      tool("convert") + " --checkpoint " + missing + " --to-hf " + (dir_ / "hf").string(), dir_);
  EXPECT_EQ(c.rc, 1);
  EXPECT_TRUE(c.err.starts_with("convert: error: ")) << c.err;
  EXPECT_NE(c.err.find(missing), std::string::npos) << c.err;
  EXPECT_FALSE(fs::exists(dir_ / "hf"));

  Result g = run(tool("generate") + " --checkpoint " + missing, dir_);
  EXPECT_EQ(g.rc, 1);
  EXPECT_TRUE(g.err.starts_with("generate: error: ")) << g.err;

  // A run directory whose latest is dangling.
  make_checkpoint("256");
  const fs::path latest = dir_ / "run" / "checkpoints" / "latest";
  std::ofstream(latest) << "step_00000042\n";
  g = run(tool("generate") + " --checkpoint " + (dir_ / "run").string() + " --prompt hi", dir_);
  EXPECT_EQ(g.rc, 1);
  EXPECT_NE(g.err.find(latest.string()), std::string::npos) << g.err;

  // --device cuda where there is no GPU (CI) or no CUDA build: init_cuda's message, before the
  // checkpoint is read. With a GPU it samples there
  // (TrainGpuMpi.GenerateOnTheGpuDrawsTheCpusTokens).
  if (!tensor::cuda_available()) {
    g = run(tool("generate") + " --checkpoint " + missing + " --device cuda", dir_);
    EXPECT_EQ(g.rc, 1);
    EXPECT_TRUE(g.err.starts_with("generate: error: device: cuda requested but ")) << g.err;
    EXPECT_EQ(g.err.find(missing), std::string::npos) << g.err;
  }
}

// Note [Checkpoint digests]: `convert --verify` checks every file without building the model,
// and names the damaged one with exit status 1.
TEST_F(ToolsOnCheckpoint, ConvertVerifyChecksEveryFileAndNamesADamagedOne) {
  make_checkpoint("256");
  const std::string run_dir = (dir_ / "run").string();
  Result ok = run(tool("convert") + " --checkpoint " + run_dir + " --verify", dir_);
  EXPECT_EQ(ok.rc, 0) << ok.err;
  EXPECT_NE(ok.out.find("1 files"), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find("every digest matches"), std::string::npos) << ok.out;

  const fs::path model = dir_ / "run" / "checkpoints" / "step_00000003" / "model.safetensors";
  std::string bytes = slurp(model);
  ASSERT_GT(bytes.size(), 100u);
  bytes[bytes.size() - 5] = static_cast<char>(bytes[bytes.size() - 5] ^ 0x40);
  std::ofstream(model, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
  Result bad = run(
      tool("convert") + " --checkpoint " + run_dir + " --verify --to-hf " + (dir_ / "hf").string(),
      dir_);
  EXPECT_EQ(bad.rc, 1);
  EXPECT_TRUE(bad.err.starts_with("convert: error: ")) << bad.err;
  EXPECT_NE(bad.err.find(model.string()), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("damaged or changed"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(dir_ / "hf")) << "nothing written from a damaged checkpoint";
}

TEST_F(ToolsOnCheckpoint, GeneratePrintsThePromptAndTheSampledContinuation) {
  auto model = make_checkpoint("256");  // the byte tokenizer: ids are bytes
  const std::string prompt = "Hello, Strata";
  SampleOptions o;
  o.max_new_tokens = 12;
  o.temperature = 0.9;
  o.top_k = 20;
  o.seed = 4;
  std::vector<int32_t> ids(prompt.begin(), prompt.end());
  std::vector<int32_t> want = sample(*model, ids, o);
  ASSERT_EQ(want.size(), 12u);
  std::string expected = prompt;
  for (int32_t t : want) expected.push_back(static_cast<char>(t));

  // Both forms of --checkpoint: the run directory and the step directory.
  for (const std::string& path :
       {(dir_ / "run").string(), (dir_ / "run" / "checkpoints" / "step_00000003").string()}) {
    Result r = run(tool("generate") + " --checkpoint " + path +
                       " --prompt 'Hello, Strata' --max-new-tokens 12 --temperature 0.9"
                       " --top-k 20 --seed 4",
                   dir_);
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(r.out, expected + "\n");
  }
  // Without the KV cache: the same continuation (Note [Cached sampling]).
  Result r = run(tool("generate") + " --checkpoint " + (dir_ / "run").string() +
                     " --prompt 'Hello, Strata' --max-new-tokens 12 --temperature 0.9"
                     " --top-k 20 --seed 4 --kv-cache off",
                 dir_);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, expected + "\n");

  // --prompt-file: the same prompt from a file's bytes, and from standard input ("-").
  const fs::path prompt_file = dir_ / "prompt.txt";
  std::ofstream(prompt_file, std::ios::binary) << prompt;
  const std::string sampling = " --max-new-tokens 12 --temperature 0.9 --top-k 20 --seed 4";
  r = run(tool("generate") + " --checkpoint " + (dir_ / "run").string() + " --prompt-file " +
              prompt_file.string() + sampling,
          dir_);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, expected + "\n");
  r = run("printf 'Hello, Strata' | " + tool("generate") + " --checkpoint " +
              (dir_ / "run").string() + " --prompt-file -" + sampling,
          dir_);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, expected + "\n");
  const std::string missing_prompt = (dir_ / "no_such_prompt.txt").string();
  r = run(tool("generate") + " --checkpoint " + (dir_ / "run").string() + " --prompt-file " +
              missing_prompt,
          dir_);
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err, "generate: error: " + missing_prompt +
                       ": cannot open for reading (No such file or directory)\n");
  r = run(tool("generate") + " --checkpoint " + (dir_ / "run").string() + " --prompt hi" +
              " --prompt-file " + prompt_file.string(),
          dir_);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--prompt excludes --prompt-file"), std::string::npos) << r.err;

  // --num-samples 3: three continuations from one batch, each after its header; the first is the
  // one above (Note [Batched sampling]).
  const std::vector<std::vector<int32_t>> batch = sample_batch(*model, ids, o, 3);
  ASSERT_EQ(batch.at(0), want);
  std::string samples;
  for (size_t s = 0; s < batch.size(); ++s) {
    samples += "--- sample " + std::to_string(s + 1) + " of 3 ---\n" + prompt;
    for (int32_t t : batch[s]) samples.push_back(static_cast<char>(t));
    samples += "\n";
  }
  EXPECT_NE(batch[1], batch[0]) << "the samples of a batch draw apart";
  r = run(tool("generate") + " --checkpoint " + (dir_ / "run").string() +
              " --prompt 'Hello, Strata' --max-new-tokens 12 --temperature 0.9"
              " --top-k 20 --seed 4 --num-samples 3",
          dir_);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, samples);
  r = run(tool("generate") + " --checkpoint " + (dir_ / "run").string() + " --num-samples 0", dir_);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--num-samples"), std::string::npos) << r.err;
  // --dtype bf16: the parameters cast on load (the log says so), the same kind of continuation.
  r = run(tool("generate") + " --checkpoint " + (dir_ / "run").string() +
              " --prompt 'Hello, Strata' --max-new-tokens 12 --temperature 0.9 --top-k 20"
              " --seed 4 --dtype bf16",
          dir_);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find(" parameters, bf16) on cpu"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.size(), expected.size() + 1) << r.out;
  EXPECT_EQ(r.out.rfind(prompt, 0), 0u) << r.out;
  r = run(tool("generate") + " --checkpoint " + (dir_ / "run").string() + " --dtype f64", dir_);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--dtype"), std::string::npos) << r.err;
  r = run(
      tool("generate") + " --checkpoint " + (dir_ / "run").string() + " --prompt hi --top-p 1.5",
      dir_);
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("generate: error: top_p must be in (0, 1] (1 = no cut), got 1.5\n"),
            std::string::npos)
      << r.err;
  // --tf32 on asks for the GPU's TF32 GEMMs (Note [TF32] in tensor/cuda.h): on the CPU it is an
  // error naming what to change; auto (the default, above) and off sample as before.
  r = run(tool("generate") + " --checkpoint " + (dir_ / "run").string() + " --prompt hi --tf32 on",
          dir_);
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("generate: error: --tf32 on: TF32 is the GPU tensor cores' format for fp32 "
                       "GEMMs, but sampling runs fp32 on cpu; use --device cuda"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.out, "");
  r = run(tool("generate") + " --checkpoint " + (dir_ / "run").string() +
              " --prompt 'Hello, Strata' --max-new-tokens 12 --temperature 0.9 --top-k 20"
              " --seed 4 --tf32 off",
          dir_);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, expected + "\n");
  r = run(tool("generate") + " --checkpoint " + (dir_ / "run").string() + " --tf32 yes", dir_);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--tf32"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace strata::tools
