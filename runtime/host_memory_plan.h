#pragma once
// The host-memory plan of a `train` run: the host bytes a rank will need, by category, computed
// from the config and the model's shape before anything large is allocated, and checked against
// the host-memory budget (Note [Host memory budget] in offload/host_budget.h).
//
// Note [Host memory plan]
// On run.device cpu every model state lives in host memory: the exact parameter, gradient and
// optimizer-state bytes the engine will allocate (parallel::padded_model_state_bytes, Note [ZeRO
// padding]); with zero_optimization.offload_param on nvme the gathered units' partitions count
// only where they stay on the host (max_in_cpu), with offload_optimizer on nvme the optimizer
// states count 0 (they are on NVMe), and at stage 3 the gradients too (Note [Gradients on the
// NVMe tier] in parallel/grad_buckets.h). What the engines allocate beside them is counted by their
// own size functions (runtime/offload_plan.h):
//   ZeRO-3 unit buffers (stage 3; Category::Comm): the unit being run, gathered whole, the units
//     prefetched after it (those fitting stage3_prefetch_bucket_size, largest first), a unit's
//     whole gradient before its reduce-scatter and one reduce bucket's staging copy, each at the
//     largest gathered unit's size, and with the gradients on NVMe the partition being reduced;
//   offload buffers: parallel::ParamTier's buffer_count buffers of the largest partition on NVMe
//     and the partition a gather loads (Category::Param; parallel::param_tier_layout), and
//     optim::NvmeAdamW's buffer_count sub-group buffers (Optimizer), gradient buffers (Grad: one,
//     or one per sub-group buffer with the gradients on NVMe) and, for bf16/fp16, its model-copy
//     and widening buffers (optim::nvme_adamw_sizes).
// Activations are a lower bound, not an estimate: whatever the model does, backward needs each
// block's input, kept for every block of the micro-batch (under activation checkpointing these
// are the checkpoints), and the logits over the (padded, per tp rank) vocabulary,
// micro_batch_size x seq_len x (n_layer x n_embd + vocabulary) values of the activation dtype.
// Left out, for the allocator's check (the budget's backstop) to catch: the rest of the
// activations and the workspaces (operators' working memory, NvmeAdamW's widening buffer when a
// gradient scale applies), a unit that stays gathered while another user of it waits for its
// backward (GPT-2's tied embeddings), gradient partitions whose NVMe writes are in flight and a
// checkpoint's staged copies of offloaded states. On a GPU the model states and activations are
// on the device, so the plan has nothing to count there (ZeRO-Offload's host states are checked
// at allocation); with pipeline stages (a rank holds only its stage), or for a model family whose
// units parallel::unit_sizes cannot compute without building it, it is left to the allocator too.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/registry.h"
#include "offload/host_budget.h"
#include "parallel/zero_memory.h"
#include "runtime/train_config.h"

namespace strata::runtime {

struct HostMemoryItem {
  std::string what;  // "parameters", ..., "ZeRO-3 unit buffers", "offload buffers", "activations"
  int64_t bytes = 0;
};

struct HostMemoryPlan {
  std::vector<HostMemoryItem> items;  // in allocation order
  int64_t total() const;
};

// Note [Host memory plan]. `units` are one rank's units (tp applied), before dp padding.
HostMemoryPlan plan_host_memory(const TrainConfig& config, const models::ModelShape& shape,
                                const std::vector<parallel::UnitSize>& units, int dp, int tp);

// strata::user_error, naming the config file, the category whose bytes cross the budget, every
// item and the budget, when `in_use` plus the plan exceeds `budget` (> 0).
void check_host_memory_plan(const HostMemoryPlan& plan, int64_t in_use, int64_t budget,
                            const std::string& budget_source, const TrainConfig& config);

// run.host_memory_budget resolved: auto = MemAvailable / ranks_on_node; none = 0 (no budget).
int64_t resolve_host_budget(const TrainConfig& config, int ranks_on_node);

// The Trainer's start: sets the budget (the returned scope restores the one before) and checks
// this rank's plan against it (check_host_memory_plan's error when it does not fit).
// `whole_options` are the model options without tp group or stage.
std::unique_ptr<offload::HostBudgetScope> start_host_budget(
    const TrainConfig& config, const models::ModelShape& shape,
    const models::ModelOptions& whole_options, int dp, int tp, int ranks_on_node);

}  // namespace strata::runtime
