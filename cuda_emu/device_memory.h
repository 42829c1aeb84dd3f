#pragma once
// The emulated device's memory (Note [Emulated device memory]).
//
// Note [Emulated device memory]
// Every cudaMalloc is its own mmap: [guard page][data pages][guard page]. The data pages are
// PROT_NONE except while a device operation (a kernel, a memcpy or memset, a cuBLASLt matmul)
// runs on this thread, so host code that dereferences a device pointer faults, and the SIGSEGV
// handler names the allocation and aborts. A device operation opens what it touches: memcpy and
// memset the ranges they were given, a kernel every allocation its parameter block points into,
// and anything else on its first access (the fault handler opens the allocation and resumes the
// kernel). When the operation ends, everything it opened is closed again. An access to a guard
// page is an out-of-bounds access and aborts, naming the kernel; so does an access by a kernel to
// an address that is no memory at all.
// New allocations are filled with 0xff bytes (NaN in every float format, -1 in every integer
// one), as a real allocation holds garbage; STRATA_CUDA_EMU_POISON=0 leaves them zero.
// The total is capped at STRATA_CUDA_EMU_MEMORY_MIB (default 4096) MiB: beyond it cudaMalloc
// returns cudaErrorMemoryAllocation, as a full GPU does.
// All of this is guarded by one mutex, held for the whole of every device operation: the device
// runs one operation at a time, whichever host thread enqueued it.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

namespace strata::cuda_emu {

struct Allocation {
  uintptr_t base = 0;  // what cudaMalloc returned
  size_t bytes = 0;    // what was asked for
  size_t data = 0;     // data pages, bytes
  uintptr_t map = 0;   // the mapping, guard pages included
  size_t map_bytes = 0;
  bool open = false;  // readable and writable now
};

class DeviceMemory {
 public:
  static DeviceMemory& get();

  std::mutex& mutex() { return mu_; }

  // Callers hold mutex().
  cudaError_t allocate(void** ptr, size_t bytes);
  cudaError_t free(void* ptr);
  // The allocation whose data holds [p, p + bytes); nullptr when none does.
  Allocation* find(const void* p, size_t bytes = 1);
  // The allocation whose mapping (guard pages included) holds p.
  Allocation* find_mapping(const void* p);
  void open(Allocation& a);
  // Opens every allocation that one of the 8-byte words of [p, p + bytes) points into.
  void open_pointed_to(const void* p, size_t bytes);
  void close_opened();
  size_t used() const { return used_; }
  size_t count() const { return allocations_.size(); }
  size_t cap() const { return cap_; }

  // Pinned host memory (cudaHostAlloc / cudaMallocHost): ordinary memory, remembered so that
  // copies can check directions and cudaFreeHost can check its argument.
  cudaError_t host_alloc(void** ptr, size_t bytes);
  cudaError_t host_free(void* ptr);
  bool is_pinned(const void* p, size_t bytes = 1) const;

 private:
  DeviceMemory();

  std::mutex mu_;
  std::map<uintptr_t, Allocation> allocations_;  // by map
  std::map<uintptr_t, size_t> pinned_;           // base -> bytes
  size_t used_ = 0;
  size_t cap_ = 0;
  bool poison_ = true;
};

// One device operation (Note [Emulated device memory]): holds the device mutex, marks this thread
// as running on the device for the fault handler, and closes what was opened when it ends.
// `what` names the operation in fault messages (a kernel's name, "cudaMemcpyAsync").
class DeviceOp {
 public:
  explicit DeviceOp(const char* what);
  ~DeviceOp();
  DeviceOp(const DeviceOp&) = delete;
  DeviceOp& operator=(const DeviceOp&) = delete;

 private:
  std::unique_lock<std::mutex> lock_;
};

// Set by the SIMT engine while a kernel runs: writes where the running kernel thread is
// ("block (x,y,z) thread (x,y,z)") for a fault at `addr`, and returns true when `addr` is in the
// guard page of that thread's stack (a stack overflow).
using DescribeFn = bool (*)(const void* addr, char* buf, size_t n);
void set_fault_context(DescribeFn describe);

// Installs the SIGSEGV handler (once; idempotent).
void install_fault_handler();

}  // namespace strata::cuda_emu
