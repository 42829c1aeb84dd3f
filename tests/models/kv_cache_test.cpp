// KV-cached forward (Note [KV cache]): logits of tokens fed a few at a time through
// CausalLM::forward_cached equal the full forward's rows at those positions (GPT-2 and LLaMA with
// grouped k/v heads, tied and untied, fused ops on and off); what the cache refuses; a failed
// forward leaves it as it was; dropping rows from a filled cache (keep_rows) and repeating them
// (repeat_rows); the last position's logits alone (last_only).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "autograd/variable.h"
#include "core/error.h"
#include "core/rng.h"
#include "model_test_util.h"
#include "models/gpt2/attention.h"
#include "models/kv_cache.h"
#include "models/nn/embedding.h"
#include "models/nn/fused_ops.h"
#include "models/nn/linear.h"
#include "models/registry.h"
#include "tensor/ops.h"

namespace strata::models {
namespace {

std::unique_ptr<CausalLM> make(const std::string& name,
                               const std::map<std::string, std::string>& overrides) {
  ModelOptions o;
  o.seed = 5;
  o.overrides = overrides;
  std::unique_ptr<CausalLM> m = ModelRegistry::global().create(name, o);
  m->eval();
  return m;
}

std::unique_ptr<CausalLM> gpt2() {
  // Padded vocabulary (61 -> 64) and dropout (off in eval mode).
  return make("gpt2-tiny", {{"vocab_size", "61"},
                            {"n_positions", "24"},
                            {"n_embd", "32"},
                            {"n_layer", "3"},
                            {"n_head", "4"},
                            {"dropout", "0.1"}});
}

std::unique_ptr<CausalLM> llama(bool tied) {
  // 4 query heads over 2 k/v heads (Note [Grouped-query attention]).
  return make("llama-tiny", {{"vocab_size", "61"},
                             {"max_position_embeddings", "24"},
                             {"hidden_size", "32"},
                             {"intermediate_size", "48"},
                             {"num_hidden_layers", "3"},
                             {"num_attention_heads", "4"},
                             {"num_key_value_heads", "2"},
                             {"tie_word_embeddings", tied ? "true" : "false"}});
}

tensor::Tensor random_ids(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < B * T; ++i)
    v.push_back(static_cast<int64_t>(philox4x32({seed, 0}, static_cast<uint64_t>(i))[0] %
                                     static_cast<uint32_t>(vocab)));
  return tensor::from_ints(v, {B, T}, DType::I32);
}

// Feeds ids [B, T] in `chunks` through forward_cached and compares every chunk's logits with the
// full forward's rows at the same positions. Returns the largest difference seen.
double cached_vs_full(CausalLM& m, const tensor::Tensor& ids, const std::vector<int64_t>& chunks) {
  autograd::NoGradGuard no_grad;
  const tensor::Tensor full = m.forward(ids).data();
  KvCache cache;
  int64_t at = 0;
  double worst = 0;
  for (int64_t n : chunks) {
    const tensor::Tensor got = m.forward_cached(ids.narrow(1, at, n).contiguous(), cache).data();
    EXPECT_EQ(cache.length(), at + n);
    double max_abs = 0;
    EXPECT_TRUE(testing::all_close(got, full.narrow(1, at, n), 1e-5, 1e-5, &max_abs))
        << m.family() << ": positions " << at << ".." << at + n - 1;
    worst = std::max(worst, max_abs);
    at += n;
  }
  EXPECT_EQ(at, ids.size(1));
  return worst;
}

TEST(KvCache, CachedLogitsMatchTheFullForward) {
  const std::vector<int64_t> chunks{7, 1, 1, 5, 1, 9};  // 24 = the whole context
  for (bool fused : {true, false}) {
    nn::FusedOpsGuard guard(fused);
    std::vector<std::unique_ptr<CausalLM>> models;
    models.push_back(gpt2());
    models.push_back(llama(/*tied=*/false));
    models.push_back(llama(/*tied=*/true));
    for (auto& m : models) {
      SCOPED_TRACE(m->family() + (fused ? " fused" : " unfused"));
      const double worst = cached_vs_full(*m, random_ids(2, 24, 61, 9), chunks);
      std::printf("%s, fused ops %s: largest |cached - full| logit difference %.3g\n",
                  m->family().c_str(), fused ? "on" : "off", worst);
    }
  }
}

// The cache holds what the layers computed, not the ids: a cached token's logits depend on every
// earlier token, so a wrong position or a stale slot shows up downstream.
TEST(KvCache, EveryTokenSeesTheWholePrefix) {
  auto m = gpt2();
  autograd::NoGradGuard no_grad;
  tensor::Tensor a = random_ids(1, 10, 61, 1), b = a.clone();
  b.narrow(1, 0, 1).copy_(tensor::from_ints({(tensor::to_int_vector(a)[0] + 1) % 61}, {1, 1}));
  KvCache ca, cb;
  m->forward_cached(a.narrow(1, 0, 9).contiguous(), ca);
  m->forward_cached(b.narrow(1, 0, 9).contiguous(), cb);
  // The same last token after prefixes differing in their first token.
  const tensor::Tensor la = m->forward_cached(a.narrow(1, 9, 1).contiguous(), ca).data();
  const tensor::Tensor lb = m->forward_cached(a.narrow(1, 9, 1).contiguous(), cb).data();
  EXPECT_NE(tensor::to_float_vector(la), tensor::to_float_vector(lb));
  // clear() forgets: the same 10 tokens from scratch give the full forward's last row.
  ca.clear();
  EXPECT_EQ(ca.length(), 0);
  const tensor::Tensor again = m->forward_cached(a, ca).data();
  EXPECT_TRUE(testing::all_close(again.narrow(1, 9, 1), la, 1e-5, 1e-5));
  EXPECT_EQ(ca.layers(), 3);
}

TEST(KvCache, RefusesWhatItCannotHoldAndAFailedForwardChangesNothing) {
  auto m = llama(false);
  const tensor::Tensor ids = random_ids(2, 24, 61, 3);
  KvCache cache;
  {
    // Grad mode on: the cache is for inference.
    EXPECT_THROW(m->forward_cached(ids.narrow(1, 0, 4).contiguous(), cache), Error);
    EXPECT_EQ(cache.length(), 0);
  }
  autograd::NoGradGuard no_grad;
  m->forward_cached(ids.narrow(1, 0, 20).contiguous(), cache);
  // Past the context of 24 positions.
  EXPECT_THROW(m->forward_cached(ids.narrow(1, 0, 5).contiguous(), cache), UserError);
  // Another batch size.
  EXPECT_THROW(m->forward_cached(ids.narrow(0, 0, 1).narrow(1, 20, 1).contiguous(), cache),
               UserError);
  // Another model.
  auto other = llama(false);
  EXPECT_THROW(other->forward_cached(ids.narrow(1, 20, 1).contiguous(), cache), UserError);
  // A token outside the vocabulary fails inside the forward, after nothing was appended
  // (the embedding runs first): the cache still holds 20 positions and goes on correctly.
  std::vector<int64_t> bad{3, 99, 4, 5};
  EXPECT_THROW(m->forward_cached(tensor::from_ints(bad, {2, 2}, DType::I32), cache), Error);
  EXPECT_EQ(cache.length(), 20);
  const tensor::Tensor full = m->forward(ids).data();
  const tensor::Tensor got = m->forward_cached(ids.narrow(1, 20, 4).contiguous(), cache).data();
  EXPECT_TRUE(testing::all_close(got, full.narrow(1, 20, 4), 1e-5, 1e-5));
  EXPECT_EQ(cache.length(), 24);
  // A fresh start with another batch size and model, after clear().
  cache.clear();
  const tensor::Tensor one = other->forward_cached(ids.narrow(0, 1, 1).contiguous(), cache).data();
  EXPECT_TRUE(
      testing::all_close(one, other->forward(ids.narrow(0, 1, 1).contiguous()).data(), 1e-5, 1e-5));
}

// GPT-2 and LLaMA (untied, grouped k/v heads).
std::vector<std::unique_ptr<CausalLM>> gpt2_and_llama() {
  std::vector<std::unique_ptr<CausalLM>> models;
  models.push_back(gpt2());
  models.push_back(llama(/*tied=*/false));
  return models;
}

// The rows `rows` of ids [B, T], in that order.
tensor::Tensor pick_rows(const tensor::Tensor& ids, const std::vector<int64_t>& rows) {
  const std::vector<int64_t> all = tensor::to_int_vector(ids);
  const int64_t T = ids.size(1);
  std::vector<int64_t> picked;
  for (int64_t r : rows)
    picked.insert(picked.end(), all.begin() + r * T, all.begin() + (r + 1) * T);
  return tensor::from_ints(picked, {static_cast<int64_t>(rows.size()), T}, DType::I32);
}

// Note [Dropping cache rows]: after keep_rows the cache goes on as one filled with the kept rows
// alone (row 0 staying in place, the others moving down, twice over); refused lists change
// nothing.
TEST(KvCache, KeptRowsGoOnAsABatchOfThoseRowsAlone) {
  for (auto& m : gpt2_and_llama()) {
    SCOPED_TRACE(m->family());
    autograd::NoGradGuard no_grad;
    const tensor::Tensor ids = random_ids(4, 24, 61, 11);
    KvCache cache;
    EXPECT_EQ(cache.batch(), 0);
    m->forward_cached(ids.narrow(1, 0, 9).contiguous(), cache);
    EXPECT_EQ(cache.batch(), 4);
    for (const std::vector<int64_t>& bad :
         std::vector<std::vector<int64_t>>{{}, {2, 1}, {1, 1}, {0, 4}, {-1, 2}}) {
      EXPECT_THROW(cache.keep_rows(bad), UserError);
      EXPECT_EQ(cache.batch(), 4);
      EXPECT_EQ(cache.length(), 9);
    }
    cache.keep_rows({0, 2, 3});
    EXPECT_EQ(cache.batch(), 3);
    EXPECT_EQ(cache.length(), 9);
    const tensor::Tensor three = pick_rows(ids, {0, 2, 3});
    const tensor::Tensor got3 = m->forward_cached(three.narrow(1, 9, 3).contiguous(), cache).data();
    EXPECT_TRUE(testing::all_close(got3, m->forward(three).data().narrow(1, 9, 3), 1e-5, 1e-5));
    // The whole batch of 4 no longer fits.
    EXPECT_THROW(m->forward_cached(ids.narrow(1, 12, 1).contiguous(), cache), UserError);
    cache.keep_rows({2});  // of {0, 2, 3}: row 3 of ids
    const tensor::Tensor one = pick_rows(ids, {3});
    const tensor::Tensor got1 = m->forward_cached(one.narrow(1, 12, 12).contiguous(), cache).data();
    EXPECT_TRUE(testing::all_close(got1, m->forward(one).data().narrow(1, 12, 12), 1e-5, 1e-5));
    EXPECT_EQ(cache.length(), 24);
    // Refilled after clear(), with the kept batch size and then the original one.
    cache.clear();
    const tensor::Tensor again = m->forward_cached(ids.narrow(0, 1, 1).contiguous(), cache).data();
    EXPECT_TRUE(
        testing::all_close(again, m->forward(ids.narrow(0, 1, 1).contiguous()).data(), 1e-5, 1e-5));
    cache.clear();
    const tensor::Tensor four = m->forward_cached(ids, cache).data();
    EXPECT_TRUE(testing::all_close(four, m->forward(ids).data(), 1e-5, 1e-5));
    EXPECT_EQ(cache.batch(), 4);
  }
}

// repeat_rows(n): each row's positions n times over, so the cache goes on as one filled with
// the repeated rows (after keep_rows narrowed it too); refused requests change nothing.
TEST(KvCache, RepeatedRowsGoOnAsABatchOfTheRepeats) {
  for (auto& m : gpt2_and_llama()) {
    SCOPED_TRACE(m->family());
    autograd::NoGradGuard no_grad;
    const tensor::Tensor ids = random_ids(3, 24, 61, 12);
    KvCache cache;
    EXPECT_THROW(cache.repeat_rows(2), UserError);  // nothing to repeat yet
    m->forward_cached(ids.narrow(0, 0, 2).narrow(1, 0, 7).contiguous(), cache);
    for (int64_t bad : {0, -1}) {
      EXPECT_THROW(cache.repeat_rows(bad), UserError);
      EXPECT_EQ(cache.batch(), 2);
    }
    cache.repeat_rows(1);
    EXPECT_EQ(cache.batch(), 2);
    cache.repeat_rows(3);
    EXPECT_EQ(cache.batch(), 6);
    EXPECT_EQ(cache.length(), 7);
    const tensor::Tensor six = pick_rows(ids, {0, 0, 0, 1, 1, 1});
    const tensor::Tensor got6 = m->forward_cached(six.narrow(1, 7, 2).contiguous(), cache).data();
    EXPECT_TRUE(testing::all_close(got6, m->forward(six).data().narrow(1, 7, 2), 1e-5, 1e-5));
    // Every copy holds its row, not only the first: the repeats of row 0 given other tokens
    // from here on each attend to row 0's prefix.
    const tensor::Tensor other = pick_rows(ids, {2, 2, 0, 1, 2, 1});
    const tensor::Tensor mixed =
        m->forward_cached(other.narrow(1, 9, 1).contiguous(), cache).data();
    for (int64_t r = 0; r < 6; ++r) {
      SCOPED_TRACE(r);
      const int64_t src = r < 3 ? 0 : 1;
      std::vector<int64_t> seq = tensor::to_int_vector(pick_rows(ids, {src}).narrow(1, 0, 9));
      seq.push_back(tensor::to_int_vector(other.narrow(0, r, 1).narrow(1, 9, 1)).front());
      const tensor::Tensor full = m->forward(tensor::from_ints(seq, {1, 10}, DType::I32)).data();
      EXPECT_TRUE(testing::all_close(mixed.narrow(0, r, 1), full.narrow(1, 9, 1), 1e-5, 1e-5));
    }
    // Narrowed by keep_rows, then repeated: rows 4 and 5 (copies of row 1) twice each.
    cache.keep_rows({4, 5});
    cache.repeat_rows(2);
    EXPECT_EQ(cache.batch(), 4);
    EXPECT_EQ(cache.length(), 10);
    std::vector<int64_t> next;
    for (int64_t r : {4, 4, 5, 5}) {
      std::vector<int64_t> seq = tensor::to_int_vector(pick_rows(ids, {1}).narrow(1, 0, 9));
      seq.push_back(tensor::to_int_vector(other.narrow(0, r, 1).narrow(1, 9, 1)).front());
      seq.push_back(17);
      next.insert(next.end(), seq.begin(), seq.end());
    }
    const tensor::Tensor four = tensor::from_ints(next, {4, 11}, DType::I32);
    const tensor::Tensor got4 = m->forward_cached(four.narrow(1, 10, 1).contiguous(), cache).data();
    EXPECT_TRUE(testing::all_close(got4, m->forward(four).data().narrow(1, 10, 1), 1e-5, 1e-5));
  }
}

// Note [Last-position logits]: forward_cached(..., last_only) returns the last position's logits
// [B, 1, Vp], equal to the full forward's, and caches every position (later chunks see them).
TEST(KvCache, LastOnlyGivesTheLastPositionsLogitsAndCachesEveryPosition) {
  for (bool fused : {true, false}) {
    nn::FusedOpsGuard guard(fused);
    std::vector<std::unique_ptr<CausalLM>> models = gpt2_and_llama();
    models.push_back(llama(/*tied=*/true));
    for (auto& m : models) {
      SCOPED_TRACE(m->family() + (fused ? " fused" : " unfused"));
      autograd::NoGradGuard no_grad;
      const tensor::Tensor ids = random_ids(2, 24, 61, 13);
      const tensor::Tensor full = m->forward(ids).data();
      // The positions the model's last module (its head) runs: one per row, not the chunk's.
      nn::Module* head = m->named_children().back().second;
      int64_t head_positions = 0;
      const nn::HookHandle hook =
          head->register_forward_pre_hook([&](nn::Module&, const std::vector<Variable>& in) {
            head_positions = in.at(0).data().size(1);
          });
      KvCache cache;
      int64_t at = 0;
      for (int64_t n : {7, 1, 5, 11}) {
        const tensor::Tensor got =
            m->forward_cached(ids.narrow(1, at, n).contiguous(), cache, /*last_only=*/true).data();
        ASSERT_EQ(got.shape(), tensor::Shape({2, 1, m->padded_vocab_size()}));
        EXPECT_EQ(head_positions, 1) << head->path();
        EXPECT_TRUE(testing::all_close(got, full.narrow(1, at + n - 1, 1), 1e-5, 1e-5))
            << "positions " << at << ".." << at + n - 1;
        at += n;
        EXPECT_EQ(cache.length(), at);
      }
      EXPECT_FALSE(cache.last_logits_only());  // only during the forward
      KvCache every;
      m->forward_cached(ids.narrow(1, 0, 3).contiguous(), every);
      EXPECT_EQ(head_positions, 3);  // without last_only: every position
      head->remove_hook(hook);
    }
  }
}

// A model that supports the cache but sends every position through its head (it does not call
// positions_for_logits): GPT-2's attention between an embedding and a linear head.
class AllPositionsModel : public CausalLM {
 public:
  AllPositionsModel() {
    gpt2::GPT2Config c;
    c.vocab_size = c.padded_vocab_size = 8;
    c.n_positions = 16;
    c.n_embd = 8;
    c.n_head = 2;
    wte_ = &add_module<nn::Embedding>("wte", 8, 8);
    attn_ = &add_module<gpt2::CausalSelfAttention>("attn", c);
    head_ = &add_module<nn::Linear>("head", 8, 8);
    flatten({{"all", {"wte", "attn", "head"}}});
    reset_parameters(2);
  }
  int64_t vocab_size() const override { return 8; }
  int64_t padded_vocab_size() const override { return 8; }
  int64_t max_seq_len() const override { return 16; }
  std::string family() const override { return "all-positions"; }
  bool supports_kv_cache() const override { return true; }

