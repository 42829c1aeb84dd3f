#include "offload/memory_stats.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "offload/allocator.h"

namespace strata::offload {
namespace {

TEST(MemoryStats, CurrentAndPeakPerPair) {
  MemoryStats stats;
  HostAllocator alloc(64, &stats);
  Block a = alloc.allocate(1000, Category::Param);
  Block b = alloc.allocate(500, Category::Grad);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.ptr) % 64, 0u);
  EXPECT_EQ(stats.usage(Tier::Host, Category::Param).current, 1000);
  EXPECT_EQ(stats.tier_usage(Tier::Host).current, 1500);
  alloc.deallocate(a);
  Block c = alloc.allocate(200, Category::Param);
  EXPECT_EQ(stats.usage(Tier::Host, Category::Param).current, 200);
  EXPECT_EQ(stats.usage(Tier::Host, Category::Param).peak, 1000);
  EXPECT_EQ(stats.tier_usage(Tier::Host).peak, 1500);
  stats.reset_peaks();
  EXPECT_EQ(stats.tier_usage(Tier::Host).peak, 700);
  alloc.deallocate(b);
  alloc.deallocate(c);
  EXPECT_EQ(stats.tier_usage(Tier::Host).current, 0);
  EXPECT_NE(stats.report().find("param"), std::string::npos);
}

TEST(MemoryStats, CategoryScopeNests) {
  EXPECT_EQ(current_category(), Category::Activation);
  {
    CategoryScope s(Category::Optimizer);
    EXPECT_EQ(current_category(), Category::Optimizer);
    {
      CategoryScope t(Category::Comm);
      EXPECT_EQ(current_category(), Category::Comm);
    }
    EXPECT_EQ(current_category(), Category::Optimizer);
  }
  EXPECT_EQ(current_category(), Category::Activation);
}

}  // namespace
}  // namespace strata::offload

namespace strata::offload {
namespace {

TEST(HostAllocator, LargeBlocksAreCachedAndReused) {
  MemoryStats stats;
  HostAllocator alloc(64, &stats);
  const size_t big = 3 * (size_t{1} << 20) + 5;  // rounds to 4 MiB
  Block a = alloc.allocate(big, Category::Activation);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.ptr) % 64, 0u);
  static_cast<char*>(a.ptr)[big - 1] = 7;  // the whole request is usable
  alloc.deallocate(a);
  EXPECT_EQ(stats.tier_usage(Tier::Host).current, 0);  // cached bytes are not live bytes
  EXPECT_EQ(alloc.cached_bytes(), 4 * (size_t{1} << 20));
  Block b = alloc.allocate(big - 100, Category::Grad);  // same rounded size: the cached block
  EXPECT_EQ(b.ptr, a.ptr);
  EXPECT_EQ(alloc.cached_bytes(), 0u);
  EXPECT_EQ(stats.usage(Tier::Host, Category::Grad).current, static_cast<int64_t>(big - 100));
  Block c = alloc.allocate(big, Category::Grad);  // none cached now: a fresh block
  EXPECT_NE(c.ptr, b.ptr);
  alloc.deallocate(b);
  alloc.deallocate(c);
  EXPECT_EQ(alloc.cached_bytes(), 8 * (size_t{1} << 20));
  alloc.release_cache();
  EXPECT_EQ(alloc.cached_bytes(), 0u);
}

// Note [Host cache trimming]: a trim unmaps what no allocation took since the trim before.
TEST(HostAllocator, TrimReturnsBlocksNotReusedSinceTheLastTrim) {
  MemoryStats stats;
  HostAllocator alloc(64, &stats);
  const size_t mib = size_t{1} << 20;
  Block kept = alloc.allocate(2 * mib, Category::Activation);
  Block once = alloc.allocate(6 * mib, Category::Param);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(once.ptr) % HostAllocator::kCacheGranule, 0u);
  static_cast<char*>(once.ptr)[6 * mib - 1] = 1;
  alloc.deallocate(kept);
  alloc.deallocate(once);
  EXPECT_EQ(alloc.trim(), 0u);  // both freed since the last trim: a step may ask again
  EXPECT_EQ(alloc.cached_bytes(), 8 * mib);
  Block again = alloc.allocate(2 * mib, Category::Activation);  // the next "step" reuses one
  EXPECT_EQ(again.ptr, kept.ptr);
  alloc.deallocate(again);
  EXPECT_EQ(alloc.trim(), 6 * mib);  // the other was not asked for: unmapped
  EXPECT_EQ(alloc.cached_bytes(), 2 * mib);
  EXPECT_EQ(alloc.trim(), 2 * mib);  // and this one, unused through a whole interval, too
  EXPECT_EQ(alloc.cached_bytes(), 0u);
  EXPECT_EQ(stats.tier_usage(Tier::Host).current, 0);
}

TEST(HostAllocator, SmallBlocksAreNotCached) {
  MemoryStats stats;
  HostAllocator alloc(64, &stats);
  Block a = alloc.allocate(1000, Category::Param);
  alloc.deallocate(a);
  EXPECT_EQ(alloc.cached_bytes(), 0u);
}

}  // namespace
}  // namespace strata::offload
