// Flat parameter and gradient buffers (Note [Flat parameters]).
#include <gtest/gtest.h>

#include <algorithm>

#include "autograd/functions.h"
#include "models/gpt2/gpt2.h"
#include "offload/memory_stats.h"

namespace strata::models {
namespace {

using gpt2::GPT2;
using gpt2::GPT2Config;

GPT2Config tiny() {
  GPT2Config c = gpt2::preset("gpt2-tiny");
  c.vocab_size = 250;  // padded 256: the padding rows are covered too
  c.n_layer = 3;
  return c;
}

// True when `view` lies inside `buffer`'s storage at element offset `offset`.
bool is_view_into(const tensor::Tensor& view, const tensor::Tensor& buffer, int64_t offset) {
  return view.storage() == buffer.storage() && view.offset() == buffer.offset() + offset &&
         view.is_contiguous();
}

TEST(FlatParams, UnitsCoverEveryParameterInNameSortedOrder) {
  GPT2 model(tiny(), 1);
  const auto& units = model.flat_units();
  std::vector<std::string> unit_names;
  for (const FlatUnit& u : units) unit_names.push_back(u.name);
  EXPECT_EQ(unit_names, (std::vector<std::string>{"embeddings", "h.0", "h.1", "h.2", "head"}));
  EXPECT_EQ(units[0].names, (std::vector<std::string>{"wpe.weight", "wte.weight"}));
  EXPECT_EQ(units[4].names, (std::vector<std::string>{"ln_f.bias", "ln_f.weight"}));
  EXPECT_EQ(units[1].names,
            (std::vector<std::string>{"h.0.attn.c_attn.bias", "h.0.attn.c_attn.weight",
                                      "h.0.attn.c_proj.bias", "h.0.attn.c_proj.weight",
                                      "h.0.ln_1.bias", "h.0.ln_1.weight", "h.0.ln_2.bias",
                                      "h.0.ln_2.weight", "h.0.mlp.c_fc.bias", "h.0.mlp.c_fc.weight",
                                      "h.0.mlp.c_proj.bias", "h.0.mlp.c_proj.weight"}));
  size_t total = 0;
  int64_t numel = 0;
  for (const FlatUnit& u : units) {
    EXPECT_TRUE(std::is_sorted(u.names.begin(), u.names.end()));
    total += u.names.size();
    numel += u.num_parameters();
  }
  EXPECT_EQ(total, model.named_parameters().size());
  EXPECT_EQ(numel, model.num_parameters());
}

TEST(FlatParams, EveryParameterAndGradientIsAViewIntoItsUnit) {
  GPT2 model(tiny(), 1);
  for (const FlatUnit& u : model.flat_units()) {
    EXPECT_EQ(u.params.dtype(), DType::F32);
    EXPECT_EQ(u.params.ndim(), 1);
    EXPECT_EQ(u.grads.shape(), u.params.shape());
    EXPECT_EQ(u.size() % 16, 0);
    int64_t end = 0;
    for (size_t k = 0; k < u.names.size(); ++k) {
      SCOPED_TRACE(u.names[k]);
      const autograd::Variable p = model.parameter(u.names[k]);
      EXPECT_TRUE(p.is_same(u.variables[k]));
      EXPECT_EQ(u.offsets[k] % 16, 0) << "offsets are aligned to 16 elements";
      EXPECT_GE(u.offsets[k], end) << "views do not overlap";
      end = u.offsets[k] + u.numels[k];
      EXPECT_EQ(u.numels[k], p.numel());
      EXPECT_EQ(u.shapes[k], p.shape());
      EXPECT_TRUE(is_view_into(p.data(), u.params, u.offsets[k]));
      EXPECT_TRUE(is_view_into(p.grad(), u.grads, u.offsets[k]));
    }
    EXPECT_LE(end, u.size());
  }
}

TEST(FlatParams, BuffersAreChargedToParamAndGradCategories) {
  auto& stats = offload::MemoryStats::global();
  const auto param0 = stats.usage(offload::Tier::Host, offload::Category::Param).current;
  const auto grad0 = stats.usage(offload::Tier::Host, offload::Category::Grad).current;
  {
    GPT2 model(tiny(), 1);
    int64_t bytes = 0;
    for (const FlatUnit& u : model.flat_units()) bytes += u.size() * 4;
    // Per-parameter tensors made at construction are released once rebound into the buffers.
    EXPECT_EQ(stats.usage(offload::Tier::Host, offload::Category::Param).current - param0, bytes);
    EXPECT_EQ(stats.usage(offload::Tier::Host, offload::Category::Grad).current - grad0, bytes);
  }
  EXPECT_EQ(stats.usage(offload::Tier::Host, offload::Category::Param).current, param0);
  EXPECT_EQ(stats.usage(offload::Tier::Host, offload::Category::Grad).current, grad0);
}

TEST(FlatParams, BackwardAccumulatesIntoTheFlatBufferAndZeroGradClearsIt) {
  GPT2 model(tiny(), 1);
  tensor::Tensor ids = tensor::from_ints({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  tensor::Tensor targets = tensor::from_ints({2, 3, 4, 5, 6, 7, 8, 9}, {2, 4});
  model.loss(ids, targets).backward();
  for (const FlatUnit& u : model.flat_units()) {
    SCOPED_TRACE(u.name);
    std::vector<float> flat = tensor::to_float_vector(u.grads);
    EXPECT_GT(tensor::l2_norm(u.grads), 0.0);
    for (size_t k = 0; k < u.names.size(); ++k) {
      const autograd::Variable& p = u.variables[k];
      EXPECT_TRUE(is_view_into(p.grad(), u.grads, u.offsets[k])) << "grad still bound";
      std::vector<float> g = tensor::to_float_vector(p.grad());
      EXPECT_TRUE(std::equal(g.begin(), g.end(), flat.begin() + u.offsets[k]));
    }
    // Padding between parameters stays zero.
    std::vector<bool> covered(flat.size(), false);
    for (size_t k = 0; k < u.names.size(); ++k)
      std::fill_n(covered.begin() + u.offsets[k], u.numels[k], true);
    for (size_t i = 0; i < flat.size(); ++i)
      if (!covered[i]) {
        ASSERT_EQ(flat[i], 0.f) << "padding element " << i;
      }
  }
  // Gradients accumulate: a second backward doubles them.
  std::vector<float> once = tensor::to_float_vector(model.flat_units()[1].grads);
  model.loss(ids, targets).backward();
  std::vector<float> twice = tensor::to_float_vector(model.flat_units()[1].grads);
  for (size_t i = 0; i < once.size(); ++i) ASSERT_FLOAT_EQ(twice[i], 2 * once[i]);

  model.zero_grad();
  for (const FlatUnit& u : model.flat_units()) EXPECT_EQ(tensor::l2_norm(u.grads), 0.0);
}

TEST(FlatParams, WritingTheFlatBufferChangesTheModel) {
  GPT2 model(tiny(), 1);
  FlatUnit& head = model.flat_units().back();
  head.params.fill_(0.5);
  EXPECT_EQ(tensor::to_float_vector(model.ln_f().weight().data()),
            std::vector<float>(static_cast<size_t>(tiny().n_embd), 0.5f));
}

TEST(FlatParams, EveryParameterMustBelongToExactlyOneUnit) {
  nn::Module root;
  root.register_parameter("a", tensor::Shape{3});
  auto& child = root.add_module<nn::Module>("child");
  child.register_parameter("b", tensor::Shape{5});
  EXPECT_THROW(flatten_parameters(root, {{"u", {"child"}}}), InternalError);
  EXPECT_THROW(flatten_parameters(root, {{"u", {""}}, {"v", {"child"}}}), InternalError);
  tensor::Tensor a = root.parameter("a").data();
  a.fill_(1.0);
  std::vector<FlatUnit> units = flatten_parameters(root, {{"all", {""}}}, /*align=*/4);
  ASSERT_EQ(units.size(), 1u);
  EXPECT_EQ(units[0].names, (std::vector<std::string>{"a", "child.b"}));
  EXPECT_EQ(units[0].offsets, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(units[0].size(), 12);
  EXPECT_EQ(tensor::to_float_vector(units[0].params.narrow(0, 0, 4)),
            (std::vector<float>{1, 1, 1, 0}))
      << "values are copied in and padding is zero";
}

}  // namespace
}  // namespace strata::models
