// CPU embedding (gather and deterministic scatter-add) and fused softmax cross-entropy: against
// double-precision references and central differences, ignore_index, bad ids and targets, and
// bitwise determinism across thread counts.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "tensor/ops.h"
#include "tests/support/kernel_check.h"

namespace strata::tensor {
namespace {

using strata::testing::all_close;
using strata::testing::dot;
using strata::testing::finite_differences;
using strata::testing::make_tensor;
using strata::testing::random_normal;
using strata::testing::same_bits;
using strata::testing::to_double;
using strata::testing::values;
using strata::testing::with_threads;

constexpr int64_t kIgnore = -100;

TEST(Embedding, ForwardGathersRowsForBothIdTypes) {
  const int64_t v = 11, c = 7;
  auto w = random_normal(v * c, 1);
  const std::vector<int64_t> ids = {3, 0, 10, 3, 7, 1};
  for (DType dt : {DType::I32, DType::I64}) {
    Tensor out = embedding(make_tensor(w, {v, c}), from_ints(ids, {2, 3}, dt));
    ASSERT_EQ(out.shape(), Shape({2, 3, c}));
    auto o = values(out);
    for (size_t i = 0; i < ids.size(); ++i)
      for (int64_t j = 0; j < c; ++j) EXPECT_EQ(o[i * c + j], w[ids[i] * c + j]);
  }
}

TEST(Embedding, BackwardAccumulatesRepeatedIds) {
  const int64_t v = 9, c = 5;
  const std::vector<int64_t> ids = {4, 1, 4, 8, 4, 0, 1};
  const int64_t n = static_cast<int64_t>(ids.size());
  auto g = random_normal(n * c, 2), init = random_normal(v * c, 3);
  for (DType dt : {DType::I32, DType::I64}) {
    Tensor dw = make_tensor(init, {v, c});
    embedding_backward(from_ints(ids, {n}, dt), make_tensor(g, {n, c}), dw);
    std::vector<double> want = to_double(init);  // backward accumulates into what is there
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < c; ++j) want[ids[i] * c + j] += g[i * c + j];
    EXPECT_TRUE(all_close(values(dw), want, 1e-6, 1e-6));
  }
}

TEST(Embedding, OutOfRangeIdIsUserErrorNamingIdAndVocab) {
  const int64_t v = 6, c = 3;
  Tensor w = make_tensor(random_normal(v * c, 4), {v, c});
  for (int64_t bad : {int64_t{6}, int64_t{-1}, int64_t{1000}}) {
    try {
      embedding(w, from_ints({0, bad, 2}, {3}, DType::I32));
      ADD_FAILURE() << "id " << bad << " was accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("vocabulary of 6"), std::string::npos) << e.what();
    }
    Tensor dw = make_tensor(std::vector<float>(v * c, 0.f), {v, c});
    EXPECT_THROW(
        embedding_backward(from_ints({bad}, {1}), make_tensor({1.f, 2.f, 3.f}, {1, c}), dw),
        UserError);
  }
}

TEST(Embedding, BackwardDeterministicAcrossThreadCounts) {
  // Many positions over few rows, and several column strips.
  const int64_t v = 37, c = 300, n = 3001;
  std::vector<int64_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = (i * 7919) % v;
  Tensor idt = from_ints(ids, {n});
  Tensor g = make_tensor(random_normal(n * c, 5), {n, c});
  auto run = [&] {
    Tensor dw = make_tensor(std::vector<float>(v * c, 0.5f), {v, c});
    embedding_backward(idt, g, dw);
    return values(dw);
  };
  auto one = with_threads(1, run);
  for (int threads : {2, 3, 4}) EXPECT_TRUE(same_bits(one, with_threads(threads, run))) << threads;
}

// Per-row losses (lse - logit[target], 0 for ignored rows) and lse, in double.
std::vector<double> ce_ref(const std::vector<double>& x, const std::vector<int64_t>& t, int64_t v,
                           std::vector<double>* lse = nullptr) {
  std::vector<double> loss;
  for (size_t r = 0; r < t.size(); ++r) {
    double mx = -INFINITY, s = 0;
    for (int64_t j = 0; j < v; ++j) mx = std::max(mx, x[r * v + j]);
    for (int64_t j = 0; j < v; ++j) s += std::exp(x[r * v + j] - mx);
    const double l = mx + std::log(s);
    if (lse) lse->push_back(l);
    loss.push_back(t[r] == kIgnore ? 0.0 : l - x[r * v + t[r]]);
  }
  return loss;
}

struct CeCase {
  int64_t n, v;
  float spread;
};
// Odd tiny rows; and wide rows that cross the 256-wide blocks of the exp sum, with large logits.
const CeCase kCases[] = {{5, 7, 2.f}, {3, 1, 1.f}, {4, 1000, 30.f}};

std::vector<int64_t> targets_for(int64_t n, int64_t v) {
  std::vector<int64_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = i == 1 ? kIgnore : (i * 5 + 3) % v;
  return t;
}

TEST(CrossEntropy, ForwardMatchesReference) {
  for (auto [n, v, spread] : kCases)
    for (DType dt : {DType::I32, DType::I64}) {
      auto x = random_normal(n * v, 10, 1.f, spread);
      auto t = targets_for(n, v);
      CrossEntropyResult r = cross_entropy(make_tensor(x, {n, v}), from_ints(t, {n}, dt), kIgnore);
      std::vector<double> lse;
      auto loss = ce_ref(to_double(x), t, v, &lse);
      EXPECT_TRUE(all_close(values(r.losses), loss, 2e-6, 2e-6)) << n << "x" << v;
      EXPECT_TRUE(all_close(values(r.lse), lse, 2e-6, 2e-6)) << n << "x" << v;
      EXPECT_EQ(values(r.losses)[1], 0.f);  // the ignored row
      EXPECT_EQ(values(r.norm),
                (std::vector<float>{static_cast<float>(n - 1), 1.f / static_cast<float>(n - 1)}));
    }
}

TEST(CrossEntropy, BackwardMatchesFiniteDifferences) {
  for (auto [n, v, spread] : kCases) {
    auto x = random_normal(n * v, 20, 0.f, spread);
    auto t = targets_for(n, v);
    auto dloss = random_normal(n, 21);
    Tensor xt = make_tensor(x, {n, v}), tt = from_ints(t, {n});
    CrossEntropyResult r = cross_entropy(xt, tt, kIgnore);
    auto dx = values(cross_entropy_backward(xt, tt, r.lse, make_tensor(dloss, {n}), kIgnore));
    auto loss = [&](const std::vector<double>& xs) {
      return dot(ce_ref(xs, t, v), to_double(dloss));
    };
    EXPECT_TRUE(all_close(dx, finite_differences(loss, to_double(x)), 1e-6, 1e-5)) << n << "x" << v;
    for (int64_t j = 0; j < v; ++j) EXPECT_EQ(dx[1 * v + j], 0.f);  // the ignored row
  }
}

// The backward reads one target, lse and dloss per logit row: shorter ones are refused, not read
// past their ends.
TEST(CrossEntropy, BackwardRefusesTargetsLseOrDlossOfAnotherLength) {
  const int64_t n = 4, v = 7;
  Tensor x = make_tensor(random_normal(n * v, 30), {n, v}), t = from_ints({0, 1, 2, 3}, {n});
  const CrossEntropyResult r = cross_entropy(x, t, kIgnore);
  const Tensor dloss = make_tensor(random_normal(n, 31), {n});
  const auto both = [&](const Tensor& tt, const Tensor& lse, const Tensor& dl) {
    EXPECT_THROW(cross_entropy_backward(x, tt, lse, dl, kIgnore), InternalError);
    Tensor in_place = x.clone();
    EXPECT_THROW(cross_entropy_backward_(in_place, tt, lse, dl, kIgnore), InternalError);
    EXPECT_EQ(values(in_place), values(x));  // refused before anything was written
  };
  both(t.narrow(0, 0, 3), r.lse, dloss);
  both(t, r.lse.narrow(0, 0, 3), dloss);
  both(t, r.lse, dloss.narrow(0, 0, 1));
  EXPECT_EQ(cross_entropy_backward(x, t, r.lse, dloss, kIgnore).shape(), x.shape());
}

TEST(CrossEntropy, OutOfRangeTargetIsUserError) {
  Tensor x = make_tensor(random_normal(2 * 4, 30), {2, 4});
  for (int64_t bad : {int64_t{4}, int64_t{-1}, int64_t{-99}}) {
    try {
      cross_entropy(x, from_ints({0, bad}, {2}), kIgnore);
      ADD_FAILURE() << "target " << bad << " was accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos) << e.what();
    }
    Tensor lse = make_tensor({0.f, 0.f}, {2});
    Tensor dloss = make_tensor({1.f, 1.f}, {2});
    EXPECT_THROW(
        cross_entropy_backward(x, from_ints({bad, 0}, {2}, DType::I32), lse, dloss, kIgnore),
        UserError);
  }
  // A custom ignore_index is honoured, and -100 is then an ordinary (bad) target.
  CrossEntropyResult r = cross_entropy(x, from_ints({3, 7}, {2}), 7);
  EXPECT_EQ(values(r.losses)[1], 0.f);
  EXPECT_EQ(values(r.norm), (std::vector<float>{1.f, 1.f}));
  // Every target ignored: the divisor is 1 (the loss is the sum, 0), never 1 / 0.
  EXPECT_EQ(values(cross_entropy(x, from_ints({7, 7}, {2}), 7).norm),
            (std::vector<float>{1.f, 1.f}));
  EXPECT_THROW(cross_entropy(x, from_ints({0, -100}, {2}), 7), UserError);
}

// Note [Padded vocabulary]: cross-entropy over the first `classes` columns in place gives the
// bits of narrowing to those columns (a copy) first; the skipped columns get gradient 0. Also
// in bf16 and f16 (the widening adapter), and a target in the skipped columns is a UserError.
TEST(CrossEntropy, ClassesEqualsNarrowingFirst) {
  const int64_t n = 37, ld = 1088, classes = 1043;
  Tensor x32 = make_tensor(random_normal(n * ld, 50, 0.f, 3.f), {n, ld});
  std::vector<int64_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = i % 7 == 0 ? kIgnore : (i * 97) % classes;
  t[3] = classes - 1;
  Tensor tt = from_ints(t, {n});
  Tensor dloss = make_tensor(random_normal(n, 51), {n});
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    Tensor x = x32.to(dt);
    Tensor narrowed = x.narrow(1, 0, classes).contiguous();
    CrossEntropyResult a = cross_entropy(x, tt, kIgnore, classes);
    CrossEntropyResult b = cross_entropy(narrowed, tt, kIgnore);
    EXPECT_TRUE(same_bits(values(a.losses), values(b.losses))) << dtype_name(dt);
    EXPECT_TRUE(same_bits(values(a.lse), values(b.lse))) << dtype_name(dt);
    EXPECT_EQ(values(a.norm), values(b.norm));
    Tensor da = cross_entropy_backward(x, tt, a.lse, dloss, kIgnore, classes);
    Tensor db = cross_entropy_backward(narrowed, tt, b.lse, dloss, kIgnore);
    ASSERT_EQ(da.shape(), Shape({n, ld}));
    EXPECT_EQ(da.dtype(), dt);
    // Widening to F32 is exact, so equal F32 bits are equal dt bits.
    EXPECT_TRUE(same_bits(values(da.narrow(1, 0, classes).contiguous().to(DType::F32)),
                          values(db.to(DType::F32))))
        << dtype_name(dt);
    auto tail = values(da.narrow(1, classes, ld - classes).contiguous().to(DType::F32));
    for (float g : tail) ASSERT_EQ(g, 0.f) << dtype_name(dt);
  }
  EXPECT_THROW(cross_entropy(x32.narrow(0, 0, 2), from_ints({0, classes}, {2}), kIgnore, classes),
               UserError);
}

