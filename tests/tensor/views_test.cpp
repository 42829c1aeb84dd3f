// Views (reshape, view, transpose, permute, narrow, slice, select, unsqueeze, squeeze, expand)
// and copies out of / into non-contiguous layouts.
#include <gtest/gtest.h>

#include <numeric>

#include "tensor/ops.h"
#include "tests/tensor/tensor_test_util.h"

namespace strata::tensor {
namespace {

using testing::at;
using testing::make;
using testing::values;

// 0, 1, 2, ... as an f32 tensor, so every element's value is its row-major index.
Tensor iota(const Shape& shape) {
  std::vector<float> v(static_cast<size_t>(shape.numel()));
  std::iota(v.begin(), v.end(), 0.f);
  return make(v, shape);
}

TEST(Views, ReshapeOfContiguousSharesStorage) {
  Tensor x = iota({2, 3, 4});
  Tensor y = x.reshape({6, -1});
  EXPECT_EQ(y.shape(), Shape({6, 4}));
  EXPECT_EQ(y.data_ptr(), x.data_ptr());
  EXPECT_TRUE(y.is_contiguous());
  EXPECT_EQ(at(y, {5, 3}), 23.f);
  Tensor z = x.view({24});
  EXPECT_EQ(z.storage(), x.storage());
  EXPECT_EQ(x.flatten().shape(), Shape({24}));
}

TEST(Views, TransposeAndPermuteIndexTheSameElements) {
  Tensor x = iota({2, 3, 4});
  Tensor t = x.transpose(0, 2);
  ASSERT_EQ(t.shape(), Shape({4, 3, 2}));
  EXPECT_FALSE(t.is_contiguous());
  Tensor p = x.permute({1, 2, 0});
  ASSERT_EQ(p.shape(), Shape({3, 4, 2}));
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 4; ++k) {
        const float v = static_cast<float>(i * 12 + j * 4 + k);
        EXPECT_EQ(at(t, {k, j, i}), v);
        EXPECT_EQ(at(p, {j, k, i}), v);
      }
}

TEST(Views, ViewOfNonContiguousWhereLayoutAllows) {
  // [6, 4] transposed is [4, 6] with strides (1, 4): its second dim can be split, not merged.
  Tensor t = iota({6, 4}).transpose(0, 1);
  Tensor v = t.view({4, 2, 3});
  EXPECT_EQ(v.storage(), t.storage());
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t a = 0; a < 2; ++a)
      for (int64_t b = 0; b < 3; ++b) EXPECT_EQ(at(v, {i, a, b}), at(t, {i, a * 3 + b}));
  EXPECT_THROW(t.view({24}), InternalError);
  // reshape copies instead, in logical order.
  Tensor r = t.reshape({24});
  EXPECT_NE(r.storage(), t.storage());
  std::vector<float> expect = values(t);
  EXPECT_EQ(values(r), expect);
}

TEST(Views, NarrowSliceSelect) {
  Tensor x = iota({5, 6});
  Tensor n = x.narrow(1, 2, 3);
  ASSERT_EQ(n.shape(), Shape({5, 3}));
  EXPECT_EQ(at(n, {4, 2}), 4 * 6 + 4.f);
  Tensor s = x.slice(0, 1, 5, 2);  // rows 1 and 3
  ASSERT_EQ(s.shape(), Shape({2, 6}));
  EXPECT_EQ(at(s, {1, 5}), 3 * 6 + 5.f);
  Tensor neg = x.slice(1, -2, 6);  // the last two columns
  ASSERT_EQ(neg.shape(), Shape({5, 2}));
  EXPECT_EQ(at(neg, {0, 0}), 4.f);
  Tensor row = x.select(0, -1);
  ASSERT_EQ(row.shape(), Shape({6}));
  EXPECT_EQ(at(row, {0}), 24.f);
  Tensor col = x.select(1, 2);
  ASSERT_EQ(col.shape(), Shape({5}));
  EXPECT_EQ(col.stride(0), 6);
  EXPECT_EQ(at(col, {3}), 20.f);
  EXPECT_THROW(x.narrow(0, 3, 3), InternalError);
  EXPECT_THROW(x.select(1, 6), InternalError);
}

TEST(Views, UnsqueezeSqueezeExpand) {
  Tensor x = iota({3, 4});
  Tensor u = x.unsqueeze(1);
  ASSERT_EQ(u.shape(), Shape({3, 1, 4}));
  EXPECT_TRUE(u.is_contiguous());
  EXPECT_EQ(u.unsqueeze(-1).shape(), Shape({3, 1, 4, 1}));
  EXPECT_EQ(u.squeeze(1).shape(), Shape({3, 4}));
  EXPECT_THROW(x.squeeze(0), InternalError);
  Tensor e = x.unsqueeze(0).expand({2, 3, 4});
  ASSERT_EQ(e.shape(), Shape({2, 3, 4}));
  EXPECT_EQ(e.stride(0), 0);
  EXPECT_EQ(at(e, {1, 2, 3}), 11.f);
  Tensor c = iota({3, 1}).expand({3, 5});
  EXPECT_EQ(at(c, {2, 4}), 2.f);
  EXPECT_THROW(x.expand({3, 5}), InternalError);
}

