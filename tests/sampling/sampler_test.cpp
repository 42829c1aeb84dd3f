// Sampling (sampling/sampler.h): greedy equals the argmax of a full forward, draws are a
// function of (seed, position) only, top_k 1 is greedy, the model's mode and the training
// generator are left alone; the KV cache (Note [Cached sampling]) draws the tokens of the
// uncached sampler; a batch's samples are the single samples of their index (Note [Batched
// sampling]), each stopping on its own.
#include "sampling/sampler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include "autograd/rng_context.h"
#include "models/registry.h"
#include "tensor/ops.h"

namespace strata::sampling {
namespace {

std::unique_ptr<models::CausalLM> make_model(uint64_t seed = 3) {
  models::ModelOptions o;
  o.seed = seed;
  // Padded vocabulary (61 -> 64) and dropout: sampling must ignore both.
  o.overrides = {{"vocab_size", "61"}, {"n_positions", "12"}, {"n_embd", "32"},
                 {"n_layer", "2"},     {"n_head", "4"},       {"dropout", "0.2"}};
  return models::ModelRegistry::global().create("gpt2-tiny", o);
}

std::unique_ptr<models::CausalLM> make_llama() {
  models::ModelOptions lo;
  lo.seed = 4;
  lo.overrides = {{"vocab_size", "61"},         {"max_position_embeddings", "12"},
                  {"hidden_size", "32"},        {"intermediate_size", "40"},
                  {"num_hidden_layers", "2"},   {"num_attention_heads", "4"},
                  {"num_key_value_heads", "2"}, {"initializer_range", "0.2"}};
  return models::ModelRegistry::global().create("llama-tiny", lo);
}

// The argmax over logits[:vocab_size] at every position of one full forward.
std::vector<int32_t> argmax_per_position(models::CausalLM& m, const std::vector<int32_t>& seq) {
  autograd::NoGradGuard no_grad;
  m.eval();
  std::vector<int64_t> ids(seq.begin(), seq.end());
  const int64_t T = static_cast<int64_t>(ids.size());
  tensor::Tensor logits = m.forward(tensor::from_ints(ids, {1, T})).data();
  std::vector<float> v = tensor::to_float_vector(logits);
  const int64_t Vp = m.padded_vocab_size(), V = m.vocab_size();
  std::vector<int32_t> out;
  for (int64_t t = 0; t < T; ++t) {
    const float* row = v.data() + t * Vp;
    out.push_back(static_cast<int32_t>(std::max_element(row, row + V) - row));
  }
  return out;
}

TEST(Sampler, GreedyReproducesTheArgmaxOfAFullForward) {
  auto m = make_model();
  const std::vector<int32_t> prompt{5, 17, 42};
  SampleOptions o;
  o.max_new_tokens = 9;  // 3 + 9 = 12 = max_seq_len: one window holds everything
  o.temperature = 0.0;
  std::vector<int32_t> gen = sample(*m, prompt, o);
  ASSERT_EQ(gen.size(), 9u);
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), gen.begin(), gen.end() - 1);
  std::vector<int32_t> argmax = argmax_per_position(*m, seq);
  for (size_t i = 0; i < gen.size(); ++i)
    EXPECT_EQ(gen[i], argmax[prompt.size() - 1 + i]) << "token " << i;
  for (int32_t t : gen) EXPECT_LT(t, 61) << "padding columns are not tokens";
}

TEST(Sampler, SlidesTheWindowBeyondTheContext) {
  auto m = make_model();
  SampleOptions o;
  o.max_new_tokens = 20;  // well past n_positions = 12
  o.temperature = 0.0;
  std::vector<int32_t> prompt{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
  std::vector<int32_t> gen = sample(*m, prompt, o);
  ASSERT_EQ(gen.size(), 20u);
  // The last token is the argmax over the final 12-token window.
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), gen.begin(), gen.end() - 1);
  std::vector<int32_t> window(seq.end() - 12, seq.end());
  EXPECT_EQ(gen.back(), argmax_per_position(*m, window).back());
}