// cross_entropy_backward_ writes the gradient over the logits with the out-of-place bits, in
// every dtype, with padding columns and an ignored row; it wants contiguous logits.
TEST(CrossEntropy, InPlaceBackwardGivesTheOutOfPlaceBits) {
  const int64_t n = 29, ld = 1037, classes = 1001;
  Tensor x32 = make_tensor(random_normal(n * ld, 60, 0.f, 3.f), {n, ld});
  std::vector<int64_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = i % 5 == 0 ? kIgnore : (i * 89) % classes;
  Tensor tt = from_ints(t, {n});
  Tensor dloss = make_tensor(random_normal(n, 61), {n});
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    Tensor x = x32.to(dt);
    CrossEntropyResult r = cross_entropy(x, tt, kIgnore, classes);
    Tensor out = cross_entropy_backward(x, tt, r.lse, dloss, kIgnore, classes);
    Tensor in = x.clone();
    const void* at = in.data_ptr();
    cross_entropy_backward_(in, tt, r.lse, dloss, kIgnore, classes);
    EXPECT_EQ(in.data_ptr(), at);
    EXPECT_TRUE(same_bits(values(in.to(DType::F32)), values(out.to(DType::F32)))) << dtype_name(dt);
  }
  Tensor strided = x32.transpose(0, 1);
  EXPECT_ANY_THROW(cross_entropy_backward_(strided, from_ints(std::vector<int64_t>(ld, 0), {ld}),
                                           make_tensor(random_normal(ld, 62), {ld}),
                                           make_tensor(random_normal(ld, 63), {ld})));
}

