#include "offload/pinned_allocator.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/logging.h"

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
  return r == 0 ? kAlignment : r;
}

PinnedAllocator::Raw PinnedAllocator::raw_alloc(size_t rounded) {
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
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr) return {nullptr, false};
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

void PinnedAllocator::raw_free(const Raw& r, size_t rounded) {
#if STRATA_HAVE_CUDA
  if (backing_ == Backing::CudaHost) {
    cudaFreeHost(r.ptr);
    return;
  }
#endif
  if (r.locked) munlock(r.ptr, rounded);
  std::free(r.ptr);
}

Block PinnedAllocator::allocate(size_t bytes, Category category) {
  const size_t rounded = rounded_size(bytes);
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

int64_t PinnedAllocator::pool_hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

PinnedAllocator& PinnedAllocator::instance() {
  static PinnedAllocator* alloc = new PinnedAllocator();  // never destroyed, like HostAllocator's
  return *alloc;
}

}  // namespace strata::offload
