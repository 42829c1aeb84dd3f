// The Trainer's loop: the steps of `train` (Note [Training step]), the per-step record the
// console and metrics.jsonl show, and the stop flag every rank agrees on before a step
// (Note [Interrupts]).
#include "runtime/trainer.h"

#include <fmt/format.h>

#include <atomic>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "autograd/rng_context.h"
#include "core/timer.h"
#include "offload/allocator.h"
#include "offload/memory_stats.h"
#include "parallel/param_tier.h"
#include "parallel/pipeline_schedule.h"
#include "tensor/cuda.h"

namespace strata::runtime {

namespace {

std::atomic<bool> g_stop{false};

}  // namespace

void Trainer::request_stop() {
  g_stop.store(true, std::memory_order_relaxed);
}
void Trainer::clear_stop() {
  g_stop.store(false, std::memory_order_relaxed);
}
bool Trainer::stop_requested() {
  return g_stop.load(std::memory_order_relaxed);
}

std::vector<std::pair<std::string, int64_t>> Trainer::peak_bytes() const {
  std::vector<std::pair<std::string, int64_t>> out;
  const auto& stats = offload::MemoryStats::global();
  for (int t = 0; t < offload::kNumTiers; ++t) {
    auto tier = static_cast<offload::Tier>(t);
    int64_t peak = stats.tier_usage(tier).peak;
    if (peak > 0) out.emplace_back(std::string(offload::tier_name(tier)), peak);
  }
  return out;
}

void Trainer::train_step(StepRecord& record) {
  const auto& b = config_.batch;
  const int64_t M = b.micro_batch_size, A = b.grad_accum_steps, G = b.global_batch_size;
  Stopwatch watch;
  autograd::GeneratorScope rng_scope(generator_);
  const int64_t base = step_ * G + static_cast<int64_t>(rank_) * M * A;
  parallel::TrainStepInputs in;
  in.micro_batches = A;
  in.batch = [&](int64_t m) {
    data::Batch batch = train_data_->batch(base + m * M, M);
    return parallel::MicroBatch{batch.ids.to(device_), batch.targets.to(device_)};
  };
  const double lr = schedule_->lr(step_);
  in.lr = lr;
  in.max_norm = config_.optimizer.grad_clip;
  const parallel::TrainStepOutput out = engine_->train_step(in);  // Note [Train step]
  const parallel::StepResult& result = out.result;
  ++step_;
  samples_consumed_ += G;
  const double mean_loss = engine_->average(out.mean_loss);
  double dt = watch.seconds();

  record.step = step_;
  record.loss = static_cast<float>(mean_loss);
  record.lr = lr;
  record.grad_norm = result.grad_norm;
  record.skipped = result.skipped;
  if (scaler_ != nullptr) record.loss_scale = scaler_->scale();
  record.step_s = dt;
  double tokens = static_cast<double>(G * b.seq_len);
  record.tokens_per_s = tokens / dt;
  record.mfu = peak_flops_ > 0.0 ? flops_per_token_ * tokens / dt /
                                       (peak_flops_ * static_cast<double>(world_comm_->size()))
                                 : 0.0;
  record.peak_bytes = peak_bytes();
  if (pipeline_ != nullptr) {
    // The measured idle share of this step on each stage (Note [Pipeline schedules]), beside
    // the formula; every stage's in the lead's metrics.
    tensor::Tensor mine =
        tensor::from_vector({static_cast<float>(pipeline_->last_step().bubble())}, {1});
    tensor::Tensor all = tensor::Tensor::empty({pp_size_}, DType::F32, device_);
    pp_->allgather(mine.to(device_), all)->wait();
    record.pipeline_bubble.clear();
    for (float f : tensor::to_float_vector(all.to(Device::cpu())))
      record.pipeline_bubble.push_back(f);
    record.pipeline_bubble_formula =
        parallel::pipeline_bubble_formula(pp_size_, A, pipeline_->virtual_stages());
  }
  if (const parallel::ParamTier* tier = engine_->param_tier()) {
    record.param_wait_ms = (tier->wait_seconds() - param_wait_s_) * 1e3;
    param_wait_s_ = tier->wait_seconds();
    const auto& stats = offload::MemoryStats::global();
    for (int t = 0; t < offload::kNumTiers; ++t) {
      const auto at = static_cast<offload::Tier>(t);
      const int64_t peak = stats.usage(at, offload::Category::Param).peak;
      if (peak > 0) record.param_peak_bytes.emplace_back(std::string(offload::tier_name(at)), peak);
    }
  }
  if (engine_->grads_on_nvme()) {  // Note [Gradients on the NVMe tier]
    const auto& stats = offload::MemoryStats::global();
    for (int t = 0; t < offload::kNumTiers; ++t) {
      const auto at = static_cast<offload::Tier>(t);
      const int64_t peak = stats.usage(at, offload::Category::Grad).peak;
      if (peak > 0) record.grad_peak_bytes.emplace_back(std::string(offload::tier_name(at)), peak);
    }
  }
  if (result.skipped)
    console_->event(
        fmt::format("step {}: gradient norm is {}; the update was skipped on every "
                    "rank",
                    step_, result.grad_norm));
}

bool Trainer::agree_to_stop(bool local) {
  // Every rank of every group stops at the same step.
  const std::shared_ptr<comm::Communicator>& all = world_comm_;
  if (all->size() == 1) return local;
  tensor::Tensor flag = tensor::Tensor::empty({1}, DType::I32);
  flag.data<int32_t>()[0] = local ? 1 : 0;
  if (device_.is_cpu()) {
    all->allreduce(flag, comm::ReduceOp::Max)->wait();
    return flag.data<int32_t>()[0] != 0;
  }
  tensor::Tensor on_device = flag.to(device_);  // an nccl communicator moves GPU memory only
  all->allreduce(on_device, comm::ReduceOp::Max)->wait();
  return on_device.item<int32_t>() != 0;
}

Trainer::Outcome Trainer::run(int64_t stop_at) {
  const auto& t = config_.training;
  if (step_ >= t.steps) {
    console_->event(fmt::format("already trained to step {} (training.steps = {}); nothing to do",
                                step_, t.steps));
    return Outcome::Finished;
  }
  // offload_param: the model was built (whole, or unit by unit: Note [Unit-by-unit construction]
  // in parallel/engine.h) before ZeRO-3 partitioned it onto the tier (and its gradients before
  // they went to NVMe); the peaks (metrics' peak_bytes, param_peak_bytes and grad_peak_bytes)
  // count from here, the training's own. What construction or a resume freed into the host block
  // cache (Note [Host cache trimming]) goes back to the system here.
  if (config_.zero.offload_param.enabled() || engine_->grads_on_nvme()) {
    offload::HostAllocator::instance().release_cache();
    offload::MemoryStats::global().reset_peaks();
  }
  while (step_ < t.steps) {
    if (agree_to_stop(stop_requested() || (stop_at >= 0 && step_ >= stop_at))) {
      console_->finish();
      save("interrupted");
      return Outcome::Interrupted;
    }
    StepRecord record;
    const bool first = history_.empty();
    // training.profile_steps (Note [CUDA op profiler]): every op of steps profile_start .. +n-1.
    const int64_t profile_last = t.profile_start + t.profile_steps - 1;
    if (t.profile_steps > 0 && step_ + 1 == t.profile_start) {
      tensor::cuda_profile_start();
      profile_watch_.restart();
      profiling_ = true;
    }
    train_step(record);
    std::optional<std::vector<tensor::CudaOpTime>> profiled;
    double profiled_s = 0;
    if (profiling_ && step_ == profile_last) {  // not after a resume inside the window
      profiling_ = false;
      profiled = tensor::cuda_profile_stop();  // waits for the window's work; before evaluation
      profiled_s = profile_watch_.seconds();
    }

    if (first) report_memory();
    bool last = step_ == t.steps;
    if (val_data_ && ((t.eval_every > 0 && step_ % t.eval_every == 0) || last)) {
      record.val_loss = evaluate();
    }
    if (metrics_) metrics_->append(record);
    history_.push_back(record);
    if (t.log_every > 0 && (step_ % t.log_every == 0 || last)) console_->step(record);
    if (profiled) report_profile(*profiled, profiled_s);
    if (record.val_loss) {
      console_->event(fmt::format("step {}: val loss {:.4f}", step_, *record.val_loss));
    }
    if (!std::isfinite(record.loss)) {
      console_->event(fmt::format("step {}: loss is {}; lower optimizer.lr or enable grad_clip",
                                  step_, record.loss));
    }
    if ((t.sample_every > 0 && step_ % t.sample_every == 0) || (last && t.sample_every > 0)) {
      console_->event(sample_event());
    }
    if (t.checkpoint_every > 0 && step_ % t.checkpoint_every == 0) save("periodic");
  }
  console_->finish();
  if (t.final_checkpoint) save("final");
  return Outcome::Finished;
}

}  // namespace strata::runtime
