#pragma once
// The pinned (page-locked) host tier, with a pool that reuses buffers.
//
// Note [Pinned memory and its fallbacks]
// Page-locked memory is what lets DMA engines (a GPU's copy engine, an NVMe controller under
// O_DIRECT) move bytes without the kernel pinning pages per request. Where CUDA is built in and
// a device is present, buffers come from cudaHostAlloc so the CUDA backend can copy from them
// asynchronously. Otherwise (no CUDA, or cudaGetDeviceCount reports no device) they are
// 4 KiB-aligned allocations locked with mlock. mlock is bounded by RLIMIT_MEMLOCK for
// unprivileged users; when it fails the buffer is still handed out, unlocked, a warning is
// logged once and unlocked_allocations() counts it: the NVMe path still works (O_DIRECT pins
// per request), only slower, and a training run should not die for it.
//
// Note [Pinned pool]
// Locking and unlocking pages costs a syscall and a page-table walk per call (cudaHostAlloc is
// worse: milliseconds). The swapper asks for buffers of the same few sizes over and over, so
// freed buffers are kept, keyed by their size rounded to 4 KiB, and handed out again for the
// same rounded size. Pooled bytes are not charged to any category (MemoryStats counts live
// blocks); pooled_bytes() reports them and release_pool() returns them to the system.
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "offload/allocator.h"

namespace strata::offload {

class PinnedAllocator final : public Allocator {
 public:
  static constexpr size_t kAlignment = 4096;  // O_DIRECT's strictest alignment

  enum class Backing { CudaHost, Mlock };

  // use_cuda: take cudaHostAlloc when CUDA is built in and a device is present.
  explicit PinnedAllocator(MemoryStats* stats = &MemoryStats::global(), bool use_cuda = true);
  ~PinnedAllocator() override;
  PinnedAllocator(const PinnedAllocator&) = delete;
  PinnedAllocator& operator=(const PinnedAllocator&) = delete;

  Block allocate(size_t bytes, Category category) override;
  using Allocator::allocate;
  void deallocate(const Block& block) override;
  Tier tier() const override { return Tier::Pinned; }

  void release_pool();
  size_t pooled_bytes() const;
  Backing backing() const { return backing_; }
  // Buffers handed out although mlock failed (RLIMIT_MEMLOCK); see Note [Pinned memory...].
  int64_t unlocked_allocations() const;
  int64_t pool_hits() const;

  static size_t rounded_size(size_t bytes);

  // The process-wide pinned pool.
  static PinnedAllocator& instance();

 private:
  struct Raw {
    void* ptr;
    bool locked;
  };
  Raw raw_alloc(size_t rounded);
  void raw_free(const Raw& r, size_t rounded);

  MemoryStats* stats_;
  Backing backing_;
  mutable std::mutex mu_;
  std::multimap<size_t, Raw> free_;  // rounded size -> pooled buffer
  std::map<void*, bool> locked_;     // live buffer -> whether mlock succeeded
  size_t pooled_ = 0;
  int64_t unlocked_ = 0;
  int64_t hits_ = 0;
  bool warned_ = false;
};

}  // namespace strata::offload
