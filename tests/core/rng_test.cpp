#include "core/rng.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace strata {
namespace {

// Known-answer test from the Random123 distribution (kat_vectors, philox4x32_10):
// counter (0,0,0,0), key (0,0) -> 6627e8d5 e169c58d bc57ac4c 9b00dbd8.
TEST(Philox, KnownAnswerZero) {
  auto r = philox4x32({0, 0}, 0);
  EXPECT_EQ(r[0], 0x6627e8d5u);
  EXPECT_EQ(r[1], 0xe169c58du);
  EXPECT_EQ(r[2], 0xbc57ac4cu);
  EXPECT_EQ(r[3], 0x9b00dbd8u);
}

TEST(Rng, SliceMatchesWhole) {
  RngKey key{42, rng_stream(1, 2, 3)};
  std::vector<float> whole(1001), part(333);
  rng_normal(whole.data(), whole.size(), key, 0.f, 1.f);
  rng_normal(part.data(), part.size(), key, 0.f, 1.f, 501);
  for (size_t i = 0; i < part.size(); ++i) EXPECT_EQ(part[i], whole[501 + i]);
}

TEST(Rng, NormalMoments) {
  std::vector<float> x(200000);
  rng_normal(x.data(), x.size(), {7, 9}, 1.f, 2.f);
  double m = 0, v = 0;
  for (float f : x) m += f;
  m /= x.size();
  for (float f : x) v += (f - m) * (f - m);
  v /= x.size();
  EXPECT_NEAR(m, 1.0, 0.02);
  EXPECT_NEAR(std::sqrt(v), 2.0, 0.02);
}

TEST(Rng, UniformRangeAndBernoulliRate) {
  std::vector<float> u(100000);
  rng_uniform(u.data(), u.size(), {1, 2}, -1.f, 3.f);
  for (float f : u) {
    ASSERT_GE(f, -1.f);
    ASSERT_LT(f, 3.f);
  }
  std::vector<uint8_t> b(100000);
  rng_bernoulli(b.data(), b.size(), {1, 3}, 0.9f);
  double keep = 0;
  for (uint8_t k : b) keep += k;
  EXPECT_NEAR(keep / b.size(), 0.9, 0.005);
}

TEST(Rng, GeneratorStreamsDifferAndRestore) {
  Generator g(5);
  RngKey a = g.next_key(), b = g.next_key();
  EXPECT_NE(a.stream, b.stream);
  Generator h(0);
  h.set_state(5, 1);
  EXPECT_EQ(h.next_key(), b);
}

}  // namespace
}  // namespace strata
