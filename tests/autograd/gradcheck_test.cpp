// One table-driven test: every differentiable function against finite differences, on odd
// shapes and on non-contiguous views.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/checkpoint.h"
#include "autograd/functions.h"
#include "autograd/node.h"
#include "tensor/ops.h"
#include "tests/support/gradcheck.h"

namespace strata::autograd {
namespace {

namespace tops = ::strata::tensor;
using testing::gradcheck;

enum class Layout { Contiguous, Transposed, Strided };
enum class Values { Normal, Positive, AwayFromZero };

struct InputSpec {
  Shape shape;
  Layout layout = Layout::Contiguous;
  Values values = Values::Normal;
};

struct Case {
  std::string name;
  std::vector<InputSpec> inputs;
  testing::GradFn fn;
};

// Builds an input of `spec.shape` whose memory layout is as asked: a transposed view of a
// contiguous [.., b, a] tensor, or every other element of a wider one.
Variable make_input(const InputSpec& spec, uint64_t salt) {
  Shape s = spec.shape;
  Tensor base;
  if (spec.layout == Layout::Transposed && s.ndim() >= 2) {
    Shape t = s;
    std::swap(t[t.ndim() - 1], t[t.ndim() - 2]);
    base = tops::randn(t, {99, salt}).transpose(-1, -2);
  } else if (spec.layout == Layout::Strided) {
    Shape wide = s;
    wide[wide.ndim() - 1] *= 2;
    base = tops::randn(wide, {99, salt}).slice(-1, 0, wide.back(), 2);
  } else {
    base = tops::randn(s, {99, salt});
  }
  if (spec.values != Values::Normal) {
    // Positive: |x| + 0.5 (log, div). AwayFromZero: sign(x) * (|x| + 0.2) (relu's kink, max ties).
    std::vector<float> v = tops::to_float_vector(base);
    for (float& f : v) {
      f = spec.values == Values::Positive ? std::fabs(f) + 0.5f : (f < 0 ? f - 0.2f : f + 0.2f);
    }
    Tensor fixed = tops::from_vector(v, s);
    base.copy_(fixed);
  }
  return Variable(base, true);
}

Tensor ids_tensor(std::vector<int64_t> ids, Shape s) {
  return tops::from_ints(ids, s);
}

std::vector<Case> cases() {
  const Layout T = Layout::Transposed, S = Layout::Strided;
  using V = const std::vector<Variable>&;
  std::vector<Case> c;
  c.push_back({"add_broadcast", {{{3, 5, 7}}, {{5, 1}, S}}, [](V x) { return add(x[0], x[1]); }});
  c.push_back({"sub_broadcast", {{{3, 1, 7}}, {{4, 7}, T}}, [](V x) { return sub(x[0], x[1]); }});
  c.push_back({"mul_broadcast", {{{2, 3, 5}, T}, {{5}}}, [](V x) { return mul(x[0], x[1]); }});
  c.push_back(
      {"div", {{{4, 7}}, {{4, 7}, S, Values::Positive}}, [](V x) { return div(x[0], x[1]); }});
  c.push_back({"scale", {{{3, 5}, T}}, [](V x) { return scale(x[0], -1.7f); }});
  c.push_back({"affine", {{{9}}}, [](V x) { return affine(x[0], 0.3f, 2.f); }});
  c.push_back({"gelu", {{{5, 7}, S}}, [](V x) { return gelu(x[0]); }});
  c.push_back({"silu", {{{5, 7}, T}}, [](V x) { return silu(x[0]); }});
  c.push_back({"relu", {{{6, 5}, S, Values::AwayFromZero}}, [](V x) { return relu(x[0]); }});
  c.push_back({"exp", {{{3, 5}}}, [](V x) { return exp(x[0]); }});
  c.push_back({"log", {{{3, 5}, T, Values::Positive}}, [](V x) { return log(x[0]); }});
  c.push_back({"tanh", {{{11}}}, [](V x) { return tanh(x[0]); }});
  c.push_back({"square", {{{4, 3}, S}}, [](V x) { return square(x[0]); }});
  c.push_back({"bias_add", {{{2, 3, 7}, T}, {{7}}}, [](V x) { return bias_add(x[0], x[1]); }});
  c.push_back({"dropout", {{{6, 9}, S}}, [](V x) { return dropout(x[0], 0.3f, {7, 11}); }});
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      Shape sa = ta ? Shape{5, 3} : Shape{3, 5};
      Shape sb = tb ? Shape{7, 5} : Shape{5, 7};
      c.push_back({fmt::format("matmul_{}{}", ta ? "T" : "N", tb ? "T" : "N"),
                   {{sa, S}, {sb, T}},
                   [ta, tb](V x) { return matmul(x[0], x[1], ta, tb); }});
      Shape ba = ta ? Shape{2, 5, 3} : Shape{2, 3, 5};
      c.push_back({fmt::format("matmul_shared_b_{}{}", ta ? "T" : "N", tb ? "T" : "N"),
                   {{ba}, {sb}},
                   [ta, tb](V x) { return matmul(x[0], x[1], ta, tb); }});
    }
  c.push_back({"matmul_batched", {{{2, 3, 4, 5}, T}, {{2, 3, 5, 3}}}, [](V x) {
                 return matmul(x[0], x[1]);
               }});
  c.push_back(
      {"linear", {{{2, 3, 5}, T}, {{7, 5}}, {{7}}}, [](V x) { return linear(x[0], x[1], x[2]); }});
  c.push_back({"linear_no_bias", {{{4, 5}}, {{3, 5}, T}}, [](V x) {
                 return linear(x[0], x[1], Variable());
               }});
  c.push_back({"layernorm", {{{3, 4, 7}, T}, {{7}}, {{7}}}, [](V x) {
                 return layernorm(x[0], x[1], x[2], 1e-5f);
               }});
  c.push_back({"rmsnorm", {{{5, 9}, S}, {{9}}}, [](V x) { return rmsnorm(x[0], x[1], 1e-6f); }});
  c.push_back({"softmax", {{{3, 2, 7}, T}}, [](V x) { return softmax(x[0]); }});
  c.push_back({"attention_causal", {{{2, 3, 5, 4}}, {{2, 3, 5, 4}, T}, {{2, 3, 5, 4}, S}}, [](V x) {
                 return attention(x[0], x[1], x[2], true);
               }});
  c.push_back({"attention_full_tq_ne_tk",
               {{{1, 2, 3, 4}}, {{1, 2, 6, 4}}, {{1, 2, 6, 4}}},
               [](V x) { return attention(x[0], x[1], x[2], false, 0.7f); }});
  c.push_back({"attention_causal_tq_lt_tk",
               {{{1, 2, 3, 4}}, {{1, 2, 7, 4}}, {{1, 2, 7, 4}}},
               [](V x) { return attention(x[0], x[1], x[2], true); }});
  c.push_back(
      {"attention_qkv_causal", {{{2, 5, 24}}}, [](V x) { return attention_qkv(x[0], 2, true); }});
  c.push_back({"attention_qkv_full", {{{1, 4, 18}, T}}, [](V x) {
                 return attention_qkv(x[0], 3, false, 0.6f);
               }});
  c.push_back({"rotary", {{{2, 5, 3, 6}, S}}, [](V x) {
                 auto [cs, sn] = tops::rotary_tables(5, 6);
                 return rotary(x[0], cs, sn);
               }});
  c.push_back({"embedding", {{{7, 5}}}, [](V x) {
                 return embedding(x[0], ids_tensor({3, 0, 6, 3, 3, 1}, {2, 3}));
               }});
  c.push_back({"cross_entropy", {{{2, 3, 7}, T}}, [](V x) {
                 return cross_entropy(x[0], ids_tensor({1, -100, 6, 0, 2, 2}, {2, 3}));
               }});
  c.push_back({"sum_dim", {{{3, 4, 5}, T}}, [](V x) { return sum(x[0], 1); }});
  c.push_back({"sum_keepdim", {{{3, 4, 5}}}, [](V x) { return sum(x[0], -1, true); }});
  c.push_back({"mean_dim", {{{3, 4, 5}, S}}, [](V x) { return mean(x[0], 0); }});
  c.push_back({"max_dim", {{{4, 6}, T}}, [](V x) { return max(x[0], 1); }});
  c.push_back({"sum_all", {{{3, 5}, S}}, [](V x) { return sum_all(x[0]); }});
  c.push_back({"mean_all", {{{3, 5}}}, [](V x) { return mean_all(x[0]); }});
  c.push_back({"reshape", {{{3, 4}, T}}, [](V x) {
                 return mul(reshape(x[0], {2, 6}), reshape(x[0], {2, 6}));
               }});
  c.push_back({"transpose", {{{2, 3, 4}}}, [](V x) { return square(transpose(x[0], 0, 2)); }});
  c.push_back({"permute", {{{2, 3, 4}, S}}, [](V x) { return square(permute(x[0], {1, 2, 0})); }});
  c.push_back({"narrow", {{{5, 6}}}, [](V x) { return square(narrow(x[0], 1, 2, 3)); }});
  c.push_back({"slice_step", {{{7, 3}, T}}, [](V x) { return square(slice(x[0], 0, 1, 7, 2)); }});
  c.push_back({"contiguous", {{{4, 5}, T}}, [](V x) { return square(contiguous(x[0])); }});
  c.push_back({"concat", {{{2, 3}}, {{2, 5}, T}}, [](V x) {
                 return square(concat({x[0], x[1]}, 1));
               }});
  c.push_back({"split", {{{3, 7}, S}}, [](V x) {
                 auto parts = split(x[0], {2, 5}, 1);
                 return mul(sum(parts[0], 1), sum(parts[1], 1));
               }});
  c.push_back({"checkpoint", {{{3, 5}}, {{4, 5}}}, [](V x) {
                 Variable w = x[1];
                 auto f = [w](const std::vector<Variable>& in) {
                   return std::vector<Variable>{gelu(linear(in[0], w, Variable()))};
                 };
                 return checkpoint(f, {x[0]})[0];
               }});
  return c;
}

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

class Gradcheck : public ::testing::TestWithParam<Case> {};

TEST_P(Gradcheck, MatchesFiniteDifferences) {
  const Case& c = GetParam();
  std::vector<Variable> inputs;
  for (size_t i = 0; i < c.inputs.size(); ++i) inputs.push_back(make_input(c.inputs[i], i + 1));
  std::string err = gradcheck(c.fn, inputs);
  EXPECT_TRUE(err.empty()) << c.name << ": " << err;
}

INSTANTIATE_TEST_SUITE_P(AllOps, Gradcheck, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
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
