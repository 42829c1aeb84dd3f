#pragma once
// CausalLM: what every model in the zoo is to the rest of Strata — token ids in, next-token
// logits out, parameters in flat units (Note [Flat parameters]).
//
// Note [Padded vocabulary]
// The output projection has `padded_vocab_size` columns (GPT-2: 50257 -> 50304, a multiple of
// 64) so its matmul tiles evenly. The extra columns are not tokens: `loss` takes the cross
// entropy over the first `vocab_size` columns only, so their logits get no gradient and cannot
// change the loss. It does so in place (the `classes` argument of cross_entropy): narrowing
// would make the loss copy the [B*T, vocab] logits forward and again backward, and the narrow's
// backward scatter its gradient into a zeroed full-width copy - three extra passes over the
// largest activation of the step (1.6 GB in bf16 for GPT-2 at B=16, T=1024) and its memory. Rows of
// a tied embedding beyond vocab_size start at zero and, with zero gradient, stay there (weight
// decay of zero is zero).
//
// Note [Last-position logits]
// Sampling needs the logits of each row's last position only, but a prefill (the prompt, or a
// whole window once a sequence passes the context) runs T positions, and the vocabulary
// projection of all of them is a large share of its work (GPT-2 124M: 2 * 768 * 50304 FLOPs per
// position against about 2 * 85M for the rest of the model, about 30%) and its largest output
// ([B, T, padded_vocab]). forward_cached(ids, cache, /*last_only=*/true) marks the running
// forward (KvCache::last_logits_only()); a model's forward_logits passes its hidden states
// through positions_for_logits() before the final norm, which keeps the last position when so
// marked, so the norm and the head run one position per row. The keys and values of every
// position are cached as usual. A model that does not call it still gives the right logits:
// forward_cached keeps the last position of what it returns, at the full cost.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "models/flat_params.h"
#include "models/kv_cache.h"
#include "models/nn/module.h"
#include "models/nn/tensor_parallel.h"

namespace strata::models {

using autograd::Variable;
using tensor::Tensor;

// Note [Pipeline stages]
// Under pipeline parallelism a rank builds one *stage* of the model: the decoder layers
// [begin, end) of the whole stack, the embeddings with the first stage, the final norm and the
// head with the last. Parameters keep the whole model's names (h.{i} with the global i) and,
// drawn by name (Note [Name-keyed init]), the whole model's values, so the stages put together
// are the single-process model of the same seed. A tied head (GPT-2; LLaMA with
// tie_word_embeddings) needs the embedding matrix on the last stage too: that stage builds the
// whole "embeddings" unit (the same layout and values as the first stage's; wpe unused there),
// and the pipeline sums that unit's gradients between the two stages before the step, as
// Megatron does, so both copies stay equal (parallel/pipeline_schedule.h). forward_stage runs
// the stage: token ids on the first stage, else the previous stage's hidden states [B, T, C]; it
// returns the hidden states [B, T, C] to send on, or the logits on the last stage.
//
// Note [Virtual pipeline stages]
// Under the interleaved schedule (parallel/pipeline_schedule.h) the L layers form p x v
// contiguous chunks of L / (p v) layers and rank r holds chunks r, r + p, ..., r + (v - 1) p:
// v non-adjacent *chunks*, chunk c being layers [begin + c stride, end + c stride) with stride
// = L / v. One model (so one Engine and one set of flat units, named as in the whole model)
// holds them all; forward_stage(ids, hidden, c) runs chunk c alone. The embeddings go with
// chunk 0 when begin is 0 (rank 0), the final norm and head with chunk v - 1 when it ends the
// stack (rank p - 1); a tied head's copy of the embeddings is built there as above.
struct StageLayers {
  int64_t begin = 0;
  int64_t end = -1;    // one past the stage's last layer; -1: through the last layer
  int64_t chunks = 1;  // Note [Virtual pipeline stages]: more chunks, every `stride` layers
  int64_t stride = 0;

