// sum_to, sum/mean/max over a dim, sum_all, sum_squares: against double references, on
// non-contiguous inputs, and bit-identical whatever the thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "tensor/ops.h"
#include "tests/tensor/tensor_test_util.h"

namespace strata::tensor {
namespace {

using testing::at;
using testing::make;
using testing::rand;
using testing::values;

// The f32 result of a sum accumulated in double must be the double sum rounded, give or take the
// double rounding of a different addition order: allow one f32 ulp.
void expect_sum_close(float got, double ref, const std::string& what) {
  const double tol = testing::ulp(static_cast<float>(ref)) + 1e-300;
  ASSERT_LE(std::fabs(got - ref), tol) << what << ": got " << got << " want " << ref;
}

// Reference sum_to: out[o] = sum of x over all elements that broadcast onto o.
std::vector<double> ref_sum_to(const Tensor& x, const Shape& out) {
  std::vector<double> r(static_cast<size_t>(out.numel()), 0.0);
  const int lead = x.ndim() - out.ndim();
  for (int64_t i = 0; i < x.numel(); ++i) {
    auto idx = testing::unravel(x.shape(), i);
    int64_t o = 0;
    for (int d = 0; d < out.ndim(); ++d) o = o * out[d] + (out[d] == 1 ? 0 : idx[d + lead]);
    r[o] += at(x, idx);
  }
  return r;
}

void check_sum_to(const Tensor& x, const Shape& out) {
  Tensor y = sum_to(x, out);
  ASSERT_EQ(y.shape(), out);
  std::vector<double> ref = ref_sum_to(x, out);
  std::vector<float> got = values(y);
  for (size_t o = 0; o < ref.size(); ++o)
    expect_sum_close(got[o], ref[o], x.str() + " -> " + out.str() + " at " + std::to_string(o));
}

TEST(SumTo, BroadcastBackwardShapes) {
  Tensor x = rand({3, 5, 7}, 1);
  for (const Shape& s : {Shape{5, 1}, Shape{7}, Shape{3, 1, 7}, Shape{1, 1, 1}, Shape{},
                         Shape{3, 5, 1}, Shape{1, 5, 7}, Shape{3, 1, 1}})
    check_sum_to(x, s);
  EXPECT_TRUE(sum_to(x, x.shape()).is_same(x));  // nothing to sum: the op returns x itself
}

TEST(SumTo, NonContiguousInputs) {
  Tensor x = rand({7, 5, 3}, 2).permute({2, 1, 0});  // [3, 5, 7]
  for (const Shape& s : {Shape{5, 1}, Shape{7}, Shape{3, 1, 1}, Shape{}}) check_sum_to(x, s);
  Tensor e = rand({1, 9}, 3).expand({6, 9});  // zero-stride dim summed
  check_sum_to(e, {9});
  check_sum_to(rand({40, 30}, 4).slice(0, 1, 40, 3), {1, 30});
}

TEST(SumTo, LargeShapesUseEveryChunking) {
  // Bias gradient: [B*T, C] -> [C] (rows chunked), and the transposed case (inner dim reduced,
  // longer than one chunk), and a full reduction of more than one chunk.
  check_sum_to(rand({2048, 300}, 5), {300});
  check_sum_to(rand({3, 40000}, 6), {3, 1});
  check_sum_to(rand({70000}, 7), {1});
  check_sum_to(rand({4, 600, 5}, 8), {600, 1});
}

TEST(SumTo, BitIdenticalAcrossThreadCounts) {
  std::vector<std::pair<Tensor, Shape>> cases = {{rand({2048, 768}, 1), {768}},
                                                 {rand({768, 2048}, 2).transpose(0, 1), {768}},
                                                 {rand({8, 50000}, 3), {8, 1}},
                                                 {rand({300001}, 4), {}}};
  for (auto& [x, s] : cases) {
    Tensor ref = sum_to(x, s);
    testing::for_thread_counts({1, 2, 3, 5}, [&](int n) {
      EXPECT_TRUE(testing::same_bits(sum_to(x, s), ref)) << x.str() << " threads " << n;
    });
  }
}

TEST(SumTo, HalfPrecisionInputKeepsItsDtype) {
  Tensor x = rand({64, 33}, 9).to(DType::BF16);
  Tensor y = sum_to(x, {33});
  EXPECT_EQ(y.dtype(), DType::BF16);
  Tensor xf = x.to(DType::F32);
  std::vector<double> ref = ref_sum_to(xf, {33});
  std::vector<float> got = to_float_vector(y);
  for (int j = 0; j < 33; ++j)
    EXPECT_EQ(got[j], static_cast<float>(BFloat16(static_cast<float>(ref[j])))) << j;
}

// ---- reduce over one dim ----

TEST(Reduce, SumMeanMaxOverEachDim) {
  for (const Tensor& x : {rand({3, 5, 7}, 1), rand({7, 5, 3}, 2).permute({2, 1, 0})}) {
    for (int dim = 0; dim < 3; ++dim) {
      Tensor s = sum(x, dim), m = mean(x, dim), sk = sum(x, dim, /*keepdim=*/true);
      MaxResult mx = max(x, dim);
      Shape expect = x.shape();
      expect.erase(dim);
      ASSERT_EQ(s.shape(), expect);
      ASSERT_EQ(mx.indices.shape(), expect);
      ASSERT_EQ(mx.indices.dtype(), DType::I64);
      ASSERT_EQ(sk.ndim(), 3);
      std::vector<int64_t> arg = to_int_vector(mx.indices);
      for (int64_t o = 0; o < s.numel(); ++o) {
        auto oi = testing::unravel(expect, o);
        double total = 0;
        float best = -INFINITY;
        int64_t best_at = -1;
        for (int64_t r = 0; r < x.size(dim); ++r) {
          auto xi = oi;
          xi.insert(xi.begin() + dim, r);
          const float v = at(x, xi);
          total += v;
          if (v > best) {
            best = v;
            best_at = r;
          }
        }
        expect_sum_close(at(s, oi), total, "sum");
        expect_sum_close(at(m, oi), total / x.size(dim), "mean");
        ASSERT_EQ(at(mx.values, oi), best);
        ASSERT_EQ(arg[o], best_at);
      }
      EXPECT_TRUE(testing::same_bits(sk.squeeze(dim), s));
    }
  }
}

TEST(Reduce, ArgmaxTakesTheFirstOfTiesAndNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = make({1, 3, 3, 2,      // tie: first 3
                   5, 5, 5, 5,      // all equal
                   1, nan, 9, nan,  // NaN wins, first one
                   -INFINITY, -INFINITY, -1, -1},
                  {4, 4});
  MaxResult r = max(x, 1);
  EXPECT_EQ(to_int_vector(r.indices), std::vector<int64_t>({1, 0, 1, 2}));
  std::vector<float> v = values(r.values);
  EXPECT_EQ(v[0], 3.f);
  EXPECT_TRUE(std::isnan(v[2]));
  EXPECT_EQ(v[3], -1.f);
  // Over dim 0 (inner dim kept: the column path).
  MaxResult c = max(x, 0);
  EXPECT_EQ(to_int_vector(c.indices), std::vector<int64_t>({1, 2, 2, 2}));
}

TEST(Reduce, LargeAndThreadCountIndependent) {
  Tensor x = rand({64, 5000}, 3);
  Tensor s = sum(x, 1), m = mean(x, 0);
  MaxResult mx = max(x, 1), mc = max(x, 0);
  testing::for_thread_counts({1, 3}, [&](int) {
    EXPECT_TRUE(testing::same_bits(sum(x, 1), s));
    EXPECT_TRUE(testing::same_bits(mean(x, 0), m));
    EXPECT_TRUE(testing::same_bits(max(x, 1).values, mx.values));
    EXPECT_EQ(to_int_vector(max(x, 0).indices), to_int_vector(mc.indices));
  });
  std::vector<float> sv = values(s);
  for (int64_t i = 0; i < 64; i += 9) {
    double t = 0;
    for (int64_t j = 0; j < 5000; ++j) t += at(x, {i, j});
    expect_sum_close(sv[i], t, "row sum");
  }
}

// ---- top_k (Note [Top-k]) ----

// The reference order, written from the note rather than from the backends' keys: NaN first,
// then larger values, equal values (-0 == +0) and NaNs by index (a stable sort of the row).
std::vector<int64_t> ref_top_k(const std::vector<float>& row, int64_t k) {
  std::vector<int64_t> order(row.size());
  for (size_t i = 0; i < row.size(); ++i) order[i] = static_cast<int64_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const float x = row[static_cast<size_t>(a)], y = row[static_cast<size_t>(b)];
    if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && !std::isnan(y);
    return x > y;
  });
  order.resize(static_cast<size_t>(k));
  return order;
}

