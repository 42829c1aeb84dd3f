#include "offload/swapper.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "offload_test_util.h"

namespace strata::offload {
namespace {

using testing::TempDir;

class SwapperTest : public ::testing::TestWithParam<IoEngineKind> {
 protected:
  void SetUp() override {
    STRATA_SKIP_IF_NO_ENGINE(GetParam());
    NvmeConfig c;
    c.paths = {dir_.path()};
    c.block_bytes = 64 * 1024;
    c.aio.engine = GetParam();
    c.aio.block_size = 64 * 1024;
    store_ = std::make_unique<NvmeStore>(c, &stats_);
    pinned_ = std::make_unique<PinnedAllocator>(&stats_);
  }
  // Names b0..b{n-1} of sizes that are not page multiples, filled and swapped out.
  std::vector<std::vector<unsigned char>> populate(Swapper& s, int n, size_t len) {
    std::vector<std::vector<unsigned char>> data;
    for (int i = 0; i < n; ++i) s.add(name(i), len + i * 1000, Category::Optimizer);
    for (int i = 0; i < n; ++i) {
      data.push_back(testing::random_bytes(len + i * 1000, 500 + i));
      auto* p = static_cast<unsigned char*>(s.acquire(name(i)));
      EXPECT_EQ(p[0], 0);  // a new buffer starts zeroed
      std::memcpy(p, data.back().data(), data.back().size());
      s.swap_out(name(i));
    }
    s.wait_all();
    return data;
  }
  static std::string name(int i) { return "b" + std::to_string(i); }

