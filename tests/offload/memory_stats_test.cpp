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
