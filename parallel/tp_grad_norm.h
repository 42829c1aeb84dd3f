#pragma once
// The gradient norm of a tensor-parallel model (Note [Tensor-parallel gradient norm]).
//
// Note [Tensor-parallel gradient norm]
// Under tensor parallelism a sharded parameter's gradient is split over the tp group and a
// replicated one (norms, row-parallel biases, wpe) is whole and identical on every rank of it
// (Note [Replicated parameters under sequence parallelism] in models/nn/tensor_parallel.h). The
// model's norm counts every element once: the sharded gradients' sum of squares is all-reduced
// over the group, the replicated ones' is added on each rank as it is, not tp times. Every rank of
// the group gets the same norm, so every rank clips by the same coefficient. At tp = 1 it is
// optim::global_grad_norm of the parameters' gradients.
#include <functional>
#include <vector>

#include "models/causal_lm.h"
#include "optim/optimizer.h"

namespace strata::parallel {

// The sums of squares of the optimizer groups' gradients (their segments name the parameters:
// ZeRO partitions, Note [ZeRO partitions]), split into sharded and replicated parameters. Local.
struct SplitSumOfSquares {
  double sharded = 0, replicated = 0;
};
SplitSumOfSquares split_sum_of_squares(const models::CausalLM& model,
                                       const std::vector<optim::ParamGroup>& groups);
// Which of `segments` name sharded parameters, in order.
std::vector<bool> sharded_segments(const models::CausalLM& model,
                                   const std::vector<optim::Segment>& segments);
// Adds the sums of squares of one unit's segments, each taken alone (one gradient tensor's, as
// grad_sum_of_squares gives it), to the sharded or replicated term in order: over the units in
// order, what split_sum_of_squares gives over the same gradients (the placements whose gradient
// reduction takes the sums: Note [Gradients streamed to the host] in parallel/grad_buckets.h).
void add_segment_sums(SplitSumOfSquares& s, const std::vector<double>& segment_sums,
                      const std::vector<bool>& sharded);
// The whole model's sum of squares from this rank's split: `global` sums a term over the ranks
// that hold other parts of the same parameters (dp partitions, pipeline stages), then the sharded
// term is summed over the tp group and the replicated one is not. Collective (in that order).
double tp_sum_of_squares(const models::CausalLM& model, const SplitSumOfSquares& s,
                         const std::function<double(double)>& global);
// The sum over the model's tp group of each rank's `x`, added in rank order (the same bits on
// every rank). Collective over the tp group; `x` itself at tp = 1.
double sum_over_tp(const models::CausalLM& model, double x);

// sqrt of the sum of squares of the whole model's gradient, each element once. Collective over
// the model's tp group.
double tp_global_grad_norm(const models::CausalLM& model);
// Scales every parameter's gradient by optim::clip_coefficient(norm, max_norm) when it clips;
// returns the norm before clipping (a non-finite norm scales nothing, as in clip_grad_norm).
double tp_clip_grad_norm(models::CausalLM& model, double max_norm);

}  // namespace strata::parallel
