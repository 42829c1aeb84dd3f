#pragma once
// What the `train`-under-mpirun suites share (train_mpi_test.cpp on the CPU, gpu/
// train_gpu_mpi_test.cpp on GPUs): the tiny GPT-2 run they train, its data, launching the binary
// with or without mpirun, and reading back its metrics and checkpoints.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tensor/safetensors.h"
#include "tests/support/tool_test_util.h"

namespace strata::testing {

// The run both suites train. `device` empty leaves run.device at its default (the CPU).
inline std::string train_mpi_config_text(const std::string& run, const std::string& data, int steps,
                                         const std::string& device) {
  return fmt::format(
      R"(run:
  dir: {run}
  seed: 5
{device_line}model:
  name: gpt2-tiny
  config:
    n_layer: 2
    n_embd: 32
    n_head: 2
    n_positions: 32
data:
  train: "{data}/train_*.bin"
  val: "{data}/val_*.bin"
  tokenizer: byte
batch:
  micro_batch_size: 2
  global_batch_size: 8
  seq_len: 16
optimizer:
  name: adamw
  lr: 3.0e-3
  grad_clip: 1.0
schedule:
  name: constant  # the rate must not depend on training.steps: runs stop early to be resumed
  warmup_steps: 1
training:
  steps: {steps}
  eval_every: 3
  eval_batches: 2
  keep_checkpoints: 0
  progress: lines
distributed:
  timeout_s: 60
zero_optimization:
  reduce_bucket_size: 3000
  allgather_bucket_size: 5000
  stage3_prefetch_bucket_size: 20000
  stage3_param_persistence_threshold: 1000
)",
      fmt::arg("run", run), fmt::arg("data", data), fmt::arg("steps", steps),
      fmt::arg("device_line", device.empty() ? std::string() : "  device: " + device + "\n"));
}

inline std::string describe(const CommandResult& r) {
  return fmt::format("exit {}\n--- stdout\n{}\n--- stderr\n{}", r.exit_code, r.out, r.err);
}

inline void expect_close(const std::vector<double>& got, const std::vector<double>& want,
                         double rel, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_LE(std::abs(got[i] - want[i]), rel * std::abs(want[i]))
        << what << ": step " << i + 1 << " loss " << got[i] << " vs " << want[i];
}

// A scratch directory with the run's token shards; `bin` is where the tool binaries are.
class TrainMpiFixture : public ::testing::Test {
 protected:
  TrainMpiFixture(std::string bin, std::string device)
      : bin_(std::move(bin)), device_(std::move(device)) {}

  void SetUp() override {
    write_raw_shard(tmp_ / "data/train_000000.bin", {pattern_tokens(4000, 200, 1)});
    write_raw_shard(tmp_ / "data/val_000000.bin", {pattern_tokens(600, 200, 2)});
  }

  // Writes the config for run `name` (its directory is tmp_/name) and returns its path.
  std::string config(const std::string& name, int steps) {
    std::string path = tmp_ / (name + ".yaml");
    write_text(path, train_mpi_config_text(tmp_ / name, tmp_ / "data", steps, device_));
    return path;
  }

  // np == 0: a plain process, no launcher. `sets` are --set overrides.
  CommandResult train(int np, const std::string& cfg, const std::vector<std::string>& sets) {
    std::vector<std::string> argv;
    if (np > 0)
      argv = {"/usr/bin/mpirun", "--oversubscribe", "--allow-run-as-root", "-np",
              std::to_string(np)};
    argv.push_back(bin_ + "/train");
    argv.push_back("--config");
    argv.push_back(cfg);
    for (const std::string& s : sets) {
      argv.push_back("--set");
      argv.push_back(s);
    }
    return run_command(argv, std::chrono::seconds(300));
  }

  // What train_full_and_resumed's three commands printed.
  struct ResumedRuns {
    CommandResult whole, first, second;
  };

  // Trains run `full` for `steps` steps without a stop, and run `parts` for `stop_at` steps, then
  // again to `steps` from its checkpoint, all on `np` ranks with `sets`; each must exit 0 and the
  // second part must say it resumed. Callers wrap it in ASSERT_NO_FATAL_FAILURE and compare what
  // the two runs left (and what they printed, through `runs` when given).
  void train_full_and_resumed(int np, const std::vector<std::string>& sets, int steps, int stop_at,
                              const std::string& full = "full", const std::string& parts = "parts",
                              ResumedRuns* runs = nullptr) {
    ResumedRuns local;
    ResumedRuns& r = runs != nullptr ? *runs : local;
    r.whole = train(np, config(full, steps), sets);
    ASSERT_EQ(r.whole.exit_code, 0) << describe(r.whole);
    const std::string cfg = config(parts, steps);
    std::vector<std::string> first = sets;
    first.push_back("training.steps=" + std::to_string(stop_at));
    r.first = train(np, cfg, first);
    ASSERT_EQ(r.first.exit_code, 0) << describe(r.first);
    r.second = train(np, cfg, sets);
    ASSERT_EQ(r.second.exit_code, 0) << describe(r.second);
    EXPECT_NE(r.second.out.find("resumed from"), std::string::npos) << r.second.out;
  }

  // Every metrics record of run `name`, in order.
  std::vector<nlohmann::json> records(const std::string& name) {
    std::vector<nlohmann::json> out;
    std::istringstream in(read_text(tmp_ / (name + "/metrics.jsonl")));
    std::string line;
    while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
    return out;
  }

  // The per-step losses run `name` logged, in order.
  std::vector<double> losses(const std::string& name) {
    std::vector<double> out;
    for (const nlohmann::json& j : records(name)) out.push_back(j["loss"].get<double>());
    return out;
  }

  // Every tensor of run `run`'s checkpoint at `step` whose file name starts with `prefix` (every
  // safetensors file by default), by "file:tensor".
  std::map<std::string, std::vector<uint8_t>> checkpoint_tensors(const std::string& run, int step,
                                                                 const std::string& prefix = "") {
    std::map<std::string, std::vector<uint8_t>> out;
    const std::filesystem::path dir = tmp_ / fmt::format("{}/checkpoints/step_{:08d}", run, step);
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      const std::string file = e.path().filename().string();
      if (file.rfind(prefix, 0) != 0 || e.path().extension() != ".safetensors") continue;
      for (auto& [name, t] : tensor::load_safetensors(e.path().string())) {
        const auto* p = static_cast<const uint8_t*>(t.data_ptr());
        out[file + ":" + name].assign(p, p + t.nbytes());
      }
    }
    return out;
  }

  // Run a's checkpointed parameters at `step` equal run b's bit for bit, and so do the optimizer
  // tensors both hold (the moments; an in-memory fp32 run keeps no separate masters).
  void expect_same_states(const std::string& a, const std::string& b, int step) {
    const auto ma = checkpoint_tensors(a, step, "model"), mb = checkpoint_tensors(b, step, "model");
    ASSERT_FALSE(ma.empty()) << a;
    EXPECT_EQ(ma, mb) << a << " vs " << b << ": the parameters differ";
    const auto oa = checkpoint_tensors(a, step, "optimizer");
    const auto ob = checkpoint_tensors(b, step, "optimizer");
    int common = 0;
    for (const auto& [name, bytes] : oa) {
      auto it = ob.find(name);
      if (it == ob.end()) continue;
      ++common;
      EXPECT_TRUE(bytes == it->second) << name << " differs between " << a << " and " << b;
    }
    EXPECT_GT(common, 0) << "no optimizer tensors in common";
  }

  std::string bin_, device_;
  ScratchDir tmp_;
};

}  // namespace strata::testing