// x [rows, n] (any layout): top_k's values and indices are the reference's, row by row.
void check_top_k(const Tensor& x, int64_t k) {
  SCOPED_TRACE(x.str() + " k=" + std::to_string(k));
  TopKResult r = top_k(x, k);
  ASSERT_EQ(r.values.shape(), Shape({x.size(0), k}));
  ASSERT_EQ(r.values.dtype(), x.dtype());
  ASSERT_EQ(r.indices.dtype(), DType::I64);
  // values() reads F32; the widening is exact.
  const std::vector<float> xv = values(x.to(DType::F32)), got_v = values(r.values.to(DType::F32));
  const std::vector<int64_t> got_i = to_int_vector(r.indices);
  const auto n = static_cast<size_t>(x.size(1));
  for (int64_t row = 0; row < x.size(0); ++row) {
    const std::vector<float> rv(xv.begin() + row * n, xv.begin() + (row + 1) * n);
    const std::vector<int64_t> want = ref_top_k(rv, k);
    for (int64_t j = 0; j < k; ++j) {
      const size_t o = static_cast<size_t>(row * k + j);
      ASSERT_EQ(got_i[o], want[static_cast<size_t>(j)]) << "row " << row << " rank " << j;
      const float w = rv[static_cast<size_t>(want[static_cast<size_t>(j)])];
      if (std::isnan(w)) {
        ASSERT_TRUE(std::isnan(got_v[o]));
      } else {
        ASSERT_EQ(std::bit_cast<uint32_t>(got_v[o]), std::bit_cast<uint32_t>(w));
      }
    }
  }
}

