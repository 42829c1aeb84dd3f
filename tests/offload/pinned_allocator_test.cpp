#include "offload/pinned_allocator.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstring>

#include "offload_test_util.h"

namespace strata::offload {
namespace {

TEST(PinnedAllocator, AlignedAccountedAndPooled) {
  MemoryStats stats;
  PinnedAllocator alloc(&stats, /*use_cuda=*/false);  // the mlock path, GPU or not
  EXPECT_EQ(alloc.backing(), PinnedAllocator::Backing::Mlock);
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

// The default allocator takes cudaHostAlloc where a CUDA device is visible (a GPU machine, the
// CUDA emulator) and mlock'ed memory elsewhere; either way the buffers are aligned, usable,
// accounted and pooled. (The tests above ask for the mlock path, which a visible device would
// otherwise replace.)
TEST(PinnedAllocator, DefaultBackingHandsOutUsableAccountedBuffers) {
  MemoryStats stats;
  PinnedAllocator alloc(&stats);
  SCOPED_TRACE(alloc.backing() == PinnedAllocator::Backing::CudaHost ? "cudaHostAlloc" : "mlock");
  const size_t n = 2 * 4096 + 5;
  Block a = alloc.allocate(n, Category::Activation);
  ASSERT_NE(a.ptr, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.ptr) % 4096, 0u);
  EXPECT_EQ(stats.usage(Tier::Pinned, Category::Activation).current, static_cast<int64_t>(n));
  auto data = testing::random_bytes(n, 9);
  std::memcpy(a.ptr, data.data(), n);
  EXPECT_EQ(std::memcmp(a.ptr, data.data(), n), 0);
  alloc.deallocate(a);
  EXPECT_EQ(stats.tier_usage(Tier::Pinned).current, 0);
  Block b = alloc.allocate(3 * 4096, Category::Activation);  // the same rounded size: pooled
  EXPECT_EQ(b.ptr, a.ptr);
  alloc.deallocate(b);
  alloc.release_pool();
  EXPECT_EQ(alloc.pooled_bytes(), 0u);
}

// Note [Pinned buffers on huge pages]: which sizes take whole 2 MiB pages, what they occupy,
// and that such buffers are 2 MiB-aligned, usable and accounted.
TEST(PinnedAllocator, LargeBuffersAreMappedForHugePages) {
  constexpr size_t kMiB = size_t{1} << 20;
  EXPECT_EQ(PinnedAllocator::rounded_size(kMiB + 1), kMiB + 4096);     // small: 4 KiB pages
  EXPECT_EQ(PinnedAllocator::rounded_size(2 * kMiB), 2 * kMiB);        // a 2 MiB multiple
  EXPECT_EQ(PinnedAllocator::rounded_size(3 * kMiB), 3 * kMiB);        // padding would be 1/3
  EXPECT_EQ(PinnedAllocator::rounded_size(16 * kMiB + 1), 18 * kMiB);  // padding < 1/8
  EXPECT_FALSE(PinnedAllocator::uses_huge_pages(PinnedAllocator::rounded_size(3 * kMiB)));
  EXPECT_TRUE(PinnedAllocator::uses_huge_pages(PinnedAllocator::rounded_size(16 * kMiB + 1)));
  MemoryStats stats;
  PinnedAllocator alloc(&stats, /*use_cuda=*/false);
  Block a = alloc.allocate(16 * kMiB + 1, Category::Optimizer);
  Block b = alloc.allocate(kMiB, Category::Optimizer);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.ptr) % PinnedAllocator::kHugePage, 0u);
  EXPECT_EQ(alloc.huge_page_bytes(), 18 * kMiB);
  EXPECT_EQ(stats.usage(Tier::Pinned, Category::Optimizer).current,
            static_cast<int64_t>(17 * kMiB + 1));
  auto data = testing::random_bytes(a.bytes, 5);
  std::memcpy(a.ptr, data.data(), a.bytes);
  EXPECT_EQ(std::memcmp(a.ptr, data.data(), a.bytes), 0);
  // Live and pooled buffers are in the table an AIO engine registers from; released ones not.
  EXPECT_EQ(alloc.buffer_table()->snapshot(nullptr).size(), 2u);
  alloc.deallocate(a);
  EXPECT_EQ(alloc.pooled_bytes(), 18 * kMiB);
  EXPECT_EQ(alloc.buffer_table()->snapshot(nullptr).size(), 2u);
  alloc.release_pool();
  EXPECT_EQ(alloc.huge_page_bytes(), 0u);
  const auto left = alloc.buffer_table()->snapshot(nullptr);
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].ptr, b.ptr);
  alloc.deallocate(b);
}

TEST(PinnedAllocator, FallsBackToUnlockedMemoryWhenMlockIsRefused) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // The sanitizers' runtimes replace mlock with a no-op that succeeds, so nothing is refused.
  GTEST_SKIP() << "mlock is a no-op under AddressSanitizer and ThreadSanitizer";
#endif
  // RLIMIT_MEMLOCK binds only without CAP_IPC_LOCK: as root, drop to nobody in a child first.
  auto r = testing::run_in_child([] {
    if (::geteuid() == 0 && ::setuid(65534) != 0) return std::string("setuid failed");
    rlimit lim{64 * 1024, 64 * 1024};
    if (::setrlimit(RLIMIT_MEMLOCK, &lim) != 0) return std::string("setrlimit failed");
    MemoryStats stats;
    PinnedAllocator alloc(&stats, /*use_cuda=*/false);
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