  int64_t chunk_begin(int64_t c) const { return begin + c * stride; }
  int64_t chunk_end(int64_t c) const { return end + c * stride; }
};

class CausalLM : public nn::Module {
 public:
  // ids [B, T] (I32 or I64) -> logits [B, T, padded_vocab_size]. Runs the module hooks. Under
  // tensor parallelism, this rank's slice of the vocabulary: [B, T, padded_vocab_size / tp], the
  // columns from local_vocab_start() on (Note [Vocab-parallel cross-entropy]).
  Variable forward(const Tensor& ids);
  // Inference on new tokens ids [B, T] at positions [cache.length(), cache.length() + T),
  // attending to the positions `cache` holds; returns their logits [B, T, padded_vocab_size] and
  // commits them to the cache (Note [KV cache]). With last_only, the logits of the last position
  // alone, [B, 1, padded_vocab_size] (Note [Last-position logits]); every position is cached
  // either way. Grad mode must be off. strata::user_error when the positions would pass
  // max_seq_len(), when the batch size differs from the one the cache holds, or when the model
  // has no cached forward (supports_kv_cache()). Under tensor parallelism each rank caches its
  // own heads' keys and values (GQA: its own k/v heads) and returns its slice of the vocabulary,
  // as forward does; sequence parallelism is paused (Note [Decoding without sequence
  // parallelism] in models/nn/tensor_parallel.h).
  Variable forward_cached(const Tensor& ids, KvCache& cache, bool last_only = false);
  // Whether this model's attention layers take part in forward_cached.
  virtual bool supports_kv_cache() const { return false; }
  // Mean cross entropy of logits[..., :vocab_size] against targets [B, T]; targets equal to
  // ignore_index (-100) do not count (Note [Padded vocabulary]). Under tensor parallelism the
  // vocab-parallel loss on each rank's slice, the same value on every rank of the group.
  Variable loss(const Tensor& ids, const Tensor& targets, int64_t ignore_index = -100);

  virtual int64_t vocab_size() const = 0;
  virtual int64_t padded_vocab_size() const = 0;
  virtual int64_t max_seq_len() const = 0;
  // Family name, e.g. "gpt2".
  virtual std::string family() const = 0;

  // ---- pipeline stages (Note [Pipeline stages]) ----
  // This model's layers [begin, end) (the whole stack unless built as a stage).
  const StageLayers& stage_layers() const { return stage_; }
  int64_t num_layers() const { return n_layer_; }
  // Chunks this model holds (Note [Virtual pipeline stages]); 1 unless interleaved.
  int num_chunks() const { return static_cast<int>(stage_.chunks); }
  bool is_first_stage() const { return stage_.begin == 0; }
  bool is_last_stage() const { return stage_.chunk_end(stage_.chunks - 1) == n_layer_; }
  bool is_whole() const { return is_first_stage() && is_last_stage() && stage_.chunks == 1; }
  // The chunk whose forward and backward use flat unit u: "embeddings" goes with chunk 0 on the
  // first stage and with the last chunk elsewhere (a tied head's copy), "head" with the last
  // chunk, a layer's unit (named "<prefix>.<layer>", Note [Flat parameters]) with the chunk
  // holding that layer. 0 for every unit of a one-chunk model.
  int unit_chunk(int u) const;
  // Whether chunk c takes the token ids (the embeddings) / computes the logits (the head).
  bool chunk_is_first(int c) const { return c == 0 && is_first_stage(); }
  bool chunk_is_last(int c) const { return c == num_chunks() - 1 && is_last_stage(); }
  // Width of the hidden states between stages (C).
  virtual int64_t hidden_size() const { return 0; }
  // Whether the head reads the embedding matrix (its gradient is summed between the stages).
  virtual bool ties_embeddings() const { return false; }
  // ids [B, T] on the first stage (hidden undefined), else hidden [B, T, C] from the previous
  // stage (ids may be undefined) -> hidden [B, T, C], or logits [B, T, padded_vocab] on the last.
  // `chunk`: which of this model's chunks runs (Note [Virtual pipeline stages]).
  virtual Variable forward_stage(const Tensor& ids, const Variable& hidden, int chunk = 0);
  // Note [Cached pipeline stages]
  // forward_cached for a model built as a pipeline stage: chunk `chunk` of one decode step,
  // forward_stage under `cache` (Note [KV cache]). ids [B, T] are given on every stage (the
  // positions and the batch come from them), hidden [B, T, C] from the previous stage on all but
  // the first chunk of the model; returns the hidden states [B, T, C] to send on, or on the last
  // chunk the logits as forward_cached. A step runs this model's chunks 0, 1, ..., in order, on
  // the same ids: the layers of chunk c take the cache's slots after those of chunk c - 1, and
  // the T positions are committed when the model's last chunk returns, so one KvCache serves all
  // of a rank's chunks. Sequence parallelism is paused as in forward_cached. No module hooks run
  // (as in a pipeline's forward_stage; ZeRO-3 is not combined with pipelines).
  Variable forward_stage_cached(const Tensor& ids, const Variable& hidden, int chunk,
                                KvCache& cache, bool last_only = false);
  // The last stage's mean cross entropy, as loss() (Note [Padded vocabulary]); runs the last
  // chunk.
  Variable stage_loss(const Tensor& ids, const Variable& hidden, const Tensor& targets,
                      int64_t ignore_index = -100);
  // The tensor-parallel group the model was built for (size 1 without one).
  const nn::TensorParallel& tensor_parallel() const { return tp_; }
  // The first column of this rank's slice of the logits (0 at tp = 1).
  int64_t local_vocab_start() const { return tp_.rank() * (padded_vocab_size() / tp_.size()); }
  // Full parameter name -> how it is split over the tensor-parallel group (Note [Tensor-parallel
  // shards]); parameters not listed are replicated. Empty at tp = 1.
  const std::map<std::string, nn::ShardSpec>& shard_specs() const { return shard_specs_; }

