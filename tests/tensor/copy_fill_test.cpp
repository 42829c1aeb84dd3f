// copy across every dtype pair (with rounding and Note [Dtype conversion]), fill, arange, random
// draws and concat.
#include <gtest/gtest.h>

#include <bit>
#include <limits>

#include "core/rng.h"
#include "tensor/cpu/convert.h"
#include "tensor/ops.h"
#include "tests/tensor/tensor_test_util.h"

namespace strata::tensor {
namespace {

using cpu::visit_dtype;
using testing::at;
using testing::make;
using testing::values;

constexpr DType kAll[] = {DType::F32, DType::BF16, DType::F16, DType::I32,
                          DType::I64, DType::U16,  DType::U8};

// A tensor of dtype T holding `v` (each exactly representable in every dtype), written directly.
template <typename T>
Tensor typed(const std::vector<double>& v, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DTypeOf<T>::value);
  T* p = static_cast<T*>(t.data_ptr());
  for (size_t i = 0; i < v.size(); ++i) {
    if constexpr (cpu::kIsFloatLike<T>) {
      p[i] = T(static_cast<float>(v[i]));
    } else {
      p[i] = static_cast<T>(v[i]);
    }
  }
  return t;
}

// Element idx of t as double, read directly from memory.
double read(const Tensor& t, const std::vector<int64_t>& idx) {
  return visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T v = static_cast<const T*>(t.data_ptr())[testing::offset_of(t, idx)];
    if constexpr (cpu::kIsFloatLike<T>) {
      return static_cast<double>(static_cast<float>(v));
    } else {
      return static_cast<double>(v);
    }
  });
}

TEST(Copy, EveryDtypePairContiguousAndStrided) {
  const std::vector<double> vals = {0, 1, 2, 3, 7, 100, 42, 255, 17, 64, 5, 128};
  for (DType s : kAll) {
    for (DType d : kAll) {
      Tensor src = visit_dtype(s, [&](auto tag) { return typed<decltype(tag)>(vals, {3, 4}); });
      Tensor dst = Tensor::empty({3, 4}, d);
      dst.copy_(src);
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t j = 0; j < 4; ++j)
          ASSERT_EQ(read(dst, {i, j}), vals[i * 4 + j]) << dtype_name(s) << " -> " << dtype_name(d);
      // Transposed source into a transposed destination slice.
      Tensor wide = Tensor::empty({4, 6}, d);
      Tensor dv = wide.narrow(1, 1, 3);
      dv.copy_(src.transpose(0, 1));
      for (int64_t i = 0; i < 4; ++i)
        for (int64_t j = 0; j < 3; ++j)
          ASSERT_EQ(read(wide, {i, j + 1}), vals[j * 4 + i])
              << dtype_name(s) << " -> " << dtype_name(d) << " strided";
      // to() agrees.
      Tensor conv = src.to(d);
      EXPECT_EQ(conv.dtype(), d);
      EXPECT_EQ(read(conv, {2, 3}), vals[11]);
    }
  }
}

TEST(Copy, BFloat16RoundsToNearestEven) {
  const float one = 1.f;
  const float halfway_even = 1.f + std::ldexp(1.f, -8);     // tie between 1 and 1+2^-7
  const float halfway_odd = 1.f + 3 * std::ldexp(1.f, -8);  // tie between 1+2^-7 and 1+2^-6
  const float above_half = 1.f + std::ldexp(1.f, -8) + std::ldexp(1.f, -20);
  const float big = std::numeric_limits<float>::max();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  Tensor src = make({one, halfway_even, halfway_odd, above_half, -halfway_odd, big, inf, nan}, {8});
  Tensor b = src.to(DType::BF16);
  const BFloat16* p = b.data<BFloat16>();
  EXPECT_EQ(static_cast<float>(p[0]), 1.f);
  EXPECT_EQ(static_cast<float>(p[1]), 1.f);
  EXPECT_EQ(static_cast<float>(p[2]), 1.f + std::ldexp(1.f, -6));
  EXPECT_EQ(static_cast<float>(p[3]), 1.f + std::ldexp(1.f, -7));
  EXPECT_EQ(static_cast<float>(p[4]), -(1.f + std::ldexp(1.f, -6)));
  EXPECT_EQ(static_cast<float>(p[5]), inf);  // rounds past the largest bf16
  EXPECT_EQ(static_cast<float>(p[6]), inf);
  EXPECT_TRUE(std::isnan(static_cast<float>(p[7])));
  // bf16 -> f32 is exact.
  Tensor back = b.to(DType::F32);
  EXPECT_EQ(at(back, {2}), 1.f + std::ldexp(1.f, -6));
}