TEST(TopK, TakesTheLargestBestFirstAndBreaksTiesByIndex) {
  // Few distinct values, so ties straddle every cut.
  Tensor coarse = rand({6, 300}, 11, -4.f, 4.f);
  {
    std::vector<float> v = values(coarse);
    for (float& e : v) e = std::round(e);
    coarse = make(v, {6, 300});
  }
  for (int64_t k : {0, 1, 2, 40, 299, 300}) check_top_k(coarse, k);
  for (int64_t k : {1, 7, 64, 257}) check_top_k(rand({5, 1000}, 12), k);
  // Low precision: the values are copied, so they are the input's.
  check_top_k(coarse.to(DType::BF16), 40);
  check_top_k(rand({3, 500}, 13).to(DType::F16), 33);
}

TEST(TopK, OrdersSignedZerosInfinitiesAndNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = make({0.f, -0.f, 1.f, -INFINITY, nan, INFINITY, -0.f, nan, -1.f, 0.f}, {1, 10});
  TopKResult r = top_k(x, 10);
  // NaNs first (by index), then +inf, 1, the four zeros by index (-0 == +0), -1, -inf.
  EXPECT_EQ(to_int_vector(r.indices), std::vector<int64_t>({4, 7, 5, 2, 0, 1, 6, 9, 8, 3}));
  check_top_k(x, 10);
  check_top_k(x, 5);
  // k = 1 is max's argmax on rows without NaN.
  Tensor y = rand({9, 77}, 14);
  EXPECT_EQ(to_int_vector(top_k(y, 1).indices), to_int_vector(max(y, 1).indices));
}

