// Every differentiable function against finite differences, on odd shapes and on non-contiguous
// views: the gradcheck samples of the op table (tests/support/op_table.h), one test each.
#include <gtest/gtest.h>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "tensor/ops.h"
#include "tests/support/gradcheck.h"
#include "tests/support/op_table.h"

namespace strata::autograd {
namespace {

namespace tops = ::strata::tensor;
using testing::gradcheck;
using testing::GradSample;

struct Param {
  std::string op;
  GradSample sample;
};

std::vector<Param> params() {
  std::vector<Param> out;
  for (const testing::OpInfo& e : testing::op_table())
    for (const GradSample& s : e.gradcheck) out.push_back({e.name, s});
  return out;
}

void PrintTo(const Param& p, std::ostream* os) {
  *os << p.op << "/" << p.sample.name;
}

class Gradcheck : public ::testing::TestWithParam<Param> {};

TEST_P(Gradcheck, MatchesFiniteDifferences) {
  const GradSample& c = GetParam().sample;
  std::vector<Variable> inputs;
  for (size_t i = 0; i < c.inputs.size(); ++i)
    inputs.push_back(testing::make_grad_input(c.inputs[i], i + 1));
  std::string err = gradcheck(c.fn, inputs);
  EXPECT_TRUE(err.empty()) << c.name << ": " << err;
}

// Test names: <sample> (unique over the table; op_table_test checks), e.g.
// OpTable/Gradcheck.MatchesFiniteDifferences/add_broadcast.
INSTANTIATE_TEST_SUITE_P(OpTable, Gradcheck, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return info.param.sample.name;
                         });

// The checker itself must be able to fail: a function whose backward is deliberately wrong.
TEST(GradcheckSelfTest, DetectsAWrongBackward) {
  Variable x(tops::randn({3, 4}, {1, 2}), true);
  auto wrong = [](const std::vector<Variable>& in) {
    Tensor xd = in[0].data();
    return make_output("WrongSquare", tops::mul(xd, xd), in, [xd](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{tops::mul(g[0], xd)};  // missing the factor 2
    });
  };
  EXPECT_FALSE(gradcheck(wrong, {x}).empty());
}

}  // namespace
}  // namespace strata::autograd