TEST(Copy, Float16RoundsToNearestEvenIncludingSubnormals) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> in = {1.f + std::ldexp(1.f, -11),      // tie -> 1
                           1.f + 3 * std::ldexp(1.f, -11),  // tie -> 1 + 2^-9
                           65504.f,
                           65519.f,
                           65520.f,                   // max, below the tie, tie -> inf
                           std::ldexp(1.f, -24),      // smallest subnormal
                           std::ldexp(1.f, -25),      // tie with 0 -> 0
                           3 * std::ldexp(1.f, -26),  // rounds up to 2^-24
                           -2.5f,
                           1e-3f};
  std::vector<float> expect = {1.f,     1.f + std::ldexp(1.f, -9),
                               65504.f, 65504.f,
                               inf,     std::ldexp(1.f, -24),
                               0.f,     std::ldexp(1.f, -24),
                               -2.5f,   Float16::to_float(Float16::from_float(1e-3f))};
  // Short (scalar tail) and long (vector path) tensors must agree.
  for (int reps : {1, 9}) {
    std::vector<float> v;
    for (int r = 0; r < reps; ++r) v.insert(v.end(), in.begin(), in.end());
    Tensor h = make(v, {static_cast<int64_t>(v.size())}).to(DType::F16);
    const Float16* p = h.data<Float16>();
    for (size_t i = 0; i < v.size(); ++i)
      EXPECT_EQ(static_cast<float>(p[i]), expect[i % in.size()]) << "element " << i;
  }
  EXPECT_NEAR(expect.back(), 1e-3f, 1e-6f);
}

// The vectorised f32 <-> half loops against the scalar conversions of core/half.h, bit for bit,
// over random bit patterns covering every exponent (NaNs excluded: their payloads may differ).
TEST(Copy, VectorisedHalfConversionsMatchScalar) {
  const int64_t n = 1 << 16;
  std::vector<float> v;
  for (int64_t i = 0; v.size() < static_cast<size_t>(n); ++i) {
    auto r = philox4x32({3, 4}, static_cast<uint64_t>(i));
    for (uint32_t u : r) {
      const float f = std::bit_cast<float>(u);
      if (!std::isnan(f)) v.push_back(f);
    }
  }
  v.resize(static_cast<size_t>(n));
  Tensor x = make(v, {n});
  Tensor h = x.to(DType::F16), b = x.to(DType::BF16);
  const Float16* hp = h.data<Float16>();
  const BFloat16* bp = b.data<BFloat16>();
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(hp[i].bits, Float16::from_float(v[i])) << v[i];
    ASSERT_EQ(bp[i].bits, BFloat16::from_float(v[i])) << v[i];
  }
  Tensor hf = h.to(DType::F32), bf = b.to(DType::F32);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(testing::bits(at(hf, {i})), testing::bits(Float16::to_float(hp[i].bits)));
    ASSERT_EQ(testing::bits(at(bf, {i})), testing::bits(BFloat16::to_float(bp[i].bits)));
  }
}

TEST(Copy, FloatToIntTruncatesAndNarrowingWraps) {
  Tensor f = make({2.7f, -2.7f, 300.7f, -1.f, 65537.f}, {5});
  EXPECT_EQ(to_int_vector(f.to(DType::I32)), std::vector<int64_t>({2, -2, 300, -1, 65537}));
  EXPECT_EQ(to_int_vector(f.to(DType::U8)), std::vector<int64_t>({2, 254, 44, 255, 1}));
  EXPECT_EQ(to_int_vector(f.to(DType::U16)), std::vector<int64_t>({2, 65534, 300, 65535, 1}));
  Tensor big = from_ints({(int64_t{1} << 32) + 5, (int64_t{1} << 24) + 1, -3}, {3});
  EXPECT_EQ(to_int_vector(big.to(DType::I32)), std::vector<int64_t>({5, (1 << 24) + 1, -3}));
  // 2^24 + 1 is not an f32: round to nearest even.
  EXPECT_EQ(to_float_vector(big.to(DType::F32))[1], 16777216.f);
}

TEST(Fill, EveryDtypeAndNonContiguousViews) {
  for (DType d : kAll) {
    Tensor t = full({3, 5}, 7.0, d);
    for (int64_t i = 0; i < 15; ++i) ASSERT_EQ(read(t, {i / 5, i % 5}), 7.0) << dtype_name(d);
    // Only the viewed elements change.
    Tensor col = t.select(1, 2);
    col.fill_(3.0);
    Tensor sub = t.narrow(0, 1, 2).slice(1, 3, 5);
    sub.fill_(1.0);
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 5; ++j) {
        double expect = j == 2 ? 3.0 : 7.0;
        if (i >= 1 && j >= 3) expect = 1.0;
        ASSERT_EQ(read(t, {i, j}), expect) << dtype_name(d) << " " << i << "," << j;
      }
  }
  Tensor z = zeros({1000, 100});
  for (float v : values(z)) ASSERT_EQ(testing::bits(v), 0u);
  Tensor o = ones({4}, DType::BF16);
  EXPECT_EQ(to_float_vector(o), std::vector<float>(4, 1.f));
  EXPECT_EQ(read(full({1}, 0.1, DType::BF16), {0}), static_cast<float>(BFloat16(0.1f)));
}

