#pragma once
// Trainer: the loop behind `train`. Builds the model by name from the registry, the optimizer,
// the LR schedule and the data loaders from a TrainConfig, resumes from the latest checkpoint
// when asked, and runs steps of gradient accumulation, logging, evaluation, sampling and
// checkpointing.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "autograd/checkpoint.h"
#include "comm/communicator.h"
#include "core/rng.h"
#include "core/timer.h"
#include "data/data_loader.h"
#include "data/tokenizer.h"
#include "models/causal_lm.h"
#include "models/registry.h"
#include "offload/host_budget.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "parallel/engine.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/pipeline_stages.h"
#include "parallel/zero_memory.h"
#include "runtime/metrics.h"
#include "runtime/op_profile.h"
#include "runtime/train_config.h"
#include "tensor/cuda.h"

namespace strata::runtime {

// Note [Training step]
// Step s (0-based) reads global samples [s*G, (s+1)*G) of the data order (Note [Data order]):
// rank r takes [s*G + r*M*A, ... + M*A) in A micro-batches of M. Each micro-batch's mean loss is
// scaled by 1/A before backward, so the flat gradient buffers hold the gradient of the mean loss
// over the global batch; then the global gradient norm is taken (and clipped), the LR for step s
// comes from the schedule, and the optimizer steps once. Dropout draws come from the training
// Generator (autograd/rng_context.h), whose two-integer state is checkpointed with the step and
// the data position, so a resumed run replays exactly what an uninterrupted one computes
// (docs/design.md decision 9). Nothing in a step depends on wall-clock time or thread timing.
//
// Note [Interrupts]
// SIGINT/SIGTERM only set a flag (request_stop). The loop finishes the step in progress, writes
// a checkpoint and returns Outcome::Interrupted; `train` then exits with status 130. A second
// Ctrl-C kills the process at once: checkpoints are written to a temporary name and renamed, so
// even that never leaves a half-written checkpoint behind. With several ranks the flag is agreed
// before each step (an allreduce of one integer), since ranks see a signal at different moments
// and must all stop before the same step.
//
// Note [Distributed training]
// The Trainer always runs through a parallel::Engine over the data-parallel group: a process
// started without a launcher is a world of one (the `self` communicator) and the engine is then
// a plain single-process step. Every rank builds the same model from the same seed, reads its
// own slice of each global batch (Note [Training step]), and takes part in every collective in
// the same order: evaluation and sampling run on every rank (ZeRO-3 gathers parameters for
// them), and checkpoints are collective (Note [Distributed checkpoints]). Rank 0 alone writes
// the console, metrics.jsonl and config.yaml. Logged losses are the mean over the ranks.
//
// Note [Training on the GPU]
// run.device: cuda makes the process's GPU cuda:<local rank mod visible devices> (init_cuda)
// and starts the world on it (nccl under a launcher, else self). nccl needs a GPU per rank of a
// node (init_world says so before NCCL would refuse); with backend mpi ranks may share one. The
// model zoo builds on the host; the flat units then move to the GPU (models::move_flat_units)
// before the Engine is made, so the optimizer's groups, masters and states are all on the GPU and
// AdamW takes its fused CUDA path (Note [Optimizer devices]). Each batch's ids and targets are
// copied to the GPU. A step waits for the device twice: once for all its micro-batches' losses,
// read together after the last backward, and once in Engine::step for the gradient norm (the
// embedding backward, the loss's mean and the checks of ids and targets stay on the device: Note
// [CUDA embedding backward], Note [Deferred device checks]). Evaluation and sampling run there too.
// Checkpoints are written from host copies (save_safetensors copies) and read back into the GPU
// buffers with copy_, in the same files and layout as a CPU run's, so a run can move between CPU
// and GPU. Small control tensors (the stop flag, the memory report, checkpoint agreement) travel on
// the run's device. The memory report reads Tier::Gpu. run.dtype auto is bf16 on the GPU (fp32
// masters and moments; docs/design.md decision 7) and fp32 on the CPU.
class Trainer {
 public:
  enum class Outcome { Finished, Interrupted };