TEST(Sampler, SameSeedSameTokensAndTopK1IsGreedy) {
  auto m = make_model();
  const std::vector<int32_t> prompt{7, 8};
  SampleOptions o;
  o.max_new_tokens = 24;
  o.temperature = 1.0;
  o.top_k = 0;
  o.seed = 11;
  std::vector<int32_t> a = sample(*m, prompt, o);
  // Draws in between (training generator, another sampling run) change nothing.
  autograd::current_generator().next_key();
  SampleOptions other = o;
  other.seed = 12;
  std::vector<int32_t> c = sample(*m, prompt, other);
  EXPECT_EQ(sample(*m, prompt, o), a);
  EXPECT_NE(c, a) << "a different seed should give a different 24-token sample";
  o.top_k = 5;
  EXPECT_NE(sample(*m, prompt, o), a);  // sanity: options matter

  SampleOptions greedy = o;
  greedy.temperature = 0.0;
  SampleOptions top1 = o;
  top1.top_k = 1;
  top1.temperature = 1.5;
  EXPECT_EQ(sample(*m, prompt, top1), sample(*m, prompt, greedy));
}

// With and without the KV cache the same tokens come out, for GPT-2 and LLaMA, greedy and drawn,
// with the sequence running past the context (the cache then restarts a window every step).
TEST(Sampler, TheKvCacheDrawsTheUncachedTokens) {
  std::vector<std::unique_ptr<models::CausalLM>> models;
  models.push_back(make_model());
  models.push_back(make_llama());
  for (auto& m : models) {
    ASSERT_TRUE(m->supports_kv_cache()) << m->family();
    for (double temperature : {0.0, 1.0}) {
      SampleOptions o;
      o.max_new_tokens = 20;  // 3 + 20 > 12: past the context
      o.temperature = temperature;
      o.top_k = 0;
      o.seed = 5;
      SampleOptions uncached = o;
      uncached.kv_cache = false;
      const std::vector<int32_t> a = sample(*m, {9, 4, 33}, o);
      EXPECT_EQ(a, sample(*m, {9, 4, 33}, uncached)) << m->family() << " at " << temperature;
      EXPECT_EQ(a.size(), 20u);
      // Not a constant stream, so the comparison has something to find (GPT-2's small init
      // makes its greedy stream one token; LLaMA's init is raised to 0.2 above).
      if (temperature > 0 || m->family() == "llama") {
        EXPECT_GT(std::set<int32_t>(a.begin(), a.end()).size(), 2u) << m->family();
      }
    }
  }
}

// Row s of a batch is sample s drawn alone (first_sample s, a batch of one), whatever the batch's
// size: with and without the cache, past the context too; the rows draw apart; first_sample
// shifts a batch's rows.
TEST(Sampler, ABatchsRowsAreTheSamplesOfTheirIndex) {
  std::vector<std::unique_ptr<models::CausalLM>> models;
  models.push_back(make_model());
  models.push_back(make_llama());
  for (auto& m : models) {
    for (bool kv_cache : {true, false}) {
      SampleOptions o;
      o.max_new_tokens = 14;  // 3 + 14 > 12: past the context
      o.temperature = 1.0;
      o.top_k = 0;
      o.seed = 5;
      o.kv_cache = kv_cache;
      const std::vector<int32_t> prompt{9, 4, 33};
      const std::vector<std::vector<int32_t>> four = sample_batch(*m, prompt, o, 4);
      ASSERT_EQ(four.size(), 4u);
      for (size_t s = 0; s < 4; ++s) {
        EXPECT_EQ(four[s].size(), 14u);
        SampleOptions alone = o;
        alone.first_sample = static_cast<int64_t>(s);
        EXPECT_EQ(four[s], sample(*m, prompt, alone))
            << m->family() << " cache " << kv_cache << " row " << s;
      }
      EXPECT_EQ(std::set<std::vector<int32_t>>(four.begin(), four.end()).size(), 4u)
          << m->family() << ": four different samples";
      SampleOptions shifted = o;
      shifted.first_sample = 2;
      EXPECT_EQ(sample_batch(*m, prompt, shifted, 2),
                std::vector<std::vector<int32_t>>(four.begin() + 2, four.end()))
          << m->family() << " cache " << kv_cache;
      SampleOptions other = o;
      other.kv_cache = !kv_cache;
      EXPECT_EQ(sample_batch(*m, prompt, other, 4), four) << m->family();
    }
  }
}

