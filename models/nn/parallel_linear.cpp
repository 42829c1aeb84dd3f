#include "models/nn/parallel_linear.h"

#include <algorithm>

#include "autograd/functions.h"
#include "models/nn/init.h"

namespace strata::models::nn {

ColumnParallelLinear::ColumnParallelLinear(int64_t in_features, int64_t out_features, bool bias,
                                           const TensorParallel& tp, int64_t blocks,
                                           bool gather_output)
    : in_features_(in_features),
      out_features_(out_features),
      blocks_(blocks),
      gather_output_(gather_output),
      tp_(tp) {
  STRATA_USER_CHECK(out_features % (blocks * tp.size()) == 0,
                    "a column-parallel linear of {} outputs ({} blocks) does not split over "
                    "tensor_parallel_size {}",
                    out_features, blocks, tp.size());
  weight_ = register_parameter("weight", Shape{out_features / tp.size(), in_features});
  if (bias) bias_ = register_parameter("bias", Shape{out_features / tp.size()});
}

void ColumnParallelLinear::reset_parameters(uint64_t seed) {
  normal_shard_(weight_, seed, 0.f, init_std_, Shape{out_features_, in_features_}, {0, blocks_},
                tp_.rank(), tp_.size());
  if (bias_.defined()) init::fill_(bias_, 0.f);
}

void ColumnParallelLinear::zero_rows_from(int64_t row) {
  STRATA_CHECK(blocks_ == 1, "zero_rows_from on a {}-block layer", blocks_);
  const int64_t local = local_out_features(), start = tp_.rank() * local;
  const int64_t first = std::clamp<int64_t>(row - start, 0, local);
  if (first == local) return;
  Tensor w = weight_.data().narrow(0, first, local - first);
  w.zero_();
  if (bias_.defined()) {
    Tensor b = bias_.data().narrow(0, first, local - first);
    b.zero_();
  }
}

std::vector<std::pair<std::string, ShardSpec>> ColumnParallelLinear::shard_specs() const {
  std::vector<std::pair<std::string, ShardSpec>> out{{"weight", {0, blocks_}}};
  if (bias_.defined()) out.push_back({"bias", {0, blocks_}});
  return out;
}

Variable ColumnParallelLinear::forward(const Variable& x) {
  Variable y = autograd::tiled_linear(x, weight_, bias_, tiles_);  // 1 tile: autograd::linear
  return gather_output_ && blocks_ == 1 ? autograd::gather_from_tp_region(y, tp_.group) : y;
}

RowParallelLinear::RowParallelLinear(int64_t in_features, int64_t out_features, bool bias,
                                     const TensorParallel& tp)
    : in_features_(in_features), out_features_(out_features), tp_(tp) {
  STRATA_USER_CHECK(
      in_features % tp.size() == 0,
      "a row-parallel linear of {} inputs does not split over tensor_parallel_size {}", in_features,
      tp.size());
  weight_ = register_parameter("weight", Shape{out_features, in_features / tp.size()});
  if (bias) bias_ = register_parameter("bias", Shape{out_features});
}

void RowParallelLinear::reset_parameters(uint64_t seed) {
  normal_shard_(weight_, seed, 0.f, init_std_, Shape{out_features_, in_features_}, {1, 1},
                tp_.rank(), tp_.size());
  if (bias_.defined()) init::fill_(bias_, 0.f);
}

std::vector<std::pair<std::string, ShardSpec>> RowParallelLinear::shard_specs() const {
  return {{"weight", {1, 1}}};
}

Variable RowParallelLinear::reduce_output(const Variable& partial) const {
  if (!tp_.enabled()) return partial;
  Variable y = tp_.exit(partial);
  return bias_.defined() ? autograd::bias_add(y, tp_.replicated(bias_)) : y;
}

Variable RowParallelLinear::forward(const Variable& x) {
  // nn::Linear's bits; 1 tile is autograd::linear (Note [Tiled linear]).
  if (!tp_.enabled()) return autograd::tiled_linear(x, weight_, bias_, tiles_);
  return reduce_output(autograd::tiled_linear(x, weight_, Variable(), tiles_));
}

}  // namespace strata::models::nn
