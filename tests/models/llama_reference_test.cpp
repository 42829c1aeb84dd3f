// LLaMA against PyTorch (tests/reference/gen_llama_tiny.py): logits, loss, every parameter
// gradient, and 10 AdamW steps with Strata's optimizer over the flat units. The two files cover
// grouped-query attention with an untied head, and multi-head attention with a tied, padded
// head and an ignored target.
#include <gtest/gtest.h>

#include <iostream>

#include "llama_test_util.h"
#include "models/llama/llama.h"
#include "optim/adamw.h"

namespace strata::models {
namespace {

using llama::Llama;
using testing::all_close;

// The GPT-2 reference test's fp32 tolerances: the reference is computed in float64 from the same
// fp32 weights, so the differences are Strata's fp32 rounding alone.
constexpr double kRtol = 1e-4, kAtol = 1e-5;

class LlamaReference : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    reader_ = std::make_unique<tensor::SafetensorsReader>(testing::reference_path(GetParam()));
    model_ = std::make_unique<Llama>(testing::llama_config_from_metadata(*reader_), 0);
    testing::load_weights(*model_, *reader_);
    tokens_ = reader_->read("tokens");
    targets_ = reader_->read("targets");
  }
  std::unique_ptr<tensor::SafetensorsReader> reader_;
  std::unique_ptr<Llama> model_;
  tensor::Tensor tokens_, targets_;
};

TEST_P(LlamaReference, ParameterNamesAreTheReferences) {
  for (auto& [name, p] : model_->named_parameters()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(reader_->contains(name));
    EXPECT_EQ(reader_->read(name).shape(), p.shape());
  }
  EXPECT_EQ(model_->lm_head() == nullptr, model_->config().tie_word_embeddings);
}

TEST_P(LlamaReference, LogitsLossAndEveryGradientMatchPyTorch) {
  double logit_diff = 0, grad_diff = 0;
  {
    autograd::NoGradGuard no_grad;
    EXPECT_TRUE(all_close(model_->forward(tokens_).data(), reader_->read("logits"), kRtol, kAtol,
                          &logit_diff));
  }
  autograd::Variable loss = model_->loss(tokens_, targets_);
  const float expected = reader_->read("loss").item<float>();
  EXPECT_NEAR(loss.item(), expected, 1e-5 * std::fabs(expected));
  loss.backward();
  for (auto& [name, p] : model_->named_parameters()) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(all_close(p.grad(), reader_->read("grad." + name), kRtol, kAtol, &grad_diff));
  }
  std::cout << "[ " << GetParam() << " ] max |diff| logits " << logit_diff << ", loss "
            << std::fabs(loss.item() - expected) << ", gradients " << grad_diff << "\n";
}

TEST_P(LlamaReference, CheckpointedLayersMatchPyTorchToo) {
  model_->set_activation_checkpointing(true);
  autograd::Variable loss = model_->loss(tokens_, targets_);
  loss.backward();
  for (auto& [name, p] : model_->named_parameters()) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(all_close(p.grad(), reader_->read("grad." + name), kRtol, kAtol));
  }
}

TEST_P(LlamaReference, TenAdamWStepsMatchPyTorch) {
  optim::AdamWConfig cfg;
  cfg.lr = 1e-3;
  cfg.beta1 = 0.9;
  cfg.beta2 = 0.95;
  cfg.eps = 1e-8;
  cfg.weight_decay = 0.1;
  optim::AdamW opt(testing::unit_param_groups(*model_), cfg);
  std::vector<float> expected = tensor::to_float_vector(reader_->read("adamw.losses"));
  ASSERT_EQ(expected.size(), 11u);
  double worst = 0;
  for (size_t step = 0; step < expected.size(); ++step) {
    model_->zero_grad();
    autograd::Variable loss = model_->loss(tokens_, targets_);
    worst = std::max(worst, std::fabs(static_cast<double>(loss.item()) - expected[step]));
    EXPECT_NEAR(loss.item(), expected[step], 2e-5 * std::fabs(expected[step])) << "step " << step;
    if (step + 1 == expected.size()) break;
    loss.backward();
    opt.step();
  }
  // LLaMA has no parameter whose exact gradient is zero (no biases), so unlike GPT-2's key bias
  // every parameter after the steps is checked at the tight tolerance.
  double param_diff = 0;
  if (reader_->contains("adamw.embed_tokens.weight")) {
    for (auto& [name, p] : model_->named_parameters()) {
      SCOPED_TRACE(name);
      EXPECT_TRUE(all_close(p.data(), reader_->read("adamw." + name), kRtol, kAtol, &param_diff));
    }
  }
  std::cout << "[ " << GetParam() << " ] AdamW: max |loss diff| over 11 evaluations " << worst
            << ", max |param diff| after 10 steps " << param_diff << "\n";
}

INSTANTIATE_TEST_SUITE_P(Files, LlamaReference,
                         ::testing::Values("llama_tiny.safetensors", "llama_tiny_tied.safetensors"),
                         [](const auto& info) {
                           std::string n = info.param;
                           return n.substr(0, n.find('.'));
                         });

}  // namespace
}  // namespace strata::models
