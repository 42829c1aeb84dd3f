// The Trainer's reports: the per-rank memory report beside the ZeRO formula, and the op profile.
#include "runtime/trainer.h"

#include <fmt/format.h>

#include <string>
#include <vector>

#include "autograd/checkpoint.h"
#include "core/atomic_file.h"
#include "core/logging.h"
#include "offload/memory_stats.h"
#include "optim/nvme_adamw.h"
#include "parallel/zero_memory.h"
#include "runtime/op_profile.h"
#include "tensor/cuda.h"

namespace strata::runtime {

void Trainer::report_memory() {
  // Note [ZeRO memory model]: this rank's model states as allocated (MemoryStats), the claim of
  // the formula with the engine's padding, and the rest (activations, buffers) at its peak.
  const parallel::Engine::ModelStateBytes b = engine_->model_state_bytes();
  const auto& stats = offload::MemoryStats::global();
  int64_t rest_peak = 0;
  const offload::Tier tier = device_.is_cuda() ? offload::Tier::Gpu : offload::Tier::Host;
  for (auto cat :
       {offload::Category::Activation, offload::Category::Workspace, offload::Category::Comm})
    rest_peak += stats.usage(tier, cat).peak;
  parallel::ZeroMemoryConfig zc;
  zc.stage = config_.zero.stage;
  zc.dp = world_;
  zc.precision = engine_->param_dtype() == DType::F32 ? parallel::StatePrecision::FP32
                                                      : parallel::StatePrecision::Mixed;
  zc.optimizer = config_.optimizer.name == "adamw"  ? parallel::StateOptimizer::AdamW
                 : config_.optimizer.momentum > 0.0 ? parallel::StateOptimizer::SgdMomentum
                                                    : parallel::StateOptimizer::Sgd;
  // This rank's units: under pipeline parallelism its stage's (Note [Pipeline stages]).
  const parallel::ModelStateBytes claim = parallel::padded_model_state_bytes(
      zc, unit_sizes_, config_.zero.stage3_param_persistence_threshold);
  constexpr int kFields = 5;
  tensor::Tensor mine = tensor::Tensor::empty({kFields}, DType::I64);
  int64_t* m = mine.data<int64_t>();
  m[0] = b.params;
  m[1] = b.grads;
  m[2] = b.optimizer;
  m[3] = rest_peak;
  m[4] = claim.total();
  // On the run's device: an nccl communicator moves GPU memory only. Under tensor or pipeline
  // parallelism every rank of the world reports (the tp ranks hold different shards, the stages
  // different layers).
  const bool layout = tp_size_ > 1 || pp_size_ > 1;
  comm::Communicator& over = layout ? *world_comm_ : *dp_;
  const int n = over.size();
  tensor::Tensor all_dev = tensor::Tensor::empty({kFields * n}, DType::I64, device_);
  over.allgather(mine.to(device_), all_dev)->wait();
  const tensor::Tensor all = all_dev.to(Device::cpu());
  if (!lead_) return;
  // Under tensor parallelism Ψ is one tp rank's (Note [Tensor-parallel shards]).
  // Under pipeline parallelism Ψ is one stage's, so each rank's claim follows its line.
  console_->event(fmt::format(
      "memory per rank, {}{}ZeRO stage {} x dp {}: model states claimed {} = {}{} (params {}, "
      "grads {}, optimizer {})",
      pp_size_ > 1 ? fmt::format("pp {} (Ψ per stage) x ", pp_size_) : std::string(),
      tp_size_ > 1 ? fmt::format("tp {} (Ψ per tp rank) x ", tp_size_) : std::string(), zc.stage,
      world_, parallel::formula(zc), format_bytes(claim.total()),
      pp_size_ > 1 ? " on rank 0's stage" : "", format_bytes(claim.params),
      format_bytes(claim.grads), format_bytes(claim.optimizer)));
  if (config_.zero.offload_optimizer.device == "nvme") {
    // ZeRO-Infinity: the states the claim counts live on NVMe; resident are the sub-group
    // buffers (Note [Optimizer states on NVMe]).
    using offload::Category;
    using offload::Tier;
    console_->event(fmt::format(
        "  ZeRO-Infinity (rank 0): optimizer states on NVMe in {}, not in the claim's device "
        "bytes: nvme {} (masters and moments); resident pinned {} (sub-group buffers {}, "
        "gradient staging {}, parameter staging {}), host optimizer {}; peak resident "
        "optimizer {} (pinned {}, host {})",
        config_.zero.offload_optimizer.nvme_path,
        format_bytes(stats.usage(Tier::Nvme, Category::Optimizer).current),
        format_bytes(stats.tier_usage(Tier::Pinned).current),
        format_bytes(stats.usage(Tier::Pinned, Category::Optimizer).current),
        format_bytes(stats.usage(Tier::Pinned, Category::Grad).current),
        format_bytes(stats.usage(Tier::Pinned, Category::Param).current),
        format_bytes(stats.usage(Tier::Host, Category::Optimizer).current),
        format_bytes(stats.usage(Tier::Pinned, Category::Optimizer).peak +
                     stats.usage(Tier::Host, Category::Optimizer).peak),
        format_bytes(stats.usage(Tier::Pinned, Category::Optimizer).peak),
        format_bytes(stats.usage(Tier::Host, Category::Optimizer).peak)));
    if (engine_->grads_on_nvme())  // Note [Gradients on the NVMe tier]
      console_->event(fmt::format(
          "  ZeRO-Infinity gradients (rank 0): reduced partitions on NVMe {}; resident gradient "
          "buffers {} (peak {}), not the model's",
          format_bytes(stats.usage(Tier::Nvme, Category::Grad).current),
          format_bytes(stats.usage(Tier::Pinned, Category::Grad).current +
                       stats.usage(Tier::Host, Category::Grad).current),
          format_bytes(stats.usage(Tier::Pinned, Category::Grad).peak +
                       stats.usage(Tier::Host, Category::Grad).peak)));
    // What the aio section configured, as the engine runs it.
    if (auto* nvme = dynamic_cast<optim::NvmeAdamW*>(&engine_->optimizer())) {
      const offload::AioEngine& io = nvme->store().engine();
      console_->event(fmt::format(
          "  optimizer swap (rank 0): {} sub-groups through {} buffers of {}; aio {} "
          "(block_size {}, queue_depth {}, thread_count {}, single_submit {}, overlap_events "
          "{}), O_DIRECT {}",
          nvme->sub_groups(), nvme->buffer_count(), format_bytes(nvme->buffer_bytes()),
          offload::io_engine_name(io.kind()), io.config().block_size, io.config().queue_depth,
          io.config().intra_op_parallelism, io.config().single_submit, io.config().overlap_events,
          nvme->store().direct() ? "on" : "off"));
    }
  } else if (config_.zero.offload_optimizer.enabled()) {
    // ZeRO-Offload: the optimizer states the claim counts live on the host, not the GPU.
    using offload::Category;
    using offload::Tier;
    console_->event(fmt::format(
        "  ZeRO-Offload (rank 0): optimizer states on the host, not in the claim's GPU bytes: "
        "pinned {} (masters {}, gradients {}, parameter staging {}), host {} (moments)",
        format_bytes(stats.tier_usage(Tier::Pinned).current),
        format_bytes(stats.usage(Tier::Pinned, Category::Optimizer).current),
        format_bytes(stats.usage(Tier::Pinned, Category::Grad).current),
        format_bytes(stats.usage(Tier::Pinned, Category::Param).current),
        format_bytes(stats.usage(Tier::Host, Category::Optimizer).current)));
  }
  if (const parallel::ParamTier* tier = engine_->param_tier()) {
    // ZeRO-Infinity (Note [Parameter tier]): the partitions live on the tier; what the device
    // holds of them is transient (a unit being loaded, updated or allgathered).
    using offload::Category;
    using offload::Tier;
    // Note [Unit-by-unit construction] in parallel/engine.h
    std::string built;
    if (model_->built_deferred())
      built = device_.is_cpu() ? "; built unit by unit, never whole in host memory"
                               : "; built unit by unit, never whole in host memory or on the GPU";
    console_->event(fmt::format(
        "  ZeRO-Infinity parameters (rank 0): offload_param.device {}; nvme {} (swap files {}), "
        "pinned {} (peak {}), host {} (peak {}); {} buffers of {}{}",
        config_.zero.offload_param.device,
        format_bytes(stats.usage(Tier::Nvme, Category::Param).current),
        tier->files().empty() ? std::string("none") : tier->files().front(),
        format_bytes(stats.usage(Tier::Pinned, Category::Param).current),
        format_bytes(stats.usage(Tier::Pinned, Category::Param).peak),
        format_bytes(stats.usage(Tier::Host, Category::Param).current),
        format_bytes(stats.usage(Tier::Host, Category::Param).peak), tier->buffer_count(),
        format_bytes(tier->buffer_bytes()), built));
  }
  if (autograd::cpu_checkpointing()) {
    // Note [CPU checkpointing]: the checkpoints' bytes moved from the device to pinned memory.
    using offload::Category;
    using offload::Tier;
    console_->event(fmt::format(
        "  cpu_checkpointing (rank 0): activation checkpoints in pinned host memory, peak {}; "
        "activations on the device, peak {}",
        format_bytes(stats.usage(Tier::Pinned, Category::Activation).peak),
        format_bytes(stats.usage(Tier::Gpu, Category::Activation).peak)));
  }
  const int64_t* a = all.data<int64_t>();
  for (int r = 0; r < n; ++r) {
    const int64_t* x = a + kFields * r;
    // Note [Process group order]: global rank r = (pp rank x dp + dp rank) x tp + tp rank.
    const int tp = r % tp_size_, dp = (r / tp_size_) % world_, pp = r / (tp_size_ * world_);
    const std::string who = pp_size_ > 1
                                ? fmt::format("rank {} (stage {}, tp {}, dp {})", r, pp, tp, dp)
                            : tp_size_ > 1 ? fmt::format("rank {} (tp {}, dp {})", r, tp, dp)
                                           : fmt::format("rank {}", r);
    console_->event(
        fmt::format("  {}: model states {} (params {}, grads {}, optimizer {}){}; rest peak {} "
                    "(activations, workspace, communication buffers)",
                    who, format_bytes(x[0] + x[1] + x[2]), format_bytes(x[0]), format_bytes(x[1]),
                    format_bytes(x[2]),
                    pp_size_ > 1 ? fmt::format(", claimed {}", format_bytes(x[4])) : std::string(),
                    format_bytes(x[3])));
  }
}

// The profiled window's table, in the log and in <run.dir>/profile.md (rank 0; every rank times
// its own ops).
void Trainer::report_profile(const std::vector<tensor::CudaOpTime>& ops, double seconds) {
  const auto& t = config_.training;
  const double step_ms = seconds * 1e3 / static_cast<double>(t.profile_steps);
  if (!lead_) return;
  const std::string text = fmt::format(
      "GPU time per op over steps {} to {} (rank 0; device time from CUDA events, share of the "
      "steps' wall time):\n\n{}",
      t.profile_start, t.profile_start + t.profile_steps - 1,
      op_time_table(ops, t.profile_steps, step_ms, peak_rates_));
  console_->event(text);
  write_file_atomically(config_.run.dir + "/profile.md", text);
}

}  // namespace strata::runtime
