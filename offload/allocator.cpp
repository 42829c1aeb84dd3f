#include "offload/allocator.h"

#include <cstdlib>
#include <new>

#include "core/error.h"

namespace strata::offload {

HostAllocator::HostAllocator(size_t alignment, MemoryStats* stats)
    : alignment_(alignment), stats_(stats) {
  STRATA_CHECK(alignment >= sizeof(void*) && (alignment & (alignment - 1)) == 0,
               "alignment {} must be a power of two", alignment);
}

Block HostAllocator::allocate(size_t bytes, Category category) {
  size_t rounded = (bytes + alignment_ - 1) / alignment_ * alignment_;
  if (rounded == 0) rounded = alignment_;
  void* p = std::aligned_alloc(alignment_, rounded);
  if (p == nullptr) {
    user_error("out of host memory allocating {:.1f} MiB for {} (current host use {:.1f} MiB)",
               bytes / 1048576.0, category_name(category),
               stats_->tier_usage(Tier::Host).current / 1048576.0);
  }
  stats_->on_alloc(Tier::Host, category, static_cast<int64_t>(bytes));
  return {p, bytes, category};
}

void HostAllocator::deallocate(const Block& block) {
  if (block.ptr == nullptr) return;
  std::free(block.ptr);
  stats_->on_free(Tier::Host, block.category, static_cast<int64_t>(block.bytes));
}

HostAllocator& HostAllocator::instance() {
  static HostAllocator alloc;
  return alloc;
}

}  // namespace strata::offload
