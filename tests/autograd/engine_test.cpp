#include <gtest/gtest.h>

#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/hooks.h"
#include "autograd/rng_context.h"
#include "tensor/ops.h"

namespace strata::autograd {
namespace {

namespace tops = ::strata::tensor;

std::vector<float> vals(const Tensor& t) {
  return tops::to_float_vector(t);
}

TEST(Engine, AccumulatesAcrossBackwardCalls) {
  Variable x(tops::from_vector({1, 2, 3}, {3}), true);
  for (int i = 0; i < 3; ++i) sum_all(mul(x, x)).backward();
  EXPECT_EQ(vals(x.grad()), (std::vector<float>{6, 12, 18}));  // 3 * 2x
  x.zero_grad();
  EXPECT_EQ(vals(x.grad()), (std::vector<float>{0, 0, 0}));
}

TEST(Engine, GradBoundToFlatBufferViewIsWrittenInPlace) {
  Tensor flat = tops::zeros({10});
  Variable w(tops::from_vector({1, 2, 3, 4}, {2, 2}), true);
  w.set_grad(flat.narrow(0, 3, 4).view({2, 2}));
  sum_all(scale(w, 2.f)).backward();
  EXPECT_EQ(vals(flat), (std::vector<float>{0, 0, 0, 2, 2, 2, 2, 0, 0, 0}));
}

TEST(Engine, SharedLeafGetsSummedGradAndOneReadyHook) {
  Variable w(tops::from_vector({2}, {1}), true);
  int fired = 0;
  float seen = 0;
  w.add_grad_ready_hook([&](Variable& v) {
    ++fired;
    seen = vals(v.grad())[0];
  });
  Variable y = add(mul(w, w), scale(w, 3.f));  // dy/dw = 2w + 3 = 7
  sum_all(y).backward();
  EXPECT_EQ(fired, 1);
  EXPECT_EQ(seen, 7.f);
}

TEST(Engine, ReadyHookFiresBeforeBackwardReachesEarlierLayers) {
  // Two "layers": the later layer's weight is final before the earlier layer's backward runs.
  Variable w1(tops::from_vector({1.5f}, {1}), true), w2(tops::from_vector({-2.f}, {1}), true);
  Variable x(tops::from_vector({3.f}, {1}));
  std::vector<std::string> order;
  w1.add_grad_ready_hook([&](Variable&) { order.push_back("w1"); });
  w2.add_grad_ready_hook([&](Variable&) { order.push_back("w2"); });
  Variable h = on_backward({mul(x, w1)}, [&] { order.push_back("layer1-backward"); })[0];
  Variable y = mul(gelu(h), w2);
  sum_all(y).backward();
  ASSERT_EQ(order.size(), 3u);
  EXPECT_EQ(order[0], "w2");
  EXPECT_EQ(order[1], "layer1-backward");
  EXPECT_EQ(order[2], "w1");
}

TEST(Engine, NoGradBuildsNoGraph) {
  Variable x(tops::ones({2}), true);
  Variable y;
  {
    NoGradGuard g;
    y = mul(x, x);
  }
  EXPECT_FALSE(y.requires_grad());
  EXPECT_THROW(sum_all(y).backward(), InternalError);
}

TEST(Engine, SecondBackwardThroughReleasedGraphIsAnError) {
  Variable x(tops::ones({2}), true);
  Variable loss = sum_all(gelu(x));
  loss.backward();
  EXPECT_THROW(loss.backward(), InternalError);
}

TEST(Engine, SplitWithOneUnusedOutputGetsZeroGrad) {
  Variable x(tops::from_vector({1, 2, 3, 4}, {4}), true);
  auto parts = split(x, {1, 3}, 0);
  sum_all(square(parts[1])).backward();
  EXPECT_EQ(vals(x.grad()), (std::vector<float>{0, 4, 6, 8}));
}

TEST(Checkpoint, SameGradientsAndDropoutReplays) {
  Variable w(tops::randn({6, 6}, {3, 4}), true);
  Variable x0(tops::randn({4, 6}, {5, 6}), true);
  auto block = [&](const std::vector<Variable>& in) {
    Generator& g = current_generator();
    Variable h = dropout(gelu(linear(in[0], w, Variable())), 0.5f, g.next_key());
    return std::vector<Variable>{h};
  };
  auto run = [&](bool ckpt) {
    Generator gen(17);
    GeneratorScope scope(gen);
    w.set_grad(Tensor());
    x0.set_grad(Tensor());
    Variable y = ckpt ? checkpoint(block, {x0})[0] : block({x0})[0];
    Variable z = dropout(y, 0.5f, gen.next_key());  // draws after the block must not shift
    sum_all(square(z)).backward();
    return std::make_tuple(vals(y.data()), vals(w.grad()), vals(x0.grad()));
  };
  auto [y1, gw1, gx1] = run(false);
  auto [y2, gw2, gx2] = run(true);
  EXPECT_EQ(y1, y2);
  EXPECT_EQ(gw1, gw2);
  EXPECT_EQ(gx1, gx2);
}

TEST(Checkpoint, ParametersGetGradsEvenWhenInputsNeedNone) {
  Variable w(tops::ones({3}), true);
  Variable x(tops::from_vector({1, 2, 3}, {3}));
  auto f = [&](const std::vector<Variable>& in) { return std::vector<Variable>{mul(in[0], w)}; };
  sum_all(checkpoint(f, {x})[0]).backward();
  EXPECT_EQ(vals(w.grad()), (std::vector<float>{1, 2, 3}));
}

}  // namespace
}  // namespace strata::autograd
