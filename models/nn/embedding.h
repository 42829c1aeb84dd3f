#pragma once
// Embedding: a lookup table [num_embeddings, dim]; forward maps integer ids [...] to [..., dim].
#include "models/nn/module.h"
#include "models/nn/tensor_parallel.h"

namespace strata::models::nn {

class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim);

  const Variable& weight() const { return weight_; }
  int64_t num_embeddings() const { return num_embeddings_; }
  int64_t dim() const { return dim_; }

  void set_init_std(float stddev) { init_std_ = stddev; }
  void reset_parameters(uint64_t seed) override;
  // Note [Replicated parameters under sequence parallelism]: under sequence parallelism this
  // layer sees 1/tp of the tokens, and its parameters' gradients are summed over the group.
  void set_tensor_parallel(const TensorParallel& tp) { tp_ = tp; }

 protected:
  // `ids` wraps an I32/I64 tensor (no gradient); the call wrapper sees it as an input that does
  // not require grad, so post-backward hooks fire when the weight's gradient is final.
  Variable forward(const Variable& ids) override;

 private:
  int64_t num_embeddings_, dim_;
  float init_std_ = 0.02f;
  TensorParallel tp_;
  Variable weight_;
};

}  // namespace strata::models::nn
