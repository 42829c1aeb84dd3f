// Pipeline stages without communication: the balanced split against every split of a small
// stack, the layout errors, and stage models that put together are the whole model (same
// parameters by name, the same logits through forward_stage).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <memory>

#include "models/registry.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/pipeline_stages.h"
#include "tensor/ops.h"

namespace strata::parallel {
namespace {

models::ModelShape shape_of(int64_t n_layer, int64_t layer, int64_t embedding, int64_t head) {
  models::ModelShape s;
  s.n_layer = n_layer;
  s.layer_parameters = layer;
  s.embedding_parameters = embedding;
  s.head_parameters = head;
  return s;
}

int64_t largest_stage(const models::ModelShape& shape, const StagePartition& p) {
  int64_t m = 0;
  for (int s = 0; s < p.size(); ++s) m = std::max(m, p.parameters(shape, s));
  return m;
}

// The smallest largest stage over every split into pp non-empty contiguous stages.
int64_t best_by_enumeration(const models::ModelShape& shape, int pp) {
  int64_t best = std::numeric_limits<int64_t>::max();
  StagePartition p;
  std::function<void(int64_t)> go = [&](int64_t left) {
    const int s = p.size();
    if (s == pp - 1) {
      p.layers.push_back(left);
      best = std::min(best, largest_stage(shape, p));
      p.layers.pop_back();
      return;
    }
    for (int64_t k = 1; k <= left - (pp - 1 - s); ++k) {
      p.layers.push_back(k);
      go(left - k);
      p.layers.pop_back();
    }
  };
  go(shape.n_layer);
  return best;
}

TEST(PipelineStages, BalanceMinimisesTheLargestStage) {
  for (const models::ModelShape& shape :
       {shape_of(6, 10, 25, 5), shape_of(12, 7, 40, 41), shape_of(9, 100, 0, 0),
        shape_of(8, 3, 2, 30), shape_of(5, 1, 1, 1)})
    for (int pp = 1; pp <= std::min<int64_t>(shape.n_layer, 5); ++pp) {
      const StagePartition p = balance_stages(shape, pp);
      ASSERT_EQ(p.size(), pp);
      int64_t sum = 0;
      for (int64_t l : p.layers) {
        EXPECT_GE(l, 1);
        sum += l;
      }
      EXPECT_EQ(sum, shape.n_layer);
      EXPECT_EQ(largest_stage(shape, p), best_by_enumeration(shape, pp))
          << "n_layer " << shape.n_layer << " pp " << pp;
    }
  // Equal layers and no extras: an even split.
  EXPECT_EQ(balance_stages(shape_of(8, 5, 0, 0), 4).layers, (std::vector<int64_t>{2, 2, 2, 2}));
  // Heavy embeddings push layers to the later stages.
  const StagePartition heavy = balance_stages(shape_of(6, 10, 25, 5), 2);
  EXPECT_LT(heavy.layers[0], heavy.layers[1]);
  EXPECT_EQ(heavy.stage(1).begin, heavy.layers[0]);
  EXPECT_EQ(heavy.stage(1).end, 6);
}

TEST(PipelineStages, BadLayoutsAreUserErrors) {
  EXPECT_THROW(balance_stages(shape_of(2, 1, 1, 1), 3), UserError);  // more stages than layers
  EXPECT_THROW(balance_stages(shape_of(2, 1, 1, 1), 0), UserError);
  EXPECT_THROW(explicit_stages({1, 2}, 4, 2), UserError);  // adds up to 3, not 4
  EXPECT_THROW(explicit_stages({2, 2}, 4, 3), UserError);  // 2 entries for 3 stages
  EXPECT_THROW(explicit_stages({4, 0}, 4, 2), UserError);  // an empty stage
  EXPECT_EQ(explicit_stages({1, 3}, 4, 2).stage(1).begin, 1);
  EXPECT_THROW(check_pipeline_layout(4, 2, 4), UserError);  // tp x pp = 8 > 4 ranks
  EXPECT_THROW(check_pipeline_layout(6, 2, 2), UserError);  // 6 is not 4 x dp
  EXPECT_THROW(check_pipeline_layout(4, 1, 0), UserError);
  EXPECT_NO_THROW(check_pipeline_layout(8, 2, 2));
  EXPECT_THROW(parse_pipeline_schedule("zigzag"), UserError);
  EXPECT_EQ(parse_pipeline_schedule("1f1b"), PipelineScheduleKind::OneFOneB);
  EXPECT_EQ(parse_pipeline_schedule("interleaved"), PipelineScheduleKind::Interleaved);
  EXPECT_DOUBLE_EQ(pipeline_bubble_formula(4, 8), 3.0 / 11.0);
  // Note [Interleaved schedule]: v chunks per stage shrink the bubble to (p - 1) / (v m + p - 1).
  EXPECT_DOUBLE_EQ(pipeline_bubble_formula(4, 8, 2), 3.0 / 19.0);
}

models::ModelOptions tiny(const std::string& family, models::StageLayers stage = {}) {
  models::ModelOptions o;
  o.seed = 7;
  o.stage = stage;
  if (family == "gpt2")
    o.overrides = {{"n_layer", "4"}, {"n_embd", "32"}, {"n_head", "2"}, {"dropout", "0"}};
  else
    o.overrides = {{"n_layer", "4"},
                   {"hidden_size", "32"},
                   {"intermediate_size", "48"},
                   {"n_head", "2"},
                   {"n_kv_head", "1"},
                   {"tie_word_embeddings", family == "llama-tied" ? "true" : "false"}};
  return o;
}

TEST(PipelineStages, StagesPutTogetherAreTheWholeModel) {
  for (const std::string family : {"gpt2", "llama", "llama-tied"}) {
    SCOPED_TRACE(family);
    const char* preset = family == "gpt2" ? "gpt2-tiny" : "llama-tiny";
    const models::ModelRegistry& reg = models::ModelRegistry::global();
    std::unique_ptr<models::CausalLM> whole = reg.create(preset, tiny(family));
    const StagePartition partition = explicit_stages({1, 2, 1}, 4, 3);
    std::vector<std::unique_ptr<models::CausalLM>> stages;
    for (int s = 0; s < 3; ++s)
      stages.push_back(reg.create(preset, tiny(family, partition.stage(s))));

    // Every stage parameter is the whole model's of the same name, bit for bit, and every
    // whole-model parameter lives on some stage.
    std::map<std::string, tensor::Tensor> params;
    for (auto& [name, v] : whole->named_parameters()) params[name] = v.data();
    std::map<std::string, int> seen;
    for (auto& st : stages)
      for (auto& [name, v] : st->named_parameters()) {
        ASSERT_TRUE(params.count(name)) << name;
        EXPECT_EQ(tensor::max_abs_diff(v.data(), params[name]), 0.0) << name;
        ++seen[name];
      }
    EXPECT_EQ(seen.size(), params.size());
    // Only a tied embeddings unit is held twice (first and last stage).
    const models::FlatUnit& emb = whole->flat_units().front();
    ASSERT_EQ(emb.name, "embeddings");
    for (auto& [name, n] : seen) {
      const bool in_emb = std::find(emb.names.begin(), emb.names.end(), name) != emb.names.end();
      EXPECT_EQ(n, whole->ties_embeddings() && in_emb ? 2 : 1) << name;
    }
    // What each stage builds is what the balance counts for it (Note [Stage balance]).
    const models::ModelShape shape = reg.shape(preset, tiny(family));
    for (int s = 0; s < 3; ++s) {
      int64_t built = 0;
      for (const models::FlatUnit& u : stages[s]->flat_units()) built += u.num_parameters();
      EXPECT_EQ(built, partition.parameters(shape, s)) << "stage " << s;
    }
    auto n = [&](int s) { return std::to_string(partition.parameters(shape, s)); };
    EXPECT_EQ(partition.describe(shape),
              "stage 0: layers 0-0 (" + n(0) + " parameters), stage 1: layers 1-2 (" + n(1) +
                  " parameters), stage 2: layers 3-3 (" + n(2) + " parameters)");
    EXPECT_TRUE(stages[0]->is_first_stage() && !stages[0]->is_last_stage());
    EXPECT_TRUE(stages[2]->is_last_stage() && !stages[1]->is_first_stage());
    EXPECT_THROW(stages[1]->forward(tensor::from_ints({1, 2}, {1, 2})), UserError);

    const tensor::Tensor ids = tensor::from_ints({3, 1, 4, 1, 5, 9, 2, 6, 5, 3}, {2, 5});
    const tensor::Tensor expected = whole->forward(ids).data();
    autograd::Variable h = stages[0]->forward_stage(ids, {});
    EXPECT_EQ(h.data().shape(), (tensor::Shape{2, 5, 32}));
    h = stages[1]->forward_stage({}, h);
    const tensor::Tensor logits = stages[2]->forward_stage({}, h).data();
    ASSERT_EQ(logits.shape(), expected.shape());
    EXPECT_LE(tensor::max_abs_diff(logits, expected), 1e-5);
  }
}

// Note [Virtual pipeline stages]: at pp 2 x v 2 a 4-layer model's rank 0 holds layers 0 and 2,
// rank 1 layers 1 and 3; their chunks run in virtual-stage order give the whole model's logits,
// and every parameter is the whole model's of the same name.
TEST(PipelineStages, InterleavedChunksPutTogetherAreTheWholeModel) {
  for (const std::string family : {"gpt2", "llama", "llama-tied"}) {
    SCOPED_TRACE(family);
    const char* preset = family == "gpt2" ? "gpt2-tiny" : "llama-tiny";
    const models::ModelRegistry& reg = models::ModelRegistry::global();
    std::unique_ptr<models::CausalLM> whole = reg.create(preset, tiny(family));
    std::vector<std::unique_ptr<models::CausalLM>> ranks;
    for (int r = 0; r < 2; ++r)
      ranks.push_back(reg.create(preset, tiny(family, interleaved_stage(4, 2, 2, r))));
    const std::string layer = family == "gpt2" ? "h." : "layers.";
    std::vector<std::string> units0, units1;
    for (const models::FlatUnit& u : ranks[0]->flat_units()) units0.push_back(u.name);
    for (const models::FlatUnit& u : ranks[1]->flat_units()) units1.push_back(u.name);
    EXPECT_EQ(units0, (std::vector<std::string>{"embeddings", layer + "0", layer + "2"}));
    std::vector<std::string> want1 = {layer + "1", layer + "3", "head"};
    if (family != "llama") want1.insert(want1.begin(), "embeddings");  // the tied copy
    EXPECT_EQ(units1, want1);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(ranks[r]->num_chunks(), 2);
      EXPECT_FALSE(ranks[r]->is_whole());
      EXPECT_THROW(ranks[r]->forward(tensor::from_ints({1, 2}, {1, 2})), UserError);
    }
    EXPECT_TRUE(ranks[0]->chunk_is_first(0) && !ranks[0]->chunk_is_first(1));
    EXPECT_TRUE(ranks[1]->chunk_is_last(1) && !ranks[1]->chunk_is_last(0));
    EXPECT_FALSE(ranks[0]->chunk_is_last(1));

    std::map<std::string, tensor::Tensor> params;
    for (auto& [name, v] : whole->named_parameters()) params[name] = v.data();
    for (auto& rank : ranks)
      for (auto& [name, v] : rank->named_parameters()) {
        ASSERT_TRUE(params.count(name)) << name;
        EXPECT_EQ(tensor::max_abs_diff(v.data(), params[name]), 0.0) << name;
      }

    const tensor::Tensor ids = tensor::from_ints({3, 1, 4, 1, 5, 9, 2, 6, 5, 3}, {2, 5});
    const tensor::Tensor expected = whole->forward(ids).data();
    autograd::Variable h = ranks[0]->forward_stage(ids, {}, 0);
    h = ranks[1]->forward_stage({}, h, 0);
    h = ranks[0]->forward_stage({}, h, 1);
    EXPECT_EQ(h.data().shape(), (tensor::Shape{2, 5, 32}));
    const tensor::Tensor logits = ranks[1]->forward_stage({}, h, 1).data();
    ASSERT_EQ(logits.shape(), expected.shape());
    EXPECT_LE(tensor::max_abs_diff(logits, expected), 1e-5);
  }
  EXPECT_EQ(describe_interleaved(shape_of(4, 10, 100, 1000), 2, 2),
            "rank 0: layers 0-0, 2-2 (120 parameters), rank 1: layers 1-1, 3-3 (1020 parameters)");
  EXPECT_THROW(interleaved_stage(6, 2, 2, 0), UserError);  // 4 chunks of 6 layers
}

TEST(PipelineStages, StageRangeOutsideTheStackIsAUserError) {
  const models::ModelRegistry& reg = models::ModelRegistry::global();
  EXPECT_THROW(reg.create("gpt2-tiny", tiny("gpt2", {3, 6})), UserError);
  EXPECT_THROW(reg.create("llama-tiny", tiny("llama", {2, 2})), UserError);
}

}  // namespace
}  // namespace strata::parallel
