#pragma once
// ParamTier: where ZeRO-Infinity keeps each rank's persistent parameter partitions between uses
// (zero_optimization.offload_param) — pinned host memory (device: cpu) or an NVMe swap file
// (device: nvme) — and the pinned buffers and read-ahead that bring them back. The tier backend
// of ParamGatherer (Note [ZeRO-3 gathering] in parallel/zero3.h).
//
// Note [Parameter tier]
// A managed unit's partition (ZeRO-3's owned slice, L elements) is a tensor whose storage is
// released between uses (Note [Released storage]); its home copy is here:
//   - device cpu, and under nvme the first units that fit max_in_cpu elements: a host block of
//     the partition's bytes (pinned when pin_memory), Category::Param on the pinned/host tier;
//   - device nvme: an extent of an NvmeStore under nvme_path (Category::Param on Tier::Nvme);
//     each rank has its own store and reads only its own slice (bandwidth-centric partitioning:
//     the ranks read in parallel, then allgather), through a pool of buffer_count host buffers
//     (pinned when pin_memory) of the largest partition's bytes, at most buffer_size elements
//     (pinned buffers of at least 2 MiB are rounded up to whole 2 MiB pages: Note [Pinned buffers
//     on huge pages]).
// load(u, dst) fills a materialized partition from the home copy (NVMe -> buffer -> device;
// on a CPU run the host plays the device and the last step is a memcpy); store(u, src) writes
// one back (after the optimizer updated it, and once at construction). Data moves bit for bit,
// so an offloaded run is bitwise the in-memory one.
//
// Note [Parameter read-ahead]
// Each buffer is free, reading a unit, writing one, or holding a copy of one: the bytes of its
// home, landed from a read or left by a finished write. A load takes the copy of its unit if a
// buffer has one (waiting if its read or write is in flight), else reads on demand; the buffer
// keeps the copy afterwards, so a unit used again soon (backward after forward, the step after
// backward) is not read twice. store() replaces the unit's copy, which the update made stale,
// with the write. read_ahead(order, from) names the window: the first buffer_count - 1 distinct
// units on NVMe of order[from...]. Their copies are kept, and units of the window without one are
// read into free buffers or buffers whose copy is outside the window, never waiting. Copies
// outside the window give way first when a load or store needs a buffer, then writes in flight
// (they always finish), so the pool never deadlocks; one buffer is always outside the window.
// ParamGatherer passes the units it will load next: the gather order recorded in the first
// micro-batch (forward and backward), then the step's order (the optimizer's groups, ascending),
// then the next pass's. wait_seconds() is how long load() and store() blocked for reads,
// writes and buffers: the time compute waited for parameter data; waits() splits it.
//
// Note [Tier copies]
// Partitions move between the buffers (or host homes) and the device on a CopyStream of the
// tier's own (offload/copy_stream.h), made on the first load or store for the device they go to:
// on a CPU run it copies at once with memcpy, on a GPU it is a CUDA stream of its own. A load
// waits for the NVMe read on the host, then enqueues the host-to-device copy after the compute
// stream's work so far (dst may be memory that work used) and returns without waiting for it;
// the buffer's CopyMark tells a later read or store into the buffer to wait for that copy.
// order_before_compute() makes the compute stream's later work wait for every copy enqueued so
// far: ParamGatherer calls it before a unit's allgather and after the step's loads. On a GPU
// the gatherer also stages the unit after the prefetched ones (its copy is enqueued at the
// request before, and ordered before compute only when its allgather starts), so the copy of
// unit k + 1 runs beside the compute of unit k. A store copies device-to-host on the same
// stream after the compute stream's work (the update) and waits for it: the NVMe write, or the
// release of the partition, comes next. Copies move bytes, so a run is bitwise the in-memory run.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "offload/aio_engine.h"
#include "offload/allocator.h"
#include "offload/copy_stream.h"
#include "tensor/tensor.h"

namespace strata::offload {
class NvmeStore;
}