// Note [Fused cross-entropy gradient]: cross_entropy_fused_ gives cross_entropy's losses, lse and
// norm, and leaves in the logits the gradient cross_entropy_backward gives for dloss = grad / m
// (the division the autograd backward makes), bit for bit; with every row ignored (m = 1) too. A
// bad target is a UserError that leaves the logits as they were.
TEST(CrossEntropy, FusedGivesTheForwardAndBackwardBits) {
  const int64_t n = 23, ld = 1037, classes = 1001;
  Tensor x32 = make_tensor(random_normal(n * ld, 70, 0.f, 3.f), {n, ld});
  std::vector<int64_t> t(n), none(n, kIgnore);
  for (int64_t i = 0; i < n; ++i) t[i] = i % 6 == 0 ? kIgnore : (i * 71) % classes;
  for (const auto& targets : {t, none}) {
    Tensor tt = from_ints(targets, {n});
    for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
      for (float grad : {1.0f, 0.25f, 1024.0f / 3.0f}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " grad " + std::to_string(grad));
        Tensor x = x32.to(dt);
        CrossEntropyResult want = cross_entropy(x, tt, kIgnore, classes);
        Tensor g = full({}, grad, DType::F32);
        Tensor dloss = div(g, want.norm.narrow(0, 0, 1).reshape({})).reshape({1}).expand({n});
        Tensor dx = cross_entropy_backward(x, tt, want.lse, dloss, kIgnore, classes);
        Tensor fused = x.clone();
        CrossEntropyResult got = cross_entropy_fused_(fused, tt, grad, kIgnore, classes);
        EXPECT_TRUE(same_bits(values(got.losses), values(want.losses)));
        EXPECT_TRUE(same_bits(values(got.lse), values(want.lse)));
        EXPECT_EQ(values(got.norm), values(want.norm));
        EXPECT_TRUE(same_bits(values(fused.to(DType::F32)), values(dx.to(DType::F32))));
      }
    }
  }
  Tensor bad = x32.narrow(0, 0, 2).clone();
  const std::vector<float> before = values(bad);
  EXPECT_THROW(cross_entropy_fused_(bad, from_ints({0, classes}, {2}), 1.f, kIgnore, classes),
               UserError);
  EXPECT_TRUE(same_bits(values(bad), before));
}