  TempDir dir_;
  MemoryStats stats_;
  std::unique_ptr<NvmeStore> store_;
  std::unique_ptr<PinnedAllocator> pinned_;
};

TEST_P(SwapperTest, RoundTripsThroughNvmeBitExact) {
  Swapper s(*store_, *pinned_, {size_t{4} << 20, 2});
  auto data = populate(s, 6, 150000);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(s.state(name(i)), Swapper::State::OnTier);
  EXPECT_EQ(s.pinned_in_use(), 0u);
  EXPECT_EQ(stats_.tier_usage(Tier::Pinned).current, 0);
  for (int round = 0; round < 2; ++round) {
    for (int i = 5; i >= 0; --i) {
      auto* p = static_cast<unsigned char*>(s.acquire(name(i)));
      ASSERT_EQ(std::memcmp(p, data[i].data(), data[i].size()), 0) << name(i);
      p[7] ^= 1;  // modify, write back, and expect the modification next round
      data[i][7] ^= 1;
      s.swap_out(name(i));
    }
  }
  s.wait_all();
}

TEST_P(SwapperTest, PrefetchKeepsTheNextKInFlightInOrder) {
  Swapper s(*store_, *pinned_, {size_t{8} << 20, 2});
  auto data = populate(s, 5, 100000);
  std::vector<std::string> landed;
  s.set_landed_hook([&](const std::string& n, void* p, size_t bytes) {
    landed.push_back(n);
    // The GPU hop would start here: the bytes are already in pinned memory.
    const int i = n[1] - '0';
    EXPECT_EQ(bytes, data[i].size());
    EXPECT_EQ(std::memcmp(p, data[i].data(), bytes), 0);
  });
  s.set_access_order({name(0), name(1), name(2), name(3), name(4)});
  // Before anything is used, the first K are already on their way.
  EXPECT_NE(s.state(name(0)), Swapper::State::OnTier);
  EXPECT_NE(s.state(name(1)), Swapper::State::OnTier);
  EXPECT_EQ(s.state(name(2)), Swapper::State::OnTier);
  for (int step = 0; step < 10; ++step) {
    const int i = step % 5;
    auto* p = static_cast<unsigned char*>(s.acquire(name(i)));
    ASSERT_EQ(std::memcmp(p, data[i].data(), data[i].size()), 0);
    // While i is in use, i+1 and i+2 are in flight or landed; i+3 is not touched.
    EXPECT_NE(s.state(name((i + 1) % 5)), Swapper::State::OnTier) << "step " << step;
    EXPECT_NE(s.state(name((i + 2) % 5)), Swapper::State::OnTier) << "step " << step;
    EXPECT_EQ(s.state(name((i + 3) % 5)), Swapper::State::OnTier) << "step " << step;
    s.release(name(i));
  }
  s.wait_all();
  // Every buffer landed in access order, each exactly when its turn came.
  std::vector<std::string> expected;
  for (int k = 0; k < 12; ++k) expected.push_back(name(k % 5));
  expected.resize(landed.size());
  EXPECT_EQ(landed, expected);
  EXPECT_GE(landed.size(), 10u);
}

TEST_P(SwapperTest, PinnedBoundHoldsUnderBackPressure) {
  const size_t len = 200000;  // rounds to 49 pages
  const size_t bound = 3 * PinnedAllocator::rounded_size(len + 5000);
  Swapper s(*store_, *pinned_, {bound, 4});  // prefetch wants more than the bound allows
  auto data = populate(s, 6, len);
  std::vector<std::string> order;
  for (int i = 0; i < 6; ++i) order.push_back(name(i));
  s.set_access_order(order);
  for (int step = 0; step < 18; ++step) {
    const int i = step % 6;
    auto* p = static_cast<unsigned char*>(s.acquire(name(i)));
    ASSERT_EQ(std::memcmp(p, data[i].data(), data[i].size()), 0) << "step " << step;
    EXPECT_LE(s.pinned_in_use(), bound);
    p[1] ^= 0xff;
    data[i][1] ^= 0xff;
    s.swap_out(name(i));  // the write holds pinned memory until it completes
  }
  s.wait_all();
  EXPECT_LE(s.peak_pinned(), bound);
  EXPECT_LE(static_cast<size_t>(stats_.tier_usage(Tier::Pinned).peak), bound);
  // K = 4 ahead never fits a bound of 3 buffers: prefetches were held back, not over-issued.
  EXPECT_GT(s.deferred_prefetches(), 0);
}

TEST_P(SwapperTest, WorkingSetLargerThanTheBoundIsAClearError) {
  const size_t len = 100000;
  Swapper s(*store_, *pinned_, {2 * PinnedAllocator::rounded_size(len), 1});
  for (int i = 0; i < 3; ++i) s.add(name(i), len, Category::Param);
  s.acquire(name(0));
  s.acquire(name(1));
  try {
    s.acquire(name(2));
    FAIL() << "expected the bound to be reported";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("pinned memory bound too small"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("b2"), std::string::npos);
  }
  s.release(name(0));
  EXPECT_NE(s.acquire(name(2)), nullptr);  // fits once something is released
  EXPECT_THROW(s.add("big", 10 << 20, Category::Param), UserError);
}

TEST_P(SwapperTest, FailedSwapOutKeepsTheDataResident) {
  Swapper s(*store_, *pinned_, {size_t{4} << 20, 1});
  auto data = populate(s, 2, 70000);
  auto* p = static_cast<unsigned char*>(s.acquire(name(0)));
  p[3] ^= 0x42;
  data[0][3] ^= 0x42;
  store_->engine().set_fault_injector([](const IoOp& op, long r) { return op.write ? -EIO : r; });
  // The failure surfaces at the first call that learns of it: swap_out itself when the write
  // has already completed by the time it polls, wait_all otherwise.
  EXPECT_THROW(
      {
        s.swap_out(name(0));
        s.wait_all();
      },
      UserError);
  EXPECT_EQ(s.state(name(0)), Swapper::State::Acquired);
  store_->engine().set_fault_injector(nullptr);
  p = static_cast<unsigned char*>(s.acquire(name(0)));
  EXPECT_EQ(std::memcmp(p, data[0].data(), data[0].size()), 0);
  s.swap_out(name(0));
  s.wait_all();
  for (int i = 0; i < 2; ++i) {
    p = static_cast<unsigned char*>(s.acquire(name(i)));
    EXPECT_EQ(std::memcmp(p, data[i].data(), data[i].size()), 0);
    s.release(name(i));
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, SwapperTest, ::testing::ValuesIn(testing::engine_kinds()),
                         testing::engine_param_name);

}  // namespace
}  // namespace strata::offload
