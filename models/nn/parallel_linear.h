#pragma once
// Megatron's tensor-parallel linears (Shoeybi et al. 2019). At tp = 1 each is nn::Linear: the same
// parameter names, shapes, initial values and forward bits.
//
// ColumnParallelLinear splits the output features: rank r holds rows of the [out, in] weight
// (and of the bias), and maps the whole input to its slice of the output. Its input must already
// be in the tensor-parallel region (TensorParallel::enter, done once by the caller for every
// column-parallel layer reading the same input: LLaMA's q/k/v, gate/up). With `blocks` > 1 the
// output is that many sub-matrices stacked (GPT-2's fused qkv) and rank r holds its slice of each
// (Note [Tensor-parallel shards]), so its output is [q_r, k_r, v_r].
//
// RowParallelLinear splits the input features: rank r holds columns of the weight, maps its slice
// of the input to a partial sum of the whole output, and reduces it (TensorParallel::exit: an
// all-reduce, or a reduce-scatter to this rank's tokens under sequence parallelism). The bias is
// replicated and added once, after the reduction.
#include "models/nn/module.h"
#include "models/nn/tensor_parallel.h"

namespace strata::models::nn {

class ColumnParallelLinear : public Module, public ShardedModule {
 public:
  ColumnParallelLinear(int64_t in_features, int64_t out_features, bool bias,
                       const TensorParallel& tp, int64_t blocks = 1, bool gather_output = false);

  const Variable& weight() const { return weight_; }  // [out / tp, in]
  const Variable& bias() const { return bias_; }      // [out / tp], undefined without bias
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }  // the whole layer's
  int64_t local_out_features() const { return out_features_ / tp_.size(); }
  const TensorParallel& tp() const { return tp_; }

  void set_init_std(float stddev) { init_std_ = stddev; }
  float init_std() const { return init_std_; }
  // Note [Tiled linear] in autograd/functions.h: forward and backward in `tiles` tiles (this
  // rank's shard is what is tiled); 1 (the default) is the plain linear. Same bits.
  void set_tiles(int64_t tiles) { tiles_ = tiles; }
  int64_t tiles() const { return tiles_; }
  void reset_parameters(uint64_t seed) override;
  // Zeroes the weight rows of whole-layer outputs >= `row` (padded vocabulary rows); blocks == 1.
  void zero_rows_from(int64_t row);

  std::vector<std::pair<std::string, ShardSpec>> shard_specs() const override;

 protected:
  // x [..., in] in the tensor-parallel region -> [..., out / tp] (or [..., out] with
  // gather_output).
  Variable forward(const Variable& x) override;

 private:
  int64_t in_features_, out_features_, blocks_;
  bool gather_output_;
  TensorParallel tp_;
  float init_std_ = 0.02f;
  int64_t tiles_ = 1;
  Variable weight_, bias_;
};

class RowParallelLinear : public Module, public ShardedModule {
 public:
  RowParallelLinear(int64_t in_features, int64_t out_features, bool bias, const TensorParallel& tp);

  const Variable& weight() const { return weight_; }  // [out, in / tp]
  const Variable& bias() const { return bias_; }      // [out], replicated
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  const TensorParallel& tp() const { return tp_; }

  void set_init_std(float stddev) { init_std_ = stddev; }
  float init_std() const { return init_std_; }
  void set_tiles(int64_t tiles) { tiles_ = tiles; }  // as ColumnParallelLinear's
  int64_t tiles() const { return tiles_; }
  void reset_parameters(uint64_t seed) override;

  // The tail of forward for a caller that computed x W^T itself (a fused MLP node): reduces the
  // partial sums and adds the bias. At tp = 1 the caller should have added the bias inside its
  // own op; this then returns `partial` as it is.
  Variable reduce_output(const Variable& partial) const;

  std::vector<std::pair<std::string, ShardSpec>> shard_specs() const override;

 protected:
  // x [..., in / tp] (this rank's slice) -> [..., out] (or this rank's tokens of it).
  Variable forward(const Variable& x) override;

 private:
  int64_t in_features_, out_features_;
  TensorParallel tp_;
  float init_std_ = 0.02f;
  int64_t tiles_ = 1;
  Variable weight_, bias_;
};

}  // namespace strata::models::nn
