#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

#include "autograd/comm_functions.h"
#include "autograd/variable.h"
#include "core/env.h"
#include "core/error.h"
#include "core/rng.h"
#include "tensor/ops.h"

namespace strata::sampling {

namespace {

// Restores the model's train/eval mode on scope exit (also when forward throws).
class EvalScope {
 public:
  explicit EvalScope(models::CausalLM& m) : model_(m), was_training_(m.is_training()) {
    model_.eval();
  }
  ~EvalScope() { model_.train(was_training_); }
  EvalScope(const EvalScope&) = delete;
  EvalScope& operator=(const EvalScope&) = delete;

 private:
  models::CausalLM& model_;
  bool was_training_;
};

// Candidates sorted per extension of the sorted prefix at least (Note [Sampling cost]).
constexpr size_t kSortChunk = 64;

}  // namespace

namespace detail {

double uniform_draw(uint64_t seed, int64_t position, int64_t sample) {
  const RngKey key{seed, rng_stream(0x5a3b1e, static_cast<uint64_t>(position))};
  const std::array<uint32_t, 4> r = philox4x32(key, static_cast<uint64_t>(sample));
  const uint64_t bits = (static_cast<uint64_t>(r[0]) << 21) ^ (r[1] >> 11);
  return static_cast<double>(bits & ((uint64_t{1} << 53) - 1)) * 0x1.0p-53;
}

// Note [Sampling cost]
// Sorting the whole vocabulary for every token (50257 entries for GPT-2; `bench_generate --top-k 0
// --temperature 1` measures the draw) can cost more than a GPU decode step of the model. So a draw
// sorts only what it reaches: the top-k set is found by selection (nth_element), the best
// candidates are sorted in chunks (64, then doubling) as the top-p sum or the inverse-CDF walk
// reaches the end of the sorted prefix; a peaked distribution sorts one chunk. The weights are
// recomputed from the logits where needed rather than stored. The choice is the one a full sort
// would make (tests/sampling/sampler_test.cpp holds it to a full-sort reference).
int32_t choose_token(std::span<const float> logits, const SampleOptions& o, int64_t position,
                     int64_t sample) {
  const float* l = logits.data();
  const size_t V = logits.size();
  if (o.temperature == 0.0) {
    // First maximum: ties go to the smaller id.
    return static_cast<int32_t>(std::max_element(l, l + V) - l);
  }
  auto before = [l](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  // order[0, sorted) holds the best candidates, best first; the rest come after all of them.
  size_t sorted = 0;
  auto sort_to = [&](size_t m) {
    m = std::min(m, order.size());
    if (m <= sorted) return;
    if (m < order.size())
      std::nth_element(order.begin() + sorted, order.begin() + m, order.end(), before);
    std::sort(order.begin() + sorted, order.begin() + m, before);
    sorted = m;
  };
  auto grow = [&] { sort_to(std::max(kSortChunk, 2 * sorted)); };

  // The top-k candidates: order[0, k) (before is a strict total order, so the set is exact).
  const size_t k = o.top_k > 0 ? std::min(static_cast<size_t>(o.top_k), V) : V;
  if (k < V) {
    if (k <= kSortChunk) {
      sort_to(k);
    } else {
      std::nth_element(order.begin(), order.begin() + k, order.end(), before);
    }
    order.resize(k);
  }
  // Their softmax weights at the temperature, in double, relative to the best; the total summed
  // in id order (Note [Sampling cost]).
  float best = l[order[0]];
  for (int32_t t : order) best = std::max(best, l[t]);
  auto weight = [&](int32_t t) {
    return std::exp((static_cast<double>(l[t]) - static_cast<double>(best)) / o.temperature);
  };
  double total = 0;
  if (k == V) {
    for (size_t t = 0; t < V; ++t) total += weight(static_cast<int32_t>(t));
  } else {
    std::vector<int32_t> ids(order.begin(), order.end());
    std::sort(ids.begin(), ids.end());
    for (int32_t t : ids) total += weight(t);
  }
  size_t limit = k;  // candidates the draw picks among
  if (o.top_p < 1.0) {
    // The fewest best candidates holding top_p of the mass; the draw's total is theirs.
    const double need = o.top_p * total;
    double kept = 0;
    size_t m = 0;
    while (m < k && kept < need) {
      if (m == sorted) grow();
      kept += weight(order[m++]);
    }
    limit = m;
    total = kept;
  }
  const double u = uniform_draw(o.seed, position, sample) * total;
  double acc = 0;
  for (size_t i = 0; i < limit; ++i) {
    if (i == sorted) grow();
    acc += weight(order[i]);
    if (u < acc) return order[i];
  }
  return order[limit - 1];  // u within rounding of total (the loop sorted through limit)
}

bool drawable(std::span<const float> logits, double temperature) {
  // No early exit, so the loop vectorises: a NaN fails x < inf, +inf fails it too.
  bool bad = false;
  if (temperature > 0.0) {
    for (float x : logits) bad |= !(x < std::numeric_limits<float>::infinity());
  } else {
    for (float x : logits) bad |= x != x;
  }
  return !bad;
}

int64_t device_candidates(const SampleOptions& o, int64_t vocab, Device logits_device) {
  static const bool on =
      env_choice(
          "STRATA_DEVICE_CANDIDATES",
          {{"on",
            "a GPU picks each row's top-k (greedy: the best) and the host draws from "
            "those"},
           {"off", "every row's whole logits come to the host (Note [Device candidates])"}}) == 0;
  if (!on || logits_device.is_cpu()) return 0;
  if (o.temperature == 0.0) return 1;
  if (o.top_k > 0 && o.top_k < vocab && o.top_k <= kDeviceCandidates) return o.top_k;
  return 0;
}

int32_t choose_from_candidates(std::span<const float> values, std::span<const int64_t> ids,
                               const SampleOptions& o, int64_t position, int64_t sample) {
  STRATA_CHECK(!values.empty() && values.size() == ids.size(), "{} candidate values, {} ids",
               values.size(), ids.size());
  const size_t k = values.size();
  if (o.temperature == 0.0) return static_cast<int32_t>(ids[0]);
  // choose_token's arithmetic on its order[0, k) (Note [Device candidates]).
  float best = values[0];
  for (float v : values) best = std::max(best, v);
  auto weight = [&](size_t c) {
    return std::exp((static_cast<double>(values[c]) - static_cast<double>(best)) / o.temperature);
  };
  std::vector<size_t> by_id(k);
  std::iota(by_id.begin(), by_id.end(), size_t{0});
  std::sort(by_id.begin(), by_id.end(), [&](size_t a, size_t b) { return ids[a] < ids[b]; });
  double total = 0;
  for (size_t c : by_id) total += weight(c);
  size_t limit = k;
  if (o.top_p < 1.0) {
    const double need = o.top_p * total;
    double kept = 0;
    size_t m = 0;
    while (m < k && kept < need) kept += weight(m++);
    limit = m;
    total = kept;
  }
  const double u = uniform_draw(o.seed, position, sample) * total;
  double acc = 0;
  for (size_t i = 0; i < limit; ++i) {
    acc += weight(i);
    if (u < acc) return static_cast<int32_t>(ids[i]);
  }
  return static_cast<int32_t>(ids[limit - 1]);
}

}  // namespace detail

namespace {

// The model's own step forward (Note [Sampling over ranks]): forward_cached or forward, the last
// positions, gathered over the tensor-parallel group.
tensor::Tensor whole_model_last_logits(models::CausalLM& model, const tensor::Tensor& ids,
                                       models::KvCache* cache) {
  // The uncached forward at tp > 1 too (Note [Decoding without sequence parallelism]).
  const models::nn::SequenceParallelPause no_sp;
  autograd::Variable logits =
      cache != nullptr ? model.forward_cached(ids, *cache, /*last_only=*/true) : model.forward(ids);
  // [rows, T or 1, padded_vocab (/ tp)] -> each row's last position.
  tensor::Tensor last = logits.data().select(1, logits.data().size(1) - 1);
  const models::nn::TensorParallel& tp = model.tensor_parallel();
  if (!tp.enabled()) return last;
  return autograd::gather_from_tp_region(autograd::Variable(last.contiguous()), tp.group).data();
}

}  // namespace

std::vector<std::vector<int32_t>> sample_batch(models::CausalLM& model,
                                               const std::vector<int32_t>& prompt,
                                               const SampleOptions& o, int64_t num_samples,
                                               const StepForward& forward) {
  const int64_t V = model.vocab_size();
  STRATA_USER_CHECK(!prompt.empty(), "sampling needs a prompt of at least one token");
  for (int32_t t : prompt)
    STRATA_USER_CHECK(t >= 0 && t < V, "prompt token {} is outside the vocabulary [0, {})", t, V);
  STRATA_USER_CHECK(o.max_new_tokens >= 0, "max_new_tokens must be >= 0, got {}", o.max_new_tokens);
  STRATA_USER_CHECK(o.temperature >= 0.0 && std::isfinite(o.temperature),
                    "temperature must be >= 0 (0 = greedy), got {}", o.temperature);
  STRATA_USER_CHECK(o.top_k >= 0, "top_k must be >= 0 (0 = no cut), got {}", o.top_k);
  STRATA_USER_CHECK(o.top_p > 0.0 && o.top_p <= 1.0, "top_p must be in (0, 1] (1 = no cut), got {}",
                    o.top_p);
  STRATA_USER_CHECK(num_samples >= 1, "the number of samples must be >= 1, got {}", num_samples);
  STRATA_USER_CHECK(o.first_sample >= 0, "first_sample must be >= 0, got {}", o.first_sample);

  autograd::NoGradGuard no_grad;
  EvalScope eval(model);
  const auto B = static_cast<size_t>(num_samples);
  // Every row's sequence: the prompt, then its draws.
  std::vector<std::vector<int64_t>> seq(B, std::vector<int64_t>(prompt.begin(), prompt.end()));
  std::vector<std::vector<int32_t>> out(B);
  // The rows still drawing, in order: a stopped row leaves the batch (Note [Batched sampling]).
  std::vector<size_t> live(B);
  std::iota(live.begin(), live.end(), size_t{0});
  const int64_t window = model.max_seq_len();
  // Where the model's parameters are (the GPU in a `train` run with run.device: cuda).
  const Device device =
      model.flat_units().empty() ? Device::cpu() : model.flat_units().front().params.device();
  // Note [Cached sampling].
  const bool cached = o.kv_cache && model.supports_kv_cache();
  models::KvCache cache;
  for (int64_t i = 0; i < o.max_new_tokens && !live.empty(); ++i) {
    const auto n = static_cast<int64_t>(seq[live.front()].size());  // every row's length
    // The tokens this step runs: the last T of each row (with the cache, those it does not hold).
    int64_t T = std::min<int64_t>(n, window);
    if (cached) {
      if (n > window) {
        cache.clear();  // past the context: a fresh window
      } else {
        T = n - cache.length();
      }
    }
    // The first step's rows are all the prompt: it runs once, as a batch of one (Note [Batched
    // sampling]).
    const bool shared = i == 0;
    const auto rows_now = shared ? int64_t{1} : static_cast<int64_t>(live.size());
    std::vector<int64_t> ctx;
    ctx.reserve(static_cast<size_t>(rows_now * T));
    for (size_t s : live) {
      ctx.insert(ctx.end(), seq[s].end() - T, seq[s].end());
      if (shared) break;
    }
    tensor::Tensor ids = tensor::from_ints(ctx, {rows_now, T}, DType::I32);
    if (!device.is_cpu()) ids = ids.to(device);
    // Cached: the last position's logits only (Note [Last-position logits]). [rows,
    // padded_vocab] on every rank (Note [Sampling over ranks]).
    models::KvCache* step_cache = cached ? &cache : nullptr;
    const tensor::Tensor whole =
        forward ? forward(ids, step_cache) : whole_model_last_logits(model, ids, step_cache);
    STRATA_CHECK(whole.ndim() == 2 && whole.size(0) == rows_now &&
                     whole.size(1) == model.padded_vocab_size(),
                 "sampling: a step's forward returned {} for ids {}", whole.str(), ids.str());
    tensor::Tensor last = whole.narrow(1, 0, V);
    // To the host as contiguous fp32: each row's top candidates when the device can pick them
    // (Note [Device candidates]), else the whole rows.
    const int64_t cand = detail::device_candidates(o, V, last.device());
    tensor::Tensor rows, cand_ids;
    if (cand > 0) {
      tensor::TopKResult top = tensor::top_k(last, cand);
      rows = top.values.to(Device::cpu()).to(DType::F32).contiguous();
      cand_ids = top.indices.to(Device::cpu());
    } else {
      rows = last.to(Device::cpu()).to(DType::F32).contiguous();
    }
    const auto width = static_cast<size_t>(cand > 0 ? cand : V);
    std::vector<int64_t> keep;  // indices into `live` of the rows that go on
    for (size_t j = 0; j < live.size(); ++j) {
      const size_t s = live[j];
      const size_t at = (shared ? 0 : j) * width;
      const int64_t sample_index = o.first_sample + static_cast<int64_t>(s);
      // Note [Non-finite logits]: a NaN or +inf ranks first among the candidates.
      if (!detail::drawable({rows.data<float>() + at, cand > 0 ? size_t{1} : width}, o.temperature))
        user_error(
            "sampling: the logits of sample {} at position {} are not finite (NaN{}): the model's "
            "weights or activations are not finite, as after a diverged training run (lower "
            "optimizer.lr or enable grad_clip)",
            sample_index, n, o.temperature > 0.0 ? " or +inf" : "");
      const int32_t next =
          cand > 0 ? detail::choose_from_candidates({rows.data<float>() + at, width},
                                                    {cand_ids.data<int64_t>() + at, width}, o, n,
                                                    sample_index)
                   : detail::choose_token({rows.data<float>() + at, width}, o, n, sample_index);
      seq[s].push_back(next);
      out[s].push_back(next);
      if (o.stop_token < 0 || next != o.stop_token) keep.push_back(static_cast<int64_t>(j));
    }
    if (shared && cached && !keep.empty()) {
      // The prompt's keys and values, once per row that goes on (Note [Dropping cache rows]).
      cache.repeat_rows(static_cast<int64_t>(keep.size()));
    } else if (cached && !keep.empty() && keep.size() < live.size()) {
      // Note [Dropping cache rows]: the cache keeps the rows that go on (none: the loop ends).
      cache.keep_rows(keep);
    }
    if (keep.size() == live.size()) continue;
    std::vector<size_t> still;
    still.reserve(keep.size());
    for (int64_t j : keep) still.push_back(live[static_cast<size_t>(j)]);
    live = std::move(still);
  }
  return out;
}

std::vector<int32_t> sample(models::CausalLM& model, const std::vector<int32_t>& prompt,
                            const SampleOptions& o, const StepForward& forward) {
  return std::move(sample_batch(model, prompt, o, 1, forward).front());
}

}  // namespace strata::sampling
