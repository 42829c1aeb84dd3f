#pragma once
// The GPU tier: a caching allocator over raw device memory.
//
// Note [GPU caching allocator]
// cudaMalloc and cudaFree synchronise the device and cost milliseconds, so a training step must
// not call them: after the first step every request is served from memory this allocator already
// holds (PyTorch's CUDACachingAllocator idea, simplified).
//   - Sizes round up to 512 bytes. Requests up to 1 MiB come from 2 MiB segments (the small
//     pool), requests up to 10 MiB from 20 MiB segments, larger ones from a segment of their own
//     size rounded to 2 MiB (the large pool). A free block is found best-fit (smallest size, then
//     lowest address) and split when the remainder is worth keeping; freed neighbours in the same
//     segment merge again.
//   - Blocks belong to the stream they were allocated on, and free blocks are kept per stream: a
//     block freed on stream S is reused at once by later work on S (stream order makes that safe)
//     but never handed to another stream. A block that other streams also used (record_stream)
//     is held back after its free until an event recorded on each of those streams has completed.
//   - When the raw allocator fails, the allocator waits for the device, returns every wholly free
//     segment, and tries once more; then it raises strata::user_error with the GPU usage.
//   - Poisoning (set_poison, STRATA_GPU_POISON in the CUDA backend): every block handed out, new
//     or reused, is first filled with 0xff bytes on its stream (NaN in f32/bf16/f16, -1 in the
//     integers). Memory from the cache holds whatever its last owner left, often the right values
//     when a step frees and asks again for the same shapes; a kernel that reads what it did not
//     write then passes by luck. Poisoned, it reads NaN, and its test fails.
// Bytes handed out are charged per category to MemoryStats (tier Gpu), the requested size, as
// the host allocator does; cached and rounding bytes show in reserved_bytes().
// Raw memory and events come through DeviceMemoryApi, so the policy is tested on the CPU with a
// fake (tests/offload/gpu_allocator_test.cpp); the CUDA runtime one lives in tensor/cuda/.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

#include "offload/allocator.h"

namespace strata::offload {

// Opaque handles: a cudaStream_t / cudaEvent_t in the CUDA implementation.
using StreamHandle = void*;
using EventHandle = void*;

class DeviceMemoryApi {
 public:
  virtual ~DeviceMemoryApi() = default;
  virtual void* raw_malloc(size_t bytes) = 0;  // nullptr when out of memory
  virtual void raw_free(void* ptr) = 0;
  virtual EventHandle record_event(StreamHandle stream) = 0;
  virtual bool event_completed(EventHandle event) = 0;
  virtual void destroy_event(EventHandle event) = 0;
  virtual void synchronize_device() = 0;
  // Enqueues a fill of `bytes` bytes at `ptr` with `byte` on `stream` (cudaMemsetAsync).
  virtual void fill(void* ptr, size_t bytes, int byte, StreamHandle stream) = 0;
};

struct GpuAllocatorCounters {
  int64_t raw_mallocs = 0;  // calls to raw_malloc that succeeded
  int64_t raw_frees = 0;
  int64_t cache_hits = 0;  // requests served from a cached block
  int64_t oom_retries = 0;
};

class GpuCachingAllocator final : public Allocator {
 public:
  static constexpr size_t kRound = 512;
  static constexpr size_t kSmallRequest = size_t{1} << 20;
  static constexpr size_t kSmallSegment = size_t{2} << 20;
  static constexpr size_t kMediumRequest = size_t{10} << 20;
  static constexpr size_t kMediumSegment = size_t{20} << 20;
  static constexpr size_t kLargeGranule = size_t{2} << 20;

  explicit GpuCachingAllocator(std::unique_ptr<DeviceMemoryApi> api,
                               MemoryStats* stats = &MemoryStats::global());
  ~GpuCachingAllocator() override;

  Block allocate(size_t bytes, Category category) override {
    return allocate(bytes, category, default_stream_);
  }
  using Allocator::allocate;
  Block allocate(size_t bytes, Category category, StreamHandle stream);
  void deallocate(const Block& block) override;
  Tier tier() const override { return Tier::Gpu; }

  // Marks `ptr` (a live block) as used by `stream` too, so its memory is not reused before the
  // work queued there has finished (see the Note).
  void record_stream(void* ptr, StreamHandle stream);
  // The stream allocate(bytes, category) uses (the compute stream).
  void set_default_stream(StreamHandle stream) { default_stream_ = stream; }
  // Fill every block handed out from now on with 0xff bytes first (see the Note).
  void set_poison(bool on) { poison_ = on; }
  bool poison() const { return poison_; }
  static constexpr int kPoisonByte = 0xff;

  // Waits for pending frees and returns every wholly free segment to the raw allocator.
  void release_cache();
  size_t reserved_bytes() const;   // held from the raw allocator
  size_t allocated_bytes() const;  // in live blocks (rounded sizes)
  GpuAllocatorCounters counters() const;

 private:
  struct BlockInfo;
  struct BySizeThenAddress {
    bool operator()(const BlockInfo* a, const BlockInfo* b) const;
  };
  using FreeSet = std::set<BlockInfo*, BySizeThenAddress>;
  struct PoolKey {
    bool small;
    StreamHandle stream;
    bool operator<(const PoolKey& o) const {
      return small != o.small ? small < o.small : stream < o.stream;
    }
  };

  static size_t round_size(size_t bytes);
  static size_t segment_size(size_t rounded);
  BlockInfo* take_free(bool small, StreamHandle stream, size_t rounded);
  BlockInfo* new_segment(bool small, StreamHandle stream, size_t rounded, Category category);
  void split(BlockInfo* b, size_t rounded);
  void free_block(BlockInfo* b);  // into its pool, merged with free neighbours
  void process_events();
  bool is_pending(const BlockInfo* b) const;
  void release_free_segments();

  std::unique_ptr<DeviceMemoryApi> api_;
  MemoryStats* stats_;
  StreamHandle default_stream_ = nullptr;
  bool poison_ = false;
  mutable std::mutex mu_;
  std::map<PoolKey, FreeSet> free_;
  std::unordered_map<void*, BlockInfo*> live_;
  std::vector<std::unique_ptr<BlockInfo>> storage_;  // owns every BlockInfo ever made
  std::vector<BlockInfo*> spare_infos_;
  struct Pending {
    BlockInfo* block;
    std::vector<EventHandle> events;
  };
  std::vector<Pending> pending_;
  size_t reserved_ = 0;
  size_t allocated_ = 0;
  GpuAllocatorCounters counters_;
};

}  // namespace strata::offload
