// The host-memory budget through the Trainer (Note [Host memory budget], Note [Host memory
// plan]): a run the plan shows cannot fit stops before the run directory exists, naming the
// category; the allocator's check stops a run whose actual host bytes cross the budget; a budget
// equal to a run's measured peak lets it train.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <filesystem>
#include <functional>
#include <string>

#include "core/error.h"
#include "offload/host_budget.h"
#include "offload/memory_stats.h"
#include "runtime/host_memory_plan.h"
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

}  // namespace
}  // namespace strata::runtime
