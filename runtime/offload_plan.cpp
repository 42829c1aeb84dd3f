#include "runtime/offload_plan.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/dtype.h"
#include "core/error.h"
#include "offload/nvme_store.h"

namespace strata::runtime {

namespace {

namespace fs = std::filesystem;

DType param_dtype_of(const TrainConfig& c) {
  return c.run.dtype == "bf16" ? DType::BF16 : c.run.dtype == "fp16" ? DType::F16 : DType::F32;
}

// Bytes of an extent as the store reserves it: whole blocks.
int64_t on_disk(int64_t bytes) {
  const size_t block = offload::NvmeConfig{}.block_bytes;
  return static_cast<int64_t>(offload::NvmeStore::blocks_for(static_cast<size_t>(bytes), block) *
                              block);
}

std::string size_text(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  return b >= 1073741824.0 ? fmt::format("{:.2f} GiB", b / 1073741824.0)
                           : fmt::format("{:.1f} MiB", b / 1048576.0);
}

std::string sized(int64_t bytes) {
  return fmt::format("{} ({} bytes)", size_text(bytes), bytes);
}

bool alive(pid_t pid) {
  return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM);
}

}  // namespace

OffloadPlan plan_offload(const TrainConfig& c, const std::vector<parallel::UnitSize>& units,
                         int dp) {
  OffloadPlan p;
  const int stage = c.zero.stage;
  p.zero3 = stage == 3;
  for (const parallel::UnitSize& u : units) {
    const int64_t padded = parallel::padded_unit_size(u.size, stage, dp);
    p.padded.push_back(padded);
    p.shard.push_back(stage == 0 ? padded : padded / dp);
    // parallel::ParamGathering: a unit is gathered when its (unpadded) size reaches the threshold.
    p.managed.push_back(p.zero3 && u.size >= c.zero.stage3_param_persistence_threshold);
    if (p.managed.back()) p.managed_shard_elements += p.shard.back();
  }
  const DType dtype = param_dtype_of(c);
  p.param_tier = p.zero3 && c.zero.offload_param.enabled();
  if (p.param_tier) {
    parallel::OffloadParamConfig pc;  // what the trainer's zero_config gives ParamTier
    pc.device = c.zero.offload_param.device == "nvme" ? parallel::OffloadParamConfig::Device::Nvme
                                                      : parallel::OffloadParamConfig::Device::Cpu;
    pc.buffer_count = c.zero.offload_param.buffer_count;
    pc.max_in_cpu = c.zero.offload_param.max_in_cpu;
    std::vector<int64_t> numel;
    for (size_t u = 0; u < units.size(); ++u) numel.push_back(p.managed[u] ? p.shard[u] : 0);
    p.tier = parallel::param_tier_layout(pc, numel, dtype);
  }
  p.nvme_optimizer = c.zero.offload_optimizer.device == "nvme";
  if (p.nvme_optimizer) {
    optim::NvmeAdamWOptions o;
    o.sub_group_size = c.zero.sub_group_size;
    o.buffer_count = static_cast<int>(c.zero.offload_optimizer.buffer_count);
    // parallel::Engine: at stage 3 the reduced partitions go to the optimizer's store.
    p.grads_on_nvme = p.zero3;
    o.grads_on_nvme = p.grads_on_nvme;
    o.grad_dtype = dtype;  // the units' gradients have their parameters' dtype
    p.optimizer = optim::nvme_adamw_sizes(p.shard, o, dtype, dtype);
  }
  return p;
}

std::vector<NvmeSpaceNeed> plan_nvme_space(const TrainConfig& c, const OffloadPlan& plan,
                                           int ranks_on_node) {
  struct Kind {
    std::string dir;
    int64_t params = 0, optimizer = 0, grads = 0;
  };
  std::vector<Kind> kinds;
  const int64_t ranks = std::max(ranks_on_node, 1);
  if (plan.param_tier && !plan.tier.nvme_extents.empty()) {
    Kind k{c.zero.offload_param.nvme_path};
    for (const int64_t e : plan.tier.nvme_extents) k.params += ranks * on_disk(e);
    kinds.push_back(k);
  }
  if (plan.nvme_optimizer && !plan.optimizer.extents.empty()) {
    Kind k{c.zero.offload_optimizer.nvme_path};
    for (const optim::NvmeAdamWSizes::Extents& e : plan.optimizer.extents)
      k.optimizer += ranks * e.count * on_disk(e.bytes);
    for (const optim::NvmeAdamWSizes::Extents& e : plan.optimizer.grad_extents)
      k.grads += ranks * e.count * on_disk(e.bytes);
    kinds.push_back(k);
  }
  // Per filesystem: directories that cannot be examined are left to the stores' checks.
  std::map<dev_t, NvmeSpaceNeed> by_fs;
  std::vector<dev_t> order;
  for (const Kind& k : kinds) {
    struct stat st {};
    if (k.dir.empty() || ::stat(k.dir.c_str(), &st) != 0) continue;
    if (!by_fs.count(st.st_dev)) order.push_back(st.st_dev);
    NvmeSpaceNeed& n = by_fs[st.st_dev];
    if (std::find(n.dirs.begin(), n.dirs.end(), k.dir) == n.dirs.end()) n.dirs.push_back(k.dir);
    n.params += k.params;
    n.optimizer += k.optimizer;
    n.grads += k.grads;
  }
  std::vector<NvmeSpaceNeed> out;
  for (const dev_t d : order) out.push_back(by_fs[d]);
  return out;
}

