#pragma once
// What a model needs to know to build tensor-parallel (Megatron-style) layers: the group, whether
// sequence parallelism is on, and how each parameter is split over the group.
//
// Note [Tensor-parallel shards]
// A sharded parameter keeps its HF name and holds this rank's slice of the whole tensor: along
// `dim`, the whole extent is `blocks` equal blocks side by side (GPT-2's c_attn weight is q, k and
// v stacked: 3 blocks), each block is cut into tp equal pieces, and rank r holds piece r of every
// block, the blocks still side by side. Replicated parameters (norms, row-parallel biases, GPT-2's
// wpe) hold the whole tensor on every rank. A parameter's initial values are drawn for the whole
// tensor, keyed by its name (Note [Name-keyed init]), and each rank keeps its slice: a model built
// at any tp with seed S holds, put together, the tp = 1 model's weights for seed S.
//
// Note [Replicated parameters under sequence parallelism]
// Without sequence parallelism a replicated parameter sees every token on every rank, so each
// rank's gradient is already the whole gradient. With it, a parameter used in a sequence-parallel
// region (norm weights and biases, a row-parallel bias, wpe) sees 1/tp of the tokens; it is
// passed through copy_to_tp_region (identity forward, all-reduce backward), so the gradient that
// reaches it is again the whole one, identical on every rank, per backward pass (so gradient
// accumulation stays correct).
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "autograd/comm_functions.h"
#include "models/nn/module.h"

namespace strata::models::nn {

using autograd::TpGroup;

struct TensorParallel {
  TpGroup group;                   // null or a group of one: no tensor parallelism
  bool sequence_parallel = false;  // Note [Sequence-parallel layout]; ignored at tp = 1

  int size() const { return autograd::tp_size(group); }
  int rank() const { return autograd::tp_rank(group); }
  bool enabled() const { return size() > 1; }
  // Sequence parallelism in effect: configured, tp > 1, and not paused on this thread (Note
  // [Decoding without sequence parallelism]).
  bool sp() const;

  // Into a tensor-parallel region: the input of column-parallel layers. x is replicated (or, under
  // sequence parallelism, this rank's tokens); the result is the whole [B, T, C] on every rank.
  Variable enter(const Variable& x) const;
  // `consumers` (the column-parallel layers reading x) run on enter(x). Under sequence
  // parallelism backward keeps this rank's tokens of x and gathers the whole input again instead
  // of keeping it (Note [Sequence-parallel saved input]); otherwise this is consumers(enter(x)).
  std::vector<Variable> enter_columns(const Variable& x,
                                      const autograd::GatheredConsumers& consumers) const;
  Variable enter_columns(const Variable& x,
                         const std::function<Variable(const Variable&)>& consumer) const;
  // Out of it: the partial sums of row-parallel layers, reduced (or reduce-scattered to this
  // rank's tokens under sequence parallelism).
  Variable exit(const Variable& partial) const;
  // Note [Replicated parameters under sequence parallelism].
  Variable replicated(const Variable& param) const;
};

// Note [Decoding without sequence parallelism]
// A decode step runs one new position per row, which cannot be split over the tp ranks, and a
// prefill's prompt need not divide by tp either. So the KV-cached forward (CausalLM::
// forward_cached and forward_stage_cached) and sampling's uncached forward run a sequence-parallel
// model in the plain tensor-parallel layout: while a SequenceParallelPause lives on the calling
// thread, TensorParallel::sp() is false, every activation is whole on every rank, and the
// row-parallel outputs are all-reduced instead of reduce-scattered. The parameters are the same
// (sequence parallelism only changes where activations live), so the logits are those of the
// sequence-parallel forward up to the collectives' summation order. Inference only: a backward
// through a paused forward would not match the training layout, and forward_cached refuses grad
// mode anyway.
class SequenceParallelPause {
 public:
  SequenceParallelPause();
  ~SequenceParallelPause();
  SequenceParallelPause(const SequenceParallelPause&) = delete;
  SequenceParallelPause& operator=(const SequenceParallelPause&) = delete;

 private:
  bool was_;
};

struct ShardSpec {
  int dim = -1;        // -1: replicated
  int64_t blocks = 1;  // Note [Tensor-parallel shards]
  bool operator==(const ShardSpec&) const = default;
};

// Rank `rank`'s slice of the whole tensor `full` (Note [Tensor-parallel shards]): a contiguous
// copy, `full` itself when replicated or size == 1.
Tensor shard_of(const Tensor& full, const ShardSpec& spec, int rank, int size);
// The shape of one rank's slice of a whole tensor of shape `full`.
Shape shard_shape(const Shape& full, const ShardSpec& spec, int size);

// Elements read_shard reads at once by default when a slice is strided.
inline constexpr int64_t kShardReadChunk = int64_t{1} << 20;
// Fills dst (F32, contiguous, host) with elements [begin, begin + dst.numel()) of a whole tensor
// stored row-major elsewhere (a file).
using ReadRange = std::function<void(int64_t begin, Tensor dst)>;
// shard_of without the whole tensor: rank `rank`'s slice of a whole tensor of shape `full`, read
// through `read` into `dst` (F32, contiguous, host, the slice's size), reading only the slice: a
// row shard one range per block, a column shard whole rows `chunk` elements (or one row, when a
// row is longer) at a time.
void read_shard(const Shape& full, const ShardSpec& spec, int rank, int size, const ReadRange& read,
                Tensor dst, int64_t chunk = kShardReadChunk);

// Layers whose parameters are split over a tensor-parallel group say how.
class ShardedModule {
 public:
  virtual ~ShardedModule() = default;
  // Local parameter name -> spec, for the sharded parameters only.
  virtual std::vector<std::pair<std::string, ShardSpec>> shard_specs() const = 0;
};

// Full parameter name -> spec, for every sharded parameter under `root`.
std::map<std::string, ShardSpec> collect_shard_specs(Module& root);

// Draws the whole tensor of shape `full` ~ N(mean, stddev) keyed by (seed, p.name()) and writes
// this rank's slice into p (Note [Tensor-parallel shards]).
void normal_shard_(const Variable& p, uint64_t seed, float mean, float stddev, const Shape& full,
                   const ShardSpec& spec, int rank, int size);

}  // namespace strata::models::nn