TEST(Views, ContiguousCopiesOnlyWhenNeeded) {
  Tensor x = iota({4, 5});
  EXPECT_EQ(x.contiguous().data_ptr(), x.data_ptr());
  Tensor t = x.transpose(0, 1);
  Tensor c = t.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_NE(c.data_ptr(), x.data_ptr());
  EXPECT_EQ(values(c), values(t));
  Tensor k = x.clone();
  EXPECT_NE(k.data_ptr(), x.data_ptr());
  EXPECT_EQ(values(k), values(x));
}

// Every kind of view as a source, each copied out and compared element by element.
TEST(Views, CopiesOutOfEveryKindOfView) {
  Tensor x = iota({4, 5, 6});
  std::vector<Tensor> views = {x.transpose(0, 2),
                               x.permute({2, 0, 1}),
                               x.narrow(2, 1, 4),
                               x.slice(1, 0, 5, 2),
                               x.select(1, 3),
                               x.unsqueeze(0),
                               x.select(2, 0).unsqueeze(2).expand({4, 5, 7}),
                               x.slice(0, 1, 4, 2).transpose(1, 2).narrow(2, 1, 3)};
  for (const Tensor& v : views) {
    Tensor c = v.contiguous();
    ASSERT_EQ(c.shape(), v.shape());
    EXPECT_EQ(values(c), values(v)) << v.str();
    EXPECT_EQ(to_float_vector(v), values(v)) << v.str();
  }
}

TEST(Views, SixDimensionalPermutedSlicedCopy) {
  Tensor x = iota({2, 3, 1, 4, 5, 3});
  Tensor v = x.permute({5, 3, 0, 4, 2, 1}).slice(3, 1, 5, 2).narrow(0, 1, 2);  // [2, 4, 2, 2, 1, 3]
  ASSERT_EQ(v.shape(), Shape({2, 4, 2, 2, 1, 3}));
  Tensor c = v.contiguous();
  for (int64_t i = 0; i < c.numel(); ++i) {
    auto idx = testing::unravel(v.shape(), i);
    // v[a, b, c, d, e, f] = x[c, f, e, b, 1 + 2 d, 1 + a]
    const float expect = at(x, {idx[2], idx[5], idx[4], idx[1], 1 + 2 * idx[3], 1 + idx[0]});
    ASSERT_EQ(at(c, idx), expect) << i;
  }
  // And back into a 6-d permuted destination, as f16.
  Tensor dst = Tensor::empty({3, 1, 2, 2, 4, 2}, DType::F16);
  Tensor dv = dst.permute({2, 4, 3, 5, 1, 0});
  dv.copy_(v);
  EXPECT_EQ(to_float_vector(dv), values(v));
}

TEST(Views, CopyIntoNonContiguousDestinations) {
  Tensor src = iota({3, 4});
  // Into a transposed view: dst^T == src.
  Tensor dst = Tensor::empty({4, 3});
  dst.fill_(-1.0);
  Tensor dt = dst.transpose(0, 1);
  dt.copy_(src);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(at(dst, {j, i}), at(src, {i, j}));
  // Into a strided slice: only every other column changes.
  Tensor wide = Tensor::empty({3, 8});
  wide.fill_(-1.0);
  Tensor every_other = wide.slice(1, 0, 8, 2);
  every_other.copy_(src);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 8; ++j)
      EXPECT_EQ(at(wide, {i, j}), j % 2 == 0 ? at(src, {i, j / 2}) : -1.f);
  // From a zero-stride (expanded) source into a permuted destination.
  Tensor row = iota({1, 4});
  Tensor big = Tensor::empty({4, 6});
  Tensor bt = big.transpose(0, 1);
  bt.copy_(row.expand({6, 4}));
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 6; ++j) EXPECT_EQ(at(big, {i, j}), static_cast<float>(i));
}

TEST(Views, LargeStridedCopyRunsInParallelAndMatches) {
  // Big enough for the threaded path, with few long rows (rows are cut into pieces).
  Tensor x = testing::rand({3, 70001}, 5);
  Tensor dst = Tensor::empty({70001, 3});
  Tensor dt = dst.transpose(0, 1);
  dt.copy_(x);
  for (int64_t j = 0; j < 70001; j += 997)
    for (int64_t i = 0; i < 3; ++i) ASSERT_EQ(at(dst, {j, i}), at(x, {i, j}));
  Tensor back = dt.contiguous();
  EXPECT_TRUE(testing::same_bits(back, x));
}

TEST(Views, OverlappingCopyReadsBeforeWriting) {
  Tensor x = iota({10});
  Tensor expect = make({0, 0, 1, 2, 3, 4, 5, 6, 7, 8}, {10});
  Tensor tail = x.narrow(0, 1, 9);
  tail.copy_(x.narrow(0, 0, 9));
  EXPECT_EQ(values(x), values(expect));
  // Transposing a square matrix in place through a view of itself.
  Tensor m = iota({3, 3});
  m.copy_(m.transpose(0, 1));
  EXPECT_EQ(values(m), std::vector<float>({0, 3, 6, 1, 4, 7, 2, 5, 8}));
}

TEST(Views, SplitGivesViews) {
  Tensor x = iota({2, 7});
  auto parts = split(x, {3, 4}, 1);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[1].shape(), Shape({2, 4}));
  EXPECT_EQ(parts[1].storage(), x.storage());
  EXPECT_EQ(at(parts[1], {1, 0}), 10.f);
}

}  // namespace
}  // namespace strata::tensor
