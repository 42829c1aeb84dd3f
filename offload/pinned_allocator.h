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
// freed buffers are kept, keyed by rounded_size() (4 KiB pages, or 2 MiB ones below), and handed
// out again for the same rounded size. Pooled bytes are not charged to any category (MemoryStats
// counts live blocks); pooled_bytes() reports them and release_pool() returns them to the system.
//
// Note [Pinned buffers on huge pages]
// Under mlock, large buffers are mapped 2 MiB-aligned and advised MADV_HUGEPAGE, so the kernel
// backs them with transparent huge pages where it can. An O_DIRECT transfer then touches one
// page per 2 MiB instead of 512 (the per-I/O pinning and page-table walk shrink with it) and its
// memory is physically contiguous, so the block layer builds fewer, larger requests: reads into
// huge-page buffers take less CPU per GB and run faster than into 4 KiB pages (measurements in
// docs/offload.md, "Read destinations"). Only sizes that waste
// little take it: a multiple of 2 MiB, or >= 16 MiB (padding < 1/8); rounded_size() says what
// a buffer really occupies. Where THP is off (`never`) or missing the advice is ignored or
// refused and the buffer is an ordinary one: nothing depends on it but speed.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "offload/allocator.h"
#include "offload/buffer_table.h"

namespace strata::offload {

class PinnedAllocator final : public Allocator {
 public:
  static constexpr size_t kAlignment = 4096;            // O_DIRECT's strictest alignment
  static constexpr size_t kHugePage = size_t{2} << 20;  // see Note [Pinned buffers on huge pages]

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
  // Bytes of live and pooled buffers mapped for huge pages (what the kernel gave them is up to it:
  // AnonHugePages in /proc/self/smaps).
  size_t huge_page_bytes() const;

  // What a buffer of `bytes` occupies (and its pool key): 4 KiB pages, or whole 2 MiB ones.
  static size_t rounded_size(size_t bytes);
  static bool uses_huge_pages(size_t rounded);

  // Every buffer the pool holds (live or pooled), for an AIO engine to register as io_uring
  // fixed buffers (Note [Registered buffers]): NvmeStore::engine().set_buffer_table(...).
  const std::shared_ptr<BufferTable>& buffer_table() const { return table_; }

  // The process-wide pinned pool.
  static PinnedAllocator& instance();

 private:
  struct Raw {
    void* ptr;
    bool locked;
  };
  Raw raw_alloc(size_t rounded);  // map_buffer + publish in the table
  void raw_free(const Raw& r, size_t rounded);
  Raw map_buffer(size_t rounded);
  void unmap_buffer(const Raw& r, size_t rounded);

  MemoryStats* stats_;
  Backing backing_;
  std::shared_ptr<BufferTable> table_ = std::make_shared<BufferTable>();
  mutable std::mutex mu_;
  std::multimap<size_t, Raw> free_;  // rounded size -> pooled buffer
  std::map<void*, bool> locked_;     // live buffer -> whether mlock succeeded
  size_t pooled_ = 0;
  size_t huge_ = 0;
  int64_t unlocked_ = 0;
  int64_t hits_ = 0;
  bool warned_ = false;
};

}  // namespace strata::offload
