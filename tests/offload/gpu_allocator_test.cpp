// The GPU caching allocator's policy, checked on the CPU through a fake DeviceMemoryApi
// (Note [GPU caching allocator]).
#include "offload/gpu_allocator.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include "core/error.h"

namespace strata::offload {
namespace {

// Host memory standing in for device memory, with a capacity, and events whose completion the
// test controls.
struct FakeState {
  size_t capacity = size_t{1} << 40;
  size_t in_use = 0;
  std::set<void*> live;
  std::map<void*, size_t> sizes;
  int events_made = 0;
  std::set<intptr_t> completed;
  int syncs = 0;
  struct Fill {
    void* ptr;
    size_t bytes;
    StreamHandle stream;
  };
  std::vector<Fill> fills;
};

class FakeApi final : public DeviceMemoryApi {
 public:
  explicit FakeApi(FakeState* s) : s_(s) {}
  void* raw_malloc(size_t bytes) override {
    if (s_->in_use + bytes > s_->capacity) return nullptr;
    void* p = std::malloc(bytes);
    s_->in_use += bytes;
    s_->live.insert(p);
    s_->sizes[p] = bytes;
    return p;
  }
  void raw_free(void* p) override {
    EXPECT_TRUE(s_->live.count(p)) << "raw_free of a pointer raw_malloc did not return";
    s_->in_use -= s_->sizes[p];
    s_->live.erase(p);
    std::free(p);
  }
  EventHandle record_event(StreamHandle) override {
    return reinterpret_cast<EventHandle>(static_cast<intptr_t>(++s_->events_made));
  }
  bool event_completed(EventHandle e) override {
    return s_->completed.count(reinterpret_cast<intptr_t>(e)) > 0;
  }
  void destroy_event(EventHandle) override {}
  void synchronize_device() override {
    ++s_->syncs;
    for (int i = 1; i <= s_->events_made; ++i) s_->completed.insert(i);
  }
  void fill(void* ptr, size_t bytes, int byte, StreamHandle stream) override {
    std::memset(ptr, byte, bytes);  // the fake's device memory is host memory
    s_->fills.push_back({ptr, bytes, stream});
  }

