#pragma once
// SGD with momentum, torch.optim.SGD semantics, over parameter groups of flat buffers:
//   d = g + weight_decay * p          (weight_decay only on decay segments)
//   buf = d                           on the first step
//   buf = momentum * buf + (1 - dampening) * d   afterwards
//   d = nesterov ? d + momentum * buf : buf
//   p = p - lr * d
// Without momentum there is no state; with it, "momentum_buffer" per group (Note [Optimizer
// state]). Groups on a GPU take the multi-tensor kernel of Note [CUDA SGD]
// (optim/cuda/sgd_cuda.h), which gives these bits.
#include "optim/optimizer.h"

namespace strata::optim {

struct SgdConfig {
  double lr = 1e-2;  // used by step() without an argument
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

class Sgd final : public Optimizer {
 public:
  // strata::user_error for malformed groups or invalid hyper-parameters (nesterov needs
  // momentum > 0 and dampening 0, as in PyTorch).
  Sgd(std::vector<ParamGroup> groups, const SgdConfig& config = {});

  void step(double lr) override;
  void step() { step(config_.lr); }
  std::string_view name() const override { return "SGD"; }

  const SgdConfig& config() const { return config_; }
  // Undefined tensor when momentum is 0.
  tensor::Tensor momentum_buffer(size_t group) const;

 private:
  // The step on GPU groups [g0, g1) (Note [CUDA SGD]); the scalars as the CPU loop rounds them.
  void step_cuda(float weight_decay, float momentum, float one_minus_dampening, float lr,
                 bool first, float scale, size_t g0, size_t g1);

  SgdConfig config_;
};

}  // namespace strata::optim