TEST(Arange, StartStepAndDtypes) {
  Tensor a = arange(5);
  EXPECT_EQ(values(a), std::vector<float>({0, 1, 2, 3, 4}));
  Tensor i = arange(4, DType::I64);
  EXPECT_EQ(to_int_vector(i), std::vector<int64_t>({0, 1, 2, 3}));
  Tensor t = Tensor::empty({4}, DType::F32);
  backend_for(Device::cpu()).arange(t, 1.5, -0.5);
  EXPECT_EQ(values(t), std::vector<float>({1.5f, 1.f, 0.5f, 0.f}));
  Tensor big = arange(100000, DType::I32);
  std::vector<int64_t> v = to_int_vector(big);
  for (int64_t k = 0; k < 100000; ++k) ASSERT_EQ(v[k], k);
}

TEST(Random, ElementIDependsOnlyOnKeyAndI) {
  const RngKey key{11, rng_stream(1, 2)};
  const int64_t n = 100003;  // past the threaded threshold, odd
  std::vector<float> ref(n);
  rng_normal(ref.data(), ref.size(), key, 0.5f, 2.f);
  testing::for_thread_counts({1, 2, 3}, [&](int) {
    Tensor x = randn({n}, key, 0.5f, 2.f);
    std::vector<float> v = values(x);
    ASSERT_EQ(std::memcmp(v.data(), ref.data(), n * sizeof(float)), 0);
  });
  // Shape does not matter, only the logical index.
  Tensor y = randn({7, 11}, key, 0.5f, 2.f);
  for (int64_t i = 0; i < 77; ++i) EXPECT_EQ(at(y, {i / 11, i % 11}), ref[i]);
  // A different key draws different numbers.
  Tensor z = randn({77}, RngKey{11, rng_stream(1, 3)}, 0.5f, 2.f);
  int same = 0;
  for (int64_t i = 0; i < 77; ++i) same += at(z, {i}) == ref[i];
  EXPECT_LT(same, 2);
}

TEST(Random, NonF32AndNonContiguousDestinations) {
  const RngKey key{5, 6};
  std::vector<float> ref(24);
  rng_uniform(ref.data(), ref.size(), key, -2.f, 3.f);
  Tensor b = Tensor::empty({4, 6}, DType::BF16);
  backend_for(Device::cpu()).random_uniform(b, key, -2.f, 3.f);
  const BFloat16* bp = b.data<BFloat16>();
  for (int i = 0; i < 24; ++i) EXPECT_EQ(bp[i].bits, BFloat16::from_float(ref[i]));
  // A transposed destination receives element i at logical index i.
  Tensor base = Tensor::empty({6, 4});
  Tensor t = base.transpose(0, 1);
  backend_for(Device::cpu()).random_uniform(t, key, -2.f, 3.f);
  for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(at(t, {i / 6, i % 6}), ref[i]);
  Tensor u = uniform({50000}, key, -2.f, 3.f);
  for (float f : values(u)) {
    ASSERT_GE(f, -2.f);
    ASSERT_LT(f, 3.f);
  }
}

TEST(Concat, AlongEachDimWithViewsAndEmptyPieces) {
  Tensor a = testing::rand({2, 3, 4}, 1), b = testing::rand({2, 5, 4}, 2);
  Tensor e = Tensor::empty({2, 0, 4});
  Tensor c = concat({a, e, b}, 1);
  ASSERT_EQ(c.shape(), Shape({2, 8, 4}));
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 8; ++j)
      for (int64_t k = 0; k < 4; ++k)
        ASSERT_EQ(at(c, {i, j, k}), j < 3 ? at(a, {i, j, k}) : at(b, {i, j - 3, k}));
  // Non-contiguous pieces along the last dim.
  Tensor x = testing::rand({4, 3}, 3).transpose(0, 1);      // [3, 4]
  Tensor y = testing::rand({3, 10}, 4).slice(1, 0, 10, 5);  // [3, 2]
  Tensor d = concat({x, y}, -1);
  ASSERT_EQ(d.shape(), Shape({3, 6}));
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 6; ++j)
      ASSERT_EQ(at(d, {i, j}), j < 4 ? at(x, {i, j}) : at(y, {i, j - 4}));
  Tensor f = concat({a, a}, 0);
  ASSERT_EQ(f.shape(), Shape({4, 3, 4}));
  EXPECT_EQ(at(f, {3, 2, 1}), at(a, {1, 2, 1}));
  // Integer dtypes too.
  Tensor ia = from_ints({1, 2}, {2}), ib = from_ints({3}, {1});
  EXPECT_EQ(to_int_vector(concat({ia, ib}, 0)), std::vector<int64_t>({1, 2, 3}));
}

}  // namespace
}  // namespace strata::tensor