  // Note [Flat parameters]: one entry per unit, in forward order.
  std::vector<FlatUnit>& flat_units() { return flat_units_; }
  const std::vector<FlatUnit>& flat_units() const { return flat_units_; }
  // Zeroes the flat gradient buffers.
  void zero_grad() override;

  // ---- Note [Deferred initialisation] (models/nn/module.h) ----
  // Built inside a DeferredInitScope: the units' buffers start released and uninitialised.
  bool built_deferred() const { return built_deferred_; }
  // Materializes unit u's flat parameters (Category::Param) and gives them the values the
  // constructor gives outside the scope: zero padding, every module under the unit's prefixes
  // reset from the seed, then finish_unit_init. The gradient buffer is left alone.
  void init_unit(int u);
  // Instead of the seed, init_unit fills each unit with `fill` (model.init_from:
  // hf_unit_loader in models/hf_interop.h), after zeroing it.
  void set_unit_source(std::function<void(const FlatUnit&)> fill) {
    unit_source_ = std::move(fill);
  }

 protected:
  // The model's computation, ids -> logits.
  virtual Variable forward_logits(const Tensor& ids) = 0;
  // For forward_logits, on the hidden states [B, T, C] before the final norm: x itself, or its
  // last position [B, 1, C] when the running forward_cached asked for the last position's logits
  // only (Note [Last-position logits]).
  static Variable positions_for_logits(const Variable& x);
  // Derived constructors call this before building modules: the layers [begin, end) of
  // n_layer (and the further chunks: Note [Virtual pipeline stages]). strata::user_error for a
  // range that is empty, outside the stack, or chunks that overlap.
  void set_stage(const StageLayers& stage, int64_t n_layer);
  // The positions of chunk c's layers among this model's layers (its modules in build order).
  std::pair<size_t, size_t> chunk_slots(int c) const;
  // Derived constructors call this before building layers that read it.
  void set_tensor_parallel(const nn::TensorParallel& tp) { tp_ = tp; }
  // Derived constructors call this once all modules are registered.
  void flatten(const std::vector<UnitSpec>& units, int64_t align = 16);
  // Derived constructors call this last, after flatten: reset_parameters(seed), or inside a
  // DeferredInitScope only records the seed for init_unit (Note [Deferred initialisation]).
  void initialize(uint64_t seed);
  // What reset_parameters does beyond resetting each module, restricted to `unit`'s parameters
  // (GPT-2: zeroing the padded vocabulary rows of wte when the unit holds it).
  virtual void finish_unit_init(const FlatUnit& unit) { (void)unit; }
  static bool holds_prefix(const FlatUnit& unit, const std::string& prefix);

 private:
  Variable forward(const Variable& ids) final { return forward_logits(ids.data()); }
  // forward_cached (whole: the module call with its hooks) and forward_stage_cached (chunk
  // `chunk` through forward_stage).
  Variable run_cached(const Tensor& ids, const Variable& hidden, int chunk, KvCache& cache,
                      bool last_only, bool whole);

  std::vector<FlatUnit> flat_units_;
  StageLayers stage_{0, 0};
  int64_t n_layer_ = 0;
  nn::TensorParallel tp_;
  std::map<std::string, nn::ShardSpec> shard_specs_;
  uint64_t init_seed_ = 0;
  std::function<void(const FlatUnit&)> unit_source_;
  bool built_deferred_ = false;
};

}  // namespace strata::models
