// The host-memory budget through the Trainer (Note [Host memory budget], Note [Host memory
// plan]): a run the plan shows cannot fit stops before the run directory exists, naming the
// category; the allocator's check stops a run whose actual host bytes cross the budget; a budget
// equal to a run's measured peak lets it train.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>

#include "core/error.h"
#include "offload/host_budget.h"
#include "offload/memory_stats.h"
#include "runtime/host_memory_plan.h"
#include "runtime/offload_plan.h"
#include "runtime/train_config.h"
#include "runtime/trainer.h"
#include "tests/support/tool_test_util.h"

namespace strata::runtime {
namespace {

namespace fs = std::filesystem;
using testing::ScratchDir;

TrainConfig tiny_config(const ScratchDir& tmp, const std::string& run, int64_t micro,
                        const std::string& budget) {
  testing::write_raw_shard(tmp / "train_000000.bin", {testing::pattern_tokens(3000, 200, 1)});
  const std::string text =
      fmt::format(R"(run: {{dir: {run}, seed: 7, threads: 1, host_memory_budget: "{budget}"}}
model:
  name: gpt2-tiny
  config: {{n_layer: 2, n_embd: 32, n_head: 2, n_positions: 32}}
data: {{train: "{data}/train_*.bin", tokenizer: byte}}
batch: {{micro_batch_size: {micro}, seq_len: 16}}
optimizer: {{name: adamw, lr: 1.0e-2}}
schedule: {{name: constant}}
training: {{steps: 2, progress: lines, resume: never}}
)",
                  fmt::arg("run", tmp / run), fmt::arg("data", tmp.path()),
                  fmt::arg("micro", micro), fmt::arg("budget", budget));
  testing::write_text(tmp / (run + ".yaml"), text);
  return load_train_config(tmp / (run + ".yaml"));
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// The process's host peak (host + pinned tiers) over one 2-step run.
int64_t peak_of_run(TrainConfig config) {
  auto& stats = offload::MemoryStats::global();
  stats.reset_peaks();
  {
    Trainer t(std::move(config));
    t.run();
  }
  return stats.tier_usage(offload::Tier::Host).peak + stats.tier_usage(offload::Tier::Pinned).peak;
}

TEST(HostMemoryBudget, AHugeMicroBatchFailsInThePlanBeforeTheRunDirectory) {
  ScratchDir tmp;
  TrainConfig c = tiny_config(tmp, "huge", 100'000'000, "auto");
  const std::string msg = error_of([&] { Trainer t(c); });
  EXPECT_NE(msg.find("run.host_memory_budget"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the activations take it over the budget"), std::string::npos) << msg;
  EXPECT_NE(msg.find("MemAvailable"), std::string::npos) << msg;
  EXPECT_NE(msg.find("batch.micro_batch_size (100000000)"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(tmp / "huge")) << "nothing may be written for a run that cannot fit";
}

TEST(HostMemoryBudget, PlanCountsTheExactModelStatesAndNamesTheCategoryThatCrosses) {
  ScratchDir tmp;
  TrainConfig c = tiny_config(tmp, "run", 2, "none");
  const int64_t in_use = offload::HostMemoryBudget::in_use(offload::MemoryStats::global());
  int64_t params = 0, grads = 0, optim = 0;
  {
    Trainer t(c);
    const auto b = t.engine().model_state_bytes();
    params = b.params;
    grads = b.grads;
    optim = b.optimizer;
    EXPECT_EQ(params, grads);
    EXPECT_EQ(optim, 2 * params);  // fp32 AdamW: m and v (Note [ZeRO memory model])
  }
  // Budgets inside each category's running sum name that category (the plan's order:
  // parameters, gradients, optimizer states, activations).
  models::ModelOptions mo;
  mo.seed = 7;
  mo.overrides = c.model.config;
  const models::ModelShape shape = models::ModelRegistry::global().shape(c.model.name, mo);
  const HostMemoryPlan plan =
      plan_host_memory(c, shape, parallel::unit_sizes(c.model.name, mo, 1), 1, 1);
  ASSERT_EQ(plan.items.size(), 4u);
  EXPECT_EQ(plan.items[0].bytes, params);
  EXPECT_EQ(plan.items[1].bytes, grads);
  EXPECT_EQ(plan.items[2].bytes, optim);
  // 2 x 16 tokens x (2 blocks x 32 + the padded vocabulary) fp32 values.
  EXPECT_EQ(plan.items[3].bytes, 2 * 16 * (2 * 32 + shape.padded_vocab_size) * 4);
  const int64_t crossing[] = {params, params + grads, params + grads + optim, plan.total()};
  const char* names[] = {"parameters", "gradients", "optimizer states", "activations"};
  for (int i = 0; i < 4; ++i) {
    const std::string msg =
        error_of([&] { check_host_memory_plan(plan, in_use, in_use + crossing[i] - 1, "b", c); });
    EXPECT_NE(msg.find(fmt::format("the {} take it over", names[i])), std::string::npos) << msg;
  }
  EXPECT_EQ(error_of([&] { check_host_memory_plan(plan, in_use, in_use + plan.total(), "b", c); }),
            "");
  // offload_param (ZeRO-Infinity, stage 3): on nvme the parameters are not host memory.
  TrainConfig z3 = c;
  z3.zero.stage = 3;
  z3.zero.offload_param.device = "cpu";
  const int64_t on_host =
      plan_host_memory(z3, shape, parallel::unit_sizes(c.model.name, mo, 1), 1, 1).items[0].bytes;
  EXPECT_GT(on_host, 0);
  z3.zero.offload_param.device = "nvme";
  // Units under stage3_param_persistence_threshold stay whole in memory (all of this model's).
  EXPECT_EQ(
      plan_host_memory(z3, shape, parallel::unit_sizes(c.model.name, mo, 1), 1, 1).items[0].bytes,
      on_host);
  z3.zero.stage3_param_persistence_threshold = 0;
  EXPECT_EQ(
      plan_host_memory(z3, shape, parallel::unit_sizes(c.model.name, mo, 1), 1, 1).items[0].bytes,
      0);
  // offload_optimizer on nvme: the optimizer states are not host memory either.
  TrainConfig nv = c;
  nv.zero.offload_optimizer.device = "nvme";
  const HostMemoryPlan on_nvme =
      plan_host_memory(nv, shape, parallel::unit_sizes(c.model.name, mo, 1), 1, 1);
  EXPECT_EQ(on_nvme.items[2].bytes, 0);
  EXPECT_EQ(on_nvme.items[0].bytes, params);
}

TEST(HostMemoryBudget, JustBelowTheMeasuredPeakFailsAtAllocationJustAbovePasses) {
  ScratchDir tmp;
  peak_of_run(tiny_config(tmp, "warm", 16, "none"));  // lazily built process-wide tables
  const int64_t peak = peak_of_run(tiny_config(tmp, "measure", 16, "none"));
  ASSERT_GT(peak, 1 << 20);
  // One byte under the peak: the plan (a lower bound) passes, an allocation during the step
  // crosses; the error names what was being allocated and the budget.
  TrainConfig below = tiny_config(tmp, "below", 16, std::to_string(peak - 1));
  const std::string msg = error_of([&] {
    Trainer t(std::move(below));
    t.run();
  });
  EXPECT_NE(msg.find("host memory budget exceeded by "), std::string::npos) << msg;
  EXPECT_NE(msg.find(fmt::format("{} in ", peak - 1)), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(tmp / "below/checkpoints")) << "no checkpoint for a failed run";
  // The measured peak itself: the same allocations fit exactly, and training finishes.
  EXPECT_EQ(peak_of_run(tiny_config(tmp, "at", 16, std::to_string(peak))), peak);
  EXPECT_TRUE(fs::exists(tmp / "at/checkpoints"));
}

// The peak of one category over the host and pinned tiers.
int64_t host_peak(offload::Category cat) {
  auto& stats = offload::MemoryStats::global();
  return stats.usage(offload::Tier::Host, cat).peak + stats.usage(offload::Tier::Pinned, cat).peak;
}

// A tiny ZeRO-Inf-NVMe run (stage 3, every unit gathered, parameters and optimizer states on
// NVMe, one unit prefetched): each plan item against the measured peak of the categories it
// claims over two steps (Note [Host memory plan]).
// ZeRO-3 with every partition managed, parameters and optimizer states (and so the gradients)
// in swap files under `dir`, sub-groups of 3000 elements.
void all_on_nvme(TrainConfig& c, const std::string& dir) {
  c.zero.stage = 3;
  c.zero.stage3_param_persistence_threshold = 0;
  c.zero.offload_param.device = "nvme";
  c.zero.offload_param.nvme_path = dir;
  c.zero.offload_optimizer.device = "nvme";
  c.zero.offload_optimizer.nvme_path = dir;
  c.zero.sub_group_size = 3000;
}

TEST(HostMemoryBudget, OffloadedPlanEqualsTheMeasuredPeaksOfItsCategories) {
  ScratchDir tmp;
  fs::create_directories(tmp / "swap");
  TrainConfig c = tiny_config(tmp, "off", 2, "none");
  c.training.final_checkpoint = false;  // checkpoints are not part of the plan
  all_on_nvme(c, tmp / "swap");
  models::ModelOptions mo;
  mo.seed = 7;
  mo.overrides = c.model.config;
  const auto units = parallel::unit_sizes(c.model.name, mo, 1);
  int64_t block = 0;
  for (const auto& u : units) block = std::max(block, parallel::padded_unit_size(u.size, 3, 1));
  c.zero.stage3_prefetch_bucket_size = block;  // one block prefetched
  const models::ModelShape shape = models::ModelRegistry::global().shape(c.model.name, mo);
  const HostMemoryPlan plan = plan_host_memory(c, shape, units, 1, 1);
  const OffloadPlan off = plan_offload(c, units, 1);
  ASSERT_EQ(plan.items.size(), 6u);
  auto item = [&](const std::string& what) {
    for (const HostMemoryItem& i : plan.items)
      if (i.what == what) return i.bytes;
    ADD_FAILURE() << "no plan item " << what;
    return int64_t{0};
  };
  auto& stats = offload::MemoryStats::global();
  {
    Trainer t(c);
    stats.reset_peaks();  // the steps, not the start's whole model
    t.run();
  }
  // The offload buffers: the parameter tier's 5 read/write-back buffers of the largest
  // partition and the partition a gather loads (Category::Param), NvmeAdamW's 4 sub-group
  // buffers (Optimizer) and its gradient staging buffer (Grad); fp32, so no model copy or
  // widening buffer of its own dtype.
  const int64_t tier = off.tier.buffer_count * off.tier.buffer_bytes + block * 4;
  EXPECT_EQ(off.tier.buffer_count, 5);
  EXPECT_EQ(off.tier.buffer_bytes, block * 4);
  EXPECT_EQ(off.optimizer.buffer_count, 4);
  EXPECT_EQ(off.optimizer.state_buffer_bytes, (3000 * 12 + 4095) / 4096 * 4096);
  EXPECT_EQ(item("offload buffers"), tier + off.optimizer.host_bytes());
  // At stage 3 the gradients live on NVMe (Note [Gradients on NVMe]): one gradient buffer per
  // sub-group buffer.
  EXPECT_TRUE(off.grads_on_nvme);
  EXPECT_EQ(off.optimizer.grad_buffer_count, 4);
  EXPECT_EQ(off.optimizer.host_bytes(),
            4 * off.optimizer.state_buffer_bytes + 4 * off.optimizer.grad_stage_bytes);
  EXPECT_EQ(item("parameters"), 0);  // every partition on NVMe
  EXPECT_EQ(host_peak(offload::Category::Param), tier);
  EXPECT_EQ(item("gradients"), 0);
  EXPECT_EQ(host_peak(offload::Category::Grad),
            off.optimizer.grad_buffer_count * off.optimizer.grad_stage_bytes);
  EXPECT_EQ(item("optimizer states"), 0);
  EXPECT_EQ(host_peak(offload::Category::Optimizer),
            off.optimizer.buffer_count * off.optimizer.state_buffer_bytes);
  // ZeRO-3's unit buffers (Category::Comm): the gathered, prefetched, gradient, staging and
  // transient reduced units planned, and beyond them what the plan leaves out: a unit kept
  // gathered (GPT-2's tied embeddings wait for the head's backward) and the partitions whose
  // NVMe writes are in flight (at most 2, parallel/grad_buckets.cpp), each at most a block.
  const int64_t comm = host_peak(offload::Category::Comm);
  EXPECT_EQ(item("ZeRO-3 unit buffers"), 5 * block * 4);
  EXPECT_GE(comm, item("ZeRO-3 unit buffers"));
  EXPECT_LE(comm, item("ZeRO-3 unit buffers") + 3 * block * 4);
  // Activations: a lower bound.
  EXPECT_GE(host_peak(offload::Category::Activation), item("activations"));
}

// ZeRO-Inf-CPU (stage 3, offload_param cpu): a budget that holds the model states but not
// ZeRO-3's unit buffers is refused at start, naming them, before the run directory exists.
TEST(HostMemoryBudget, ZeroThreeUnitBuffersOverTheBudgetFailAtStart) {
  ScratchDir tmp;
  TrainConfig c = tiny_config(tmp, "units", 2, "none");
  c.model.config["n_embd"] = "128";  // a plan above the 1 MiB a budget must have
  c.zero.stage = 3;
  c.zero.stage3_param_persistence_threshold = 0;
  c.zero.offload_param.device = "cpu";
  models::ModelOptions mo;
  mo.seed = 7;
  mo.overrides = c.model.config;
  const models::ModelShape shape = models::ModelRegistry::global().shape(c.model.name, mo);
  const HostMemoryPlan plan =
      plan_host_memory(c, shape, parallel::unit_sizes(c.model.name, mo, 1), 1, 1);
  ASSERT_EQ(plan.items.size(), 6u);
  ASSERT_EQ(plan.items[3].what, "ZeRO-3 unit buffers");
  ASSERT_GT(plan.items[3].bytes, 0);
  const int64_t states = plan.items[0].bytes + plan.items[1].bytes + plan.items[2].bytes;
  const int64_t in_use = offload::HostMemoryBudget::in_use(offload::MemoryStats::global());
  c.run.host_memory_budget = std::to_string(in_use + states + plan.items[3].bytes - 1);
  const std::string msg = error_of([&] { Trainer t(c); });
  EXPECT_NE(msg.find("the ZeRO-3 unit buffers take it over"), std::string::npos) << msg;
  EXPECT_NE(msg.find("stage3_prefetch_bucket_size"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(tmp / "units")) << "nothing may be written for a run that cannot fit";
}

// Note [NVMe space plan], through the free-space seam (check_nvme_space's FreeSpaceFn): the
// swap files' whole blocks per extent against the free bytes, a dead run's stale swap files
// counted as free, the ranks on the node multiplying the need.
TEST(NvmeSpacePlan, SwapFilesThatDoNotFitAreRefusedNamingTheDirectoryAndTheBytes) {
  ScratchDir tmp;
  fs::create_directories(tmp / "swap");
  TrainConfig c = tiny_config(tmp, "space", 2, "none");
  all_on_nvme(c, tmp / "swap");
  models::ModelOptions mo;
  mo.overrides = c.model.config;
  const auto units = parallel::unit_sizes(c.model.name, mo, 1);
  // Every partition and every sub-group of this model is under one 1 MiB block.
  const OffloadPlan off = plan_offload(c, units, 1);
  const int64_t mib = 1 << 20;
  const int64_t params = static_cast<int64_t>(off.tier.nvme_extents.size()) * mib;
  const int64_t optimizer = off.optimizer.sub_groups * mib;
  // At stage 3 the gradients' homes are in the optimizer's store too: one extent per sub-group.
  const int64_t grads = off.optimizer.sub_groups * mib;
  const int64_t all = params + optimizer + grads;
  ASSERT_EQ(off.tier.nvme_extents.size(), units.size());
  ASSERT_EQ(off.optimizer.sub_groups, 15);  // 34688 elements in sub-groups of <= 3000
  const std::vector<NvmeSpaceNeed> need = plan_nvme_space(c, off, 1);
  ASSERT_EQ(need.size(), 1u);  // one directory for both kinds
  EXPECT_EQ(need[0].params, params);
  EXPECT_EQ(need[0].optimizer, optimizer);
  EXPECT_EQ(need[0].grads, grads);
  auto free_is = [](int64_t bytes) {
    return [bytes](const std::string&) { return std::optional<int64_t>(bytes); };
  };
  auto check = [&](int64_t free, int ranks) {
    return error_of([&] { check_nvme_space(c, units, 1, 1, ranks, free_is(free)); });
  };
  EXPECT_EQ(check(all, 1), "");
  const std::string msg = check(all - 1, 1);
  EXPECT_NE(msg.find(std::string(tmp / "swap")), std::string::npos) << msg;
  EXPECT_NE(msg.find(fmt::format("parameters 4.0 MiB ({} bytes)", params)), std::string::npos)
      << msg;
  EXPECT_NE(msg.find(fmt::format("optimizer states 15.0 MiB ({} bytes)", optimizer)),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find(fmt::format("({} bytes) free", all - 1)), std::string::npos) << msg;
  EXPECT_NE(msg.find(fmt::format("gradients 15.0 MiB ({} bytes)", grads)), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("nvme_path at a larger drive"), std::string::npos) << msg;
  // Two ranks on the node share the directory: twice the bytes.
  EXPECT_NE(check(all, 2).find("2 rank(s) on this node"), std::string::npos);
  EXPECT_EQ(check(2 * (all), 2), "");
  // A dead run's lock and its 2 MiB swap file: removed at start, so counted as free.
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  std::ofstream(tmp / "swap/strata-optimizer-rank0.lock") << dead << "\n";
  std::ofstream(tmp / fmt::format("swap/strata-swap-{}-0-0.bin", dead))
      << std::string(static_cast<size_t>(2 * mib), 'x');
  EXPECT_EQ(stale_swap_bytes(tmp / "swap", 1), 2 * mib);
  EXPECT_EQ(check(all - 2 * mib, 1), "");
  const std::string stale = check(all - 2 * mib - 1, 1);
  EXPECT_NE(stale.find("2.0 MiB (2097152 bytes) in a dead run's swap files"), std::string::npos)
      << stale;
  // Two directories on one filesystem share its free space: one need naming both.
  fs::create_directories(tmp / "swap2");
  TrainConfig two = c;
  two.zero.offload_optimizer.nvme_path = tmp / "swap2";
  const std::vector<NvmeSpaceNeed> shared = plan_nvme_space(two, off, 1);
  ASSERT_EQ(shared.size(), 1u);
  EXPECT_EQ(shared[0].dirs, (std::vector<std::string>{tmp / "swap", tmp / "swap2"}));
  EXPECT_EQ(shared[0].needed(), all);
  // A live holder's files are not counted.
  std::ofstream(tmp / "swap/strata-optimizer-rank0.lock") << ::getpid() << "\n";
  EXPECT_EQ(stale_swap_bytes(tmp / "swap", 1), 0);
}

}  // namespace
}  // namespace strata::runtime
