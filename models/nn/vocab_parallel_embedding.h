#pragma once
// VocabParallelEmbedding: a token embedding whose [V, C] table is split by rows over the
// tensor-parallel group (Megatron). Rank r holds rows [r V / tp, (r + 1) V / tp); ids outside
// them look up row 0 and are masked to zero, and the partial embeddings are summed over the
// group (TensorParallel::exit: an all-reduce, or a reduce-scatter to this rank's tokens under
// sequence parallelism, Note [Sequence-parallel layout]). The sum has one nonzero term per token,
// so the values are the whole table's bits. At tp = 1 it is nn::Embedding: same name, shape,
// initial values and bits. A tied LM head reads the local rows as its slice of the vocabulary.
#include "models/nn/module.h"
#include "models/nn/tensor_parallel.h"

namespace strata::models::nn {

class VocabParallelEmbedding : public Module, public ShardedModule {
 public:
  VocabParallelEmbedding(int64_t num_embeddings, int64_t dim, const TensorParallel& tp);

  const Variable& weight() const { return weight_; }          // [V / tp, C]
  int64_t num_embeddings() const { return num_embeddings_; }  // the whole table's
  int64_t dim() const { return dim_; }
  // The first whole-table row this rank holds.
  int64_t vocab_start() const { return tp_.rank() * (num_embeddings_ / tp_.size()); }
  int64_t local_rows() const { return num_embeddings_ / tp_.size(); }
  const TensorParallel& tp() const { return tp_; }

  void set_init_std(float stddev) { init_std_ = stddev; }
  void reset_parameters(uint64_t seed) override;
  // Zeroes the rows of whole-table index >= `row` that this rank holds (padded vocabulary).
  void zero_rows_from(int64_t row);

  std::vector<std::pair<std::string, ShardSpec>> shard_specs() const override;

 protected:
  // ids [B, T] (wrapped, no gradient) -> [B, T, C], or [B, T / tp, C] under sequence parallelism.
  Variable forward(const Variable& ids) override;

 private:
  int64_t num_embeddings_, dim_;
  TensorParallel tp_;
  float init_std_ = 0.02f;
  Variable weight_;
};

}  // namespace strata::models::nn
