// Hostile inputs (Note [Hostile input tests] in tests/support/mutate.h): mutants of valid files
// for every reader of user files the tools have — safetensors, token shards, the GPT-2
// tokenizer's vocab.json and merges.txt, and train configs (with a base) — are either taken or
// refused with a UserError naming the file; never another exception or a crash. What a reader
// accepts it must then be able to use: every tensor read, every token touched, every id decoded.
// Checkpoints are mutated file by file under a Trainer that resumes from them (ZeRO-0's whole
// files and ZeRO-3's shard files); a refused resume must leave the checkpoints as they were. The
// Hugging Face loader has its tests beside its others (tests/models/hf_interop_test.cpp and
// llama_hf_files_test.cpp: safetensors files, shard indexes and config.json).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "tensor/safetensors.h"
#include "tests/support/mutate.h"
#include "tests/support/temp_dir.h"
#include "tests/support/tool_test_util.h"
#include "data/token_shard.h"
#include "data/tokenizer.h"
#include "runtime/train_config.h"
#include "runtime/trainer.h"

namespace strata::runtime {
namespace {

namespace fs = std::filesystem;
using ::strata::testing::check_hostile;
using ::strata::testing::hostile_iterations;
using ::strata::testing::HostileTally;
using testing::read_bytes;
using testing::ScratchDir;
using testing::TempDir;
using testing::write_bytes;

const std::string kSource = STRATA_SOURCE_DIR;

// Both outcomes must be seen, or the mutations do not reach the reader's checks (all refused at
// the first byte) or never break anything (all taken).
void expect_both_outcomes(const std::string& what, const HostileTally& t, int iterations) {
  if (iterations < 50) return;  // too few draws to ask for both
  EXPECT_GT(t.refused, 0) << what << ": no mutant was refused";
  EXPECT_GT(t.accepted, 0) << what << ": every mutant was refused";
  std::printf("%s: %d mutants taken, %d refused\n", what.c_str(), t.accepted, t.refused);
}

// Every tensor's name, dtype, shape and bytes, and the metadata a writer gave (the digests left
// out), in one comparable value.
std::map<std::string, std::string> contents(const std::string& path) {
  std::map<std::string, std::string> out;
  tensor::SafetensorsReader r(path);
  for (const auto& e : r.entries()) {
    const tensor::Tensor t = r.read(e.name);
    const char* p = static_cast<const char*>(t.data_ptr());
    out[e.name] = fmt::format("{} {} ", dtype_name(t.dtype()), t.shape().str()) +
                  std::string(p, p + t.nbytes());
  }
  for (const auto& [k, v] : r.metadata())
    if (!k.starts_with("strata.")) out["meta:" + k] = v;
  return out;
}

// Files without digests (transformers' own; Strata's before Note [Safetensors digests]): the
// parser alone decides, so both outcomes occur. Strata's files carry digests: a mutant that
// loads must load exactly the original's tensors and metadata, anything else is refused.
TEST(HostileInput, SafetensorsFilesAreReadOrRefused) {
  TempDir dir;
  const std::string path = dir.file("mutant.safetensors");
  const int n = hostile_iterations(600);

  const std::string hf = read_bytes(kSource + "/tests/reference/gpt2_hf_tiny/model.safetensors");
  ASSERT_FALSE(hf.empty());
  const HostileTally plain = check_hostile("safetensors without digests", path, hf, n, 1, [&] {
    tensor::SafetensorsReader r(path);
    EXPECT_FALSE(r.has_digests());
    contents(path);  // every tensor read
  });
  expect_both_outcomes("safetensors without digests", plain, n);

  const std::string good_path = dir.file("good.safetensors");
  tensor::save_safetensors(good_path,
                           {{"a", tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3})},
                            {"b", tensor::from_ints({-1, 7}, {2})},
                            {"c", tensor::from_vector({0.5f, -2.f, 3.f}, {3}, DType::BF16)},
                            {"empty", tensor::Tensor::empty({0, 4})},
                            {"scalar", tensor::from_vector({3.f}, {})}},
                           {{"format", "pt"}, {"step", "12"}});
  ASSERT_TRUE(tensor::SafetensorsReader(good_path).has_digests());
  const auto want = contents(good_path);
  int changed = 0;
  const HostileTally digested =
      check_hostile("safetensors with digests", path, read_bytes(good_path), n, 2, [&] {
        tensor::SafetensorsReader(path).verify();
        if (contents(path) != want) ++changed;
      });
  std::printf("safetensors with digests: %d mutants taken, %d refused\n", digested.accepted,
              digested.refused);
  EXPECT_EQ(changed, 0) << "mutants whose changed content loaded past the digests";
  EXPECT_GT(digested.refused, 0);
}