  // Validates and builds everything (user errors name the config file or the data/checkpoint
  // file at fault) before touching the run directory; then creates it, writes config.yaml and
  // resumes per training.resume.
  explicit Trainer(TrainConfig config);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains up to training.steps, or until step `stop_at` when >= 0 (then it stops as if
  // interrupted: checkpoint written, Outcome::Interrupted), or until request_stop().
  Outcome run(int64_t stop_at = -1);

  // Mean loss over training.eval_batches validation batches (the same batches every time).
  float evaluate();
  // A sample of training.sample_tokens tokens from training.sample_prompt, decoded.
  std::string sample_text();
  // The console event for a sample at the current step: the sample, or, when the model's logits
  // cannot be drawn from (Note [Non-finite logits] in sampling/sampler.h), why it was skipped.
  std::string sample_event();

  int64_t step() const { return step_; }
  // Records of the steps run by this object (not those before a resume).
  const std::vector<StepRecord>& history() const { return history_; }
  const std::string& last_checkpoint() const { return last_checkpoint_; }
  models::CausalLM& model() { return *model_; }
  parallel::Engine& engine() { return *engine_; }
  int rank() const { return rank_; }
  int world_size() const { return world_; }
  const TrainConfig& config() const { return config_; }

  // Async-signal-safe: asks the running loop to stop after the current step (Note [Interrupts]).
  static void request_stop();
  static void clear_stop();
  static bool stop_requested();

 private:
  void train_step(StepRecord& record);
  void save(const char* why);
  void resume(const std::string& checkpoint_dir);
  void report_memory();
  // The tp = 1 model of this run's config (Note [Tensor-parallel checkpoints]).
  std::unique_ptr<models::CausalLM> make_whole_model() const;
  bool agree_to_stop(bool local);
  void report_profile(const std::vector<tensor::CudaOpTime>& ops, double seconds);
  std::vector<std::pair<std::string, int64_t>> peak_bytes() const;

  // Note [Host memory budget]: set for the Trainer's life, restored after everything is freed.
  std::unique_ptr<offload::HostBudgetScope> host_budget_;
  std::unique_ptr<autograd::CpuCheckpointingScope> cpu_checkpointing_;  // Note [CPU checkpointing]
  Stopwatch profile_watch_;  // training.profile_steps: the profiled window's wall time
  bool profiling_ = false;   // inside that window, having started it
  TrainConfig config_;
  std::string config_yaml_;
  std::unique_ptr<models::CausalLM> model_;
  std::shared_ptr<comm::Communicator> dp_;
  // Every rank: the stop decision and the run directory's barrier span tp x dp.
  std::shared_ptr<comm::Communicator> world_comm_;
  std::unique_ptr<parallel::Engine> engine_;
  std::unique_ptr<optim::LossScaler> scaler_;  // run.dtype fp16 only
  std::unique_ptr<optim::LrSchedule> schedule_;
  std::unique_ptr<data::DataLoader> train_data_;
  std::unique_ptr<data::DataLoader> val_data_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  std::unique_ptr<MetricsFile> metrics_;
  std::unique_ptr<ConsoleReporter> console_;
  Generator generator_;
  Device device_ = Device::cpu();  // Note [Training on the GPU]
  int rank_ = 0;                   // within dp: the data split, the engine's partitions
  int world_ = 1;                  // dp size
  int tp_rank_ = 0, tp_size_ = 1;
  // Pipeline parallelism (docs/pipeline.md): this rank's stage, the split, and the schedule the
  // engine owns (null at pp = 1).
  std::shared_ptr<comm::Communicator> pp_;
  int pp_rank_ = 0, pp_size_ = 1;
  parallel::StagePartition partition_;
  parallel::PipelineSchedule* pipeline_ = nullptr;
  // The rank that writes config, metrics and the console (global rank 0: dp, tp and pp rank 0).
  bool lead_ = true;
  models::ModelOptions whole_options_;  // the model options without the tp group and the stage
  int64_t step_ = 0;
  int64_t samples_consumed_ = 0;
  double param_wait_s_ = 0;  // offload_param: the tier's wait time at the last step's end
  double flops_per_token_ = 0.0;
  double peak_flops_ = 0.0;
  PeakRates peak_rates_;  // the GPU's, for the profile's roofline bound (Note [Roofline bound])
  std::vector<StepRecord> history_;
  std::vector<parallel::UnitSize> unit_sizes_;
  std::string last_checkpoint_;
  int64_t last_saved_step_ = -1;
};

// Note [MFU]: model flops per token of a training step (6 per matmul parameter, plus causal
// attention's 12*L*T*C counted in full, as PaLM's appendix and llm.c do), and the device's
// peak: on the CPU an estimate, threads x clock (from /proc/cpuinfo) x f32 flops per cycle of
// the widest FMA unit (32 with AVX2+FMA, 64 with AVX-512), for comparing runs on one machine, not
// a hardware counter; on a GPU the dense peak of the run's dtype (Note [GPU peaks] in
// device_peaks.h: the datasheet's where the name identifies the part), which the first log line
// names.
double training_flops_per_token(const models::ModelShape& shape, int64_t seq_len);
double estimated_peak_flops(const std::string& device);  // "cpu"; 0 for any other device

}  // namespace strata::runtime
