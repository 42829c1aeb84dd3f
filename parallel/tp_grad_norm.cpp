#include "parallel/tp_grad_norm.h"

#include <cmath>
#include <vector>

#include "optim/grad_clip.h"
#include "parallel/rank_sum.h"
#include "tensor/ops.h"

namespace strata::parallel {

SplitSumOfSquares split_sum_of_squares(const models::CausalLM& model,
                                       const std::vector<optim::ParamGroup>& groups) {
  std::vector<tensor::Tensor> sharded, replicated;
  for (const optim::ParamGroup& g : groups)
    for (const optim::Segment& s : g.segments)
      (model.shard_specs().contains(s.name) ? sharded : replicated)
          .push_back(g.grad.narrow(0, s.offset, s.numel));
  return {optim::grad_sum_of_squares(sharded), optim::grad_sum_of_squares(replicated)};
}

std::vector<bool> sharded_segments(const models::CausalLM& model,
                                   const std::vector<optim::Segment>& segments) {
  std::vector<bool> out;
  out.reserve(segments.size());
  for (const optim::Segment& s : segments) out.push_back(model.shard_specs().contains(s.name));
  return out;
}

void add_segment_sums(SplitSumOfSquares& s, const std::vector<double>& segment_sums,
                      const std::vector<bool>& sharded) {
  STRATA_CHECK(segment_sums.size() == sharded.size(), "{} segment sums for {} segments",
               segment_sums.size(), sharded.size());
  for (size_t i = 0; i < sharded.size(); ++i)
    (sharded[i] ? s.sharded : s.replicated) += segment_sums[i];
}

double tp_sum_of_squares(const models::CausalLM& model, const SplitSumOfSquares& s,
                         const std::function<double(double)>& global) {
  const double sharded = sum_over_tp(model, global(s.sharded));
  return sharded + global(s.replicated);
}

double sum_over_tp(const models::CausalLM& model, double x) {
  const models::nn::TensorParallel& tp = model.tensor_parallel();
  if (!tp.enabled()) return x;
  // The tensors travel where the gradients are (what an nccl group serves).
  return sum_over_ranks(*tp.group, x, model.flat_units().front().grads.device());
}

double tp_global_grad_norm(const models::CausalLM& model) {
  std::vector<tensor::Tensor> sharded, replicated;
  for (auto& [name, p] : model.named_parameters()) {
    if (!p.grad().defined()) continue;
    (model.shard_specs().contains(name) ? sharded : replicated).push_back(p.grad());
  }
  return std::sqrt(sum_over_tp(model, optim::grad_sum_of_squares(sharded)) +
                   optim::grad_sum_of_squares(replicated));
}

double tp_clip_grad_norm(models::CausalLM& model, double max_norm) {
  const double norm = tp_global_grad_norm(model);
  if (!std::isfinite(norm)) return norm;
  const float coef = optim::clip_coefficient(norm, max_norm);
  if (coef < 1.f) {
    std::vector<tensor::Tensor> grads;
    for (auto& [name, p] : model.named_parameters())
      if (p.grad().defined()) grads.push_back(p.grad());
    optim::scale_grads(grads, coef);
  }
  return norm;
}

}  // namespace strata::parallel
