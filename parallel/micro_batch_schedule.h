#pragma once
// MicroBatchSchedule: the Engine part that runs one optimizer step's micro-batches — each one's
// forward and backward, in the schedule's order — for Engine::train_step (Note [Train step] in
// parallel/engine.h), and the inputs and outputs of that step.
//
// AccumulationSchedule is the schedule of a single-stage run: micro-batch m's forward then its
// backward, for m = 0 .. A-1, gradients accumulating in the flat buffers. Pipeline parallelism's
// GPipe, 1F1B and interleaved 1F1B (parallel/pipeline_schedule.h) are other schedules of this
// interface, sending activations and their gradients to the neighbouring stages between the
// calls; under PP the last stage alone computes losses.
#include <cstdint>
#include <functional>
#include <vector>

#include "models/causal_lm.h"
#include "parallel/optimizer_placement.h"

namespace strata::parallel {

class Engine;

struct MicroBatch {
  tensor::Tensor ids, targets;  // [M, T] token ids and next tokens, on the model's device
};

struct TrainStepInputs {
  int64_t micro_batches = 1;  // A, on this rank
  // Micro-batch m's ids and targets. Called once per micro-batch, in order, before its forward
  // (after begin_micro_batch under AccumulationSchedule; a pipeline schedule calls
  // begin_micro_batch before each backward instead: Note [Pipeline schedules]).
  std::function<MicroBatch(int64_t m)> batch;
  double lr = 0;
  double max_norm = 0;  // > 0: clip the global gradient norm to it
  // Each micro-batch's loss is scaled by weight = loss_factor / A before backward (A = 1 and
  // loss_factor = 1: not scaled), and its forward runs under LossGradientScope(
  // engine.loss_gradient(weight)) so the fused cross-entropy gradient is the one backward
  // brings (Note [Fused cross-entropy gradient] in autograd/functions_nn.cpp). Tests force an
  // overflow with an infinite factor.
  float loss_factor = 1.f;
};

struct TrainStepOutput {
  std::vector<float> losses;  // each micro-batch's mean loss on this rank, in micro-batch order
  double mean_loss = 0;       // their mean: a double sum in order, over A (this rank's)
  StepResult result;
};

class MicroBatchSchedule {
 public:
  virtual ~MicroBatchSchedule() = default;
  // Runs every micro-batch's forward and backward through engine.begin_micro_batch and
  // engine.backward. Returns each micro-batch's loss ([1], where it was computed, not read back),
  // in micro-batch order.
  virtual std::vector<tensor::Tensor> run(Engine& engine, models::CausalLM& model,
                                          const TrainStepInputs& in) = 0;
};

class AccumulationSchedule final : public MicroBatchSchedule {
 public:
  std::vector<tensor::Tensor> run(Engine& engine, models::CausalLM& model,
                                  const TrainStepInputs& in) override;
};

}  // namespace strata::parallel
