#pragma once
// The host-memory plan of a `train` run: the host bytes a rank will need, by category, computed
// from the config and the model's shape before anything large is allocated, and checked against
// the host-memory budget (Note [Host memory budget] in offload/host_budget.h).
//
// Note [Host memory plan]
// On run.device cpu every model state lives in host memory: the exact parameter, gradient and
// optimizer-state bytes the engine will allocate (parallel::padded_model_state_bytes, Note [ZeRO
// padding]); with zero_optimization.offload_param on nvme the parameters, with offload_optimizer
// on nvme the optimizer states count 0 (they are on NVMe, staged through buffers). Activations are
// a lower bound, not an estimate: whatever the model does, backward needs each block's input, kept
// for every block of the micro-batch (under activation checkpointing these are the checkpoints),
// and the logits over the (padded, per tp rank) vocabulary, micro_batch_size x seq_len x (n_layer x
// n_embd + vocabulary) values of the activation dtype. Being a lower bound, the plan never refuses
// a run that would fit; the allocator's check (the budget's backstop) catches what the plan cannot
// see (the rest of the activations, workspaces). On a GPU the model states and activations are on
// the device, so the plan has nothing to count there (ZeRO-Offload's host states are checked at
// allocation); with pipeline stages (a rank holds only its stage), or for a model family whose
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
  std::string what;  // "parameters", "gradients", "optimizer states", "activations"
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
