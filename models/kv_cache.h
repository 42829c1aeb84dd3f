#pragma once
// KvCache: the keys and values of the positions a model has already seen, so that decoding one
// more token costs one position's work instead of the whole window's.
//
// Note [KV cache]
// CausalLM::forward_cached(ids, cache) runs the model's ordinary forward (the same modules, the
// same module hooks, so ZeRO-3 gathering and offload work unchanged) on the new tokens ids
// [B, T] at positions [cache.length(), cache.length() + T), with `cache` active for the calling
// thread. Every attention layer that sees an active cache (KvCache::active()) writes its new
// keys and values into its own slot at those positions (append: the layers take slots in the
// order they run) and attends its T queries to all cache.length() + T positions with the
// bottom-right causal mask of tensor::attention, so query i sees the held positions and the new
// ones up to itself. Position-dependent inputs (GPT-2's position embedding, LLaMA's rotary
// tables) start at KvCache::active()->start(). Only when the forward returns does the cache
// commit the T positions; a forward that throws leaves length() as it was (what it wrote beyond
// length() is ignored and overwritten next time).
// Each slot holds k and v as [B, capacity, heads, D] buffers in the model's compute dtype on its
// device (for GQA the k/v heads, not the repeated ones), allocated at the layer's first append
// with capacity = the model's context, charged to Category::Activation; the attention reads
// [B, heads, length, D] views of them (unit last stride, no copy: Note [Strided attention
// operands]). A whole cache for GPT-2 1558M at batch 1 is 48 layers x 2 x 1024 x 1600 x 2 bytes
// = 315 MB in bf16.
// Numerics: the cached forward computes each position's logits from the same operands as the
// full forward over the prefix, with the same op order; only the shapes of the matmuls and of
// the attention calls differ (T rows instead of the whole prefix), which can change summation
// order in a backend's tiling, so agreement is to rounding, not promised bitwise (tests/models/
// kv_cache_test.cpp measures it).
// Inference only: forward_cached refuses to run with grad mode on.
#include <cstdint>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace strata::models {

class CausalLM;

class KvCache {
 public:
  KvCache() = default;
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  // Positions held (committed by completed forwards).
  int64_t length() const { return length_; }
  // Forgets every position; the buffers are kept for reuse by the same model and batch.
  void clear() { length_ = 0; }
  // Layers holding a slot (0 before the first forward).
  int64_t layers() const { return static_cast<int64_t>(slots_.size()); }
  // Batch rows held: B of the forward that filled the cache, fewer after keep_rows (0 before the
  // first forward).
  int64_t batch() const { return batch_; }

  // Note [Dropping cache rows]
  // A batch whose rows finish at different steps (sampling with a stop token, Note [Batched
  // sampling] in sampling/sampler.h) need not keep computing the finished ones: keep_rows(rows)
  // moves each kept row's held positions down to its new index, in place (row rows[j] to row j,
  // j <= rows[j], in increasing j, so a row is read before anything is written over it), and every
  // slot becomes a view of its first rows.size() rows, so later appends and attention views see
  // the smaller batch with no new allocation. The memory of the dropped rows is held until the
  // cache is destroyed or refilled with another batch. The kept rows' keys and values are copied
  // bit for bit, so their later logits are those of a batch that held only them from the start,
  // up to the rounding a different batch size may bring to a backend's tiling (tests/models/
  // kv_cache_test.cpp). The other way, repeat_rows(n) gives each row n copies in new buffers of
  // n times the batch (the positions held are copied, the rest of the capacity left unwritten):
  // n samples of one prompt run its prefill once, on a batch of one, and then decode as n rows.
  //
  // Keeps only the batch rows `rows` (strictly increasing, within [0, batch())) with the
  // positions they hold, in that order: later forwards take ids [rows.size(), T], row j being
  // the old row rows[j] (Note [Dropping cache rows]). strata::user_error on an empty, unsorted or
  // out-of-range list, or during a forward; the cache is unchanged then.
  void keep_rows(const std::vector<int64_t>& rows);
  // Repeats every batch row n times, with the positions it holds: row r becomes rows
  // [r * n, (r + 1) * n), so one prefill of a prompt serves n samples of it (Note [Dropping cache
  // rows]). New buffers of the larger batch replace the old. strata::user_error when n < 1, on
  // an empty cache (no forward yet) or during a forward; the cache is unchanged then.
  void repeat_rows(int64_t n);

  // ---- for attention layers, during CausalLM::forward_cached ----
  // The cache of the forward running on this thread, or null outside forward_cached.
  static KvCache* active();
  // Position of this forward's first token (= length()).
  int64_t start() const { return length_; }
  // Whether this forward wants the logits of its last position only (Note [Last-position
  // logits] in models/causal_lm.h).
  bool last_logits_only() const { return last_only_; }
  // Writes k and v [B, T, heads, D] (any layout) at positions [start(), start() + T) of the next
  // layer's slot and returns views [B, heads, start() + T, D] of every position it now holds.
  std::pair<tensor::Tensor, tensor::Tensor> append(const tensor::Tensor& k,
                                                   const tensor::Tensor& v);

 private:
  friend class CausalLM;
  struct Slot {
    tensor::Tensor k, v;  // [B, capacity, heads, D]
  };
  std::vector<Slot> slots_;
  const CausalLM* model_ = nullptr;  // the model whose positions it holds
  int64_t length_ = 0;
  int64_t capacity_ = 0;    // the model's context; set by forward_cached
  int64_t batch_ = 0;       // B of the first forward; 0 until then
  size_t next_ = 0;         // slot the next append takes in the running forward
  int64_t tokens_ = 0;      // T of the running forward
  bool last_only_ = false;  // the running forward's last_only
  int next_chunk_ = 0;      // the chunk the running step runs next (Note [Cached pipeline stages])
};

namespace detail {
// The thread's active cache, set and restored by CausalLM::forward_cached.
KvCache*& active_kv_cache();
}  // namespace detail

}  // namespace strata::models
