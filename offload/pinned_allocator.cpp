#include "offload/pinned_allocator.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/logging.h"
#include "offload/host_budget.h"

#if STRATA_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace strata::offload {
namespace {

bool cuda_device_present() {
#if STRATA_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return n > 0;
#else
  return false;
#endif
}

}  // namespace

PinnedAllocator::PinnedAllocator(MemoryStats* stats, bool use_cuda)
    : stats_(stats),
      backing_(use_cuda && cuda_device_present() ? Backing::CudaHost : Backing::Mlock) {}

PinnedAllocator::~PinnedAllocator() {
  release_pool();
}

size_t PinnedAllocator::rounded_size(size_t bytes) {
  size_t r = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (r == 0) return kAlignment;
  if (r >= kHugePage && (r % kHugePage == 0 || r >= 8 * kHugePage))
    r = (r + kHugePage - 1) / kHugePage * kHugePage;
  return r;
}

bool PinnedAllocator::uses_huge_pages(size_t rounded) {
  return rounded % kHugePage == 0;
}

namespace {

// A 2 MiB-aligned anonymous mapping of `bytes` (a multiple of 2 MiB), advised for huge pages.
void* map_huge(size_t bytes) {
  const size_t pad = PinnedAllocator::kHugePage;
  void* raw =
      ::mmap(nullptr, bytes + pad, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto at = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (at + pad - 1) / pad * pad;
  if (aligned > at) ::munmap(raw, aligned - at);
  const uintptr_t end = at + bytes + pad;
  if (end > aligned + bytes)
    ::munmap(reinterpret_cast<void*>(aligned + bytes), end - aligned - bytes);
  void* p = reinterpret_cast<void*>(aligned);
  // EINVAL where the kernel has no THP: the mapping stays, on 4 KiB pages.
  ::madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}

}  // namespace

PinnedAllocator::Raw PinnedAllocator::raw_alloc(size_t rounded) {
  Raw r = map_buffer(rounded);
  if (r.ptr != nullptr) table_->add(r.ptr, rounded);
  return r;
}

void PinnedAllocator::raw_free(const Raw& r, size_t rounded) {
  table_->remove(r.ptr);  // waits until no io_uring ring holds it (Note [Registered buffers])
  unmap_buffer(r, rounded);
}

PinnedAllocator::Raw PinnedAllocator::map_buffer(size_t rounded) {
#if STRATA_HAVE_CUDA
  if (backing_ == Backing::CudaHost) {
    void* p = nullptr;
    cudaError_t e = cudaHostAlloc(&p, rounded, cudaHostAllocDefault);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return {nullptr, false};
    }
    return {p, true};
  }
#endif
  const bool huge = uses_huge_pages(rounded);
  void* p = huge ? map_huge(rounded) : std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr) return {nullptr, false};
  if (huge) huge_ += rounded;  // called with mu_ held
  if (mlock(p, rounded) == 0) return {p, true};
  const int err = errno;
  {
    // Called with mu_ held.
    ++unlocked_;
    if (!warned_) {
      warned_ = true;
      log::warn(
          "pinned memory: mlock of {} bytes failed ({}); using unlocked host memory. Raise the "
          "limit with `ulimit -l unlimited` (RLIMIT_MEMLOCK) for full NVMe/GPU copy speed",
          rounded, std::strerror(err));
    }
  }
  return {p, false};
}

void PinnedAllocator::unmap_buffer(const Raw& r, size_t rounded) {
#if STRATA_HAVE_CUDA
  if (backing_ == Backing::CudaHost) {
    cudaFreeHost(r.ptr);
    return;
  }
#endif
  if (uses_huge_pages(rounded)) {
    huge_ -= rounded;
    ::munmap(r.ptr, rounded);  // unlocks too
    return;
  }
  if (r.locked) munlock(r.ptr, rounded);
  std::free(r.ptr);
}

Block PinnedAllocator::allocate(size_t bytes, Category category) {
  const size_t rounded = rounded_size(bytes);
  HostMemoryBudget::check(*stats_, category,
                          static_cast<int64_t>(bytes));  // Note [Host memory budget]
  std::lock_guard<std::mutex> lock(mu_);
  Raw r{nullptr, false};
  auto it = free_.find(rounded);
  if (it != free_.end()) {
    r = it->second;
    free_.erase(it);
    pooled_ -= rounded;
    ++hits_;
  } else {
    r = raw_alloc(rounded);
    if (r.ptr == nullptr && pooled_ > 0) {
      // Pooled buffers of other sizes may be what stands in the way.
      for (auto& [size, buf] : free_) raw_free(buf, size);
      free_.clear();
      pooled_ = 0;
      r = raw_alloc(rounded);
    }
    if (r.ptr == nullptr) {
      user_error(
          "out of pinned host memory allocating {:.1f} MiB for {} (pinned in use {:.1f} MiB); "
          "lower offload buffer_count/buffer_size or max_in_cpu",
          bytes / 1048576.0, category_name(category),
          stats_->tier_usage(Tier::Pinned).current / 1048576.0);
    }
  }
  locked_[r.ptr] = r.locked;
  stats_->on_alloc(Tier::Pinned, category, static_cast<int64_t>(bytes));
  return {r.ptr, bytes, category};
}

void PinnedAllocator::deallocate(const Block& block) {
  if (block.ptr == nullptr) return;
  const size_t rounded = rounded_size(block.bytes);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = locked_.find(block.ptr);
  STRATA_CHECK(it != locked_.end(), "pinned block {} was not allocated here", block.ptr);
  free_.emplace(rounded, Raw{block.ptr, it->second});
  locked_.erase(it);
  pooled_ += rounded;
  stats_->on_free(Tier::Pinned, block.category, static_cast<int64_t>(block.bytes));
}

void PinnedAllocator::release_pool() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [size, r] : free_) raw_free(r, size);
  free_.clear();
  pooled_ = 0;
}

size_t PinnedAllocator::pooled_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pooled_;
}

int64_t PinnedAllocator::unlocked_allocations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return unlocked_;
}

size_t PinnedAllocator::huge_page_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return huge_;
}

int64_t PinnedAllocator::pool_hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

PinnedAllocator& PinnedAllocator::instance() {
  static PinnedAllocator* alloc = new PinnedAllocator();  // never destroyed, like HostAllocator's
  return *alloc;
}

}  // namespace strata::offload
