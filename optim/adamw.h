#pragma once
// AdamW (decoupled weight decay, Loshchilov & Hutter) over parameter groups of flat buffers,
// with torch.optim.AdamW's arithmetic (Note [AdamW arithmetic]). Decay-free segments and
// padding get weight_decay = 0 (Note [Segments and weight decay]). A group's optional bf16/f16
// model copy is rewritten from the updated fp32 weights in the same pass. Groups on a GPU
// (Note [Optimizer devices]) step through the fused multi-tensor kernel (Note [CUDA AdamW]),
// which gives the CPU scalar kernel's bits for the same inputs.
#include "optim/adamw_kernel.h"
#include "optim/optimizer.h"

namespace strata::optim {

struct AdamWConfig {
  double lr = 1e-3;  // used by step() without an argument
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

class AdamW final : public Optimizer {
 public:
  // State "exp_avg" and "exp_avg_sq" per group (Note [Optimizer state]). Throws
  // strata::user_error for malformed groups or hyper-parameters out of range.
  AdamW(std::vector<ParamGroup> groups, const AdamWConfig& config = {});

  void step(double lr) override;
  void step() { step(config_.lr); }
  std::string_view name() const override { return "AdamW"; }

  const AdamWConfig& config() const { return config_; }
  // The kernel used, default_adamw_isa() unless set (tests and benchmarks compare them).
  Isa isa() const { return isa_; }
  void set_isa(Isa isa);

  const tensor::Tensor& exp_avg(size_t group) const { return state(group, 0); }
  const tensor::Tensor& exp_avg_sq(size_t group) const { return state(group, 1); }

 private:
  // Groups [g0, g1) in one launch, each gradient times `scale`.
  void step_cuda(const AdamWScalars& s, float scale, size_t g0, size_t g1);

  AdamWConfig config_;
  Isa isa_;
};

}  // namespace strata::optim
