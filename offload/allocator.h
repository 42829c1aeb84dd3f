#pragma once
// The allocator interface every memory tier implements.
//
// An allocator hands out `Block`s: a pointer, the bytes asked for, and the tier and category the
// bytes are charged to in `MemoryStats` until the block is returned. Tiers: host (aligned
// malloc, here), pinned host, GPU caching allocator and the NVMe store (later issues).
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "offload/memory_stats.h"

namespace strata::offload {

struct Block {
  void* ptr = nullptr;
  size_t bytes = 0;
  Category category = Category::Workspace;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Block allocate(size_t bytes, Category category) = 0;
  virtual void deallocate(const Block& block) = 0;
  virtual Tier tier() const = 0;
  Block allocate(size_t bytes) { return allocate(bytes, current_category()); }
};

// Host memory aligned to `alignment` bytes (default 64: one cache line, one AVX-512 vector).
//
// Note [Host block cache]
// A training step allocates and frees the same large activations every step. Served by malloc,
// blocks above glibc's mmap threshold are mapped and unmapped each time, and every first touch
// of every page faults (a fifth of a GPT-2 CPU step was spent in the kernel). So freed blocks of
// at least kCacheMinBytes are kept, keyed by their rounded size (a multiple of 2 MiB, backed by
// transparent huge pages where the kernel allows), and handed out again for the same rounded
// size. Cached bytes are not charged to any category — MemoryStats counts live blocks — and are
// reported by cached_bytes(). When an allocation fails, the cache is released and it is retried.
//
// Note [Host cache trimming]
// Cached bytes are resident, so a cache that only grows makes the process's resident memory
// what construction and the largest step ever freed, not what is live: a ZeRO-3 build frees
// whole copies of the model (the modules' tensors, flat buffers before repadding, the masters'
// starting copies) that no step asks for again. Two rules keep resident memory near the live
// bytes: large blocks are mapped with mmap and unmapped when they leave the cache, so their
// memory goes back to the kernel (glibc keeps blocks below its moving mmap threshold in its
// heap); and trim() unmaps every cached block that no allocation took since the previous
// trim(). The engine trims once a step, so the cache holds what a step reuses (its activations,
// gathered units, transient gradients) and nothing else for longer than a step; after
// construction it releases the whole cache.
class HostAllocator final : public Allocator {
 public:
  static constexpr size_t kCacheMinBytes = size_t{1} << 20;
  static constexpr size_t kCacheGranule = size_t{2} << 20;

  explicit HostAllocator(size_t alignment = 64, MemoryStats* stats = &MemoryStats::global(),
                         bool cache_large_blocks = true);
  ~HostAllocator() override;
  Block allocate(size_t bytes, Category category) override;
  using Allocator::allocate;
  void deallocate(const Block& block) override;
  Tier tier() const override { return Tier::Host; }

  // Returns every cached block to the system.
  void release_cache();
  // Note [Host cache trimming]: returns the cached blocks no allocation took since the last
  // trim() to the system; returns their bytes.
  size_t trim();
  size_t cached_bytes() const;

  static HostAllocator& instance();  // the process-wide host allocator tensors use

 private:
  struct Cached {
    void* ptr;
    uint64_t epoch;  // trim() calls before it was freed
  };
  size_t rounded_size(size_t bytes) const;
  void* map_large(size_t rounded);  // kCacheGranule-aligned, or null
  static void unmap_large(void* p, size_t rounded);

  size_t alignment_;
  MemoryStats* stats_;
  bool cache_large_;
  mutable std::mutex mu_;
  std::multimap<size_t, Cached> free_;  // rounded size -> block
  size_t cached_ = 0;
  uint64_t epoch_ = 0;
};

}  // namespace strata::offload
