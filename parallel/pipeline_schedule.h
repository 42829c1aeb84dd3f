#pragma once
// PipelineSchedule: the MicroBatchSchedule of a pipeline-parallel stage (Note [Engine parts]):
// GPipe, 1F1B or interleaved 1F1B over the step's micro-batches, activations and their gradients
// moving between stages through PipelineLinks.
//
// Note [Pipeline schedules]
// The step's A micro-batches (batch.grad_accum_steps) flow through the p stages. Stage s runs
//   gpipe  F0 .. F(A-1), then B0 .. B(A-1): every micro-batch's activations are held at once;
//   1f1b   w = min(p - s - 1, A) warm-up forwards, then pairs F(w + i), B(i) while forwards
//          remain, then the cool-down backwards: at most min(p - s, A) micro-batches' activations
//          are held, so the activation peak is bounded by the stage count, not by A.
// Backwards run in micro-batch order on every stage, so Engine::begin_micro_batch(last) is called
// right before each backward (last: micro-batch A - 1), which is when the DP reduction of a
// step's last micro-batch must start; forwards need no engine call (ZeRO-3, the one part that
// acts in forward, is refused: Note [Pipeline in the engine] in parallel/engine.h).
// The last stage computes the losses: micro-batch m's loss scaled by loss_factor / A, as plain
// gradient accumulation (AccumulationSchedule), under the fused cross-entropy's gradient scope;
// its backward brings that weight to the earlier stages through the received gradients. Its
// losses are broadcast over the pp group after the last backward, so every stage returns the
// same losses and logs the same step loss. The bubble is the time a stage waits in receives
// over the step's time; with equal stages and free communication it is (p - 1) / (A + p - 1)
// for both schedules.
//
// Note [Interleaved schedule]
// Megatron-LM's interleaved 1F1B (Narayanan et al. 2021, sec. 2.2;
// forward_backward_pipelining_with_interleaving): each rank holds v chunks (Note [Virtual
// pipeline stages] in models/causal_lm.h), so a micro-batch passes p x v virtual stages, chunk c
// of rank r being virtual stage c p + r; chunk c of the last rank feeds chunk c + 1 of the first
// over the wrap-around link (Note [Pipeline channels]). A must be a multiple of p. Rank r runs
// A v virtual micro-batches: virtual index k is micro-batch (k / (p v)) p + k % p on chunk
// (k % (p v)) / p for forwards, on chunk v - 1 - (k % (p v)) / p for backwards (groups of p
// micro-batches go through one chunk, then the next). Warm-up: w = min((p - r - 1) 2 + (v - 1) p,
// A v) forwards (all A v when A == p), then pairs F(w + i), B(i), then the remaining backwards,
// so at most w + 1 chunk activations are held. Each chunk's backwards still come in
// micro-batch order, and on every link the sender's sends and the receiver's receives come in
// the same order (both walk the virtual indices), so the channels' argument holds. Each
// backward goes through one chunk's units (CausalLM::unit_chunk), and the engine is told so
// (Engine::begin_micro_batch(last, units); Note [Partial passes] in parallel/grad_buckets.h):
// a chunk's backward of micro-batch A - 1 is its last, so at ZeRO 0 and 1 it launches the dp
// reduction of that chunk's units while the later backwards of the other chunks run (Megatron's
// no_sync per chunk), and at ZeRO 2 each pass reduce-scatters its own chunk's units only. The
// idle share of an equal-stage step with free communication is (p - 1) / (v A + p - 1): the
// bubble shrinks by v.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "parallel/micro_batch_schedule.h"
#include "parallel/pipeline_links.h"

