// The differentiable collectives (autograd/comm_functions.h) against their math on CPU ranks: the
// whole world is the tensor-parallel group. Run under mpirun for 2 and 4 ranks and alone (a
// group of one, where every mapping is the identity).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "autograd/comm_functions.h"
#include "autograd/functions.h"
#include "comm/self_communicator.h"
#include "tensor/ops.h"
#include "tests/support/mpi_test_env.h"

namespace strata::autograd {
namespace {

using tensor::Tensor;

TpGroup group() {
  return strata::testing::test_world();
}

// Deterministic values, different for each `salt` (use the rank for rank-specific tensors).
Tensor values(const Shape& shape, int salt) {
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(salt));
  return tensor::from_vector(v, shape);
}

// sum over ranks r of values(shape, salt0 + r)
Tensor sum_over_ranks(const Shape& shape, int salt0, int n) {
  Tensor acc = tensor::zeros(shape);
  for (int r = 0; r < n; ++r) acc = tensor::add(acc, values(shape, salt0 + r));
  return acc;
}

void expect_near(const Tensor& a, const Tensor& b, double tol = 1e-6) {
  ASSERT_EQ(a.shape(), b.shape()) << a.str() << " vs " << b.str();
  EXPECT_LE(tensor::max_abs_diff(a, b), tol);
}

TEST(TpCommFunctions, CopyToRegionAllReducesTheGradient) {
  const int n = group()->size(), r = group()->rank();
  Variable x(values({3, 4}, 7), true);
  Variable y = copy_to_tp_region(x, group());
  expect_near(y.data(), x.data(), 0);
  y.backward(values({3, 4}, 100 + r));
  expect_near(x.grad(), sum_over_ranks({3, 4}, 100, n), 1e-5);
}

TEST(TpCommFunctions, ReduceFromRegionSumsForwardOnly) {
  const int n = group()->size(), r = group()->rank();
  Variable x(values({2, 5}, 10 + r), true);
  Variable y = reduce_from_tp_region(autograd::scale(x, 1.f), group());
  expect_near(y.data(), sum_over_ranks({2, 5}, 10, n), 1e-5);
  const Tensor g = values({2, 5}, 50);
  y.backward(g);
  expect_near(x.grad(), g, 0);
}

TEST(TpCommFunctions, SequenceGatherAndItsReduceScatterBackward) {
  const int n = group()->size(), r = group()->rank();
  const Shape full{2, 4 * n, 3};
  const Tensor whole = values(full, 3);
  Variable x(sequence_shard(whole, group()).clone(), true);
  EXPECT_EQ(x.shape(), (Shape{2, 4, 3}));
  Variable y = gather_from_sequence_region(x, group());
  expect_near(y.data(), whole, 0);
  y.backward(values(full, 200 + r));
  expect_near(x.grad(), sequence_shard(sum_over_ranks(full, 200, n), group()), 1e-5);
}

TEST(TpCommFunctions, SequenceReduceScatterAndItsGatherBackward) {
  const int n = group()->size(), r = group()->rank();
  const Shape full{2, 2 * n, 5}, local{2, 2, 5};
  Variable x(values(full, 30 + r), true);
  Variable y = reduce_scatter_to_sequence_region(autograd::scale(x, 1.f), group());
  expect_near(y.data(), sequence_shard(sum_over_ranks(full, 30, n), group()), 1e-5);
  // Every rank's gradient for its tokens, put together: the whole gradient on every rank.
  y.backward(values(local, 300 + r));
  Tensor expected = Tensor::empty(full);
  for (int q = 0; q < n; ++q)
    expected.view({n, -1}).select(0, q).copy_(values(local, 300 + q).view({-1}));
  expect_near(x.grad(), expected, 0);
}

TEST(TpCommFunctions, SequencePositionsFollowTheFlattenedTokenOrder) {
  const int n = group()->size(), r = group()->rank();
  const int64_t B = 3, T = 2 * n;
  const std::vector<int64_t> pos =
      tensor::to_int_vector(sequence_positions(B, T, 5, group(), Device::cpu()));
  ASSERT_EQ(pos.size(), static_cast<size_t>(B * T / n));
  for (size_t j = 0; j < pos.size(); ++j)
    EXPECT_EQ(pos[j], 5 + (r * B * T / n + static_cast<int64_t>(j)) % T);
}

TEST(TpCommFunctions, LastDimGatherAndScatter) {
  const int n = group()->size(), r = group()->rank();
  const Shape full{3, 2, 4 * n};
  const Tensor whole = values(full, 9);
  Variable x(whole.clone(), true);
  Variable mine = scatter_to_tp_region(x, group());
  expect_near(mine.data(), whole.narrow(2, 4 * r, 4).contiguous(), 0);
  Variable back = gather_from_tp_region(mine, group());
  expect_near(back.data(), whole, 0);
  // d back / d mine keeps the own columns; d mine / d x gathers every rank's columns.
  const Tensor g = values(full, 77);  // the same on every rank
  back.backward(g);
  expect_near(x.grad(), g, 0);
}

// The vocab-parallel loss against cross_entropy on the whole logits: value and each slice's
// gradient, with padded columns (classes < V) and an ignored target.
TEST(TpCommFunctions, VocabParallelCrossEntropyMatchesTheWholeLoss) {
  const int n = group()->size(), r = group()->rank();
  const int64_t rows = 6, vl = 5, V = vl * n, classes = V - 3;
  const Tensor whole = tensor::scale(values({2, 3, V}, 4), 3.f);
  std::vector<int64_t> t;
  for (int64_t i = 0; i < rows; ++i) t.push_back((i * 7 + 2) % classes);
  t[3] = -100;
  const Tensor targets = tensor::from_ints(t, {2, 3});

  Variable ref_logits(whole.clone(), true);
  Variable ref = cross_entropy(ref_logits, targets, -100, classes);
  ref.backward();

  Variable mine(whole.narrow(2, r * vl, vl).contiguous(), true);
  Variable loss = vocab_parallel_cross_entropy(mine, targets, r * vl, classes, group(), -100);
  EXPECT_NEAR(loss.item(), ref.item(), 1e-6 * std::fabs(ref.item()));
  loss.backward();
  expect_near(mine.grad(), ref_logits.grad().narrow(2, r * vl, vl).contiguous(), 1e-7);
}

TEST(TpCommFunctions, GroupOfOneIsTheIdentity) {
  const TpGroup self = std::make_shared<comm::SelfCommunicator>("tp");
  Variable x(values({2, 4, 3}, 1), true);
  for (const TpGroup& g : {self, TpGroup()}) {
    EXPECT_TRUE(copy_to_tp_region(x, g).is_same(x));
    EXPECT_TRUE(reduce_from_tp_region(x, g).is_same(x));
    EXPECT_TRUE(gather_from_sequence_region(x, g).is_same(x));
    EXPECT_TRUE(reduce_scatter_to_sequence_region(x, g).is_same(x));
    EXPECT_TRUE(gather_from_tp_region(x, g).is_same(x));
    EXPECT_TRUE(scatter_to_tp_region(x, g).is_same(x));
  }
}

}  // namespace
}  // namespace strata::autograd
