#pragma once
// What a `train` run's offload engines will allocate, computed from the config and the model's
// unit sizes before the model is built, by the engines' own size functions: the host buffers
// the host-memory plan counts (runtime/host_memory_plan.h) and the NVMe swap space the start
// checks against each swap directory's free space.
//
// Note [NVMe space plan]
// Each rank's swap files hold, in whole NvmeStore blocks per extent (offload::NvmeStore::
// blocks_for; the block is NvmeConfig's 1 MiB, not aio.block_size): with offload_param nvme, one
// extent per ZeRO-3 partition on NVMe (parallel::param_tier_layout: past max_in_cpu); with
// offload_optimizer nvme, one extent of 12 bytes per element per sub-group (optim::
// nvme_adamw_sizes), and at stage 3 one more per sub-group for its gradients (Note [Gradients on
// NVMe]). The ranks on a node share its directories, so a directory needs
// ranks_on_node times one rank's bytes (every rank's partitions have the same padded size, Note
// [ZeRO padding]). Directories on one filesystem share its free space, so the check sums them
// per filesystem (st_dev). Free is statvfs's f_bavail x f_frsize plus the swap files
// (strata-swap-<pid>-*.bin) of dead holders of this run's optimizer locks, which the lock
// removes when it takes them over (Note [Swap directory lock]). A filesystem whose files would
// not fit is a user error before the model is built and before the run directory exists; a
// directory that cannot be examined (missing) is left to the store's own check.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "models/registry.h"
#include "optim/nvme_adamw.h"
#include "parallel/param_tier.h"
#include "parallel/zero_memory.h"
#include "runtime/train_config.h"

namespace strata::runtime {

struct OffloadPlan {
  bool zero3 = false;           // stage 3 (ZeRO-3's gathered units exist)
  std::vector<int64_t> shard;   // [unit] one rank's partition (optimizer slice), elements
  std::vector<int64_t> padded;  // [unit] the gathered unit, elements
  std::vector<bool> managed;    // [unit] ZeRO-3 gathers it (stage3_param_persistence_threshold)
  int64_t managed_shard_elements = 0;  // sum of shard over managed units
  bool param_tier = false;             // offload_param cpu|nvme at stage 3
  parallel::ParamTierLayout tier;      // when param_tier
  bool nvme_optimizer = false;         // offload_optimizer nvme
  bool grads_on_nvme = false;          // and stage 3: the gradients' home is its store
  optim::NvmeAdamWSizes optimizer;     // when nvme_optimizer
};

// `units`: one rank's units (tp applied), before dp padding.
OffloadPlan plan_offload(const TrainConfig& config, const std::vector<parallel::UnitSize>& units,
                         int dp);

// One filesystem's share of the swap files (Note [NVMe space plan]).
struct NvmeSpaceNeed {
  std::vector<std::string> dirs;  // the configured directories on it
  int64_t params = 0;             // bytes, whole blocks, all ranks on the node
  int64_t optimizer = 0;
  int64_t grads = 0;  // ZeRO-3 with offload_optimizer nvme (Note [Gradients on NVMe])
  int64_t needed() const { return params + optimizer + grads; }
};
std::vector<NvmeSpaceNeed> plan_nvme_space(const TrainConfig& config, const OffloadPlan& plan,
                                           int ranks_on_node);

// Free bytes of the filesystem holding `dir`; nullopt when it cannot be examined.
using FreeSpaceFn = std::function<std::optional<int64_t>(const std::string& dir)>;
std::optional<int64_t> statvfs_free_bytes(const std::string& dir);
// Bytes of swap files in `dir` that taking this run's optimizer locks (strata-optimizer-rank<r>
// for r < world) will remove: those of lock holders that are no longer alive.
int64_t stale_swap_bytes(const std::string& dir, int world);

// strata::user_error naming the directory, the bytes per kind, the free bytes and what to
// change when a filesystem's swap files do not fit (Note [NVMe space plan]).
void check_nvme_space(const TrainConfig& config, const std::vector<parallel::UnitSize>& units,
                      int dp, int world, int ranks_on_node,
                      const FreeSpaceFn& free_bytes = statvfs_free_bytes);

// The Trainer's start: check_nvme_space for the units of `whole_options` (the model options
// without tp group or stage) with dp x tp ranks; nothing with pipeline stages or for a family
// whose units are not known unbuilt (the stores' own checks remain).
void check_nvme_space_at_start(const TrainConfig& config, const models::ModelOptions& whole_options,
                               int dp, int tp, int ranks_on_node);

}  // namespace strata::runtime
