#pragma once
// PipelineSchedule: the MicroBatchSchedule of a pipeline-parallel stage (Note [Engine parts]):
// GPipe or 1F1B over the step's micro-batches, activations and their gradients moving between
// stages through PipelineLinks.
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
#include <cstdint>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "parallel/micro_batch_schedule.h"
#include "parallel/pipeline_links.h"

namespace strata::parallel {

enum class PipelineScheduleKind { GPipe, OneFOneB };

// "gpipe" or "1f1b"; strata::user_error naming parallelism.pipeline_schedule otherwise.
PipelineScheduleKind parse_pipeline_schedule(const std::string& name);
const char* pipeline_schedule_name(PipelineScheduleKind kind);

// The bubble of p equal stages and m micro-batches: (p - 1) / (m + p - 1).
double pipeline_bubble_formula(int stages, int64_t micro_batches);

class PipelineSchedule final : public MicroBatchSchedule {
 public:
  // Collective over `pp` (makes the links). `pp`'s rank is this rank's stage.
  PipelineSchedule(PipelineScheduleKind kind, std::shared_ptr<comm::Communicator> pp);

  std::vector<tensor::Tensor> run(Engine& engine, models::CausalLM& model,
                                  const TrainStepInputs& in) override;

  // Evaluation (no gradients): the batch's forward through the stages, one after another, and
  // the last stage's mean loss ([1]) broadcast to every stage. Collective over the pp group.
  tensor::Tensor forward_loss(models::CausalLM& model, const tensor::Tensor& ids,
                              const tensor::Tensor& targets);

  PipelineScheduleKind kind() const { return kind_; }
  const PipelineLinks& links() const { return links_; }

  // The last run() on this stage.
  struct StepStats {
    double seconds = 0;       // the schedule's wall time
    double idle_seconds = 0;  // waiting in receives
    int max_in_flight = 0;    // micro-batches whose activations were held at once
    double bubble() const { return seconds > 0 ? idle_seconds / seconds : 0; }
  };
  const StepStats& last_step() const { return stats_; }

 private:
  PipelineScheduleKind kind_;
  std::shared_ptr<comm::Communicator> pp_;
  PipelineLinks links_;
  StepStats stats_;
};

// Makes this stage's schedule and hands it to `engine` with what the step adds across stages
// (Note [Pipeline in the engine]): the norm over `pp`, and when the model ties its embeddings
// and there are several stages, the group of the first and last stage that sums the
// "embeddings" unit's gradients. Collective over `pp`. Returns the schedule, owned by the engine.
PipelineSchedule& install_pipeline(Engine& engine, models::CausalLM& model,
                                   std::shared_ptr<comm::Communicator> pp,
                                   PipelineScheduleKind kind);

}  // namespace strata::parallel