 protected:
  Variable forward_logits(const Tensor& ids) override {
    return (*head_)((*attn_)((*wte_)(Variable(ids))));
  }

 private:
  nn::Embedding* wte_;
  gpt2::CausalSelfAttention* attn_;
  nn::Linear* head_;
};

TEST(KvCache, LastOnlyNarrowsTheLogitsOfAModelThatRanEveryPosition) {
  autograd::NoGradGuard no_grad;
  AllPositionsModel m;
  const tensor::Tensor ids = tensor::from_ints({1, 2, 3, 4, 5, 6, 7, 0, 1, 2}, {2, 5}, DType::I32);
  const tensor::Tensor full = m.forward(ids).data();
  KvCache cache;
  const tensor::Tensor got = m.forward_cached(ids, cache, /*last_only=*/true).data();
  ASSERT_EQ(got.shape(), tensor::Shape({2, 1, 8}));
  EXPECT_TRUE(testing::all_close(got, full.narrow(1, 4, 1), 1e-6, 1e-6));
  EXPECT_EQ(cache.length(), 5);
}

// A model whose attention does not use the cache.
class NoCacheModel : public CausalLM {
 public:
  explicit NoCacheModel(bool claims) : claims_(claims) {
    head_ = &add_module<nn::Linear>("head", 4, 8);
    flatten({{"all", {"head"}}});
    reset_parameters(1);
  }
  int64_t vocab_size() const override { return 8; }
  int64_t padded_vocab_size() const override { return 8; }
  int64_t max_seq_len() const override { return 16; }
  std::string family() const override { return "no-cache"; }
  bool supports_kv_cache() const override { return claims_; }