namespace strata::parallel {

struct OffloadParamConfig {  // zero_optimization.offload_param, DeepSpeed's names and meanings
  enum class Device { None, Cpu, Nvme };
  Device device = Device::None;
  std::string nvme_path;              // nvme: the directory of the swap files
  bool pin_memory = true;             // home copies (cpu) and buffers (nvme) page-locked
  int64_t buffer_count = 5;           // nvme: host buffers for reads and write-backs
  int64_t buffer_size = 100'000'000;  // nvme: elements a buffer may hold (the largest partition)
  int64_t max_in_cpu = 0;             // nvme: partition elements kept on the host instead
  bool read_ahead = true;             // Note [Parameter read-ahead]
  offload::AioConfig aio;             // the aio section's settings, when the trainer has them
  bool enabled() const { return device != Device::None; }
};

const char* offload_param_device_name(OffloadParamConfig::Device d);

// Where a ParamTier puts each unit's partition and the buffers it allocates, computed from the
// config and the partition sizes alone: the constructor allocates exactly this, and the start's
// plans count it (runtime/host_memory_plan.h, runtime/nvme_space_plan.h).
struct ParamTierLayout {
  std::vector<bool> nvme;             // [unit]: its home is an NVMe extent (else a host block)
  int64_t host_bytes = 0;             // home copies on the host (pinned with pin_memory), all units
  int64_t buffer_bytes = 0;           // one buffer (Note [Parameter tier]); 0: none on NVMe
  int64_t buffer_count = 0;           // buffers allocated (0 when nothing is on NVMe)
  int largest_unit = -1;              // the unit of that partition
  std::vector<int64_t> nvme_extents;  // bytes of each NVMe home, in unit order
};
ParamTierLayout param_tier_layout(const OffloadParamConfig& config,
                                  const std::vector<int64_t>& numel, DType dtype);

class ParamTier {
 public:
  // numel[u] > 0: unit u's partition (elements of `dtype`) lives here; 0: not managed.
  ParamTier(const OffloadParamConfig& config, const std::vector<int64_t>& numel,
            const std::vector<std::string>& names, DType dtype);
  ~ParamTier();  // completes every I/O; the NVMe store removes its files
  ParamTier(const ParamTier&) = delete;
  ParamTier& operator=(const ParamTier&) = delete;

  bool holds(int u) const { return homes_[u].numel > 0; }
  bool on_nvme(int u) const { return homes_[u].nvme; }
  // dst: materialized, contiguous, numel[u] elements of the dtype, on the run's device; all
  // loads and stores on one device. Note [Tier copies]: on a GPU, load() only enqueues the copy
  // and order_before_compute() orders the compute stream after it; store() returns once the
  // bytes are on the host.
  void load(int u, tensor::Tensor& dst);
  void store(int u, const tensor::Tensor& src);
  void order_before_compute();
  // The host <-> device copies run on a CUDA stream of their own (the first load or store on a
  // GPU made it); null before, and on a CPU run.
  const offload::CopyStream* copy_stream() const { return copies_.get(); }
  bool async_copies() const { return copies_ != nullptr && copies_->cuda(); }
  void read_ahead(const std::vector<int>& order, size_t from);
  // Completes every read and write in flight (raising the first failure).
  void wait_all();

  // Where the waits went (Note [Parameter read-ahead]); wait_seconds() is their sum.
  struct Waits {
    double late_s = 0;   // loads that found their unit's read (or write) still in flight
    double miss_s = 0;   // loads that found no copy: a buffer, then a read on demand
    double store_s = 0;  // stores waiting for a buffer (a write in flight)
    int64_t late = 0;
    int64_t misses = 0;
  };
  double wait_seconds() const { return wait_s_; }
  const Waits& waits() const { return waits_; }
  int64_t reads() const { return reads_; }            // NVMe reads issued
  int64_t ahead_hits() const { return ahead_hits_; }  // loads served by a copy in a buffer
  int64_t buffer_bytes() const { return static_cast<int64_t>(buffer_bytes_); }
  int buffer_count() const { return static_cast<int>(buffers_.size()); }
  int64_t nvme_bytes() const;  // partition bytes on NVMe
  std::vector<std::string> files() const;

 private:
  struct Home {
    int64_t numel = 0;
    size_t bytes = 0;
    bool nvme = false;
    offload::Block block;  // host block, or the NVMe extent
  };
  enum class BufState { Free, Reading, Landed, Writing };
  struct Buffer {
    offload::Block block;
    offload::CopyMark copied;  // after the host-to-device copies that read it
    BufState state = BufState::Free;
    int unit = -1;
    bool ahead = false;
    offload::IoHandle io;
  };

  int find_any(int u) const;  // a buffer reading, holding or writing unit u, or -1
  void poll();                // reads and writes that completed become Landed
  void finish_write(Buffer& b);
  int free_or_spare() const;  // a free buffer, or one holding a copy outside the window; or -1
  int take_buffer();          // a free buffer, waiting for a write if needed
  void start_read(int b, int u, bool ahead);
  void drop(int b);
  offload::CopyStream& copies(const Device& device);  // made on first use
  void to_device(tensor::Tensor& dst, const void* host, size_t bytes);
  void to_host(void* host, const tensor::Tensor& src, size_t bytes);

  DType dtype_;
  std::vector<Home> homes_;
  offload::Allocator* host_alloc_;
  std::unique_ptr<offload::NvmeStore> store_;
  std::vector<Buffer> buffers_;
  std::unique_ptr<offload::CopyStream> copies_;  // Note [Tier copies]
  size_t buffer_bytes_ = 0;
  bool read_ahead_ = true;
  double wait_s_ = 0;
  Waits waits_;
  int64_t reads_ = 0;
  int64_t ahead_hits_ = 0;
};

}  // namespace strata::parallel
