#include "runtime/host_memory_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/dtype.h"
#include "core/error.h"
#include "offload/host_budget.h"
#include "parallel/partition.h"
#include "runtime/offload_plan.h"

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
  const OffloadPlan off = plan_offload(c, units, dp);
  const int64_t psize = c.run.dtype == "fp32" ? 4 : 2;  // the parameters' (and gradients') dtype
  // offload_param: the managed units' partitions are the tier's home copies, on the host only
  // for device cpu and (nvme) the max_in_cpu ones (parallel::param_tier_layout).
  const int64_t params =
      off.param_tier ? states.params - off.managed_shard_elements * psize + off.tier.host_bytes
                     : states.params;
  plan.items.push_back({"parameters", params});
  // ZeRO-3 with offload_optimizer nvme: the reduced partitions' home is the optimizer's store
  // (Note [Gradients on the NVMe tier] in parallel/grad_buckets.h).
  plan.items.push_back({"gradients", off.grads_on_nvme ? int64_t{0} : states.grads});
  // offload_optimizer nvme: the states are on NVMe, streamed through the offload buffers.
  plan.items.push_back({"optimizer states", off.nvme_optimizer ? int64_t{0} : states.optimizer});
  if (off.zero3) {
    // Note [ZeRO-3 gathering]: the unit being run, gathered whole, the units the recorded order
    // prefetches after it (those that fit stage3_prefetch_bucket_size elements, largest first:
    // the most the prefetch holds), a unit's whole gradient before its reduce-scatter and one
    // reduce bucket's staging copy of it (parallel::plan_reduce_scatter_buckets), each at the
    // largest unit's size.
    std::vector<int64_t> sizes;
    int64_t largest_shard = 0;
    for (size_t u = 0; u < off.padded.size(); ++u)
      if (off.managed[u]) {
        sizes.push_back(off.padded[u]);
        largest_shard = std::max(largest_shard, off.shard[u]);
      }
    std::sort(sizes.rbegin(), sizes.rend());
    const int64_t largest = sizes.empty() ? 0 : sizes.front();
    int64_t prefetched = 0;
    for (size_t i = 1; i < sizes.size(); ++i)
      if (prefetched + sizes[i] <= c.zero.stage3_prefetch_bucket_size) prefetched += sizes[i];
    const int64_t staging =
        parallel::largest_reduce_scatter_bucket(largest_shard, dp, c.zero.reduce_bucket_size);
    // With the gradients on NVMe, the unit's transient partition its buckets reduce into.
    const int64_t transient =
        off.grads_on_nvme ? *std::max_element(off.shard.begin(), off.shard.end()) : 0;
    if (largest > 0)
      plan.items.push_back(
          {"ZeRO-3 unit buffers", (largest + prefetched + largest + staging + transient) * psize});
  }
  if (off.param_tier || off.nvme_optimizer) {
    // parallel::ParamTier's read and write-back buffers and the partition a gather loads;
    // optim::NvmeAdamW's sub-group, gradient staging and conversion buffers.
    int64_t largest_shard = 0;
    for (size_t u = 0; u < off.shard.size(); ++u)
      if (off.managed[u]) largest_shard = std::max(largest_shard, off.shard[u]);
    const int64_t tier =
        off.param_tier ? off.tier.buffer_count * off.tier.buffer_bytes + largest_shard * psize : 0;
    plan.items.push_back(
        {"offload buffers", tier + (off.nvme_optimizer ? off.optimizer.host_bytes() : 0)});
  }
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
  std::string advice;
  if (over->what == "activations")
    advice = fmt::format(
        "lower batch.micro_batch_size ({}) or batch.seq_len ({}), or raise run.host_memory_budget",
        c.batch.micro_batch_size, c.batch.seq_len);
  else if (over->what == "ZeRO-3 unit buffers")
    advice = fmt::format(
        "lower zero_optimization.stage3_prefetch_bucket_size ({}) or reduce_bucket_size ({}), "
        "use a model with smaller units (layers), or raise run.host_memory_budget",
        c.zero.stage3_prefetch_bucket_size, c.zero.reduce_bucket_size);
  else if (over->what == "offload buffers")
    advice = fmt::format(
        "lower zero_optimization.offload_param.buffer_count ({}), "
        "offload_optimizer.buffer_count ({}) or sub_group_size ({}), or raise "
        "run.host_memory_budget",
        c.zero.offload_param.buffer_count, c.zero.offload_optimizer.buffer_count,
        c.zero.sub_group_size);
  else
    advice = "use a smaller model, ZeRO over more ranks, or raise run.host_memory_budget";
  user_error(
      "{}: run.host_memory_budget: this run needs at least {} of host memory per rank ({}; "
      "activations counted as one micro-batch's block inputs and logits only), and the {} take it "
      "over the budget of {} ({}); {}",
      c.source, mib(sum), items, over->what, mib(budget), budget_source, advice);
}

int64_t resolve_host_budget(const TrainConfig& c, int ranks_on_node) {
  const int64_t parsed =
      offload::parse_host_budget(c.run.host_memory_budget, "run.host_memory_budget");
  if (parsed >= 0) return parsed;
  return offload::auto_host_budget() / std::max(ranks_on_node, 1);
}

std::unique_ptr<offload::HostBudgetScope> start_host_budget(const TrainConfig& c,
                                                            const models::ModelShape& shape,
                                                            const models::ModelOptions& whole,
                                                            int dp, int tp, int ranks_on_node) {
  const int64_t budget = resolve_host_budget(c, ranks_on_node);
  const std::string source =
      c.run.host_memory_budget == "auto"
          ? fmt::format(
                "run.host_memory_budget auto: MemAvailable less its reserve (max(1 GiB, "
                "1/16), Note [Auto budget reserve]) / {} rank(s) on this node",
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
