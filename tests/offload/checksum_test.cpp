#include "offload/checksum.h"

#include <gtest/gtest.h>

#include <set>

#include "offload_test_util.h"

namespace strata::offload {
namespace {

TEST(Checksum, MatchesXxh64OfEmptyInput) {
  // XXH64("", seed 0), from the xxHash reference.
  EXPECT_EQ(checksum64("", 0), 0xEF46DB3751D8E999ULL);
}

TEST(Checksum, EveryBitFlipAndLengthChangesIt) {
  auto data = testing::random_bytes(1000, 1);
  const uint64_t base = checksum64(data.data(), data.size());
  std::set<uint64_t> seen{base};
  for (size_t i = 0; i < data.size(); i += 37) {
    for (int bit = 0; bit < 8; bit += 3) {
      data[i] ^= static_cast<unsigned char>(1u << bit);
      seen.insert(checksum64(data.data(), data.size()));
      data[i] ^= static_cast<unsigned char>(1u << bit);
    }
  }
  EXPECT_EQ(checksum64(data.data(), data.size()), base);  // deterministic
  EXPECT_EQ(seen.size(), 1 + ((data.size() + 36) / 37) * 3);
  for (size_t n : {0, 1, 3, 4, 7, 8, 31, 32, 33, 999}) seen.insert(checksum64(data.data(), n));
  EXPECT_EQ(seen.size(), 1 + ((data.size() + 36) / 37) * 3 + 10);
}

}  // namespace
}  // namespace strata::offload
