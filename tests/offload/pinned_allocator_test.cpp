#include "offload/pinned_allocator.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstring>

#include "offload_test_util.h"

namespace strata::offload {
namespace {

TEST(PinnedAllocator, AlignedAccountedAndPooled) {
  MemoryStats stats;
  PinnedAllocator alloc(&stats);
  EXPECT_EQ(alloc.backing(), PinnedAllocator::Backing::Mlock);  // no GPU in the test machine
  const size_t n = 3 * 4096 + 17;
  Block a = alloc.allocate(n, Category::Optimizer);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.ptr) % 4096, 0u);
  EXPECT_EQ(stats.usage(Tier::Pinned, Category::Optimizer).current, static_cast<int64_t>(n));
  auto data = testing::random_bytes(n, 7);
  std::memcpy(a.ptr, data.data(), n);
  EXPECT_EQ(std::memcmp(a.ptr, data.data(), n), 0);
  alloc.deallocate(a);
  EXPECT_EQ(stats.tier_usage(Tier::Pinned).current, 0);
  EXPECT_EQ(alloc.pooled_bytes(), 4 * 4096u);
  Block b = alloc.allocate(4 * 4096, Category::Param);  // same rounded size: reused
  EXPECT_EQ(b.ptr, a.ptr);
  EXPECT_EQ(alloc.pool_hits(), 1);
  Block c = alloc.allocate(4096, Category::Param);  // different size: fresh
  EXPECT_NE(c.ptr, b.ptr);
  alloc.deallocate(b);
  alloc.deallocate(c);
  EXPECT_EQ(alloc.pooled_bytes(), 5 * 4096u);
  alloc.release_pool();
  EXPECT_EQ(alloc.pooled_bytes(), 0u);
}

TEST(PinnedAllocator, FallsBackToUnlockedMemoryWhenMlockIsRefused) {
  // RLIMIT_MEMLOCK binds only without CAP_IPC_LOCK: as root, drop to nobody in a child first.
  auto r = testing::run_in_child([] {
    if (::geteuid() == 0 && ::setuid(65534) != 0) return std::string("setuid failed");
    rlimit lim{64 * 1024, 64 * 1024};
    if (::setrlimit(RLIMIT_MEMLOCK, &lim) != 0) return std::string("setrlimit failed");
    MemoryStats stats;
    PinnedAllocator alloc(&stats);
    Block small = alloc.allocate(4096, Category::Param);   // fits the limit: locked
    Block big = alloc.allocate(1 << 20, Category::Param);  // does not: unlocked, counted
    std::memset(big.ptr, 1, 1 << 20);
    const int64_t unlocked = alloc.unlocked_allocations();
    alloc.deallocate(small);
    alloc.deallocate(big);
    return "unlocked=" + std::to_string(unlocked);
  });
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out, "unlocked=1");
}

}  // namespace
}  // namespace strata::offload
