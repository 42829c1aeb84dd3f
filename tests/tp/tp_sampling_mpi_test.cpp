// The KV-cached forward and sampling under tensor parallelism, on CPU ranks (tp = the world size):
// each rank caches its own heads (GPT-2; LLaMA with grouped-query attention, its own k/v heads),
// sequence parallelism is paused for decoding (Note [Decoding without sequence parallelism]), and
// the gathered logits of every cached step match the single-process model's uncached forward;
// sample_batch draws the single-process model's tokens on every rank (Note [Sampling over
// ranks]). Every rank builds the single-process model itself as its reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "autograd/comm_functions.h"
#include "autograd/functions.h"
#include "models/gpt2/gpt2.h"
#include "models/llama/llama.h"
#include "sampling/sampler.h"
#include "tensor/ops.h"
#include "tests/support/mpi_test_env.h"

namespace strata::models {
namespace {

using tensor::Tensor;

constexpr int64_t kCtx = 24, kVocab = 64;
constexpr uint64_t kSeed = 777;

std::unique_ptr<CausalLM> make_model(const std::string& family, const nn::TensorParallel& tp) {
  if (family == "gpt2") {
    gpt2::GPT2Config c;
    c.dropout = 0.f;
    c.vocab_size = c.padded_vocab_size = kVocab;
    c.n_positions = kCtx;
    c.n_embd = 32;
    c.n_layer = 2;
    c.n_head = 4;
    return std::make_unique<gpt2::GPT2>(c, kSeed, tp);
  }
  llama::LlamaConfig c = llama::preset("llama-tiny");
  c.vocab_size = c.padded_vocab_size = kVocab;
  c.max_position_embeddings = kCtx;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;  // grouped-query attention: each rank caches its own k/v heads
  return std::make_unique<llama::Llama>(c, kSeed, tp);
}

// The same prompt on every rank.
std::vector<int64_t> prompt_ids(int64_t n) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back((7 * i + 3) % kVocab);
  return v;
}

struct Layout {
  std::string family;
  bool sp;
};

std::string name_of(const Layout& l) {
  return l.family + (l.sp ? " sp" : "");
}

// Note [KV cache] under tensor parallelism: a 5-token prefill, then single tokens and a 3-token
// chunk; each step's logits, gathered over the group, against the single-process model's
// uncached forward over the whole prefix. The bound: at tp = 1 the cached and uncached forwards
// agree to 1e-5 (tests/models/kv_cache_test.cpp: only the matmul and attention shapes differ);
// tensor parallelism adds one reordered sum of tp partials per row-parallel output and per
// vocabulary-parallel embedding, each off by at most (tp - 1) * 2^-24 of the partials' magnitude
// (below 1e-6 for activations of order 1 here), so 1e-5 absolute plus 1e-5 relative still holds.
TEST(TpSampling, CachedStepsMatchTheUncachedForward) {
  auto world = strata::testing::test_world();
  for (const Layout& l : {Layout{"gpt2", false}, Layout{"gpt2", true}, Layout{"llama", false},
                          Layout{"llama", true}}) {
    const nn::TensorParallel tp{world, l.sp};
    std::unique_ptr<CausalLM> sharded = make_model(l.family, tp);
    std::unique_ptr<CausalLM> whole = make_model(l.family, nn::TensorParallel{});
    sharded->eval();
    whole->eval();
    autograd::NoGradGuard no_grad;
    const std::vector<int64_t> ids = prompt_ids(12);
    const std::vector<int64_t> steps{5, 1, 1, 3, 1, 1};  // 12 tokens
    KvCache cache;
    int64_t at = 0;
    double worst = 0;
    for (int64_t n : steps) {
      const Tensor chunk = tensor::from_ints(
          std::vector<int64_t>(ids.begin() + at, ids.begin() + at + n), {1, n}, DType::I32);
      const Tensor local = sharded->forward_cached(chunk, cache).data();  // [1, n, V / tp]
      ASSERT_EQ(local.size(2), kVocab / world->size()) << name_of(l);
      const Tensor got =
          autograd::gather_from_tp_region(autograd::Variable(local.contiguous()), tp.group).data();
      const Tensor prefix = tensor::from_ints(
          std::vector<int64_t>(ids.begin(), ids.begin() + at + n), {1, at + n}, DType::I32);
      const Tensor want = whole->forward(prefix).data().narrow(1, at, n);
      const double diff = tensor::max_abs_diff(got, want);
      const double scale = tensor::max_abs_diff(want, tensor::zeros(want.shape()));
      EXPECT_LE(diff, 1e-5 + 1e-5 * scale)
          << name_of(l) << ": positions " << at << ".." << at + n - 1;
      worst = std::max(worst, diff);
      at += n;
      EXPECT_EQ(cache.length(), at);
    }
    // Each rank holds its own heads: H / tp (GPT-2) or KV / tp (LLaMA) per slot.
    EXPECT_EQ(cache.layers(), 2);
    if (world->rank() == 0)
      std::printf("[tp %d, %s] cached vs uncached logits, worst |delta| %.3g\n", world->size(),
                  name_of(l).c_str(), worst);
  }
}

// Note [Sampling over ranks]: every rank draws the single-process model's tokens, with the cache
// and without it, and past the context (the window restarts).
TEST(TpSampling, SamplesMatchOneProcess) {
  auto world = strata::testing::test_world();
  for (const Layout& l : {Layout{"gpt2", true}, Layout{"llama", false}}) {
    std::unique_ptr<CausalLM> sharded = make_model(l.family, nn::TensorParallel{world, l.sp});
    std::unique_ptr<CausalLM> whole = make_model(l.family, nn::TensorParallel{});
    sampling::SampleOptions o;
    o.max_new_tokens = kCtx + 6;  // past the context
    o.temperature = 1.0;
    o.top_k = 0;
    o.seed = 11;
    const std::vector<int32_t> prompt{1, 2, 3};
    for (bool cached : {true, false}) {
      o.kv_cache = cached;
      const auto want = sampling::sample_batch(*whole, prompt, o, 3);
      const auto got = sampling::sample_batch(*sharded, prompt, o, 3);
      EXPECT_EQ(got, want) << name_of(l) << (cached ? " cached" : " uncached");
      // The draws are not all alike: the comparison can tell.
      EXPECT_NE(want[0], want[1]) << name_of(l);
    }
  }
}

}  // namespace
}  // namespace strata::models
