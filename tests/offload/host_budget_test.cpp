// Note [Host memory budget]: the allocators refuse, with an error naming the category and the
// budget, an allocation that would take the process's host bytes over the budget.
#include "offload/host_budget.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "core/error.h"
#include "offload/allocator.h"
#include "offload/pinned_allocator.h"

namespace strata::offload {
namespace {

constexpr int64_t kMiB = 1 << 20;

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(HostBudget, ParsesSizes) {
  EXPECT_EQ(parse_host_budget("auto", "k"), -1);
  EXPECT_EQ(parse_host_budget("none", "k"), 0);
  EXPECT_EQ(parse_host_budget("1073741824", "k"), int64_t{1} << 30);
  EXPECT_EQ(parse_host_budget("512MiB", "k"), 512 * kMiB);
  EXPECT_EQ(parse_host_budget("20GiB", "k"), int64_t{20} << 30);
  EXPECT_EQ(parse_host_budget("1.5TiB", "k"), int64_t{3} << 39);
  EXPECT_EQ(parse_host_budget("64GB", "k"), int64_t{64'000'000'000});
  EXPECT_EQ(parse_host_budget("2 MB", "k"), int64_t{2'000'000});
  for (const char* bad : {"", "lots", "20XB", "-1GiB", "1e9", "GiB", "1.2.3GiB"}) {
    const std::string msg = error_of([&] { parse_host_budget(bad, "run.host_memory_budget"); });
    EXPECT_NE(msg.find("run.host_memory_budget"), std::string::npos) << bad << ": " << msg;
    EXPECT_NE(msg.find("20GiB"), std::string::npos) << bad << ": " << msg;
  }
  EXPECT_NE(error_of([] { parse_host_budget("1000", "k"); }).find("below 1 MiB"),
            std::string::npos);
}

TEST(HostBudget, AvailableMemoryIsRead) {
  // /proc/meminfo exists on every machine the tests run on.
  EXPECT_GT(available_host_memory(), 0);
}

// Note [Auto budget reserve]: 1 GiB up to 16 GiB available, 1/16 above; auto never exceeds what
// is available less 1 GiB.
TEST(HostBudget, AutoBudgetKeepsAReserveOutsideTheAllocators) {
  constexpr int64_t kGiB = int64_t{1} << 30;
  EXPECT_EQ(auto_host_budget_reserve(4 * kGiB), kGiB);
  EXPECT_EQ(auto_host_budget_reserve(16 * kGiB), kGiB);
  EXPECT_EQ(auto_host_budget_reserve(32 * kGiB), 2 * kGiB);
  EXPECT_EQ(auto_host_budget_reserve(23 * kGiB), 23 * kGiB / 16);
  EXPECT_LE(auto_host_budget(), std::max<int64_t>(0, available_host_memory() - kGiB));
}

TEST(HostBudget, HostAllocatorRefusesPastTheBudgetNamingTheCategory) {
  MemoryStats stats;
  HostAllocator alloc(64, &stats);
  HostBudgetScope budget(10 * kMiB, "the test's budget");
  Block params = alloc.allocate(4 * kMiB, Category::Param);
  Block acts = alloc.allocate(6 * kMiB, Category::Activation);  // exactly the budget: fits
  EXPECT_EQ(HostMemoryBudget::in_use(stats), 10 * kMiB);
  const std::string msg = error_of([&] { alloc.allocate(1, Category::Optimizer); });
  EXPECT_NE(msg.find("exceeded by optimizer states"), std::string::npos) << msg;
  EXPECT_NE(msg.find("10.0 MiB"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the test's budget"), std::string::npos) << msg;
  EXPECT_NE(msg.find("parameters 4.0 MiB, activations 6.0 MiB"), std::string::npos) << msg;
  EXPECT_EQ(HostMemoryBudget::in_use(stats), 10 * kMiB);  // the refused block is not charged
  alloc.deallocate(acts);
  // The freed 6 MiB block is cached, not charged: a 3 MiB block (4 MiB rounded, so not the cached
  // one) fits the live bytes, and the cache is given back first, as it would take the process
  // to 4 + 6 + 4 MiB.
  EXPECT_EQ(alloc.cached_bytes(), size_t{6} << 20);
  Block grads = alloc.allocate(3 * kMiB, Category::Grad);
  EXPECT_EQ(alloc.cached_bytes(), 0u);
  alloc.deallocate(grads);
  alloc.deallocate(params);
}

TEST(HostBudget, PinnedBytesCountAgainstTheSameBudget) {
  MemoryStats stats;
  HostAllocator host(64, &stats);
  PinnedAllocator pinned(&stats, false);
  HostBudgetScope budget(8 * kMiB, "b");
  Block h = host.allocate(6 * kMiB, Category::Param);
  const std::string msg = error_of([&] { pinned.allocate(3 * kMiB, Category::Comm); });
  EXPECT_NE(msg.find("exceeded by communication buffers"), std::string::npos) << msg;
  Block p = pinned.allocate(2 * kMiB, Category::Comm);
  EXPECT_EQ(HostMemoryBudget::in_use(stats), 8 * kMiB);
  pinned.deallocate(p);
  host.deallocate(h);
}

TEST(HostBudget, ScopeRestoresTheBudgetBefore) {
  HostBudgetScope outer(0, "");
  {
    HostBudgetScope inner(5 * kMiB, "inner");
    EXPECT_EQ(HostMemoryBudget::limit(), 5 * kMiB);
    EXPECT_EQ(HostMemoryBudget::source(), "inner");
  }
  EXPECT_EQ(HostMemoryBudget::limit(), 0);
  MemoryStats stats;
  HostAllocator alloc(64, &stats);
  Block big = alloc.allocate(64 * kMiB, Category::Activation);  // no budget: anything goes
  alloc.deallocate(big);
}

}  // namespace
}  // namespace strata::offload