std::string raw_shard(const std::vector<uint16_t>& tokens, int32_t vocab) {
  std::array<int32_t, 256> header{};
  header[0] = data::kTokenShardMagic;
  header[1] = data::kTokenShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  header[3] = vocab;
  std::string bytes(reinterpret_cast<const char*>(header.data()), sizeof(header));
  bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  return bytes;
}

TEST(HostileInput, TokenShardsAreReadOrRefused) {
  TempDir dir;
  std::vector<uint16_t> tokens(300);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i * 37 % 256);
  const std::string full = raw_shard(tokens, 256);
  const std::string path = dir.file("mutant.bin");
  const int n = hostile_iterations(400);
  auto load = [&] {
    data::TokenShard shard(path);
    uint64_t sum = 0;
    for (int64_t i = 0; i < shard.size(); ++i) sum += shard.data()[i];
    volatile uint64_t sink = sum;
    (void)sink;
  };
  const HostileTally t = check_hostile("token shard", path, full, n, 2, load);
  expect_both_outcomes("token shard", t, n);
  // The first 16 bytes (magic, version, count, vocabulary) decide; aim there too.
  const HostileTally h = check_hostile("token shard header", path, full, n, 8, load,
                                       [&](::strata::testing::Mutator& m) {
                                         std::string head = m.mutate(full.substr(0, 16));
                                         head.resize(16, '\0');
                                         return head + full.substr(16);
                                       });
  expect_both_outcomes("token shard header", h, n);
}

TEST(HostileInput, Gpt2TokenizerFilesAreReadOrRefused) {
  TempDir dir;
  const std::string bpe = kSource + "/tests/reference/bpe_small/";
  const std::string good_vocab = read_bytes(bpe + "vocab.json");
  const std::string good_merges = read_bytes(bpe + "merges.txt");
  ASSERT_FALSE(good_vocab.empty());
  ASSERT_FALSE(good_merges.empty());
  const std::string vocab = dir.file("vocab.json"), merges = dir.file("merges.txt");
  write_bytes(vocab, good_vocab);
  write_bytes(merges, good_merges);
  auto load = [&] {
    auto tok = data::make_gpt2_tokenizer(vocab, merges);
    const std::vector<int32_t> ids = tok->encode("Hello, world! It's 2026 — naïve café\n\tend");
    std::vector<int32_t> every(static_cast<size_t>(tok->vocab_size()) + 2);
    for (size_t i = 0; i < every.size(); ++i) every[i] = static_cast<int32_t>(i) - 1;
    volatile size_t sink = tok->decode(ids).size() + tok->decode(every).size();
    (void)sink;
  };
  const int n = hostile_iterations(300);
  // A byte-level vocab.json needs all 256 byte tokens and distinct ids, so nearly every mutant
  // of the small test vocabulary is refused; only refusals are asked for.
  const HostileTally v = check_hostile("vocab.json", vocab, good_vocab, n, 3, load);
  std::printf("vocab.json: %d mutants taken, %d refused\n", v.accepted, v.refused);
  if (n >= 50) {
    EXPECT_GT(v.refused, 0);
  }
  const HostileTally m = check_hostile("merges.txt", merges, good_merges, n, 4, load);
  expect_both_outcomes("merges.txt", m, n);
}