// A row that emits the stop token ends there and leaves the batch (later forwards run fewer
// rows, with and without the cache; the first runs the shared prompt once); the others go on as
// without it.
TEST(Sampler, EachRowOfABatchStopsOnItsOwn) {
  auto m = make_llama();
  SampleOptions o;
  o.max_new_tokens = 8;
  o.temperature = 1.0;
  o.top_k = 0;
  o.seed = 2;
  const std::vector<int32_t> prompt{1, 2};
  const std::vector<std::vector<int32_t>> unstopped = sample_batch(*m, prompt, o, 3);
  o.stop_token = unstopped.at(1).at(2);  // row 1 stops at its third token, if not sooner
  for (bool kv_cache : {true, false}) {
    SCOPED_TRACE(kv_cache ? "cached" : "uncached");
    o.kv_cache = kv_cache;
    // The rows each forward runs: a stopped row leaves the batch.
    std::vector<int64_t> rows_run;
    const models::nn::HookHandle hook = m->register_forward_pre_hook(
        [&](models::nn::Module&, const std::vector<autograd::Variable>& in) {
          rows_run.push_back(in.at(0).data().size(0));
        });
    const std::vector<std::vector<int32_t>> stopped = sample_batch(*m, prompt, o, 3);
    m->remove_hook(hook);
    ASSERT_EQ(stopped.size(), 3u);
    size_t shorter = 0;
    std::vector<int64_t> want_rows;  // per step, the rows that had not stopped before it
    for (size_t s = 0; s < 3; ++s) {
      const auto first = std::find(unstopped[s].begin(), unstopped[s].end(), o.stop_token);
      const std::vector<int32_t> want(unstopped[s].begin(),
                                      first == unstopped[s].end() ? first : first + 1);
      EXPECT_EQ(stopped[s], want) << "row " << s;
      shorter += want.size() < unstopped[s].size() ? 1 : 0;
      if (want_rows.size() < want.size()) want_rows.resize(want.size(), 0);
      for (size_t i = 0; i < want.size(); ++i) ++want_rows[i];
    }
    EXPECT_GE(shorter, 1u);
    EXPECT_LE(stopped[1].size(), 3u);
    want_rows.at(0) = 1;  // the first step runs the prompt once for every row
    EXPECT_EQ(rows_run, want_rows);
    EXPECT_LT(*std::min_element(rows_run.begin(), rows_run.end()), 3);
  }
  o.kv_cache = true;
  EXPECT_THROW(sample_batch(*m, prompt, o, 0), UserError);
  o.first_sample = -1;
  EXPECT_THROW(sample_batch(*m, prompt, o, 1), UserError);
}

// The logits over the 61 tokens after the one-token prompt {token}.
std::vector<float> first_logits(models::CausalLM& m, int32_t token) {
  autograd::NoGradGuard no_grad;
  const bool was_training = m.is_training();
  m.eval();
  std::vector<float> logits =
      tensor::to_float_vector(m.forward(tensor::from_ints({token}, {1, 1})).data());
  m.train(was_training);
  logits.resize(61);
  return logits;
}

// Token ids from the largest logit down.
std::vector<int32_t> best_first(const std::vector<float>& logits) {
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  return order;
}

TEST(Sampler, TopKRestrictsTheDrawsToTheKBestTokens) {
  auto m = make_model();
  const std::vector<int32_t> prompt{3};
  SampleOptions o;
  o.max_new_tokens = 1;
  o.temperature = 5.0;  // nearly flat: without the cut, draws would spread over the vocabulary
  o.top_k = 3;
  const std::vector<float> logits = first_logits(*m, 3);
  const std::vector<int32_t> order = best_first(logits);
  std::set<int32_t> seen;
  for (uint64_t seed = 0; seed < 60; ++seed) {
    o.seed = seed;
    int32_t t = sample(*m, prompt, o).at(0);
    EXPECT_TRUE(t == order[0] || t == order[1] || t == order[2]) << t;
    seen.insert(t);
  }
  EXPECT_EQ(seen.size(), 3u) << "at temperature 5 all three candidates should come up";
}