 private:
  FakeState* s_;
};

StreamHandle stream(int i) {
  return reinterpret_cast<StreamHandle>(static_cast<intptr_t>(i));
}

struct GpuAllocatorTest : ::testing::Test {
  FakeState fake;
  MemoryStats stats;
  GpuCachingAllocator alloc{std::make_unique<FakeApi>(&fake), &stats};
};

TEST_F(GpuAllocatorTest, SteadyStateMakesNoRawAllocations) {
  // The same sequence of requests, as one training step makes them, three times over.
  const size_t sizes[] = {1000, 4 << 20, 123456, 64 << 20, 512, 3 << 20, 64 << 20};
  for (int step = 0; step < 3; ++step) {
    std::vector<Block> blocks;
    for (size_t s : sizes) blocks.push_back(alloc.allocate(s, Category::Activation));
    for (const Block& b : blocks) alloc.deallocate(b);
    if (step == 0) {
      EXPECT_GT(alloc.counters().raw_mallocs, 0);
    }
  }
  const int64_t after_first = alloc.counters().raw_mallocs;
  std::vector<Block> blocks;
  for (size_t s : sizes) blocks.push_back(alloc.allocate(s, Category::Activation));
  for (const Block& b : blocks) alloc.deallocate(b);
  EXPECT_EQ(alloc.counters().raw_mallocs, after_first);
  EXPECT_GT(alloc.counters().cache_hits, 0);
}

TEST_F(GpuAllocatorTest, SmallRequestsShareOneSegment) {
  Block a = alloc.allocate(100, Category::Param);
  Block b = alloc.allocate(700, Category::Param);
  Block c = alloc.allocate(1 << 20, Category::Param);
  EXPECT_EQ(alloc.counters().raw_mallocs, 1);
  EXPECT_EQ(alloc.reserved_bytes(), GpuCachingAllocator::kSmallSegment);
  // Rounded to 512 bytes and laid out one after the other.
  EXPECT_EQ(static_cast<char*>(b.ptr) - static_cast<char*>(a.ptr), 512);
  EXPECT_EQ(static_cast<char*>(c.ptr) - static_cast<char*>(b.ptr), 1024);
  EXPECT_EQ(alloc.allocated_bytes(), 512u + 1024u + (1u << 20));
  for (Block x : {a, b, c}) alloc.deallocate(x);
  EXPECT_EQ(alloc.allocated_bytes(), 0u);
}

TEST_F(GpuAllocatorTest, ChargesRequestedBytesPerCategory) {
  Block a = alloc.allocate(1000, Category::Param);
  Block g = alloc.allocate(3000, Category::Grad);
  EXPECT_EQ(stats.usage(Tier::Gpu, Category::Param).current, 1000);
  EXPECT_EQ(stats.usage(Tier::Gpu, Category::Grad).current, 3000);
  EXPECT_EQ(stats.tier_usage(Tier::Gpu).current, 4000);
  alloc.deallocate(a);
  alloc.deallocate(g);
  EXPECT_EQ(stats.tier_usage(Tier::Gpu).current, 0);
  EXPECT_EQ(stats.tier_usage(Tier::Gpu).peak, 4000);
}

TEST_F(GpuAllocatorTest, FreedNeighboursMergeSoABigRequestFitsAgain) {
  Block a = alloc.allocate(6 << 20, Category::Activation);  // from a 20 MiB segment
  Block b = alloc.allocate(6 << 20, Category::Activation);
  EXPECT_EQ(alloc.counters().raw_mallocs, 1);
  alloc.deallocate(a);
  alloc.deallocate(b);
  // 10 MiB only fits if a, b and the remainder merged back into one block.
  Block c = alloc.allocate(10 << 20, Category::Activation);
  EXPECT_EQ(alloc.counters().raw_mallocs, 1);
  EXPECT_EQ(c.ptr, a.ptr);
  alloc.deallocate(c);
}

TEST_F(GpuAllocatorTest, BestFitPrefersTheSmallestBlock) {
  Block big = alloc.allocate(8 << 20, Category::Activation);
  Block sep1 = alloc.allocate(2 << 20, Category::Activation);
  Block mid = alloc.allocate(3 << 20, Category::Activation);
  Block sep2 = alloc.allocate(2 << 20, Category::Activation);
  alloc.deallocate(big);
  alloc.deallocate(mid);
  Block x = alloc.allocate(3 << 20, Category::Activation);
  EXPECT_EQ(x.ptr, mid.ptr);
  for (Block b : {x, sep1, sep2}) alloc.deallocate(b);
}

TEST_F(GpuAllocatorTest, BlocksAreNotSharedAcrossStreams) {
  Block a = alloc.allocate(4096, Category::Activation, stream(1));
  void* p = a.ptr;
  alloc.deallocate(a);
  Block b = alloc.allocate(4096, Category::Activation, stream(2));
  EXPECT_NE(b.ptr, p);
  Block c = alloc.allocate(4096, Category::Activation, stream(1));
  EXPECT_EQ(c.ptr, p);
  alloc.deallocate(b);
  alloc.deallocate(c);
}

TEST_F(GpuAllocatorTest, RecordStreamHoldsTheBlockUntilTheEventCompletes) {
  Block a = alloc.allocate(4096, Category::Comm, stream(1));
  alloc.record_stream(a.ptr, stream(3));
  alloc.deallocate(a);
  EXPECT_EQ(fake.events_made, 1);
  Block b = alloc.allocate(4096, Category::Comm, stream(1));
  EXPECT_NE(b.ptr, a.ptr) << "reused while stream 3 may still read it";
  fake.completed.insert(1);
  Block c = alloc.allocate(4096, Category::Comm, stream(1));
  EXPECT_EQ(c.ptr, a.ptr);
  alloc.deallocate(b);
  alloc.deallocate(c);
}

TEST_F(GpuAllocatorTest, OutOfMemoryReleasesTheCacheAndRetries) {
  fake.capacity = 64 << 20;
  Block a = alloc.allocate(40 << 20, Category::Activation);
  alloc.deallocate(a);  // cached: 40 MiB still reserved
  EXPECT_EQ(fake.in_use, size_t{40} << 20);
  Block b = alloc.allocate(50 << 20, Category::Activation);  // must free the 40 first
  EXPECT_EQ(alloc.counters().oom_retries, 1);
  EXPECT_EQ(alloc.counters().raw_frees, 1);
  EXPECT_EQ(alloc.reserved_bytes(), size_t{50} << 20);
  alloc.deallocate(b);
}

TEST_F(GpuAllocatorTest, OutOfMemoryIsAUserErrorNamingTheCategory) {
  fake.capacity = 16 << 20;
  Block a = alloc.allocate(12 << 20, Category::Param);
  try {
    alloc.allocate(30 << 20, Category::Optimizer);
    FAIL() << "expected an out-of-memory error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("out of GPU memory"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("optimizer"), std::string::npos) << e.what();
  }
  // Nothing was charged for the failed request, and the allocator still works.
  EXPECT_EQ(stats.usage(Tier::Gpu, Category::Optimizer).current, 0);
  alloc.deallocate(a);
  Block b = alloc.allocate(1024, Category::Param);
  alloc.deallocate(b);
}

TEST_F(GpuAllocatorTest, ReleaseCacheReturnsOnlyWhollyFreeSegments) {
  Block a = alloc.allocate(100, Category::Param);       // small segment, stays live
  Block b = alloc.allocate(30 << 20, Category::Param);  // own segment
  alloc.deallocate(b);
  alloc.release_cache();
  EXPECT_EQ(alloc.reserved_bytes(), GpuCachingAllocator::kSmallSegment);
  EXPECT_EQ(fake.live.size(), 1u);
  alloc.deallocate(a);
  alloc.release_cache();
  EXPECT_EQ(alloc.reserved_bytes(), 0u);
  EXPECT_TRUE(fake.live.empty());
}

TEST_F(GpuAllocatorTest, PoisonFillsEveryBlockHandedOutOnItsStream) {
  // Off (the default): blocks come as their last owner left them.
  Block a = alloc.allocate(1000, Category::Activation, stream(1));
  std::memset(a.ptr, 0x11, 1000);
  alloc.deallocate(a);
  Block again = alloc.allocate(1000, Category::Activation, stream(1));
  ASSERT_EQ(again.ptr, a.ptr);  // the cached block
  EXPECT_EQ(static_cast<unsigned char*>(again.ptr)[999], 0x11);
  EXPECT_TRUE(fake.fills.empty());
  alloc.deallocate(again);

  // On: the reused block and a new segment's block are both filled, on the stream asked for,
  // over the whole rounded block.
  alloc.set_poison(true);
  Block reused = alloc.allocate(1000, Category::Activation, stream(1));
  ASSERT_EQ(reused.ptr, a.ptr);
  Block fresh = alloc.allocate(30 << 20, Category::Activation, stream(2));
  ASSERT_EQ(fake.fills.size(), 2u);
  EXPECT_EQ(fake.fills[0].ptr, reused.ptr);
  EXPECT_EQ(fake.fills[0].bytes, 1024u);
  EXPECT_EQ(fake.fills[0].stream, stream(1));
  EXPECT_EQ(fake.fills[1].ptr, fresh.ptr);
  EXPECT_EQ(fake.fills[1].bytes, size_t{30} << 20);
  EXPECT_EQ(fake.fills[1].stream, stream(2));
  const auto* bytes = static_cast<const unsigned char*>(reused.ptr);
  for (int i = 0; i < 1024; ++i) ASSERT_EQ(bytes[i], 0xff) << "byte " << i;
  alloc.deallocate(reused);
  alloc.deallocate(fresh);
}

TEST_F(GpuAllocatorTest, ForeignPointerIsAnInternalError) {
  int x = 0;
  EXPECT_THROW(alloc.deallocate(Block{&x, 4, Category::Param}), InternalError);
}

}  // namespace
}  // namespace strata::offload