 protected:
  Variable forward_logits(const Tensor& ids) override {
    const int64_t B = ids.size(0), T = ids.size(1);
    return (*head_)(Variable(tensor::full({B, T, 4}, 0.5f)));
  }

 private:
  bool claims_;
  nn::Linear* head_;
};

TEST(KvCache, AModelWithoutACachedForwardIsRefused) {
  autograd::NoGradGuard no_grad;
  const tensor::Tensor ids = tensor::from_ints({1, 2, 3}, {1, 3}, DType::I32);
  NoCacheModel honest(false);
  KvCache cache;
  EXPECT_THROW(honest.forward_cached(ids, cache), UserError);
  // One that claims support but whose layers never append is caught after its forward, and
  // nothing is committed.
  NoCacheModel claims(true);
  EXPECT_THROW(claims.forward_cached(ids, cache), Error);
  EXPECT_EQ(cache.length(), 0);
  EXPECT_EQ(KvCache::active(), nullptr);
}

// Note [Cached pipeline stages]: a model cut into stages, each with its own KvCache, fed in stage
// order (the hidden states handed on as the pipeline's links do), gives the whole model's cached
// logits bit for bit: the same layers with the same weights on the same operands. Two stages of
// one chunk, and two stages of two chunks each (Note [Virtual pipeline stages]: rank 0 holds
// layers 0 and 2, rank 1 layers 1 and 3, run 0, 1, 2, 3), GPT-2 and LLaMA.
TEST(KvCache, PipelineStagesWithTheirOwnCachesGiveTheWholeModelsLogits) {
  for (const std::string family : {"gpt2-tiny", "llama-tiny"}) {
    const bool is_gpt2 = family == "gpt2-tiny";
    std::map<std::string, std::string> shape =
        is_gpt2 ? std::map<std::string, std::string>{{"vocab_size", "61"},
                                                     {"n_positions", "24"},
                                                     {"n_embd", "32"},
                                                     {"n_layer", "4"},
                                                     {"n_head", "4"}}
                : std::map<std::string, std::string>{
                      {"vocab_size", "61"},        {"max_position_embeddings", "24"},
                      {"hidden_size", "32"},       {"intermediate_size", "48"},
                      {"num_hidden_layers", "4"},  {"num_attention_heads", "4"},
                      {"num_key_value_heads", "2"}};
    std::unique_ptr<CausalLM> whole = make(family, shape);
    auto stage = [&](StageLayers layers) {
      ModelOptions o;
      o.seed = 5;
      o.overrides = shape;
      o.stage = layers;
      std::unique_ptr<CausalLM> m = ModelRegistry::global().create(family, o);
      m->eval();
      return m;
    };
    const tensor::Tensor ids = random_ids(1, 9, 61, 3);
    const std::vector<int64_t> steps{4, 1, 3, 1};
    for (int chunks : {1, 2}) {
      // One chunk: layers [0, 2) and [2, 4). Two: [0, 1) + [2, 3) and [1, 2) + [3, 4).
      const int64_t per = 2 / chunks;
      std::vector<std::unique_ptr<CausalLM>> stages;
      stages.push_back(stage({0, per, chunks, chunks == 2 ? 2 : 0}));
      stages.push_back(stage({per, 2 * per, chunks, chunks == 2 ? 2 : 0}));
      KvCache whole_cache, cache0, cache1;
      KvCache* caches[2] = {&cache0, &cache1};
      autograd::NoGradGuard no_grad;
      int64_t at = 0;
      for (int64_t n : steps) {
        const tensor::Tensor chunk_ids = ids.narrow(1, at, n).contiguous();
        const tensor::Tensor want = whole->forward_cached(chunk_ids, whole_cache, true).data();
        autograd::Variable hidden;
        tensor::Tensor got;
        for (int c = 0; c < chunks; ++c)
          for (int s = 0; s < 2; ++s) {
            autograd::Variable out =
                stages[s]->forward_stage_cached(chunk_ids, hidden, c, *caches[s], true);
            if (stages[s]->chunk_is_last(c)) {
              got = out.data();
            } else {
              hidden = autograd::Variable(out.data().clone());
            }
          }
        ASSERT_TRUE(got.defined());
        EXPECT_EQ(tensor::max_abs_diff(got, want), 0.0)
            << family << ", " << chunks << " chunks, positions " << at << ".." << at + n - 1;
        at += n;
        EXPECT_EQ(cache0.length(), at);
        EXPECT_EQ(cache1.length(), at);
      }
      EXPECT_EQ(cache0.layers() + cache1.layers(), 4);
    }
    // A stage has no whole-model forward_cached: the error names what to run.
    std::unique_ptr<CausalLM> first = stage({0, 2});
    KvCache cache;
    autograd::NoGradGuard no_grad;
    try {
      first->forward_cached(ids.narrow(1, 0, 2).contiguous(), cache);
      ADD_FAILURE() << "a stage ran forward_cached";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("forward_stage_cached"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace strata::models
