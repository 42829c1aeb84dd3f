#include "parallel/micro_batch_schedule.h"

#include "autograd/functions.h"
#include "parallel/engine.h"

namespace strata::parallel {

std::vector<tensor::Tensor> AccumulationSchedule::run(Engine& engine, models::CausalLM& model,
                                                      const TrainStepInputs& in) {
  const int64_t A = in.micro_batches;
  const float weight = in.loss_factor / static_cast<float>(A);
  std::vector<tensor::Tensor> losses;
  for (int64_t m = 0; m < A; ++m) {
    engine.begin_micro_batch(m == A - 1);
    const MicroBatch b = in.batch(m);
    autograd::Variable loss;
    {
      // Note [Fused cross-entropy gradient]: the gradient this loss will receive.
      const autograd::LossGradientScope grad(engine.loss_gradient(weight));
      loss = model.loss(b.ids, b.targets);
    }
    losses.push_back(loss.data().reshape({1}));
    engine.backward(weight == 1.f ? loss : autograd::scale(loss, weight));
  }
  return losses;
}

}  // namespace strata::parallel