TEST(HostileInput, TrainConfigsAreReadOrRefused) {
  TempDir dir;
  // A config with a base: both files mutated in turn. Data paths need not exist to load.
  const std::string good_base = read_bytes(kSource + "/configs/gpt2-common.yaml");
  const std::string good_child = read_bytes(kSource + "/configs/gpt2-124m.yaml");
  const std::string good_default = read_bytes(kSource + "/configs/default.yaml");
  ASSERT_FALSE(good_base.empty());
  ASSERT_FALSE(good_child.empty());
  const std::string base = dir.file("gpt2-common.yaml"), child = dir.file("gpt2-124m.yaml"),
                    alone = dir.file("default.yaml");
  write_bytes(base, good_base);
  write_bytes(child, good_child);
  write_bytes(alone, good_default);
  const int n = hostile_iterations(300);
  const HostileTally d =
      check_hostile("default.yaml", alone, good_default, n, 5, [&] { load_train_config(alone); });
  expect_both_outcomes("default.yaml", d, n);
  const HostileTally c =
      check_hostile("gpt2-124m.yaml", child, good_child, n, 6, [&] { load_train_config(child); });
  expect_both_outcomes("gpt2-124m.yaml", c, n);
  const HostileTally b =
      check_hostile("gpt2-common.yaml", base, good_base, n, 7, [&] { load_train_config(child); });
  expect_both_outcomes("gpt2-common.yaml", b, n);
  // --set overrides are user input too.
  const std::vector<std::string> sets = {"batch.micro_batch_size=4", "model.config.n_layer=2",
                                         "optimizer.betas=[0.9, 0.99]", "run.dtype=fp32"};
  int taken = 0, refused = 0;
  for (int i = 0; i < n; ++i) {
    ::strata::testing::Mutator m(11000 + i);
    const std::string set = m.mutate(sets[static_cast<size_t>(i) % sets.size()]);
    try {
      load_train_config(alone, {set});
      ++taken;
    } catch (const UserError&) {
      ++refused;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "--set '" << set << "' raised a non-UserError: " << e.what();
    }
  }
  expect_both_outcomes("--set", HostileTally{taken, refused}, n);
}

// Every file of a checkpoint a Trainer resumes from, mutated in turn: the Trainer resumes to the
// state the unmutated checkpoint gives (the digests let no damaged value through) or refuses
// with a UserError, and a refusal changes nothing under checkpoints/; and the run's
// metrics.jsonl, which a resume reads and cuts back to the checkpoint's step. (config.yaml is
// not read by a resume, which runs the config it is given; `generate` and `convert` read it
// through load_train_config, which TrainConfigsAreReadOrRefused covers.)
// What a resume restored: the step, the model's parameters (stage 0; at stage 3 they are in the
// shards) and every shard the engine would checkpoint (optimizer states, stage 3 parameters).
std::string resumed_state(Trainer& t, int stage) {
  std::string out = fmt::format("step {}\n", t.step());
  auto bytes = [&](const tensor::Tensor& x) {
    const tensor::Tensor h = x.to(Device::cpu()).contiguous();
    const char* p = static_cast<const char*>(h.data_ptr());
    out.append(p, p + h.nbytes());
  };
  if (stage == 0)
    for (const auto& u : t.model().flat_units()) bytes(u.params);
  for (const auto& sh : t.engine().shards()) {
    out += fmt::format("{} {} {}\n", sh.unit, sh.key, sh.begin);
    bytes(sh.data);
  }
  return out;
}