// The nucleus: at top_p 0.5 every draw is among the fewest best tokens holding half the
// probability (at the temperature), and more than one of them comes up; a tiny top_p is greedy.
TEST(Sampler, TopPRestrictsTheDrawsToTheNucleus) {
  auto m = make_llama();  // initializer_range 0.2: logits spread enough for a small nucleus
  const std::vector<int32_t> prompt{3};
  SampleOptions o;
  o.max_new_tokens = 1;
  o.temperature = 1.5;
  o.top_k = 0;
  o.top_p = 0.5;
  const std::vector<float> logits = first_logits(*m, 3);
  const std::vector<int32_t> order = best_first(logits);
  std::vector<double> p;
  double total = 0;
  for (int32_t t : order) {
    p.push_back(std::exp((logits[t] - logits[order[0]]) / o.temperature));
    total += p.back();
  }
  std::set<int32_t> nucleus;
  for (double mass = 0; mass < 0.5 * total;) {
    mass += p[nucleus.size()];
    nucleus.insert(order[nucleus.size()]);
  }
  ASSERT_GE(nucleus.size(), 2u);
  ASSERT_LE(nucleus.size(), 20u) << "the cut should leave out most of the 61 tokens";
  std::set<int32_t> seen;
  for (uint64_t seed = 0; seed < 80; ++seed) {
    o.seed = seed;
    const int32_t t = sample(*m, prompt, o).at(0);
    EXPECT_TRUE(nucleus.contains(t))
        << t << " is outside the " << nucleus.size() << "-token nucleus";
    seen.insert(t);
  }
  EXPECT_GE(seen.size(), 2u);

  SampleOptions tiny = o;
  tiny.max_new_tokens = 10;
  tiny.top_p = 1e-9;
  SampleOptions greedy = tiny;
  greedy.temperature = 0.0;
  EXPECT_EQ(sample(*m, prompt, tiny), sample(*m, prompt, greedy));
}

// Note [Sampling draws] done the plain way: the whole vocabulary sorted best first (ties to the
// smaller id), the first top_k kept, their weights' total summed in id order, top-p's prefix
// summed best first, the inverse-CDF walk best first.
int32_t full_sort_choice(const std::vector<float>& l, const SampleOptions& o, int64_t position,
                         int64_t sample) {
  if (o.temperature == 0.0)
    return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
  std::vector<int32_t> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  const size_t k = o.top_k > 0 ? std::min(static_cast<size_t>(o.top_k), l.size()) : l.size();
  order.resize(k);
  auto w = [&](int32_t t) {
    return std::exp((static_cast<double>(l[t]) - static_cast<double>(l[order[0]])) / o.temperature);
  };
  std::vector<int32_t> ids = order;
  std::sort(ids.begin(), ids.end());
  double total = 0;
  for (int32_t t : ids) total += w(t);
  size_t limit = k;
  if (o.top_p < 1.0) {
    double kept = 0;
    size_t m = 0;
    while (m < k && kept < o.top_p * total) kept += w(order[m++]);
    limit = m;
    total = kept;
  }
  const double u = detail::uniform_draw(o.seed, position, sample) * total;
  double acc = 0;
  for (size_t i = 0; i < limit; ++i) {
    acc += w(order[i]);
    if (u < acc) return order[i];
  }
  return order[limit - 1];
}

