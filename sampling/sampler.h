#pragma once
// Autoregressive sampling from a CausalLM, for `generate` and `train`'s periodic samples: sample()
// and sample_batch() draw continuations of a prompt, reproducibly from a seed, with the model's
// KV cache where it has one, choosing on the device where the logits live.
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "models/causal_lm.h"

namespace strata::sampling {

// Note [Sampling draws]
// Each new token's draw comes from Philox keyed by (options.seed, the token's position in the
// sequence) at counter s, the sample's index (options.first_sample + its row in a batch), never
// from the training generator (autograd::current_generator()), so sampling neither depends on nor
// disturbs training's random state, the same seed and prompt give the same tokens whatever happened
// before, and sample s of a batch is the same whatever the batch's size. Candidates are ordered
// by (logit descending, token id ascending), so ties break the same way everywhere; the top-k cut
// keeps the first top_k; the nucleus (top-p) cut then keeps the fewest first candidates whose
// probabilities at the temperature, renormalised over those top_k, sum to at least top_p (always
// the best one: temperature, then top-k, then top-p, the order of Hugging Face's samplers); the
// inverse-CDF draw picks among what is left. The total the draw scales is summed in token id
// order (top-p's, in candidate order); the draw walks the candidates best first.
//
// Note [Cached sampling]
// With options.kv_cache (the default) and a model that supports it, the prompt runs once through
// CausalLM::forward_cached and each later step runs only the token drawn last, attending to the
// held keys and values (Note [KV cache]): one position's work per token instead of the whole
// window's. Once the sequence is longer than the model's context, each step runs the last
// max_seq_len tokens afresh, as without the cache (positions restart at 0 in that window, so
// nothing held can be reused); the cache buys nothing there. Without the cache (kv_cache off, or
// a model without a cached forward) every step runs the model over the last max_seq_len tokens.
// Both ways draw from the same positions' logits, equal up to rounding (Note [KV cache]).
struct SampleOptions {
  int64_t max_new_tokens = 128;
  double temperature = 0.8;  // 0 = greedy (argmax)
  int64_t top_k = 40;        // 0 = no cut
  double top_p = 1.0;        // nucleus: the fewest best tokens holding this much mass; 1 = no cut
  uint64_t seed = 0;
  int64_t stop_token = -1;  // stop after emitting this token (e.g. the tokenizer's eot); -1: never
  bool kv_cache = true;     // Note [Cached sampling]
  // The index of the first sample drawn (Note [Sampling draws]): sample_batch's row r draws as
  // sample first_sample + r, so sample s of a batch can be drawn alone, or a batch split.
  int64_t first_sample = 0;
};

// Note [Batched sampling]
// sample_batch draws num_samples continuations of one prompt in one batch: every step runs the
// model once on [num_samples, T] ids (and the KV cache holds num_samples rows), so on a GPU the
// samples cost little more than one. The first step's rows all hold the prompt alone, so it runs
// once, as a batch of one, every row drawing from its logits; with the cache its keys and values
// are then repeated once per row (KvCache::repeat_rows), so a long prompt's prefill is paid once,
// not num_samples times. Rows are independent: row s's draws are sample s's (Note [Sampling
// draws]) and its logits are the ones a batch of one would compute, up to rounding. A
// row that emits stop_token ends there and leaves the batch: later steps run only the rows still
// drawing, and the KV cache drops the stopped rows' keys and values (KvCache::keep_rows, Note
// [Dropping cache rows] in models/kv_cache.h), so the work per step shrinks with the rows left.
// The batch ends when every row has stopped or at max_new_tokens.
//
// Note [Sampling over ranks]
// A model split over ranks samples with every rank of the split running sample_batch together,
// with the same prompt and options: each rank computes the same logits of the step's last
// positions, so each draws the same token and feeds the same ids back (the draws are Philox, keyed
// by the seed, position and sample alone: Note [Sampling draws]), and every rank makes the same
// decisions (a stopped row, a window restart, a non-finite row's UserError) with no further
// message. Under tensor parallelism each rank's forward gives its slice of the vocabulary; the
// slices are all-gathered over the tp group, so every rank holds the same whole row (a copy of
// each rank's values, bit for bit). Under pipeline parallelism the forward is a StepForward that
// runs the stages (parallel::PipelineSchedule::forward_last_logits): each stage runs its layers
// with its own KV cache (Note [Cached pipeline stages] in models/causal_lm.h) and the last stage
// broadcasts the whole rows to the others. The logits differ from one process only in the
// summation order of the tp all-reduces, a rounding-level change; a draw can only differ where two
// candidates' cumulative weights are that close to the uniform.
//
// A step's forward: ids [rows, T] (on the model's device) -> the logits of each row's last
// position, [rows, padded_vocab_size], the whole vocabulary, the same on every rank that runs the
// sampling. `cache` is null when the step runs without the KV cache (Note [Cached sampling]);
// otherwise the forward runs forward_cached (or each stage's forward_stage_cached) with
// last_only, committing the positions to it. Runs under NoGradGuard in eval mode.
using StepForward =
    std::function<tensor::Tensor(const tensor::Tensor& ids, models::KvCache* cache)>;

// Continuations of `prompt`, num_samples of them drawn in one batch (Note [Batched sampling]);
// element r is sample first_sample + r, what sample() gives with that first_sample. Validation as
// sample(), and strata::user_error when num_samples < 1 or first_sample < 0. `forward`: how a
// step's logits are computed (Note [Sampling over ranks]); empty: the model's own forward_cached
// or forward, gathered over its tensor-parallel group.
std::vector<std::vector<int32_t>> sample_batch(models::CausalLM& model,
                                               const std::vector<int32_t>& prompt,
                                               const SampleOptions& options, int64_t num_samples,
                                               const StepForward& forward = {});

// Returns the new tokens only (up to max_new_tokens; fewer when stop_token is emitted). Runs
// under NoGradGuard in eval mode and restores the model's previous train/eval mode. Each step
// runs the model on the last max_seq_len tokens and samples from logits[:vocab_size] (Note
// [Padded vocabulary], Note [Sampling draws], Note [Cached sampling]). strata::user_error on an
// empty prompt, a token outside [0, vocab_size) or options out of range.
std::vector<int32_t> sample(models::CausalLM& model, const std::vector<int32_t>& prompt,
                            const SampleOptions& options, const StepForward& forward = {});

namespace detail {
// The uniform in [0, 1) that sample `sample`'s token at `position` draws with (Note [Sampling
// draws]), and the token it picks from one row's logits[:vocab_size] (Note [Sampling cost]).
double uniform_draw(uint64_t seed, int64_t position, int64_t sample);
int32_t choose_token(std::span<const float> logits, const SampleOptions& options, int64_t position,
                     int64_t sample);

// Note [Non-finite logits]
// A model whose weights went to NaN or inf (a diverged run: `train` logs a non-finite loss and
// goes on) gives logits that cannot be drawn from. The draws' orders and sums assume finite
// logits: a NaN breaks the comparisons the selection sorts with, and a nucleus over NaN weights
// keeps no candidate at all. So sample_batch checks each row before its draw (detail::drawable)
// and raises a UserError naming the sample and position; `train` reports it in place of the
// sample and trains on. On the device's candidates a NaN or +inf ranks first (Note [Top-k]), so
// the first candidate tells.
//
// Whether a draw at `temperature` can be made from a row holding these logits: not when one is
// NaN, nor at a temperature above 0 when one is +inf (its weight, exp(inf - inf), is undefined).
// -inf is a token with weight 0. sample_batch raises a UserError for a row that is not drawable
// (Note [Non-finite logits]).
bool drawable(std::span<const float> logits, double temperature);

// Note [Device candidates]
// On a GPU the whole-row draw can cost the host more than the step: each row's logits (50257
// bf16 for GPT-2) are copied to the host, widened to f32 there and searched, per row and token,
// while the device computes the whole step of a small model in less. But a greedy draw
// needs only the best token, and a top-k draw only the top_k best. So when the logits are on a
// device and the draw needs at most kDeviceCandidates of them (temperature 0: one; 0 < top_k <
// the vocabulary, at most kDeviceCandidates: top_k), the device picks each row's candidates
// (tensor::top_k, Note [Top-k] in tensor/ops.h) and only those k values and ids come to the
// host, where choose_from_candidates makes the choice. The tokens are the ones the whole-row draw
// picks: top_k's order is choose_token's `before` (larger logits first, ties by smaller id) on
// logits without NaN, so the candidates are the same set in the same order, and the draw does the
// same arithmetic on them in the same order (the total over the candidates in id order, the
// nucleus and the inverse-CDF walk best first), in double, on the same f32 values. top_k = 0 (the
// whole vocabulary) and the CPU keep the whole-row draw. STRATA_DEVICE_CANDIDATES=off keeps it
// everywhere, for comparing the two.
//
// The most candidates a draw asks the device for.
inline constexpr int64_t kDeviceCandidates = 1024;
// How many candidates per row the draw asks a device holding the logits for; 0: the whole rows
// come to the host (the CPU, top_k = 0 or above kDeviceCandidates, top_k >= vocab, the switch off).
int64_t device_candidates(const SampleOptions& options, int64_t vocab, Device logits_device);
// choose_token's choice from a row's top candidates: `values` their logits and `ids` their token
// ids, best first in top_k's order (Note [Top-k]), as many as device_candidates asked for.
int32_t choose_from_candidates(std::span<const float> values, std::span<const int64_t> ids,
                               const SampleOptions& options, int64_t position, int64_t sample);
}  // namespace detail

}  // namespace strata::sampling