void check_resume(int stage, uint64_t seed) {
  ScratchDir tmp;
  const std::string data = tmp / "data";
  testing::write_raw_shard(data + "/train_000000.bin", {testing::pattern_tokens(3000, 200, 1)});
  testing::write_raw_shard(data + "/val_000000.bin", {testing::pattern_tokens(1000, 200, 3)});
  const std::string run = tmp / "run";
  testing::write_text(tmp / "c.yaml", fmt::format(R"(run: {{dir: {run}, seed: 7}}
model:
  name: gpt2-tiny
  config: {{n_layer: 2, n_embd: 32, n_head: 2, n_positions: 32}}
data: {{train: "{data}/train_*.bin", val: "{data}/val_*.bin", tokenizer: byte}}
batch: {{micro_batch_size: 2, grad_accum_steps: 1, seq_len: 16}}
optimizer: {{name: adamw, lr: 1.0e-2, weight_decay: 0.1}}
training: {{steps: 4, eval_every: 0, progress: lines}}
zero_optimization: {{stage: {stage}}}
)",
                                                  fmt::arg("run", run), fmt::arg("data", data),
                                                  fmt::arg("stage", stage)));
  const TrainConfig config = load_train_config(tmp / "c.yaml");
  {
    Trainer first(config);
    ASSERT_EQ(first.run(/*stop_at=*/2), Trainer::Outcome::Interrupted);
  }
  const fs::path ckpts = fs::path(run) / "checkpoints";
  std::map<std::string, std::string> before;  // every file under checkpoints/, by path
  for (const auto& e : fs::recursive_directory_iterator(ckpts))
    if (e.is_regular_file()) before[e.path().string()] = read_bytes(e.path().string());
  ASSERT_GE(before.size(), 5u);
  std::string want;  // the state the unmutated checkpoint resumes to
  {
    ::testing::internal::CaptureStdout();
    Trainer resumed(config);
    ::testing::internal::GetCapturedStdout();
    want = resumed_state(resumed, stage);
  }
  // metrics.jsonl is read back on a resume too (records past the checkpoint are cut).
  std::map<std::string, std::string> mutated = before;
  mutated[run + "/metrics.jsonl"] = read_bytes(run + "/metrics.jsonl");
  ASSERT_FALSE(mutated[run + "/metrics.jsonl"].empty());
  const int n = hostile_iterations(40);
  int file_seed = 0;
  for (const auto& [path, good] : mutated) {
    if (fs::path(path).filename() == "config.yaml") continue;
    const std::string what = fmt::format("ZeRO-{} {}", stage, fs::path(path).filename().string());
    int changed = 0;  // mutants a resume took and restored another state from
    const HostileTally t = check_hostile(what, path, good, n, seed * 100 + file_seed++, [&] {
      ::testing::internal::CaptureStdout();  // each resume prints its banner
      try {
        Trainer resumed(config);
        ::testing::internal::GetCapturedStdout();
        if (resumed_state(resumed, stage) != want) ++changed;
      } catch (const UserError&) {
        ::testing::internal::GetCapturedStdout();
        // Nothing under checkpoints/ may change but the mutant itself.
        std::map<std::string, std::string> after;
        for (const auto& e : fs::recursive_directory_iterator(ckpts))
          if (e.is_regular_file() && e.path().string() != path)
            after[e.path().string()] = read_bytes(e.path().string());
        std::map<std::string, std::string> expected = before;
        expected.erase(path);
        EXPECT_TRUE(after == expected) << what << ": a refused resume changed checkpoints/";
        throw;
      }
    });
    std::printf("%s: %d mutants taken, %d refused\n", what.c_str(), t.accepted, t.refused);
    // Note [Checkpoint digests]: no damaged file resumes to another state.
    EXPECT_EQ(changed, 0) << what << ": mutants that resumed to another state";
    if (n >= 20 && fs::path(path).filename() != "metrics.jsonl") {  // its bad lines are dropped
      EXPECT_GT(t.refused, 0) << what << ": no mutant was refused";
    }
  }
}

TEST(HostileInput, CheckpointsResumeOrAreRefused) {
  check_resume(0, 21);
}

TEST(HostileInput, ZeroThreeShardCheckpointsResumeOrAreRefused) {
  check_resume(3, 22);
}

}  // namespace
}  // namespace strata::runtime
