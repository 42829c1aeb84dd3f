#include "optim/adamw.h"

#include <cmath>

#include "core/error.h"

namespace strata::optim {

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWConfig& config)
    : Optimizer(std::move(groups), {"exp_avg", "exp_avg_sq"}),
      config_(config),
      isa_(default_adamw_isa()) {
  const AdamWConfig& c = config_;
  if (!(c.lr >= 0)) user_error("AdamW: lr must be >= 0, got {}", c.lr);
  if (!(c.beta1 >= 0 && c.beta1 < 1)) user_error("AdamW: beta1 must be in [0, 1), got {}", c.beta1);
  if (!(c.beta2 >= 0 && c.beta2 < 1)) user_error("AdamW: beta2 must be in [0, 1), got {}", c.beta2);
  if (!(c.eps >= 0)) user_error("AdamW: eps must be >= 0, got {}", c.eps);
  if (!(c.weight_decay >= 0))
    user_error("AdamW: weight_decay must be >= 0, got {}", c.weight_decay);
}

void AdamW::set_isa(Isa isa) {
  if (!adamw_isa_available(isa))
    user_error("AdamW kernel {} is not available on this CPU or build", isa_name(isa));
  isa_ = isa;
}

void AdamW::step(double lr) {
  if (!(lr >= 0) || !std::isfinite(lr)) user_error("AdamW: learning rate must be >= 0, got {}", lr);
  ++step_;
  const AdamWConfig& c = config_;
  const AdamWScalars decay = adamw_scalars(lr, c.beta1, c.beta2, c.eps, c.weight_decay, step_);
  const AdamWScalars no_decay = adamw_scalars(lr, c.beta1, c.beta2, c.eps, 0.0, step_);
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const ParamGroup& g = groups_[gi];
    float* param = g.param.data<float>();
    const float* grad = g.grad.data<float>();
    float* m = exp_avg(gi).data<float>();
    float* v = exp_avg_sq(gi).data<float>();
    auto* lp = g.low_precision_copy.defined()
                   ? static_cast<uint16_t*>(g.low_precision_copy.data_ptr())
                   : nullptr;
    for (const Run& r : runs(gi)) {
      AdamWBuffers b;
      b.param = param + r.offset;
      b.grad = grad + r.offset;
      b.exp_avg = m + r.offset;
      b.exp_avg_sq = v + r.offset;
      b.low_precision = lp == nullptr ? nullptr : lp + r.offset;
      if (lp != nullptr) b.low_precision_dtype = g.low_precision_copy.dtype();
      b.numel = r.numel;
      adamw_update(b, r.decay ? decay : no_decay, isa_);
    }
  }
}

}  // namespace strata::optim
