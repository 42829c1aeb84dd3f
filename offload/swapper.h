#pragma once
// Named buffers swapped between the NVMe store and pinned host memory, with prefetch.
//
// Note [Swapper]
// A buffer (a partition of parameters, gradients or optimizer states) is declared once with
// add(); its home is the NVMe store. acquire() makes it resident in pinned memory and returns
// it; swap_out() writes it home and gives its pinned memory back once the write completes;
// release() drops a resident copy that was only read. With set_access_order() the swapper
// knows which buffers come next (the optimizer walks partitions in the same order every step)
// and keeps the next `prefetch_depth` of them being read while the current one is used: the
// SSD -> CPU stage of ZeRO-Infinity's SSD -> CPU -> GPU pipeline. The CPU -> GPU stage plugs in
// through set_landed_hook(), called on the caller's thread as each prefetched buffer lands in
// pinned memory, in access order: the CUDA backend will issue its async host-to-device copy
// there.
//
// Note [Pinned bound and back-pressure]
// Pinned memory held by the swapper (resident buffers, reads and writes in flight) never exceeds
// `max_pinned_bytes` (DeepSpeed's buffer_count x buffer_size). A prefetch that does not fit is
// simply not issued yet; it is retried on the next call. A demand (acquire) that does not fit
// first waits for in-flight writes and reads to finish and then evicts prefetched-but-unused
// copies, farthest in the access order first; backpressure_waits() counts those waits. If
// everything pinned is acquired by the caller and still nothing fits, the bound is too small
// for the working set: that is a UserError naming the numbers, never a hang.
//
// The Swapper is used from one thread (the training loop); I/O runs on the AIO engine's
// threads. A failed swap-out keeps the data resident (nothing is lost) and raises its error.
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "offload/nvme_store.h"
#include "offload/pinned_allocator.h"

namespace strata::offload {

struct SwapperConfig {
  size_t max_pinned_bytes = size_t{1} << 30;
  int prefetch_depth = 2;  // K: buffers of the access order kept in flight ahead of the current
};

class Swapper {
 public:
  enum class State { New, OnTier, Reading, Prefetched, Acquired, Writing };
  using LandedHook = std::function<void(const std::string& name, void* pinned, size_t bytes)>;

  Swapper(NvmeStore& store, PinnedAllocator& pinned, SwapperConfig config);
  ~Swapper();  // waits for in-flight I/O; frees pinned and NVMe blocks
  Swapper(const Swapper&) = delete;
  Swapper& operator=(const Swapper&) = delete;

  void add(const std::string& name, size_t bytes, Category category);
  // Resident pinned copy of `name` (zero-filled the first time), blocking until it is there.
  void* acquire(const std::string& name);
  void swap_out(const std::string& name);
  void release(const std::string& name);
  // Buffers are used in this order, cyclically; unknown names are an error.
  void set_access_order(std::vector<std::string> order);
  void set_landed_hook(LandedHook hook) { landed_ = std::move(hook); }
  // Completes every read and write in flight (raising the first failure).
  void wait_all();

  State state(const std::string& name) const;
  size_t pinned_in_use() const { return pinned_bytes_; }
  size_t peak_pinned() const { return peak_pinned_; }
  int64_t backpressure_waits() const { return waits_; }
  int64_t evictions() const { return evictions_; }
  // Prefetches held back because they did not fit the bound (retried later).
  int64_t deferred_prefetches() const { return deferred_; }

 private:
  struct Buf {
    std::string name;
    size_t bytes = 0;
    Category category = Category::Workspace;
    Block home;    // NVMe extent
    Block pinned;  // when resident or in flight
    State state = State::New;
    IoHandle io;
  };

  Buf& find(const std::string& name);
  const Buf& find(const std::string& name) const;
  bool fits(size_t bytes) const;
  void take_pinned(Buf& b);
  void give_pinned(Buf& b);
  void start_read(Buf& b);
  // Moves completed I/O on: reads land (in order), writes give their memory back.
  void progress(bool block_on_one);
  void finish_read(Buf& b);
  void finish_write(Buf& b);
  void make_room(size_t bytes, const std::string& for_name);
  void prefetch();

  NvmeStore& store_;
  PinnedAllocator& pinned_alloc_;
  SwapperConfig config_;
  std::map<std::string, Buf> bufs_;
  std::vector<std::string> order_;
  std::map<std::string, size_t> order_pos_;
  size_t cursor_ = 0;        // index in order_ of the next buffer expected
  std::deque<Buf*> reads_;   // in issue order
  std::deque<Buf*> writes_;  // in issue order
  size_t pinned_bytes_ = 0;
  size_t peak_pinned_ = 0;
  int64_t waits_ = 0;
  int64_t evictions_ = 0;
  int64_t deferred_ = 0;
  LandedHook landed_;
};

}  // namespace strata::offload
