// Note [Deferred initialisation] (models/nn/module.h): a model built inside a DeferredInitScope
// holds no parameter bytes, and init_unit gives each unit, alone, the bits of the whole build:
// GPT-2 (tied head, padded vocabulary rows) and LLaMA (untied head), in any unit order.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "models/gpt2/gpt2.h"
#include "models/llama/llama.h"
#include "offload/memory_stats.h"

namespace strata::models {
namespace {

using offload::Category;
using offload::MemoryStats;
using offload::Tier;

// Units are initialised in reverse order: nothing may depend on what was drawn before.
void expect_unit_by_unit_equals_whole(CausalLM& whole, CausalLM& deferred) {
  ASSERT_FALSE(whole.built_deferred());
  ASSERT_TRUE(deferred.built_deferred());
  std::vector<FlatUnit>& a = whole.flat_units();
  std::vector<FlatUnit>& b = deferred.flat_units();
  ASSERT_EQ(a.size(), b.size());
  for (const FlatUnit& u : b) {
    EXPECT_TRUE(u.params.storage()->is_released()) << u.name;
    EXPECT_TRUE(u.grads.storage()->is_released()) << u.name;
  }
  for (int u = static_cast<int>(b.size()) - 1; u >= 0; --u) {
    SCOPED_TRACE(b[u].name);
    ASSERT_EQ(a[u].names, b[u].names);
    ASSERT_EQ(a[u].size(), b[u].size());
    const int64_t before = MemoryStats::global().usage(Tier::Host, Category::Param).current;
    deferred.init_unit(u);
    // Exactly the unit's buffer came into existence.
    EXPECT_EQ(MemoryStats::global().usage(Tier::Host, Category::Param).current - before,
              static_cast<int64_t>(b[u].params.nbytes()));
    EXPECT_EQ(std::memcmp(a[u].params.data_ptr(), b[u].params.data_ptr(), a[u].params.nbytes()), 0);
    // The variables view the unit's buffer: what the model computes with.
    for (size_t k = 0; k < b[u].variables.size(); ++k)
      EXPECT_EQ(b[u].variables[k].data().data_ptr(),
                static_cast<float*>(b[u].params.data_ptr()) + b[u].offsets[k])
          << b[u].names[k];
  }
}

TEST(DeferredInit, Gpt2UnitByUnitIsTheWholeBuild) {
  gpt2::GPT2Config c = gpt2::preset("gpt2-tiny");
  c.vocab_size = 250;  // padded rows of wte are zeroed by finish_unit_init
  c.padded_vocab_size = 256;
  gpt2::GPT2 whole(c, 7);
  const int64_t before = MemoryStats::global().usage(Tier::Host, Category::Param).current;
  nn::DeferredInitScope scope;
  gpt2::GPT2 deferred(c, 7);
  EXPECT_EQ(MemoryStats::global().usage(Tier::Host, Category::Param).current, before);
  expect_unit_by_unit_equals_whole(whole, deferred);
}

TEST(DeferredInit, LlamaUnitByUnitIsTheWholeBuild) {
  llama::LlamaConfig c = llama::preset("llama-tiny");
  c.tie_word_embeddings = false;
  c.padded_vocab_size = c.vocab_size + 16;
  llama::Llama whole(c, 11);
  std::unique_ptr<llama::Llama> deferred;
  {
    nn::DeferredInitScope scope;
    deferred = std::make_unique<llama::Llama>(c, 11);
  }
  EXPECT_FALSE(nn::DeferredInitScope::active());
  expect_unit_by_unit_equals_whole(whole, *deferred);
}

}  // namespace
}  // namespace strata::models
