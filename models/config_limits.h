#pragma once
// Upper bounds on the dimensions a model config sets.
//
// Note [Model size limits]
// Every size a config gives is bounded, far above any model trained today (GPT-3 175B: 96
// layers of width 12288; vocabularies of 50k to 256k; contexts up to 1M), so that what is computed
// from them (parameter counts, shapes, byte counts, all int64) cannot overflow: at the limits a
// LLaMA model has under 2^61 parameters. A typo such as `n_layer: 1000000000` is a UserError
// naming the key and the limit, not a signed overflow or a request for exabytes.
#include <cstdint>

#include "core/error.h"

namespace strata::models {

inline constexpr int64_t kMaxVocab = int64_t{1} << 30;        // vocab_size
inline constexpr int64_t kMaxPaddedVocab = int64_t{1} << 31;  // padded_vocab_size
inline constexpr int64_t kMaxWidth = int64_t{1} << 20;        // n_embd, hidden_size
inline constexpr int64_t kMaxFfnWidth = int64_t{1} << 22;     // intermediate_size
inline constexpr int64_t kMaxLayers = int64_t{1} << 16;       // n_layer, num_hidden_layers
inline constexpr int64_t kMaxContext = int64_t{1} << 24;  // n_positions, max_position_embeddings

// strata::user_error "<family> config: <key> <value> is above the limit <limit> ..." when
// value > limit.
inline void check_limit(const char* family, const char* key, int64_t value, int64_t limit) {
  STRATA_USER_CHECK(value <= limit,
                    "{} config: {} {} is above the limit {} (Note [Model size limits] in "
                    "models/config_limits.h); is it a typo?",
                    family, key, value, limit);
}

// vocab_size rounded up to a multiple of `multiple` (Note [Padded vocabulary]); a size above
// kMaxVocab is returned as it is, for validate() to refuse, not rounded past int64.
inline int64_t round_up_vocab(int64_t vocab_size, int64_t multiple) {
  if (vocab_size > kMaxVocab) return vocab_size;
  return (vocab_size + multiple - 1) / multiple * multiple;
}

}  // namespace strata::models
