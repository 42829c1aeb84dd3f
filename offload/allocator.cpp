#include "offload/allocator.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <new>

#include "core/error.h"
#include "offload/host_budget.h"

namespace strata::offload {

HostAllocator::HostAllocator(size_t alignment, MemoryStats* stats, bool cache_large_blocks)
    : alignment_(alignment), stats_(stats), cache_large_(cache_large_blocks) {
  STRATA_CHECK(alignment >= sizeof(void*) && (alignment & (alignment - 1)) == 0,
               "alignment {} must be a power of two", alignment);
}

HostAllocator::~HostAllocator() {
  release_cache();
}

// Note [Host cache trimming]: a mapping of its own, so unmapping returns it to the kernel.
void* HostAllocator::map_large(size_t rounded) {
  const size_t span = rounded + kCacheGranule;
  void* m = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  const auto base = reinterpret_cast<uintptr_t>(m);
  const uintptr_t aligned = (base + kCacheGranule - 1) / kCacheGranule * kCacheGranule;
  if (aligned > base) munmap(m, aligned - base);
  const uintptr_t end = base + span, used = aligned + rounded;
  if (end > used) munmap(reinterpret_cast<void*>(used), end - used);
  return reinterpret_cast<void*>(aligned);
}

void HostAllocator::unmap_large(void* p, size_t rounded) {
  munmap(p, rounded);
}

size_t HostAllocator::rounded_size(size_t bytes) const {
  if (cache_large_ && bytes >= kCacheMinBytes)
    return (bytes + kCacheGranule - 1) / kCacheGranule * kCacheGranule;
  size_t r = (bytes + alignment_ - 1) / alignment_ * alignment_;
  return r == 0 ? alignment_ : r;
}

Block HostAllocator::allocate(size_t bytes, Category category) {
  const size_t rounded = rounded_size(bytes);
  const int64_t limit = HostMemoryBudget::limit();
  if (limit > 0) HostMemoryBudget::check(*stats_, category, static_cast<int64_t>(bytes));
  void* p = nullptr;
  const bool cacheable = cache_large_ && bytes >= kCacheMinBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(rounded);
    if (it != free_.end()) {
      p = it->second.ptr;
      free_.erase(it);
      cached_ -= rounded;
    }
  }
  if (p == nullptr) {
    // Note [Host memory budget]: cached blocks are resident too; give them back before new
    // memory would take the process over the budget with them.
    if (cacheable && limit > 0 &&
        HostMemoryBudget::in_use(*stats_) + static_cast<int64_t>(cached_bytes() + rounded) > limit)
      release_cache();
    p = cacheable ? map_large(rounded) : std::aligned_alloc(alignment_, rounded);
    if (p == nullptr && cacheable) {
      release_cache();
      p = map_large(rounded);
    }
    if (p == nullptr) {
      user_error("out of host memory allocating {:.1f} MiB for {} (current host use {:.1f} MiB)",
                 bytes / 1048576.0, category_name(category),
                 stats_->tier_usage(Tier::Host).current / 1048576.0);
    }
#ifdef MADV_HUGEPAGE
    if (cacheable) madvise(p, rounded, MADV_HUGEPAGE);  // a hint; failure is harmless
#endif
  }
  stats_->on_alloc(Tier::Host, category, static_cast<int64_t>(bytes));
  return {p, bytes, category};
}

void HostAllocator::deallocate(const Block& block) {
  if (block.ptr == nullptr) return;
  stats_->on_free(Tier::Host, block.category, static_cast<int64_t>(block.bytes));
  if (cache_large_ && block.bytes >= kCacheMinBytes) {
    const size_t rounded = rounded_size(block.bytes);
    std::lock_guard<std::mutex> lock(mu_);
    free_.emplace(rounded, Cached{block.ptr, epoch_});
    cached_ += rounded;
    return;
  }
  std::free(block.ptr);
}

void HostAllocator::release_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [size, c] : free_) unmap_large(c.ptr, size);
  free_.clear();
  cached_ = 0;
}

size_t HostAllocator::trim() {
  std::lock_guard<std::mutex> lock(mu_);
  size_t freed = 0;
  for (auto it = free_.begin(); it != free_.end();) {
    if (it->second.epoch < epoch_) {
      unmap_large(it->second.ptr, it->first);
      freed += it->first;
      it = free_.erase(it);
    } else {
      ++it;
    }
  }
  cached_ -= freed;
  ++epoch_;
  return freed;
}

size_t HostAllocator::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}

HostAllocator& HostAllocator::instance() {
  // Never destroyed: tensors in other statics may be freed after it would have been.
  static HostAllocator* alloc = new HostAllocator();
  return *alloc;
}

}  // namespace strata::offload
