// ZeRO-Infinity's parameter offload through `train` (zero_optimization.offload_param, Note
// [Parameter tier] in parallel/param_tier.h), on CPU ranks with the host playing the device:
// every placement (cpu, nvme; dp 1, 2, 4) is bitwise the in-memory ZeRO-3 run over 20 steps,
// losses and final checkpoint files; an offloaded run stopped and resumed is bitwise the
// uninterrupted one; the parameters' measured resident bytes are the buffers, not the model; the
// model is built unit by unit, from the seed or from model.init_from; bad settings are clear
// errors. Label mpi: the tests start mpirun themselves.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "train_mpi_fixture.h"

namespace strata::tools {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using testing::describe;

const std::string kBin = STRATA_BINARY_DIR;

class TrainOffloadParam : public testing::TrainMpiFixture {
 protected:
  TrainOffloadParam() : TrainMpiFixture(kBin, "") {}

  // --set overrides that put the parameters on `device` (none: in memory), ZeRO-3.
  std::vector<std::string> placement(const std::string& device) {
    std::vector<std::string> s = {"zero_optimization.stage=3"};
    if (device == "none") return s;
    s.push_back("zero_optimization.offload_param.device=" + device);
    s.push_back("zero_optimization.offload_param.nvme_path=" + std::string(tmp_ / "nvme"));
    fs::create_directories(std::string(tmp_ / "nvme"));
    return s;
  }

