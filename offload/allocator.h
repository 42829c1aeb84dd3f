#pragma once
// The allocator interface every memory tier implements.
//
// An allocator hands out `Block`s: a pointer, the bytes asked for, and the tier and category the
// bytes are charged to in `MemoryStats` until the block is returned. Tiers: host (aligned
// malloc, here), pinned host, GPU caching allocator and the NVMe store (later issues).
#include <cstddef>
#include <cstdint>

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
class HostAllocator final : public Allocator {
 public:
  explicit HostAllocator(size_t alignment = 64, MemoryStats* stats = &MemoryStats::global());
  Block allocate(size_t bytes, Category category) override;
  using Allocator::allocate;
  void deallocate(const Block& block) override;
  Tier tier() const override { return Tier::Host; }

  static HostAllocator& instance();  // the process-wide host allocator tensors use

 private:
  size_t alignment_;
  MemoryStats* stats_;
};

}  // namespace strata::offload
