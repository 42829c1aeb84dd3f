#include "models/causal_lm.h"

#include <algorithm>

#include "autograd/comm_functions.h"
#include "autograd/functions.h"
#include "offload/memory_stats.h"

namespace strata::models {

Variable CausalLM::forward(const Tensor& ids) {
  STRATA_USER_CHECK(is_whole(),
                    "model '{}' holds the pipeline stage of layers [{}, {}) only: run it with "
                    "forward_stage (Note [Pipeline stages])",
                    family(), stage_.begin, stage_.end);
  STRATA_USER_CHECK(ids.ndim() == 2, "token ids must be [batch, seq], got {}", ids.str());
  STRATA_USER_CHECK(ids.dtype() == DType::I32 || ids.dtype() == DType::I64,
                    "token ids must be i32 or i64, got {}", ids.str());
  STRATA_USER_CHECK(ids.size(1) <= max_seq_len(),
                    "sequence length {} exceeds the model's context of {} positions", ids.size(1),
                    max_seq_len());
  return (*this)(Variable(ids));
}

Variable CausalLM::forward_cached(const Tensor& ids, KvCache& cache, bool last_only) {
  STRATA_USER_CHECK(is_whole(),
                    "model '{}' holds the pipeline stage of layers [{}, {}) only: run it with "
                    "forward_stage_cached (Note [Cached pipeline stages])",
                    family(), stage_.begin, stage_.end);
  return run_cached(ids, Variable(), 0, cache, last_only, /*whole=*/true);
}

Variable CausalLM::forward_stage_cached(const Tensor& ids, const Variable& hidden, int chunk,
                                        KvCache& cache, bool last_only) {
  STRATA_CHECK(chunk >= 0 && chunk < num_chunks(), "chunk {} of {}", chunk, num_chunks());
  return run_cached(ids, hidden, chunk, cache, last_only, /*whole=*/false);
}

Variable CausalLM::run_cached(const Tensor& ids, const Variable& hidden, int chunk, KvCache& cache,
                              bool last_only, bool whole) {
  STRATA_USER_CHECK(supports_kv_cache(), "model family '{}' has no KV-cached forward", family());
  STRATA_CHECK(!autograd::GradMode::is_enabled(),
               "forward_cached is for inference: run it under autograd::NoGradGuard");
  STRATA_USER_CHECK(ids.ndim() == 2 && ids.size(1) > 0, "token ids must be [batch, seq], got {}",
                    ids.str());
  STRATA_USER_CHECK(ids.dtype() == DType::I32 || ids.dtype() == DType::I64,
                    "token ids must be i32 or i64, got {}", ids.str());
  const int64_t B = ids.size(0), T = ids.size(1);
  if (chunk == 0) {
    if (cache.length() == 0 && (cache.model_ != this || cache.batch_ != B)) {
      cache.slots_.clear();  // a fresh or cleared cache takes this model's and batch's shapes
      cache.model_ = this;
      cache.batch_ = B;
    }
    STRATA_USER_CHECK(cache.model_ == this,
                      "this KV cache holds another model's positions; clear() it first");
    STRATA_USER_CHECK(B == cache.batch_, "the KV cache holds a batch of {}, got ids {}",
                      cache.batch_, ids.str());
    STRATA_USER_CHECK(cache.length() + T <= max_seq_len(),
                      "positions {}..{} pass the model's context of {} positions (the KV cache "
                      "holds {})",
                      cache.length(), cache.length() + T - 1, max_seq_len(), cache.length());
    cache.capacity_ = max_seq_len();
    cache.tokens_ = T;
    cache.next_ = 0;
  } else {
    // Note [Cached pipeline stages]: the chunks of one step, in order, on the same tokens.
    STRATA_CHECK(cache.model_ == this && cache.next_chunk_ == chunk && cache.tokens_ == T &&
                     cache.batch_ == B,
                 "forward_stage_cached: chunk {} of ids {} after chunk {} of [{}, {}]", chunk,
                 ids.str(), cache.next_chunk_ - 1, cache.batch_, cache.tokens_);
  }
  const bool first = whole || chunk_is_first(chunk), last = whole || chunk_is_last(chunk);
  if (!first)
    STRATA_CHECK(hidden.defined() && hidden.data().ndim() == 3 && hidden.data().size(0) == B &&
                     hidden.data().size(1) == T,
                 "chunk {} takes hidden states [{}, {}, C], got {}", chunk, B, T,
                 hidden.defined() ? hidden.data().str() : std::string("none"));
  KvCache*& slot = detail::active_kv_cache();
  STRATA_CHECK(slot == nullptr, "forward_cached inside another forward_cached");
  struct Activate {
    KvCache*& slot;
    ~Activate() {
      slot->last_only_ = false;
      slot = nullptr;
    }
  } activate{slot};
  slot = &cache;
  cache.last_only_ = last_only;
  // Note [Decoding without sequence parallelism].
  const nn::SequenceParallelPause no_sp;
  const size_t slots_before = cache.next_;
  Variable out = whole ? (*this)(Variable(ids)) : forward_stage(ids, hidden, chunk);
  if (last) {
    STRATA_CHECK(out.data().ndim() == 3 && out.data().size(0) == B &&
                     (out.data().size(1) == T || (last_only && out.data().size(1) == 1)),
                 "model '{}' returned logits {} for ids {}", family(), out.data().str(), ids.str());
    // Note [Last-position logits]: a model that ran every position through its head.
    if (last_only && out.data().size(1) != 1) out = autograd::narrow(out, 1, T - 1, 1);
  } else {
    STRATA_CHECK(out.data().ndim() == 3 && out.data().size(0) == B && out.data().size(1) == T,
                 "model '{}' chunk {} returned hidden states {} for ids {}", family(), chunk,
                 out.data().str(), ids.str());
  }
  // Every attention layer took its slot: a layer that ignored the cache would have attended to
  // the new tokens alone.
  STRATA_CHECK(cache.next_ > slots_before,
               "model '{}' chunk {}: no attention layer used the KV "
               "cache",
               family(), chunk);
  if (whole || chunk == num_chunks() - 1) {
    STRATA_CHECK(cache.next_ == cache.slots_.size(),
                 "model '{}': {} of its {} attention layers used the KV cache", family(),
                 cache.next_, cache.slots_.size());
    cache.length_ += T;
    cache.next_chunk_ = 0;
  } else {
    cache.next_chunk_ = chunk + 1;
  }
  return out;
}

Variable CausalLM::positions_for_logits(const Variable& x) {
  const KvCache* cache = KvCache::active();
  if (cache == nullptr || !cache->last_logits_only() || x.data().size(1) == 1) return x;
  return autograd::narrow(x, 1, x.data().size(1) - 1, 1);
}

Variable CausalLM::loss(const Tensor& ids, const Tensor& targets, int64_t ignore_index) {
  STRATA_USER_CHECK(targets.shape() == ids.shape(), "targets {} must have the shape of ids {}",
                    targets.str(), ids.str());
  Variable logits = forward(ids);
  if (tp_.enabled())  // Note [Vocab-parallel cross-entropy]
    return autograd::vocab_parallel_cross_entropy(logits, targets, local_vocab_start(),
                                                  vocab_size(), tp_.group, ignore_index);
  // Note [Padded vocabulary]: the loss reads the first vocab_size columns in place. The logits
  // are handed over: under a LossGradientScope their gradient comes with the forward (Note
  // [Fused cross-entropy gradient] in autograd/functions_nn.cpp).
  return autograd::cross_entropy_consuming(std::move(logits), targets, ignore_index, vocab_size());
}

void CausalLM::set_stage(const StageLayers& stage, int64_t n_layer) {
  const int64_t end = stage.end < 0 && stage.chunks == 1 ? n_layer : stage.end;
  STRATA_USER_CHECK(stage.begin >= 0 && stage.begin < end && end <= n_layer,
                    "pipeline stage layers [{}, {}) are not a non-empty range of the model's {} "
                    "layers",
                    stage.begin, end, n_layer);
  StageLayers s = stage;
  s.end = end;
  if (s.chunks > 1) {
    // Note [Virtual pipeline stages]: equal chunks that neither overlap nor pass the stack.
    STRATA_USER_CHECK(s.stride >= end - s.begin && s.chunk_end(s.chunks - 1) <= n_layer,
                      "pipeline chunks of layers [{}, {}) every {} layers, {} of them, do not fit "
                      "the model's {} layers without overlapping",
                      s.begin, end, s.stride, s.chunks, n_layer);
  } else {
    STRATA_USER_CHECK(s.chunks == 1, "a pipeline stage holds {} chunks", s.chunks);
    s.stride = 0;
  }
  stage_ = s;
  n_layer_ = n_layer;
}

std::pair<size_t, size_t> CausalLM::chunk_slots(int c) const {
  STRATA_CHECK(c >= 0 && c < num_chunks(), "chunk {} of {}", c, num_chunks());
  const auto n = static_cast<size_t>(stage_.end - stage_.begin);
  return {static_cast<size_t>(c) * n, static_cast<size_t>(c + 1) * n};
}

int CausalLM::unit_chunk(int u) const {
  STRATA_CHECK(u >= 0 && u < static_cast<int>(flat_units_.size()), "unit {} of {}", u,
               flat_units_.size());
  if (num_chunks() == 1) return 0;
  const std::string& name = flat_units_[u].name;
  if (name == "embeddings") return is_first_stage() ? 0 : num_chunks() - 1;
  if (name == "head") return num_chunks() - 1;
  const size_t dot = name.rfind('.');
  const std::string digits = dot == std::string::npos ? std::string() : name.substr(dot + 1);
  STRATA_CHECK(!digits.empty() && std::all_of(digits.begin(), digits.end(),
                                              [](char ch) { return ch >= '0' && ch <= '9'; }),
               "unit '{}' of a chunked model is neither embeddings, head nor a layer", name);
  const int64_t layer = std::stoll(digits);
  for (int c = 0; c < num_chunks(); ++c)
    if (layer >= stage_.chunk_begin(c) && layer < stage_.chunk_end(c)) return c;
  STRATA_CHECK(false, "unit '{}': layer {} is in none of this model's chunks", name, layer);
  return 0;
}

Variable CausalLM::forward_stage(const Tensor&, const Variable&, int) {
  user_error("model family '{}' cannot run as a pipeline stage", family());
}

Variable CausalLM::stage_loss(const Tensor& ids, const Variable& hidden, const Tensor& targets,
                              int64_t ignore_index) {
  STRATA_CHECK(is_last_stage(), "stage_loss on a stage without the head");
  Variable logits = forward_stage(ids, hidden, num_chunks() - 1);
  STRATA_USER_CHECK(
      logits.data().ndim() == 3 && targets.ndim() == 2 &&
          logits.data().size(0) == targets.size(0) && logits.data().size(1) == targets.size(1),
      "targets {} do not match the stage's logits {}", targets.str(), logits.data().str());
  if (tp_.enabled())  // Note [Vocab-parallel cross-entropy]
    return autograd::vocab_parallel_cross_entropy(logits, targets, local_vocab_start(),
                                                  vocab_size(), tp_.group, ignore_index);
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
  if (tp_.enabled()) shard_specs_ = nn::collect_shard_specs(*this);
}

void CausalLM::initialize(uint64_t seed) {
  STRATA_CHECK(!flat_units_.empty(), "initialize before flatten");
  init_seed_ = seed;
  built_deferred_ = nn::DeferredInitScope::active();
  if (!built_deferred_) reset_parameters(seed);
}

bool CausalLM::holds_prefix(const FlatUnit& unit, const std::string& prefix) {
  return std::find(unit.prefixes.begin(), unit.prefixes.end(), prefix) != unit.prefixes.end();
}

// Note [Deferred initialisation]: reset_parameters restricted to one unit. Module resets draw by
// name, so resetting the unit's modules alone gives their parameters the bits of a whole reset.
void CausalLM::init_unit(int u) {
  STRATA_CHECK(u >= 0 && u < static_cast<int>(flat_units_.size()), "unit {} of {}", u,
               flat_units_.size());
  FlatUnit& unit = flat_units_[u];
  unit.params.storage()->materialize(offload::Category::Param);
  unit.params.zero_();  // the alignment padding (Note [Flat parameters])
  if (unit_source_) {
    unit_source_(unit);
    return;
  }
  for (const std::string& prefix : unit.prefixes) module(prefix).reset_parameters(init_seed_);
  finish_unit_init(unit);
}

}  // namespace strata::models