  // Same losses and gradient norms, bit for bit, and the same checkpoint tensors at `step`.
  void expect_bitwise(const std::string& a, const std::string& b, int step) {
    SCOPED_TRACE(a + " vs " + b);
    const auto x = records(a), y = records(b);
    ASSERT_EQ(x.size(), static_cast<size_t>(step));
    ASSERT_EQ(y.size(), x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(x[i]["loss"].get<double>(), y[i]["loss"].get<double>()) << "step " << i + 1;
      EXPECT_EQ(x[i]["grad_norm"].get<double>(), y[i]["grad_norm"].get<double>())
          << "step " << i + 1;
    }
    const auto p = checkpoint_tensors(a, step), q = checkpoint_tensors(b, step);
    ASSERT_FALSE(p.empty());
    ASSERT_EQ(p.size(), q.size());
    for (const auto& [name, bytes] : p) {
      auto it = q.find(name);
      ASSERT_NE(it, q.end()) << name;
      EXPECT_TRUE(bytes == it->second) << name << " differs";
    }
  }
};

TEST_F(TrainOffloadParam, EveryPlacementIsBitwiseTheInMemoryRun) {
  const int kSteps = 20;
  for (int dp : {1, 2, 4}) {
    const std::vector<std::string> devices = dp == 4
                                                 ? std::vector<std::string>{"none", "nvme"}
                                                 : std::vector<std::string>{"none", "cpu", "nvme"};
    for (const std::string& device : devices) {
      const std::string name = fmt::format("dp{}{}", dp, device);
      CommandResult r = train(dp == 1 ? 0 : dp, config(name, kSteps), placement(device));
      ASSERT_EQ(r.exit_code, 0) << describe(r);
      if (device == "none") continue;
      expect_bitwise(fmt::format("dp{}none", dp), name, kSteps);
      // The memory report shows the tier; every step logs how long it waited for parameters.
      EXPECT_NE(r.out.find("ZeRO-Infinity parameters (rank 0): offload_param.device " + device),
                std::string::npos)
          << r.out;
      // Note [Unit-by-unit construction]: a CPU run in fp32 never builds the model whole.
      EXPECT_NE(r.out.find("built unit by unit, never whole in host memory"), std::string::npos)
          << r.out;
      const auto rec = records(name);
      EXPECT_TRUE(rec.back().contains("param_wait_ms")) << rec.back().dump();
      EXPECT_EQ(rec.back()["param_peak_bytes"].contains("nvme"), device == "nvme")
          << rec.back().dump();
    }
  }
  // The swap files went with the runs.
  EXPECT_TRUE(fs::is_empty(std::string(tmp_ / "nvme")));
}

TEST_F(TrainOffloadParam, ResumeOnNvmeIsBitwise) {
  std::vector<std::string> sets = placement("nvme");
  ASSERT_NO_FATAL_FAILURE(train_full_and_resumed(2, sets, 6, 3));
  expect_bitwise("full", "parts", 6);
  // An offloaded checkpoint is an ordinary ZeRO-3 one: the in-memory run resumes it.
  std::vector<std::string> mem = placement("none");
  mem.push_back("training.steps=8");
  CommandResult c = train(2, tmp_ / "parts.yaml", mem);
  ASSERT_EQ(c.exit_code, 0) << describe(c);
  EXPECT_EQ(records("parts").size(), 8u);
}

// Note [Parameter tier]: on NVMe the parameters' resident bytes are the pinned buffers plus the
// partitions being loaded, updated or allgathered, bounded by buffer_count and the prefetch size,
// not by the model: measured by the allocators (Category::Param peaks from the first step).
TEST_F(TrainOffloadParam, ResidentParametersAreTheBuffersNotTheModel) {
  auto run = [&](const std::string& name, const std::string& device, int buffers) {
    std::vector<std::string> sets = placement(device);
    for (const char* s :
         {"model.config.n_layer=8", "zero_optimization.stage3_prefetch_bucket_size=14000",
          "zero_optimization.stage3_param_persistence_threshold=100", "training.eval_every=0",
          "run.threads=1"})  // one thread: no OpenMP spinning against the NVMe engine's threads
      sets.push_back(s);
    sets.push_back(fmt::format("zero_optimization.offload_param.buffer_count={}", buffers));
    CommandResult r = train(0, config(name, 3), sets);
    EXPECT_EQ(r.exit_code, 0) << describe(r);
    return records(name).back()["param_peak_bytes"];
  };
  const nlohmann::json two = run("two", "nvme", 2), four = run("four", "nvme", 4);
  const nlohmann::json host = run("host", "cpu", 2);
  ASSERT_TRUE(two.contains("nvme") && two.contains("pinned") && two.contains("host")) << two;
  const int64_t model = two["nvme"].get<int64_t>();  // every partition is on NVMe
  EXPECT_EQ(four["nvme"].get<int64_t>(), model);
  // On the cpu tier the same partitions are pinned host memory: the model's size.
  EXPECT_EQ(host["pinned"].get<int64_t>(), model);
  // The pinned bytes are the buffers, exactly: twice the buffers, twice the bytes.
  EXPECT_EQ(four["pinned"].get<int64_t>(), 2 * two["pinned"].get<int64_t>());
  // One buffer holds the largest partition: 8 blocks of about equal size and the embeddings.
  const int64_t buffer = two["pinned"].get<int64_t>() / 2;
  EXPECT_LT(buffer, model / 6);
  // The partitions resident on the "device" at once: the unit in use and what the prefetch
  // (14000 elements, one block) adds.
  EXPECT_LE(two["host"].get<int64_t>(), 3 * buffer);
  EXPECT_EQ(four["host"].get<int64_t>(), two["host"].get<int64_t>());
  const int64_t resident = two["pinned"].get<int64_t>() + two["host"].get<int64_t>();
  EXPECT_LT(resident, model * 3 / 4) << "resident " << resident << " of " << model;
}

// Note [Unit-by-unit construction]: model.init_from on an offloaded run reads each unit's tensors
// from the HF file as the unit is built (at tp 2 the rank's slices of them, hf_shard_reader);
// the run is bitwise the in-memory ZeRO-3 run started from the same file (which builds the
// model whole first, then loads it), at dp 1 and 2, in bf16 (the unit read in fp32, its master
// taken, then cast), and at tp 2 in fp32 on nvme and bf16 on cpu.
TEST_F(TrainOffloadParam, InitFromLoadsUnitByUnitBitwise) {
  CommandResult base = train(0, config("base", 3), placement("none"));
  ASSERT_EQ(base.exit_code, 0) << describe(base);
  const std::string hf = tmp_ / "hf";
  CommandResult conv = testing::run_command(
      {kBin + "/convert", "--checkpoint", tmp_ / "base/checkpoints/step_00000003", "--to-hf", hf});
  ASSERT_EQ(conv.exit_code, 0) << describe(conv);
  const int kSteps = 4;
  struct Case {
    int dp;
    int tp;
    const char* dtype;
    const char* param;
  };
  for (const Case c :
       {Case{1, 1, "fp32", "nvme"}, Case{2, 1, "fp32", "nvme"}, Case{1, 1, "bf16", "nvme"},
        Case{1, 2, "fp32", "nvme"}, Case{1, 2, "bf16", "cpu"}}) {
    const int ranks = c.dp * c.tp;
    const std::string mem = fmt::format("mem{}x{}{}", c.dp, c.tp, c.dtype),
                      off = fmt::format("{}{}x{}{}", c.param, c.dp, c.tp, c.dtype);
    std::vector<std::string> a = placement("none"), b = placement(c.param);
    for (std::vector<std::string>* sets : {&a, &b}) {
      sets->push_back("model.init_from=" + hf);
      sets->push_back(fmt::format("run.dtype={}", c.dtype));
      sets->push_back(fmt::format("parallelism.tensor_parallel_size={}", c.tp));
    }
    CommandResult x = train(ranks == 1 ? 0 : ranks, config(mem, kSteps), a);
    ASSERT_EQ(x.exit_code, 0) << describe(x);
    EXPECT_EQ(x.out.find("built unit by unit"), std::string::npos) << x.out;
    CommandResult y = train(ranks == 1 ? 0 : ranks, config(off, kSteps), b);
    ASSERT_EQ(y.exit_code, 0) << describe(y);
    EXPECT_NE(y.out.find("built unit by unit, never whole in host memory"), std::string::npos)
        << y.out;
    expect_bitwise(mem, off, kSteps);
    // The file's weights, not a fresh init: the first loss is below the base run's first.
    EXPECT_LT(records(off).front()["loss"].get<double>(),
              records("base").front()["loss"].get<double>() - 0.05);
  }
}

// Note [Unit-by-unit construction] in mixed precision: `train` with run.dtype bf16 builds the
// model unit by unit (each unit in fp32, its master to the optimizer, the cast partition to the
// tier), for the parameters on nvme with the optimizer in memory and on cpu with it on NVMe, at
// dp 1 and 2; every run is bitwise the same run with the parameters in memory, built whole
// (losses, gradient norms, the checkpoint's parameters, masters and moments). On CPU ranks
// `train` has no offload_optimizer.device cpu; the engine's test runs that placement
// (UnitConstruction.MixedPrecisionIsBitwiseTheWholeInMemoryBuild).
TEST_F(TrainOffloadParam, MixedPrecisionIsBuiltUnitByUnitBitwise) {
  const int kSteps = 4;
  const std::string swap = std::string(tmp_ / "nvme");
  fs::create_directories(swap);
  struct Case {
    const char* param;
    const char* optimizer;  // "none": in memory
  };
  for (int dp : {1, 2}) {
    for (const Case c : {Case{"nvme", "none"}, Case{"cpu", "nvme"}}) {
      std::vector<std::string> common = {"run.dtype=bf16"};
      if (std::string(c.optimizer) != "none") {
        common.push_back(fmt::format("zero_optimization.offload_optimizer.device={}", c.optimizer));
        common.push_back("zero_optimization.offload_optimizer.nvme_path=" + swap);
        common.push_back("zero_optimization.sub_group_size=3000");
      }
      // The reference: the same run with the parameters in memory, built whole.
      const std::string whole = fmt::format("dp{}{}whole", dp, c.optimizer);
      std::vector<std::string> in_memory = placement("none");
      in_memory.insert(in_memory.end(), common.begin(), common.end());
      CommandResult w = train(dp == 1 ? 0 : dp, config(whole, kSteps), in_memory);
      ASSERT_EQ(w.exit_code, 0) << describe(w);
      EXPECT_EQ(w.out.find("built unit by unit"), std::string::npos) << w.out;
      const std::string name = fmt::format("dp{}{}{}", dp, c.param, c.optimizer);
      std::vector<std::string> offloaded = placement(c.param);
      offloaded.insert(offloaded.end(), common.begin(), common.end());
      CommandResult r = train(dp == 1 ? 0 : dp, config(name, kSteps), offloaded);
      ASSERT_EQ(r.exit_code, 0) << describe(r);
      EXPECT_NE(r.out.find("built unit by unit, never whole in host memory"), std::string::npos)
          << r.out;
      expect_bitwise(whole, name, kSteps);
    }
  }
  EXPECT_TRUE(fs::is_empty(swap));
}

// Note [Unit-by-unit construction] under tensor parallelism: each tp rank initialises its shards
// of one unit at a time (drawn by name, Note [Tensor-parallel shards]) into its partitions; tp 2,
// fp32 with the parameters on nvme and bf16 on cpu, bitwise the in-memory run built whole.
TEST_F(TrainOffloadParam, TensorParallelIsBuiltUnitByUnitBitwise) {
  const int kSteps = 4;
  struct Case {
    const char* dtype;
    const char* param;
  };
  for (const Case c : {Case{"fp32", "nvme"}, Case{"bf16", "cpu"}}) {
    const std::vector<std::string> common = {"parallelism.tensor_parallel_size=2",
                                             fmt::format("run.dtype={}", c.dtype)};
    const std::string whole = fmt::format("tp2{}whole", c.dtype);
    std::vector<std::string> in_memory = placement("none");
    in_memory.insert(in_memory.end(), common.begin(), common.end());
    CommandResult w = train(2, config(whole, kSteps), in_memory);
    ASSERT_EQ(w.exit_code, 0) << describe(w);
    EXPECT_EQ(w.out.find("built unit by unit"), std::string::npos) << w.out;
    const std::string name = fmt::format("tp2{}{}", c.dtype, c.param);
    std::vector<std::string> offloaded = placement(c.param);
    offloaded.insert(offloaded.end(), common.begin(), common.end());
    CommandResult r = train(2, config(name, kSteps), offloaded);
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    EXPECT_NE(r.out.find("built unit by unit, never whole in host memory"), std::string::npos)
        << r.out;
    expect_bitwise(whole, name, kSteps);
  }
}

TEST_F(TrainOffloadParam, BadSettingsAreClearErrors) {
  const std::string cfg = config("bad", 2);
  CommandResult stage =
      train(0, cfg, {"zero_optimization.stage=2", "zero_optimization.offload_param.device=cpu"});
  EXPECT_NE(stage.exit_code, 0);
  EXPECT_NE(stage.err.find("offload_param.device"), std::string::npos) << describe(stage);
  EXPECT_NE(stage.err.find("stage 3"), std::string::npos) << describe(stage);
  CommandResult path =
      train(0, cfg, {"zero_optimization.stage=3", "zero_optimization.offload_param.device=nvme"});
  EXPECT_NE(path.exit_code, 0);
  EXPECT_NE(path.err.find("nvme_path"), std::string::npos) << describe(path);
  std::vector<std::string> small = placement("nvme");
  small.push_back("zero_optimization.offload_param.buffer_size=100");
  CommandResult size = train(0, cfg, small);
  EXPECT_NE(size.exit_code, 0);
  EXPECT_NE(size.err.find("buffer_size"), std::string::npos) << describe(size);
  std::vector<std::string> missing = placement("nvme");
  missing.push_back("zero_optimization.offload_param.nvme_path=" + std::string(tmp_ / "no/such"));
  CommandResult dir = train(0, cfg, missing);
  EXPECT_NE(dir.exit_code, 0);
  EXPECT_NE(dir.err.find("no/such"), std::string::npos) << describe(dir);
}

// Note [NVMe space plan]: parameter partitions larger than the swap directory's disk (an
// 805B-parameter model, 4 bytes per parameter on NVMe) are refused at start, by the real free
// space, before the model is built or the run directory created.
TEST_F(TrainOffloadParam, PartitionsLargerThanTheSwapDiskAreRefusedAtStart) {
  std::vector<std::string> sets = placement("nvme");
  for (const char* s :
       {"model.config.n_layer=1000", "model.config.n_embd=8192", "run.host_memory_budget=none"})
    sets.push_back(s);
  CommandResult r = train(0, config("huge", 2), sets);
  EXPECT_EQ(r.exit_code, 1) << describe(r);
  EXPECT_NE(r.err.find("NVMe swap space"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("'" + std::string(tmp_ / "nvme") + "'"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("parameters"), std::string::npos) << describe(r);
  EXPECT_FALSE(fs::exists(tmp_ / "huge")) << "no run directory for a run that cannot start";
  EXPECT_TRUE(fs::is_empty(tmp_ / "nvme")) << "no swap file for a run that cannot start";
}

}  // namespace
}  // namespace strata::tools
