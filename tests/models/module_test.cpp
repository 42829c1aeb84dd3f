// nn::Module: names, modes, and forward/backward hooks (Note [Module hooks]).
#include <gtest/gtest.h>

#include "autograd/functions.h"
#include "autograd/rng_context.h"
#include "models/nn/dropout.h"
#include "models/nn/linear.h"
#include "models/nn/module.h"

namespace strata::models::nn {
namespace {

using autograd::Variable;

// l2(gelu(l1(x))) with a Linear(4, 8) and a Linear(8, 3).
class TwoLayer : public Module {
 public:
  TwoLayer() {
    l1 = &add_module<Linear>("l1", 4, 8);
    l2 = &add_module<Linear>("l2", 8, 3, /*bias=*/false);
    scale = register_parameter("scale", Shape{3});
    reset_parameters(7);
  }
  void reset_parameters(uint64_t seed) override {
    Module::reset_parameters(seed);
    Tensor s = scale.data();
    s.fill_(1.0);
  }
  Linear* l1;
  Linear* l2;
  Variable scale;

 protected:
  Variable forward(const Variable& x) override {
    return autograd::mul((*l2)(autograd::gelu((*l1)(x))), scale);
  }
};

Variable input(bool requires_grad) {
  return Variable(tensor::randn({2, 5, 4}, {1, 2}), requires_grad);
}

TEST(Module, NamesFollowRegistrationOrderAndNesting) {
  Module root;
  auto& net = root.add_module<TwoLayer>("net");
  std::vector<std::string> names;
  for (auto& [n, p] : root.named_parameters()) {
    names.push_back(n);
    EXPECT_EQ(p.name(), n) << "the variable carries its full name";
    EXPECT_TRUE(p.requires_grad());
  }
  EXPECT_EQ(names, (std::vector<std::string>{"net.scale", "net.l1.weight", "net.l1.bias",
                                             "net.l2.weight"}));
  std::vector<std::string> mods;
  for (auto& [n, m] : root.named_modules()) mods.push_back(n);
  EXPECT_EQ(mods, (std::vector<std::string>{"", "net", "net.l1", "net.l2"}));
  EXPECT_EQ(net.l1->path(), "net.l1");
  EXPECT_EQ(root.parameter("net.l1.weight").shape(), (Shape{8, 4}));
  EXPECT_EQ(&root.module("net.l2"), net.l2);
  EXPECT_EQ(root.num_parameters(), 3 + 8 * 4 + 8 + 3 * 8);
  EXPECT_THROW(root.parameter("net.l3.weight"), UserError);
  EXPECT_THROW(root.module("nope"), UserError);
}

TEST(Module, TrainEvalIsRecursiveAndDropoutIsIdentityInEval) {
  Module root;
  auto& d = root.add_module<Dropout>("drop", 0.5f);
  Variable x(tensor::ones({64}), false);
  EXPECT_TRUE(d.is_training());
  root.eval();
  EXPECT_FALSE(d.is_training());
  EXPECT_TRUE(d(x).is_same(x));
  root.train();
  Generator gen(3);
  autograd::GeneratorScope scope(gen);
  std::vector<float> y = tensor::to_float_vector(d(x).data());
  EXPECT_EQ(gen.offset(), 1u) << "one key per dropout call";
  int zeros = 0;
  for (float v : y) {
    EXPECT_TRUE(v == 0.f || v == 2.f);
    zeros += v == 0.f;
  }
  EXPECT_GT(zeros, 10);
  EXPECT_LT(zeros, 54);
  Dropout none(0.f);
  EXPECT_TRUE(none(x).is_same(x));
  EXPECT_EQ(gen.offset(), 1u) << "p = 0 draws nothing";
}

// Records every hook of every module of `root` into `log` as "<kind>:<path>".
void record_all(Module& root, std::vector<std::string>& log) {
  for (auto& [name, m] : root.named_modules()) {
    std::string n = name.empty() ? "root" : name;
    m->register_forward_pre_hook(
        [&log, n](Module&, const std::vector<Variable>&) { log.push_back("fwd_pre:" + n); });
    m->register_forward_hook(
        [&log, n](Module&, const std::vector<Variable>&, const std::vector<Variable>&) {
          log.push_back("fwd:" + n);
        });
    m->register_backward_pre_hook([&log, n](Module&) { log.push_back("bwd_pre:" + n); });
    m->register_backward_hook([&log, n](Module&) { log.push_back("bwd_post:" + n); });
  }
}

class ModuleHooks : public ::testing::TestWithParam<bool> {};

TEST_P(ModuleHooks, FireInOrderOncePerPass) {
  const bool input_requires_grad = GetParam();
  TwoLayer net;
  std::vector<std::string> log;
  record_all(net, log);
  for (int pass = 0; pass < 2; ++pass) {
    log.clear();
    Variable y = net(input(input_requires_grad));
    EXPECT_EQ(log, (std::vector<std::string>{"fwd_pre:root", "fwd_pre:l1", "fwd:l1", "fwd_pre:l2",
                                             "fwd:l2", "fwd:root"}));
    log.clear();
    autograd::sum_all(y).backward();
    // Outer pre, then each layer's pre and post as the gradient passes through it, outer post
    // last — also when post-backward of l1 and root come from parameter grad-ready hooks
    // (no input requires grad).
    EXPECT_EQ(log, (std::vector<std::string>{"bwd_pre:root", "bwd_pre:l2", "bwd_post:l2",
                                             "bwd_pre:l1", "bwd_post:l1", "bwd_post:root"}))
        << "pass " << pass;
    net.zero_grad();
  }
}

INSTANTIATE_TEST_SUITE_P(InputRequiresGrad, ModuleHooks, ::testing::Bool());

TEST(Module, PostBackwardSeesFinalParameterGradients) {
  TwoLayer net;
  std::vector<float> seen;
  net.l1->register_backward_hook(
      [&](Module& m) { seen = tensor::to_float_vector(static_cast<Linear&>(m).weight().grad()); });
  Variable y = net(input(false));
  autograd::sum_all(y).backward();
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen, tensor::to_float_vector(net.l1->weight().grad()));
}

TEST(Module, HooksSeeTensorsAndCanBeRemoved) {
  Linear lin(4, 3);
  lin.reset_parameters(1);
  int pre = 0, post = 0, bwd = 0;
  HookHandle h1 = lin.register_forward_pre_hook([&](Module& m, const std::vector<Variable>& in) {
    EXPECT_EQ(&m, &lin);
    ASSERT_EQ(in.size(), 1u);
    EXPECT_EQ(in[0].shape(), (Shape{2, 5, 4}));
    ++pre;
  });
  HookHandle h2 = lin.register_forward_hook(
      [&](Module&, const std::vector<Variable>&, const std::vector<Variable>& out) {
        ASSERT_EQ(out.size(), 1u);
        EXPECT_EQ(out[0].shape(), (Shape{2, 5, 3}));
        ++post;
      });
  HookHandle h3 = lin.register_backward_hook([&](Module&) { ++bwd; });
  autograd::sum_all(lin(input(true))).backward();
  EXPECT_EQ(pre, 1);
  EXPECT_EQ(post, 1);
  EXPECT_EQ(bwd, 1);
  {
    autograd::NoGradGuard no_grad;  // forward hooks still run, no backward hooks are attached
    Variable y = lin(input(true));
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(pre, 2);
    EXPECT_EQ(post, 2);
  }
  lin.remove_hook(h1);
  lin.remove_hook(h2);
  lin.remove_hook(h3);
  autograd::sum_all(lin(input(true))).backward();
  EXPECT_EQ(pre, 2);
  EXPECT_EQ(post, 2);
  EXPECT_EQ(bwd, 1);
}

TEST(Module, HookedCallComputesTheSameValuesAndGradients) {
  TwoLayer plain, hooked;
  std::vector<std::string> log;
  record_all(hooked, log);
  Variable x1 = input(true), x2 = input(true);
  Variable y1 = plain(x1), y2 = hooked(x2);
  EXPECT_EQ(tensor::to_float_vector(y1.data()), tensor::to_float_vector(y2.data()));
  autograd::sum_all(y1).backward();
  autograd::sum_all(y2).backward();
  EXPECT_EQ(tensor::to_float_vector(x1.grad()), tensor::to_float_vector(x2.grad()));
  EXPECT_EQ(tensor::to_float_vector(plain.l1->weight().grad()),
            tensor::to_float_vector(hooked.l1->weight().grad()));
}

TEST(Module, RegistrationErrors) {
  Module m;
  m.register_parameter("w", Shape{2});
  EXPECT_THROW(m.register_parameter("w", Shape{2}), InternalError);
  EXPECT_THROW(m.register_parameter("a.b", Shape{2}), InternalError);
  m.add_module<Linear>("lin", 2, 2);
  EXPECT_THROW(m.add_module<Linear>("lin", 2, 2), InternalError);
}

}  // namespace
}  // namespace strata::models::nn