// scale_unless_equal_ leaves x untouched where g equals the expected value, else multiplies it by
// g / expected with one rounding (affine's bits).
TEST(CrossEntropy, ScaleUnlessEqualScalesOnlyOnADifference) {
  Tensor x32 = make_tensor(random_normal(1001, 80, 0.f, 2.f), {7, 143});
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = x32.to(dt);
    Tensor same = x.clone();
    scale_unless_equal_(same, full({}, 0.75f, DType::F32), 0.75f);
    EXPECT_TRUE(same_bits(values(same.to(DType::F32)), values(x.to(DType::F32))));
    Tensor other = x.clone();
    scale_unless_equal_(other, full({}, 0.3f, DType::F32), 0.75f);
    EXPECT_TRUE(same_bits(values(other.to(DType::F32)),
                          values(affine(x, 0.3f / 0.75f, 0.f).to(DType::F32))));
  }
}

TEST(CrossEntropy, DeterministicAcrossThreadCounts) {
  const int64_t n = 67, v = 5003;
  Tensor x = make_tensor(random_normal(n * v, 40, 0.f, 4.f), {n, v});
  std::vector<int64_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = i % 9 == 0 ? kIgnore : (i * 131) % v;
  Tensor tt = from_ints(t, {n});
  Tensor dloss = make_tensor(random_normal(n, 41), {n});
  auto run = [&] {
    CrossEntropyResult r = cross_entropy(x, tt, kIgnore);
    Tensor dx = cross_entropy_backward(x, tt, r.lse, dloss, kIgnore);
    return std::vector<std::vector<float>>{values(r.losses), values(r.lse), values(dx)};
  };
  auto one = with_threads(1, run);
  for (int threads : {2, 3, 4}) {
    auto many = with_threads(threads, run);
    for (size_t i = 0; i < one.size(); ++i)
      EXPECT_TRUE(same_bits(one[i], many[i])) << i << ", " << threads;
  }
}

}  // namespace
}  // namespace strata::tensor
