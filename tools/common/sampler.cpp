#include "tools/common/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "autograd/variable.h"
#include "core/error.h"
#include "core/rng.h"

namespace strata::tools {

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

// A uniform double in [0, 1) with 53 random bits, for sample `s`'s token at `position` (Note
// [Sampling draws]).
double uniform_draw(uint64_t seed, int64_t position, int64_t s) {
  const RngKey key{seed, rng_stream(0x5a3b1e, static_cast<uint64_t>(position))};
  const std::array<uint32_t, 4> r = philox4x32(key, static_cast<uint64_t>(s));
  const uint64_t bits = (static_cast<uint64_t>(r[0]) << 21) ^ (r[1] >> 11);
  return static_cast<double>(bits & ((uint64_t{1} << 53) - 1)) * 0x1.0p-53;
}

int32_t choose(const float* logits, int64_t V, const SampleOptions& o, int64_t position,
               int64_t s) {
  if (o.temperature == 0.0) {
    // First maximum: ties go to the smaller id.
    return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
  }
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  auto before = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, V) : V;
  std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
  order.resize(static_cast<size_t>(k));

  // Softmax of logits / temperature over the candidates, in double, from the largest.
  std::vector<double> p(order.size());
  const double top = logits[order[0]];
  double total = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    p[i] = std::exp((static_cast<double>(logits[order[i]]) - top) / o.temperature);
    total += p[i];
  }
  if (o.top_p < 1.0) {
    // Note [Sampling draws]: the fewest best candidates holding top_p of the mass.
    const double need = o.top_p * total;
    double kept = 0;
    size_t m = 0;
    while (m < p.size() && kept < need) kept += p[m++];
    p.resize(m);
    total = kept;
  }
  const double u = uniform_draw(o.seed, position, s) * total;
  double acc = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    acc += p[i];
    if (u < acc) return order[i];
  }
  return order[p.size() - 1];  // u within rounding of total
}

}  // namespace

std::vector<std::vector<int32_t>> sample_batch(models::CausalLM& model,
                                               const std::vector<int32_t>& prompt,
                                               const SampleOptions& o, int64_t num_samples) {
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
  // Every row's sequence: the prompt, then its draws (a stopped row keeps drawing, unused).
  std::vector<std::vector<int64_t>> seq(B, std::vector<int64_t>(prompt.begin(), prompt.end()));
  std::vector<std::vector<int32_t>> out(B);
  std::vector<bool> stopped(B, false);
  size_t running = B;
  const int64_t window = model.max_seq_len();
  // Where the model's parameters are (the GPU in a `train` run with run.device: cuda).
  const Device device =
      model.flat_units().empty() ? Device::cpu() : model.flat_units().front().params.device();
  // Note [Cached sampling].
  const bool cached = o.kv_cache && model.supports_kv_cache();
  models::KvCache cache;
  for (int64_t i = 0; i < o.max_new_tokens && running > 0; ++i) {
    const auto n = static_cast<int64_t>(seq[0].size());  // every row has the same length
    // The tokens this step runs: the last T of each row (with the cache, those it does not hold).
    int64_t T = std::min<int64_t>(n, window);
    if (cached) {
      if (n > window) {
        cache.clear();  // past the context: a fresh window
      } else {
        T = n - cache.length();
      }
    }
    std::vector<int64_t> ctx;
    ctx.reserve(B * static_cast<size_t>(T));
    for (const std::vector<int64_t>& row : seq) ctx.insert(ctx.end(), row.end() - T, row.end());
    tensor::Tensor ids = tensor::from_ints(ctx, {num_samples, T}, DType::I32);
    if (!device.is_cpu()) ids = ids.to(device);
    autograd::Variable logits = cached ? model.forward_cached(ids, cache) : model.forward(ids);
    // [B, T, padded_vocab] -> each row's last position, as contiguous fp32 on the host.
    tensor::Tensor last = logits.data().select(1, T - 1).narrow(1, 0, V);
    tensor::Tensor rows = last.to(Device::cpu()).to(DType::F32).contiguous();
    for (size_t s = 0; s < B; ++s) {
      const int32_t next = choose(rows.data<float>() + s * static_cast<size_t>(V), V, o, n,
                                  o.first_sample + static_cast<int64_t>(s));
      seq[s].push_back(next);
      if (stopped[s]) continue;
      out[s].push_back(next);
      if (o.stop_token >= 0 && next == o.stop_token) {
        stopped[s] = true;
        --running;
      }
    }
  }
  return out;
}

std::vector<int32_t> sample(models::CausalLM& model, const std::vector<int32_t>& prompt,
                            const SampleOptions& o) {
  return std::move(sample_batch(model, prompt, o, 1).front());
}

}  // namespace strata::tools
