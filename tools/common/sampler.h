#pragma once
// Autoregressive sampling from a CausalLM (the `generate` tool).
//
// Note [Sampling draws]
// Each new token's draw comes from Philox keyed by (options.seed, the token's position in the
// sequence), never from the training generator (autograd::current_generator()), so sampling
// neither depends on nor disturbs training's random state, and the same seed and prompt give the
// same tokens whatever happened before. Candidates are ordered by (logit descending, token id
// ascending) before the top-k cut and the inverse-CDF draw, so ties break the same way everywhere.
//
// There is no KV cache yet: every step runs the model over the whole window (the last
// max_seq_len tokens), which is O(T^2) per token. Fine for tests and small demos only.
#include <cstdint>
#include <vector>

#include "models/causal_lm.h"

namespace strata::tools {

struct SampleOptions {
  int64_t max_new_tokens = 128;
  double temperature = 0.8;  // 0 = greedy (argmax)
  int64_t top_k = 40;        // 0 = no cut
  uint64_t seed = 0;
  int64_t stop_token = -1;  // stop after emitting this token (e.g. the tokenizer's eot); -1: never
};

// Returns the new tokens only (up to max_new_tokens; fewer when stop_token is emitted). Runs
// under NoGradGuard in eval mode and restores the model's previous train/eval mode. Each step
// runs the model on the last max_seq_len tokens and samples from logits[:vocab_size] (Note
// [Padded vocabulary], Note [Sampling draws]). strata::user_error on an empty prompt, a token
// outside [0, vocab_size) or options out of range.
std::vector<int32_t> sample(models::CausalLM& model, const std::vector<int32_t>& prompt,
                            const SampleOptions& options);

}  // namespace strata::tools
