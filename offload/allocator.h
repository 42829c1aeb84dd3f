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
  size_t cached_bytes() const;

  static HostAllocator& instance();  // the process-wide host allocator tensors use

 private:
  size_t rounded_size(size_t bytes) const;

  size_t alignment_;
  MemoryStats* stats_;
  bool cache_large_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;  // rounded size -> block
  size_t cached_ = 0;
};

}  // namespace strata::offload
