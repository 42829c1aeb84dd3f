#include "runtime/host_memory_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/dtype.h"
#include "core/error.h"
#include "offload/host_budget.h"

namespace strata::runtime {

namespace {

std::string mib(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  return b >= 1073741824.0 ? fmt::format("{:.2f} GiB", b / 1073741824.0)
                           : fmt::format("{:.1f} MiB", b / 1048576.0);
}

// Saturating: a micro-batch of 10^8 sequences must not overflow the product.
int64_t mul(int64_t a, int64_t b) {
  if (a == 0 || b == 0) return 0;
  if (a > INT64_MAX / b) return INT64_MAX;
  return a * b;
}

}  // namespace

int64_t HostMemoryPlan::total() const {
  int64_t t = 0;
  for (const HostMemoryItem& i : items) t = std::min(INT64_MAX - i.bytes, t) + i.bytes;
  return t;
}

HostMemoryPlan plan_host_memory(const TrainConfig& c, const models::ModelShape& shape,
                                const std::vector<parallel::UnitSize>& units, int dp, int tp) {
  HostMemoryPlan plan;
  if (c.run.device != "cpu" || c.parallelism.pipeline_parallel_size > 1) return plan;
  parallel::ZeroMemoryConfig zc;
  zc.stage = c.zero.stage;
  zc.dp = dp;
  zc.precision =
      c.run.dtype == "fp32" ? parallel::StatePrecision::FP32 : parallel::StatePrecision::Mixed;
  zc.optimizer = c.optimizer.name == "adamw"  ? parallel::StateOptimizer::AdamW
                 : c.optimizer.momentum > 0.0 ? parallel::StateOptimizer::SgdMomentum
                                              : parallel::StateOptimizer::Sgd;
  const parallel::ModelStateBytes states =
      parallel::padded_model_state_bytes(zc, units, c.zero.stage3_param_persistence_threshold);
  // offload_param nvme: the partitions are on NVMe (max_in_cpu's are not counted: a lower
  // bound); cpu: they are host memory as counted.
  plan.items.push_back(
      {"parameters", c.zero.offload_param.device == "nvme" ? int64_t{0} : states.params});
  plan.items.push_back({"gradients", states.grads});
  // offload_optimizer nvme: the states are on NVMe, streamed through buffers (a lower bound: 0).
  plan.items.push_back({"optimizer states",
                        c.zero.offload_optimizer.device == "nvme" ? int64_t{0} : states.optimizer});
  const int64_t act_bytes = c.run.dtype == "fp32" ? 4 : 2;
  const int64_t vocab = std::max(shape.padded_vocab_size, shape.vocab_size) / std::max(tp, 1);
  const int64_t per_token = shape.n_layer * shape.n_embd + vocab;
  plan.items.push_back(
      {"activations",
       mul(mul(mul(c.batch.micro_batch_size, c.batch.seq_len), per_token), act_bytes)});
  return plan;
}

void check_host_memory_plan(const HostMemoryPlan& plan, int64_t in_use, int64_t budget,
                            const std::string& budget_source, const TrainConfig& c) {
  if (budget <= 0 || plan.items.empty()) return;
  int64_t sum = in_use;
  const HostMemoryItem* over = nullptr;
  std::string items;
  for (const HostMemoryItem& i : plan.items) {
    sum = std::min(INT64_MAX - i.bytes, sum) + i.bytes;
    if (sum > budget && over == nullptr) over = &i;
    items += fmt::format("{}{} {}", items.empty() ? "" : ", ", i.what, mib(i.bytes));
  }
  if (over == nullptr) return;
  const bool acts = over->what == "activations";
  user_error(
      "{}: run.host_memory_budget: this run needs at least {} of host memory per rank ({}; "
      "activations counted as one micro-batch's block inputs and logits only), and the {} take it "
      "over the budget of {} ({}); {}",
      c.source, mib(sum), items, over->what, mib(budget), budget_source,
      acts ? fmt::format("lower batch.micro_batch_size ({}) or batch.seq_len ({}), or raise "
                         "run.host_memory_budget",
                         c.batch.micro_batch_size, c.batch.seq_len)
           : std::string("use a smaller model, ZeRO over more ranks, or raise "
                         "run.host_memory_budget"));
}

int64_t resolve_host_budget(const TrainConfig& c, int ranks_on_node) {
  const int64_t parsed =
      offload::parse_host_budget(c.run.host_memory_budget, "run.host_memory_budget");
  if (parsed >= 0) return parsed;
  return offload::available_host_memory() / std::max(ranks_on_node, 1);
}

std::unique_ptr<offload::HostBudgetScope> start_host_budget(const TrainConfig& c,
                                                            const models::ModelShape& shape,
                                                            const models::ModelOptions& whole,
                                                            int dp, int tp, int ranks_on_node) {
  const int64_t budget = resolve_host_budget(c, ranks_on_node);
  const std::string source =
      c.run.host_memory_budget == "auto"
          ? fmt::format("run.host_memory_budget auto: MemAvailable / {} rank(s) on this node",
                        std::max(ranks_on_node, 1))
          : fmt::format("run.host_memory_budget {} in {}", c.run.host_memory_budget, c.source);
  auto scope = std::make_unique<offload::HostBudgetScope>(budget, source);
  if (c.run.device != "cpu" || c.parallelism.pipeline_parallel_size > 1) return scope;
  std::vector<parallel::UnitSize> units;
  try {
    units = parallel::unit_sizes(c.model.name, whole, tp);
  } catch (const UserError&) {
    return scope;  // a family whose units are not known unbuilt: the allocators' check alone
  }
  check_host_memory_plan(plan_host_memory(c, shape, units, dp, tp),
                         offload::HostMemoryBudget::in_use(offload::MemoryStats::global()), budget,
                         source, c);
  return scope;
}

}  // namespace strata::runtime
