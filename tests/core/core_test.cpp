#include <gtest/gtest.h>

#include <cmath>

#include "core/cpu_features.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/half.h"

namespace strata {
namespace {

TEST(Error, CheckReportsFileAndLine) {
  try {
    STRATA_CHECK(1 + 1 == 3, "math is {}", "broken");
    FAIL() << "no throw";
  } catch (const InternalError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("core_test.cpp"), std::string::npos) << msg;
    EXPECT_NE(msg.find("math is broken"), std::string::npos) << msg;
  }
}

TEST(Error, UserErrorIsDistinct) {
  EXPECT_THROW(parse_dtype("float128"), UserError);
  EXPECT_THROW(parse_device("tpu"), UserError);
  EXPECT_EQ(parse_dtype("bf16"), DType::BF16);
  EXPECT_EQ(parse_device("cuda:3").index, 3);
}

TEST(DType, Sizes) {
  EXPECT_EQ(dtype_size(DType::F32), 4u);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
  EXPECT_EQ(dtype_size(DType::U8), 1u);
}

TEST(Half, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(BFloat16::from_float(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (down).
  EXPECT_EQ(BFloat16::from_float(1.00390625f), 0x3f80);
  // 1 + 3*2^-8 is halfway too: rounds up to the even mantissa.
  EXPECT_EQ(BFloat16::from_float(1.01171875f), 0x3f82);
  EXPECT_TRUE(std::isnan(BFloat16::to_float(BFloat16::from_float(NAN))));
}

TEST(Half, Float16RoundTripsAllFiniteValues) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    uint16_t bits = static_cast<uint16_t>(h);
    if ((bits & 0x7c00) == 0x7c00) continue;  // inf/nan
    float f = Float16::to_float(bits);
    ASSERT_EQ(Float16::from_float(f), bits) << std::hex << h;
  }
  EXPECT_EQ(Float16::from_float(65520.f), 0x7c00);  // overflow to inf
  EXPECT_EQ(Float16::from_float(1.0f), 0x3c00);
}

TEST(CpuFeatures, Consistent) {
  const CpuFeatures& f = cpu_features();
  if (f.avx512bw) {
    EXPECT_TRUE(f.avx512f);
  }
  EXPECT_FALSE(f.summary().empty());
  EXPECT_GE(num_threads(), 1);
}

}  // namespace
}  // namespace strata

#include "core/timer.h"

namespace strata {
namespace {

TEST(Timer, MedianAndMonotonic) {
  EXPECT_EQ(median({5.0, 1.0, 3.0}), 3.0);
  EXPECT_EQ(median({}), 0.0);
  Stopwatch w;
  double a = w.seconds();
  double b = w.seconds();
  EXPECT_GE(a, 0.0);
  EXPECT_GE(b, a);
}

}  // namespace
}  // namespace strata