std::optional<int64_t> statvfs_free_bytes(const std::string& dir) {
  struct statvfs s {};
  if (::statvfs(dir.c_str(), &s) != 0) return std::nullopt;
  return static_cast<int64_t>(s.f_bavail) * static_cast<int64_t>(s.f_frsize);
}

int64_t stale_swap_bytes(const std::string& dir, int world) {
  int64_t bytes = 0;
  std::error_code ec;
  for (int r = 0; r < std::max(world, 1); ++r) {
    std::ifstream in(fmt::format("{}/strata-optimizer-rank{}.lock", dir, r));
    long pid = 0;
    if (!(in >> pid) || alive(static_cast<pid_t>(pid))) continue;
    // offload::SwapDirLock removes strata-swap-<pid>-*.bin of the dead holder.
    const std::string prefix = fmt::format("strata-swap-{}-", pid);
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(prefix, 0) != 0 || e.path().extension() != ".bin") continue;
      struct stat st {};
      // The blocks the file holds: an fallocate'd swap file's size is its allocation.
      if (::stat(e.path().c_str(), &st) == 0) bytes += static_cast<int64_t>(st.st_blocks) * 512;
    }
  }
  return bytes;
}

void check_nvme_space(const TrainConfig& c, const std::vector<parallel::UnitSize>& units, int dp,
                      int world, int ranks_on_node, const FreeSpaceFn& free_bytes) {
  const OffloadPlan plan = plan_offload(c, units, dp);
  for (const NvmeSpaceNeed& n : plan_nvme_space(c, plan, ranks_on_node)) {
    const std::optional<int64_t> free = free_bytes(n.dirs.front());
    if (!free) continue;
    int64_t stale = 0;
    for (const std::string& d : n.dirs) stale += stale_swap_bytes(d, world);
    if (n.needed() <= *free + stale) continue;
    std::string dirs;
    for (const std::string& d : n.dirs) dirs += fmt::format("{}'{}'", dirs.empty() ? "" : ", ", d);
    std::string kinds;
    if (n.params > 0) kinds += fmt::format("parameters {}", sized(n.params));
    if (n.optimizer > 0)
      kinds += fmt::format("{}optimizer states {}", kinds.empty() ? "" : ", ", sized(n.optimizer));
    if (n.grads > 0)
      kinds += fmt::format("{}gradients {}", kinds.empty() ? "" : ", ", sized(n.grads));
    user_error(
        "{}: NVMe swap space: this run's swap files need {} on the filesystem of {} ({}; {} "
        "rank(s) on this node, whole {} blocks per extent), and it has {} free{}; free space "
        "there, point zero_optimization.offload_param.nvme_path / "
        "offload_optimizer.nvme_path at a larger drive, or offload less (a smaller model, "
        "offload_param.max_in_cpu, device cpu)",
        c.source, sized(n.needed()), dirs, kinds, std::max(ranks_on_node, 1),
        size_text(static_cast<int64_t>(offload::NvmeConfig{}.block_bytes)), sized(*free),
        stale > 0
            ? fmt::format(" and {} in a dead run's swap files, removed at start", sized(stale))
            : std::string());
  }
}

void check_nvme_space_at_start(const TrainConfig& c, const models::ModelOptions& whole, int dp,
                               int tp, int ranks_on_node) {
  if (c.parallelism.pipeline_parallel_size > 1) return;
  if (c.zero.offload_param.device != "nvme" && c.zero.offload_optimizer.device != "nvme") return;
  std::vector<parallel::UnitSize> units;
  try {
    units = parallel::unit_sizes(c.model.name, whole, tp);
  } catch (const UserError&) {
    return;  // a family whose units are not known unbuilt: the stores' checks alone
  }
  check_nvme_space(c, units, dp, dp * std::max(tp, 1), ranks_on_node);
}

}  // namespace strata::runtime
