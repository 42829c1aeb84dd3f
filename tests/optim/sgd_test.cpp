#include "optim/sgd.h"

#include <gtest/gtest.h>

#include "tests/optim/optim_test_util.h"

namespace strata::optim {
namespace {

using testing::make_group;
using testing::random_floats;
using testing::set_values;
using testing::to_vector;

// Three steps with constant gradient 1 from p = 1, lr = 0.1; returns p after each step.
std::vector<float> trajectory(const SgdConfig& cfg) {
  Sgd opt({make_group({1.f}, {1.f})}, cfg);
  std::vector<float> out;
  for (int t = 0; t < 3; ++t) {
    opt.step();
    out.push_back(opt.groups()[0].param.data<float>()[0]);
  }
  return out;
}

TEST(Sgd, PlainStep) {
  SgdConfig cfg;
  cfg.lr = 0.1;
  std::vector<float> p = trajectory(cfg);
  EXPECT_NEAR(p[0], 0.9f, 1e-6);
  EXPECT_NEAR(p[2], 0.7f, 1e-6);
}

TEST(Sgd, MomentumByHand) {
  // buf: 1, 0.9 + 1 = 1.9, 1.71 + 1 = 2.71; p: 1 - 0.1, 0.9 - 0.19, 0.71 - 0.271.
  SgdConfig cfg;
  cfg.lr = 0.1;
  cfg.momentum = 0.9;
  std::vector<float> p = trajectory(cfg);
  EXPECT_NEAR(p[0], 0.9f, 1e-6);
  EXPECT_NEAR(p[1], 0.71f, 1e-6);
  EXPECT_NEAR(p[2], 0.439f, 1e-6);
}

TEST(Sgd, NesterovByHand) {
  // buf as above; d = g + 0.9 * buf: 1.9, 2.71, 3.439.
  SgdConfig cfg;
  cfg.lr = 0.1;
  cfg.momentum = 0.9;
  cfg.nesterov = true;
  std::vector<float> p = trajectory(cfg);
  EXPECT_NEAR(p[0], 0.81f, 1e-6);
  EXPECT_NEAR(p[1], 0.539f, 1e-6);
  EXPECT_NEAR(p[2], 0.1951f, 1e-6);
}

TEST(Sgd, DampeningSkipsFirstStep) {
  // PyTorch: the first buffer is the gradient itself; later ones are 0.9 buf + 0.5 g.
  SgdConfig cfg;
  cfg.lr = 0.1;
  cfg.momentum = 0.9;
  cfg.dampening = 0.5;
  std::vector<float> p = trajectory(cfg);
  EXPECT_NEAR(p[0], 0.9f, 1e-6);
  EXPECT_NEAR(p[1], 0.76f, 1e-6);   // buf 1.4
  EXPECT_NEAR(p[2], 0.584f, 1e-6);  // buf 1.76
}

TEST(Sgd, WeightDecayAddedToGradientOnDecaySegmentsOnly) {
  ParamGroup g = make_group({2.f, 2.f, 2.f}, {0.5f, 0.5f, 0.5f});
  g.segments = {{"w", 0, 1, true}, {"b", 1, 1, false}};  // element 2 is padding: no decay
  SgdConfig cfg;
  cfg.lr = 0.1;
  cfg.weight_decay = 0.25;
  Sgd opt({g}, cfg);
  opt.step();
  std::vector<float> p = to_vector(opt.groups()[0].param);
  EXPECT_NEAR(p[0], 2.f - 0.1f * (0.5f + 0.25f * 2.f), 1e-7);
  EXPECT_EQ(p[1], 2.f - 0.1f * 0.5f);
  EXPECT_EQ(p[2], 2.f - 0.1f * 0.5f);
}

TEST(Sgd, StateRoundTripResumesBitwise) {
  SgdConfig cfg;
  cfg.momentum = 0.9;
  cfg.weight_decay = 0.01;
  const int64_t n = 100000;  // several chunks: the parallel path
  auto run = [&](Sgd& opt, int from, int to) {
    for (int t = from; t < to; ++t) {
      set_values(opt.groups()[0].grad, random_floats(n, 77 + t));
      opt.step(0.05);
    }
  };
  Sgd whole({make_group(random_floats(n, 1), std::vector<float>(n))}, cfg);
  run(whole, 0, 5);
  Sgd first({make_group(random_floats(n, 1), std::vector<float>(n))}, cfg);
  run(first, 0, 2);
  OptimizerState s = first.state_dict();
  ASSERT_EQ(s.tensors.size(), 1u);
  EXPECT_EQ(s.tensors[0].name, "group0.momentum_buffer");
  Sgd second({make_group(to_vector(first.groups()[0].param), std::vector<float>(n))}, cfg);
  second.load_state_dict(s);
  run(second, 2, 5);
  EXPECT_EQ(to_vector(second.groups()[0].param), to_vector(whole.groups()[0].param));
}

TEST(Sgd, RejectsInvalidConfig) {
  SgdConfig cfg;
  cfg.nesterov = true;  // needs momentum
  EXPECT_THROW(Sgd({make_group({1.f}, {1.f})}, cfg), UserError);
  SgdConfig no_momentum;
  Sgd plain({make_group({1.f}, {1.f})}, no_momentum);
  EXPECT_TRUE(plain.state_dict().tensors.empty());
  EXPECT_FALSE(plain.momentum_buffer(0).defined());
}

}  // namespace
}  // namespace strata::optim