// Note [Sampling cost]: the draw that sorts only what it reaches picks the full sort's token, for
// vocabularies of 1 to GPT-2's 50257, logits with many ties or spread wide, peaked or flat
// (temperature 0.3 to 20: a flat one walks deep into the candidates, past several sorted
// chunks), every kind of top-k (none, 1, within one chunk, just past it, large) and top-p.
TEST(Sampler, TheDrawPicksTheFullSortsToken) {
  std::mt19937 gen(7);
  int compared = 0;
  std::set<int32_t> deep;  // picks past the first sorted chunk
  for (size_t V : {size_t{1}, size_t{7}, size_t{100}, size_t{3000}, size_t{50257}}) {
    for (bool ties : {false, true}) {
      std::normal_distribution<float> normal(0.0f, 2.0f);
      std::vector<float> l(V);
      for (float& x : l) x = ties ? std::round(normal(gen)) * 0.5f : normal(gen);
      for (double temperature : {0.3, 1.0, 20.0}) {
        for (int64_t top_k : {0, 1, 40, 64, 65, 700}) {
          for (double top_p : {1.0, 0.95, 0.3}) {
            SampleOptions o;
            o.temperature = temperature;
            o.top_k = top_k;
            o.top_p = top_p;
            const int draws = V > 10000 ? 2 : 6;
            for (int d = 0; d < draws; ++d) {
              o.seed = gen();
              const int64_t position = d * 11, sample = d % 3;
              const int32_t got = detail::choose_token(l, o, position, sample);
              ASSERT_EQ(got, full_sort_choice(l, o, position, sample))
                  << "V " << V << " ties " << ties << " T " << temperature << " top_k " << top_k
                  << " top_p " << top_p << " draw " << d;
              ++compared;
              std::vector<int32_t> better;
              for (size_t t = 0; t < V; ++t)
                if (l[t] > l[got] || (l[t] == l[got] && static_cast<int32_t>(t) < got))
                  better.push_back(static_cast<int32_t>(t));
              if (better.size() >= 64) deep.insert(got);
            }
          }
        }
      }
    }
  }
  EXPECT_GT(compared, 1000);
  EXPECT_GT(deep.size(), 10u) << "some draws should reach past the first sorted chunk";
}

