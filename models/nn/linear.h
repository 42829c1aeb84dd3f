#pragma once
// Linear: y = x @ weight^T + bias.
//
// Note [Linear layout]
// weight is [out_features, in_features], as torch.nn.Linear stores it, so y = x W^T reads the
// weight row-major along the reduction dimension. HF's GPT-2 uses Conv1D, whose weight is
// [in, out]: checkpoint interop transposes c_attn, c_proj and c_fc weights on load and save;
// nothing else in Strata sees the HF layout.
#include "models/nn/module.h"

namespace strata::models::nn {

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);

  const Variable& weight() const { return weight_; }
  const Variable& bias() const { return bias_; }  // undefined without bias
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }

  // Standard deviation of the normal init of the weight (GPT-2: 0.02, scaled down for
  // residual projections). The bias starts at zero.
  void set_init_std(float stddev) { init_std_ = stddev; }
  float init_std() const { return init_std_; }
  void reset_parameters(uint64_t seed) override;

 protected:
  Variable forward(const Variable& x) override;

 private:
  int64_t in_features_, out_features_;
  float init_std_ = 0.02f;
  Variable weight_, bias_;
};

}  // namespace strata::models::nn
