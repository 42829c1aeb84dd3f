#include "models/causal_lm.h"

#include "autograd/functions.h"

namespace strata::models {

Variable CausalLM::forward(const Tensor& ids) {
  STRATA_USER_CHECK(ids.ndim() == 2, "token ids must be [batch, seq], got {}", ids.str());
  STRATA_USER_CHECK(ids.dtype() == DType::I32 || ids.dtype() == DType::I64,
                    "token ids must be i32 or i64, got {}", ids.str());
  STRATA_USER_CHECK(ids.size(1) <= max_seq_len(),
                    "sequence length {} exceeds the model's context of {} positions", ids.size(1),
                    max_seq_len());
  return (*this)(Variable(ids));
}

Variable CausalLM::loss(const Tensor& ids, const Tensor& targets, int64_t ignore_index) {
  STRATA_USER_CHECK(targets.shape() == ids.shape(), "targets {} must have the shape of ids {}",
                    targets.str(), ids.str());
  Variable logits = forward(ids);
  // Note [Padded vocabulary]: the loss reads the first vocab_size columns in place. The logits
  // are handed over: under a LossGradientScope their gradient comes with the forward (Note
  // [Fused cross-entropy gradient] in autograd/functions_nn.cpp).
  return autograd::cross_entropy_consuming(std::move(logits), targets, ignore_index, vocab_size());
}

void CausalLM::zero_grad() {
  if (flat_units_.empty()) {
    nn::Module::zero_grad();
    return;
  }
  zero_flat_grads(flat_units_);
}

void CausalLM::flatten(const std::vector<UnitSpec>& units, int64_t align) {
  STRATA_CHECK(flat_units_.empty(), "flatten called twice");
  flat_units_ = flatten_parameters(*this, units, align);
}

}  // namespace strata::models