// Note [Device candidates]: drawing from a row's top candidates (tensor::top_k, as a device
// would pick them) gives choose_token's token from the whole row, for greedy and every top-k the
// device path takes (1, within and past the sorted chunks, its limit), with and without the
// nucleus, on logits with many ties and spread wide, peaked and flat.
TEST(Sampler, DrawingFromTheTopCandidatesPicksTheWholeRowsToken) {
  std::mt19937 gen(8);
  int compared = 0, differ_from_best = 0;
  for (size_t V : {size_t{2}, size_t{100}, size_t{3000}, size_t{50257}}) {
    for (bool ties : {false, true}) {
      std::normal_distribution<float> normal(0.0f, 2.0f);
      std::vector<float> l(V);
      for (float& x : l) x = ties ? std::round(normal(gen)) * 0.5f : normal(gen);
      const tensor::Tensor row = tensor::from_vector(l, {1, static_cast<int64_t>(V)});
      for (double temperature : {0.0, 0.3, 1.0, 20.0}) {
        for (int64_t top_k : {int64_t{1}, int64_t{2}, int64_t{40}, int64_t{65}, int64_t{700},
                              detail::kDeviceCandidates}) {
          SampleOptions o;
          o.temperature = temperature;
          o.top_k = top_k;
          const int64_t k = detail::device_candidates(o, static_cast<int64_t>(V), Device::cuda(0));
          if (temperature == 0.0) {
            ASSERT_EQ(k, 1);
          } else if (top_k >= static_cast<int64_t>(V)) {
            ASSERT_EQ(k, 0);  // no cut: the whole row comes to the host
            continue;
          } else {
            ASSERT_EQ(k, top_k);
          }
          const tensor::TopKResult top = tensor::top_k(row, k);
          const std::vector<float> values = tensor::to_float_vector(top.values);
          const std::vector<int64_t> ids = tensor::to_int_vector(top.indices);
          for (double top_p : {1.0, 0.95, 0.3}) {
            o.top_p = top_p;
            for (int d = 0; d < 4; ++d) {
              o.seed = gen();
              const int64_t position = d * 13 + 1, sample = d % 3;
              const int32_t want = detail::choose_token(l, o, position, sample);
              ASSERT_EQ(detail::choose_from_candidates(values, ids, o, position, sample), want)
                  << "V " << V << " ties " << ties << " T " << temperature << " top_k " << top_k
                  << " top_p " << top_p << " draw " << d;
              ++compared;
              if (want != ids[0]) ++differ_from_best;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(compared, 500);
  EXPECT_GT(differ_from_best, 100) << "most draws at temperature > 0 should not be the best token";
  // The CPU, no cut and cuts past the device's limit keep the whole-row draw.
  SampleOptions o;
  o.temperature = 1.0;
  o.top_k = 40;
  EXPECT_EQ(detail::device_candidates(o, 50257, Device::cpu()), 0);
  EXPECT_EQ(detail::device_candidates(o, 50257, Device::cuda(0)), 40);
  o.top_k = 0;
  EXPECT_EQ(detail::device_candidates(o, 50257, Device::cuda(0)), 0);
  o.top_k = detail::kDeviceCandidates + 1;
  EXPECT_EQ(detail::device_candidates(o, 50257, Device::cuda(0)), 0);
  o.temperature = 0.0;
  EXPECT_EQ(detail::device_candidates(o, 50257, Device::cpu()), 0);
  EXPECT_EQ(detail::device_candidates(o, 50257, Device::cuda(0)), 1);
}

// A model whose weights are not finite (a diverged run) has NaN logits: there is nothing to draw
// from, so every kind of draw is a UserError that says so, on either path to the host (the whole
// rows here; the device's candidates in GpuSampler). Before, a nucleus over NaN weights kept no
// candidate and the draw returned order[limit - 1] with limit 0, and the selection sorted with a
// comparator NaN breaks: no error, and tokens read from outside the candidates.
TEST(Sampler, NonFiniteLogitsAreAClearError) {
  auto m = make_model();
  m->flat_units().back().params.fill_(std::nan(""));
  for (double temperature : {0.0, 1.0}) {
    for (double top_p : {1.0, 0.9}) {
      for (int64_t top_k : {0, 5}) {
        SampleOptions o;
        o.max_new_tokens = 3;
        o.temperature = temperature;
        o.top_p = top_p;
        o.top_k = top_k;
        try {
          sample_batch(*m, {1, 2}, o, 2);
          ADD_FAILURE() << "no error at T " << temperature << " top_p " << top_p;
        } catch (const UserError& e) {
          EXPECT_THAT(e.what(), ::testing::HasSubstr("not finite")) << e.what();
        }
      }
    }
  }
  // +inf: the best token of a greedy draw, but no weight at a temperature (exp(inf - inf)).
  std::vector<float> l{0.f, 1.f, INFINITY, 2.f};
  EXPECT_TRUE(detail::drawable(l, 0.0));
  EXPECT_FALSE(detail::drawable(l, 1.0));
  l[2] = std::nan("");
  EXPECT_FALSE(detail::drawable(l, 0.0));
  l[2] = -INFINITY;  // a masked token: weight 0
  EXPECT_TRUE(detail::drawable(l, 1.0));
}

TEST(Sampler, RestoresTrainModeStopsAtTheStopTokenAndValidates) {
  auto m = make_model();
  ASSERT_TRUE(m->is_training());
  SampleOptions o;
  o.max_new_tokens = 5;
  o.temperature = 0.0;
  std::vector<int32_t> gen = sample(*m, {1, 2}, o);
  EXPECT_TRUE(m->is_training());
  m->eval();
  sample(*m, {1, 2}, o);
  EXPECT_FALSE(m->is_training());

  o.stop_token = gen.at(1);
  std::vector<int32_t> stopped = sample(*m, {1, 2}, o);
  const size_t first = static_cast<size_t>(std::find(gen.begin(), gen.end(), gen[1]) - gen.begin());
  EXPECT_EQ(stopped, std::vector<int32_t>(gen.begin(), gen.begin() + first + 1));

  o.stop_token = -1;
  EXPECT_THROW(sample(*m, {}, o), UserError);
  EXPECT_THROW(sample(*m, {61}, o), UserError);
  EXPECT_THROW(sample(*m, {-1}, o), UserError);
  SampleOptions bad = o;
  bad.temperature = -1;
  EXPECT_THROW(sample(*m, {1}, bad), UserError);
  bad = o;
  bad.top_k = -2;
  EXPECT_THROW(sample(*m, {1}, bad), UserError);
  for (double top_p : {0.0, -0.5, 1.5, std::nan("")}) {
    bad = o;
    bad.top_p = top_p;
    EXPECT_THROW(sample(*m, {1}, bad), UserError) << top_p;
  }
  bad = o;
  bad.max_new_tokens = 0;
  EXPECT_TRUE(sample(*m, {1}, bad).empty());
}

}  // namespace
}  // namespace strata::sampling