namespace strata::parallel {

enum class PipelineScheduleKind { GPipe, OneFOneB, Interleaved };

// "gpipe", "1f1b" or "interleaved"; strata::user_error naming parallelism.pipeline_schedule
// otherwise.
PipelineScheduleKind parse_pipeline_schedule(const std::string& name);
const char* pipeline_schedule_name(PipelineScheduleKind kind);

// The bubble of p equal stages, m micro-batches and v chunks per stage (v = 1 unless
// interleaved): (p - 1) / (v m + p - 1).
double pipeline_bubble_formula(int stages, int64_t micro_batches, int virtual_stages = 1);

// One compute step of a stage's schedule: micro-batch `micro_batch`'s forward or backward
// through the stage's chunk `chunk` (0 unless interleaved).
struct PipelineOp {
  bool forward = true;
  int64_t micro_batch = 0;
  int chunk = 0;
  bool operator==(const PipelineOp&) const = default;
};

// The forwards stage `stage` runs before its first backward (Note [Pipeline schedules], Note
// [Interleaved schedule]).
int64_t pipeline_warmup(PipelineScheduleKind kind, int stages, int virtual_stages,
                        int64_t micro_batches, int stage);
// Stage `stage`'s order of forwards and backwards in one step. virtual_stages must be 1 unless
// interleaved; interleaved needs micro_batches to be a multiple of stages (strata::user_error
// naming batch.grad_accum_steps otherwise).
std::vector<PipelineOp> pipeline_order(PipelineScheduleKind kind, int stages, int virtual_stages,
                                       int64_t micro_batches, int stage);

class PipelineSchedule final : public MicroBatchSchedule {
 public:
  // Collective over `pp` (makes the links). `pp`'s rank is this rank's stage; virtual_stages:
  // the chunks per stage of the interleaved schedule (1 otherwise).
  PipelineSchedule(PipelineScheduleKind kind, std::shared_ptr<comm::Communicator> pp,
                   int virtual_stages = 1);

  std::vector<tensor::Tensor> run(Engine& engine, models::CausalLM& model,
                                  const TrainStepInputs& in) override;

  // Evaluation (no gradients): the batch's forward through the stages, one after another, and
  // the last stage's mean loss ([1]) broadcast to every stage. Collective over the pp group.
  tensor::Tensor forward_loss(models::CausalLM& model, const tensor::Tensor& ids,
                              const tensor::Tensor& targets);
  // Sampling's step forward through the stages (Note [Sampling over ranks] in
  // sampling/sampler.h; no gradients): ids [rows, T] on every stage; each of this rank's chunks
  // runs in turn, with `cache` (forward_stage_cached, last position only) or without it (null),
  // the hidden states [rows, T, C] going on over the links as in forward_loss; the last stage
  // takes each row's last-position logits, gathered over its tp group, and broadcasts them to
  // every stage: [rows, padded_vocab] in f32 on the model's device. Sequence parallelism is
  // paused (Note [Decoding without sequence parallelism]). Collective over the pp group (and
  // the tp group).
  tensor::Tensor forward_last_logits(models::CausalLM& model, const tensor::Tensor& ids,
                                     models::KvCache* cache);

  PipelineScheduleKind kind() const { return kind_; }
  int virtual_stages() const { return virtual_; }
  const PipelineLinks& links() const { return links_; }

  // The last run() on this stage.
  struct StepStats {
    double seconds = 0;       // the schedule's wall time
    double idle_seconds = 0;  // waiting in receives
    int max_in_flight = 0;    // (micro-batch, chunk) activations held at once
    double bubble() const { return seconds > 0 ? idle_seconds / seconds : 0; }
  };
  const StepStats& last_step() const { return stats_; }

 private:
  // Evaluation: chunk `chunk`'s input hidden states [rows, seq, C] from the previous chunk's rank
  // (waited for); undefined for the model's first chunk, which starts from the ids.
  autograd::Variable receive_hidden(const models::CausalLM& model, int chunk, int64_t rows,
                                    int64_t seq);

  PipelineScheduleKind kind_;
  std::shared_ptr<comm::Communicator> pp_;
  int virtual_ = 1;
  PipelineLinks links_;
  StepStats stats_;
};

// Makes this stage's schedule and hands it to `engine` with what the step adds across stages
// (Note [Pipeline in the engine]): the norm over `pp`, and when the model ties its embeddings
// and there are several stages, the group of the first and last stage that sums the
// "embeddings" unit's gradients. The interleaved schedule runs the model's chunks
// (CausalLM::num_chunks(), which must be > 1 for it and 1 for the others). Collective over `pp`.
// Returns the schedule, owned by the engine.
PipelineSchedule& install_pipeline(Engine& engine, models::CausalLM& model,
                                   std::shared_ptr<comm::Communicator> pp,
                                   PipelineScheduleKind kind);

}  // namespace strata::parallel