TEST(TopK, TakesAnyLayoutAndLeadingDims) {
  // A [rows, n] slice of wider rows (a sampler's logits without the padded vocabulary).
  Tensor wide = rand({4, 130}, 15);
  check_top_k(wide.narrow(1, 0, 117), 9);
  // Rows with a non-unit stride, and leading dims: [2, 3, 50] -> [2, 3, k].
  Tensor t = rand({50, 6}, 16).transpose(0, 1);
  check_top_k(t, 5);
  Tensor x3 = rand({2, 3, 50}, 17);
  TopKResult r = top_k(x3, 4);
  ASSERT_EQ(r.indices.shape(), Shape({2, 3, 4}));
  TopKResult flat = top_k(x3.reshape({6, 50}), 4);
  EXPECT_EQ(to_int_vector(r.indices), to_int_vector(flat.indices));
  EXPECT_TRUE(testing::same_bits(r.values.reshape({6, 4}), flat.values));
  // One dim is one row.
  EXPECT_EQ(to_int_vector(top_k(make({3, 9, 1}, {3}), 2).indices), std::vector<int64_t>({1, 0}));
}

TEST(TopK, RejectsAKOutsideTheRow) {
  Tensor x = rand({2, 5}, 18);
  EXPECT_THROW(top_k(x, 6), Error);
  EXPECT_THROW(top_k(x, -1), Error);
  EXPECT_THROW(top_k(from_ints({1, 2}, {2}, DType::I64), 1), Error);
}

TEST(TopK, ThreadCountIndependent) {
  Tensor x = rand({64, 3000}, 19);
  TopKResult r = top_k(x, 50);
  testing::for_thread_counts({1, 3}, [&](int) {
    TopKResult again = top_k(x, 50);
    EXPECT_EQ(to_int_vector(again.indices), to_int_vector(r.indices));
    EXPECT_TRUE(testing::same_bits(again.values, r.values));
  });
}

TEST(Reduce, SumAllIsZeroDim) {
  Tensor x = rand({17, 19}, 4).transpose(0, 1);
  Tensor s = sum_all(x);
  EXPECT_EQ(s.ndim(), 0);
  double t = 0;
  for (float v : values(x)) t += v;
  expect_sum_close(s.item<float>(), t, "sum_all");
}

// ---- sum_squares ----

TEST(SumSquares, DoubleAccumulationAnyFloatDtypeAnyLayout) {
  Tensor x = rand({1000, 333}, 5);  // several chunks
  double ref = 0;
  for (float v : values(x)) ref += static_cast<double>(v) * v;
  EXPECT_NEAR(sum_squares(x), ref, 1e-12 * ref);
  EXPECT_NEAR(l2_norm(x), std::sqrt(ref), 1e-12 * std::sqrt(ref));
  EXPECT_NEAR(sum_squares(x.transpose(0, 1)), ref, 1e-12 * ref);
  for (DType d : {DType::BF16, DType::F16}) {
    Tensor h = x.to(d);
    double r = 0;
    for (float v : to_float_vector(h)) r += static_cast<double>(v) * v;
    EXPECT_NEAR(sum_squares(h), r, 1e-12 * r) << dtype_name(d);
  }
  EXPECT_EQ(sum_squares(Tensor::empty({0})), 0.0);
  EXPECT_NEAR(global_l2_norm({x, x}), std::sqrt(2 * ref), 1e-12 * std::sqrt(ref));
}

TEST(SumSquares, BitIdenticalAcrossThreadCounts) {
  Tensor x = rand({3000001}, 6);
  const double ref = sum_squares(x);
  testing::for_thread_counts({1, 2, 3, 7}, [&](int n) { EXPECT_EQ(sum_squares(x), ref) << n; });
}

}  // namespace
}  // namespace strata::tensor
