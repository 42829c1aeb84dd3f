// Note [Group fence] (optim/optimizer.h): with a fence, AdamW and SGD step one group at a time,
// calling the fence right before and right after each group's update; a group's parameters may
// be released between steps and materialized by the fence; the bits are those of the step
// without a fence.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "optim/adamw.h"
#include "optim/sgd.h"
#include "tests/optim/optim_test_util.h"

namespace strata::optim {
namespace {

using testing::make_group;
using testing::random_floats;
using testing::set_values;
using testing::to_vector;

template <typename Opt, typename Config>
void check(const Config& cfg) {
  std::vector<ParamGroup> a, b;
  for (int g = 0; g < 3; ++g) {
    const std::vector<float> p = random_floats(100 + 10 * g, g + 1);
    a.push_back(make_group(p, std::vector<float>(p.size(), 0.f)));
    b.push_back(make_group(p, std::vector<float>(p.size(), 0.f)));
  }
  Opt plain(a, cfg), fenced(b, cfg);
  // The fenced groups' parameters live elsewhere between steps (as ZeRO-Infinity's do): the fence
  // materializes and fills them before, saves and releases them after.
  std::vector<std::vector<float>> home;
  for (const ParamGroup& g : fenced.groups()) {
    home.push_back(to_vector(g.param));
    g.param.storage()->release();
  }
  std::vector<std::string> calls;
  fenced.set_group_fence([&](size_t g, bool before) {
    calls.push_back((before ? "+" : "-") + std::to_string(g));
    tensor::Tensor p = fenced.groups()[g].param;
    if (before) {
      p.storage()->materialize();
      set_values(p, home[g]);
    } else {
      home[g] = to_vector(p);
      p.storage()->release();
    }
  });
  for (int step = 0; step < 3; ++step) {
    for (size_t g = 0; g < a.size(); ++g) {
      const std::vector<float> grad = random_floats(a[g].grad.numel(), 50 + step * 3 + g, 0.1f);
      set_values(plain.groups()[g].grad, grad);
      set_values(fenced.groups()[g].grad, grad);
    }
    plain.step(1e-2);
    fenced.step(1e-2);
  }
  EXPECT_EQ(calls,
            (std::vector<std::string>{"+0", "-0", "+1", "-1", "+2", "-2", "+0", "-0", "+1", "-1",
                                      "+2", "-2", "+0", "-0", "+1", "-1", "+2", "-2"}));
  for (size_t g = 0; g < a.size(); ++g) {
    EXPECT_TRUE(fenced.groups()[g].param.storage()->is_released());
    EXPECT_EQ(home[g], to_vector(plain.groups()[g].param)) << "group " << g;
  }
}

TEST(GroupFence, AdamWStepsOneGroupAtATimeWithTheSameBits) {
  AdamWConfig cfg;
  cfg.weight_decay = 0.1;
  check<AdamW>(cfg);
}

TEST(GroupFence, SgdStepsOneGroupAtATimeWithTheSameBits) {
  SgdConfig cfg;
  cfg.momentum = 0.9;
  cfg.weight_decay = 0.01;
  check<Sgd>(cfg);
}

}  // namespace
}  // namespace strata::optim
