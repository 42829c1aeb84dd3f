// The CUDA runtime API of the emulated device (Note [CUDA emulator] in simt.h): one device,
// "Strata CUDA emulator of an NVIDIA H100 80GB HBM3" with an H100 SXM's numbers (sm_90, 132 SMs,
// 50 MiB of L2, a 5120-bit bus, its peak clocks; so runtime::device_peaks gives an H100's peaks).
// Memory follows Note [Emulated device memory]; streams and events (streams.cpp) Note [Emulated
// streams]. The definitions take their signatures from the real cuda_runtime_api.h, which maps
// versioned names for us.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda_emu/control.h"
#include "cuda_emu/device_memory.h"
#include "cuda_emu/streams.h"

namespace strata::cuda_emu {

namespace {

thread_local cudaError_t t_last_error = cudaSuccess;

cudaError_t ret(cudaError_t e) {
  if (e != cudaSuccess) record_error(e);
  return e;
}

// STRATA_CUDA_EMU_DEVICES=N (default 1; 0: no device): the devices a process sees. It uses one
// of them, the first it sets (Strata runs one process per GPU), so several processes of an
// mpirun job on one machine can each take the device of their local rank (Note [Emulated NCCL]).
int visible_devices() {
  static const int n = [] {
    const char* v = std::getenv("STRATA_CUDA_EMU_DEVICES");
    const long k = v != nullptr && *v != '\0' ? std::strtol(v, nullptr, 10) : 1;
    return static_cast<int>(k < 0 ? 0 : k > 64 ? 64 : k);
  }();
  return n;
}

std::atomic<int> g_device{-1};  // the device this process uses, once set

bool valid_device(int device) {
  return device >= 0 && device < visible_devices();
}

bool overlap(const void* a, const void* b, size_t n) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + n && y < x + n;
}

// Opens the allocation (if any) holding [p, p + n) for the running device operation.
void open_if_device(const void* p, size_t n) {
  DeviceMemory& mem = DeviceMemory::get();
  if (Allocation* a = mem.find(p, n)) mem.open(*a);
}

// A copy checked the way the real runtime would reject it (directions against pointer kinds,
// ranges inside one allocation), then enqueued on `s` (Note [Emulated streams]); `synchronous`
// for cudaMemcpy, which the host waits for unless it is device to device.
cudaError_t copy(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t s,
                 const char* what, bool synchronous) {
  if (!valid_stream(s)) return ret(cudaErrorInvalidResourceHandle);
  if (count == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return ret(cudaErrorInvalidValue);
  bool dst_dev = false, src_dev = false, dst_pinned = false, src_pinned = false;
  {
    DeviceMemory& mem = DeviceMemory::get();
    std::lock_guard<std::mutex> lock(mem.mutex());
    dst_dev = mem.find_mapping(dst) != nullptr;
    src_dev = mem.find_mapping(src) != nullptr;
    if (kind == cudaMemcpyDefault)
      kind = src_dev ? (dst_dev ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                     : (dst_dev ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
    bool want_src_dev = false, want_dst_dev = false;
    switch (kind) {
      case cudaMemcpyHostToHost:
        break;
      case cudaMemcpyHostToDevice:
        want_dst_dev = true;
        break;
      case cudaMemcpyDeviceToHost:
        want_src_dev = true;
        break;
      case cudaMemcpyDeviceToDevice:
        want_src_dev = want_dst_dev = true;
        break;
      default:
        return ret(cudaErrorInvalidMemcpyDirection);
    }
    if (src_dev != want_src_dev || dst_dev != want_dst_dev) return ret(cudaErrorInvalidValue);
    if ((dst_dev && mem.find(dst, count) == nullptr) ||
        (src_dev && mem.find(src, count) == nullptr))
      return ret(cudaErrorInvalidValue);
    // Overlapping ranges are undefined for cudaMemcpy; a copy that needs them is a bug.
    if (src_dev == dst_dev && overlap(dst, src, count)) return ret(cudaErrorInvalidValue);
    dst_pinned = !dst_dev && mem.is_pinned(dst, count);
    src_pinned = !src_dev && mem.is_pinned(src, count);
  }
  if (!src_dev && !src_pinned && dst_dev && !synchronous) {
    // From pageable memory: the runtime stages the source before returning.
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + count);
    enqueue(s, [dst, staged, count, what] {
      if (dry_run()) return;  // Note [Emulator dry run]: nothing is written to the device
      DeviceOp op(what);
      open_if_device(dst, count);
      std::memcpy(dst, staged->data(), count);
    });
    return cudaSuccess;
  }
  auto run = [dst, src, count, what, dst_dev] {
    if (dst_dev && dry_run()) return;  // Note [Emulator dry run]: nothing is written to the device
    DeviceOp op(what);
    open_if_device(dst, count);
    open_if_device(src, count);
    std::memcpy(dst, src, count);
  };
  // Synchronous per the runtime's documentation: cudaMemcpy unless device to device, and any
  // copy into pageable host memory or between host buffers.
  const bool wait = synchronous ? !(src_dev && dst_dev) : (!dst_dev && !dst_pinned);
  if (wait)
    enqueue_and_wait(s, run);
  else
    enqueue(s, run);
  return cudaSuccess;
}

cudaError_t set(void* dst, int value, size_t count, cudaStream_t s, const char* what) {
  if (!valid_stream(s)) return ret(cudaErrorInvalidResourceHandle);
  if (count == 0) return cudaSuccess;
  {
    DeviceMemory& mem = DeviceMemory::get();
    std::lock_guard<std::mutex> lock(mem.mutex());
    if (mem.find(dst, count) == nullptr) return ret(cudaErrorInvalidValue);
  }
  enqueue(s, [dst, value, count, what] {
    if (dry_run()) return;  // Note [Emulator dry run]
    DeviceOp op(what);
    open_if_device(dst, count);
    std::memset(dst, value, count);
  });
  return cudaSuccess;
}

}  // namespace

void record_error(cudaError_t e) {
  t_last_error = e;
}

}  // namespace strata::cuda_emu

using namespace strata::cuda_emu;  // NOLINT: the C API below is global

extern "C" {

// ---- errors ----

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  return t_last_error;
}

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidMemcpyDirection:
      return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorNotSupported:
      return "cudaErrorNotSupported";
    default:
      return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidMemcpyDirection:
      return "invalid copy direction for memcpy";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorNotSupported:
      return "operation not supported";
    default:
      return "unknown error";
  }
}

// ---- device ----

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return ret(cudaErrorInvalidValue);
  *count = visible_devices();
  return *count == 0 ? ret(cudaErrorNoDevice) : cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (visible_devices() == 0) return ret(cudaErrorNoDevice);
  if (!valid_device(device)) return ret(cudaErrorInvalidDevice);
  int expected = -1;
  if (g_device.compare_exchange_strong(expected, device) || expected == device) return cudaSuccess;
  return ret(cudaErrorInvalidDevice);  // the emulator holds one device per process
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return ret(cudaErrorInvalidValue);
  if (visible_devices() == 0) return ret(cudaErrorNoDevice);
  const int d = g_device.load();
  *device = d < 0 ? 0 : d;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return ret(cudaErrorInvalidValue);
  if (visible_devices() == 0) return ret(cudaErrorNoDevice);
  if (!valid_device(device)) return ret(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof(*prop));
  std::strncpy(prop->name, "Strata CUDA emulator of an NVIDIA H100 80GB HBM3",
               sizeof(prop->name) - 1);
  prop->totalGlobalMem = DeviceMemory::get().cap();
  prop->sharedMemPerBlock = 48 << 10;
  prop->sharedMemPerBlockOptin = 227 << 10;
  prop->sharedMemPerMultiprocessor = 228 << 10;
  prop->regsPerBlock = 65536;
  prop->regsPerMultiprocessor = 65536;
  prop->warpSize = 32;
  prop->memPitch = 2147483647;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->totalConstMem = 64 << 10;
  prop->major = 9;
  prop->minor = 0;
  prop->textureAlignment = 512;
  prop->multiProcessorCount = kMultiprocessors;
  prop->canMapHostMemory = 1;
  prop->concurrentKernels = 1;
  prop->asyncEngineCount = 2;
  prop->unifiedAddressing = 1;
  prop->memoryBusWidth = 5120;
  prop->l2CacheSize = 50 << 20;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->maxBlocksPerMultiProcessor = 32;
  prop->streamPrioritiesSupported = 1;
  prop->managedMemory = 0;
  prop->cooperativeLaunch = 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (value == nullptr) return ret(cudaErrorInvalidValue);
  if (!valid_device(device)) return ret(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock:
    case cudaDevAttrMaxBlockDimX:
    case cudaDevAttrMaxBlockDimY:
      *value = 1024;
      return cudaSuccess;
    case cudaDevAttrMaxBlockDimZ:
      *value = 64;
      return cudaSuccess;
    case cudaDevAttrMaxGridDimX:
      *value = 2147483647;
      return cudaSuccess;
    case cudaDevAttrMaxGridDimY:
    case cudaDevAttrMaxGridDimZ:
      *value = 65535;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = 48 << 10;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = 227 << 10;
      return cudaSuccess;
    case cudaDevAttrWarpSize:
      *value = 32;
      return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
      *value = strata::cuda_emu::kMultiprocessors;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = 9;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      return cudaSuccess;
    case cudaDevAttrL2CacheSize:
      *value = 50 << 20;
      return cudaSuccess;
    case cudaDevAttrGlobalMemoryBusWidth:
      *value = 5120;
      return cudaSuccess;
    // An H100 SXM's peak clocks, as its driver reports them (kHz).
    case cudaDevAttrClockRate:
      *value = 1980000;
      return cudaSuccess;
    case cudaDevAttrMemoryClockRate:
      *value = 2619000;
      return cudaSuccess;
    default:
      // Not emulated: an error the caller sees, rather than a made-up number.
      return ret(cudaErrorInvalidValue);
  }
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  if (version == nullptr) return ret(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) {
  if (version == nullptr) return ret(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}

// ---- memory ----

cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (ptr == nullptr) return ret(cudaErrorInvalidValue);
  DeviceMemory& mem = DeviceMemory::get();
  std::lock_guard<std::mutex> lock(mem.mutex());
  return ret(mem.allocate(ptr, size));
}

cudaError_t cudaFree(void* ptr) {
  drain_all();  // the real cudaFree synchronizes the device
  DeviceMemory& mem = DeviceMemory::get();
  std::lock_guard<std::mutex> lock(mem.mutex());
  return ret(mem.free(ptr));
}

cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags) {
  if (ptr == nullptr) return ret(cudaErrorInvalidValue);
  (void)flags;  // portable / mapped / write-combined: all plain host memory here
  DeviceMemory& mem = DeviceMemory::get();
  std::lock_guard<std::mutex> lock(mem.mutex());
  return ret(mem.host_alloc(ptr, size));
}

// Pinned memory is ordinary host memory here, so the device's view of it is the same pointer
// (as under unified addressing on a real device).
cudaError_t cudaHostGetDevicePointer(void** dev, void* host, unsigned int flags) {
  if (dev == nullptr || host == nullptr || flags != 0) return ret(cudaErrorInvalidValue);
  DeviceMemory& mem = DeviceMemory::get();
  std::lock_guard<std::mutex> lock(mem.mutex());
  if (!mem.is_pinned(host)) return ret(cudaErrorInvalidValue);
  *dev = host;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  return cudaHostAlloc(ptr, size, cudaHostAllocDefault);
}

cudaError_t cudaFreeHost(void* ptr) {
  drain_all();  // pending copies may still read or write it
  DeviceMemory& mem = DeviceMemory::get();
  std::lock_guard<std::mutex> lock(mem.mutex());
  return ret(mem.host_free(ptr));
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  if (free == nullptr || total == nullptr) return ret(cudaErrorInvalidValue);
  DeviceMemory& mem = DeviceMemory::get();
  std::lock_guard<std::mutex> lock(mem.mutex());
  *total = mem.cap();
  *free = mem.cap() - mem.used();
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* ptr) {
  if (attr == nullptr) return ret(cudaErrorInvalidValue);
  DeviceMemory& mem = DeviceMemory::get();
  std::lock_guard<std::mutex> lock(mem.mutex());
  std::memset(attr, 0, sizeof(*attr));
  if (mem.find(ptr) != nullptr) {
    attr->type = cudaMemoryTypeDevice;
    attr->devicePointer = const_cast<void*>(ptr);
  } else if (mem.is_pinned(ptr)) {
    attr->type = cudaMemoryTypeHost;
    attr->devicePointer = attr->hostPointer = const_cast<void*>(ptr);
  } else {
    attr->type = cudaMemoryTypeUnregistered;
    attr->device = -2;
    attr->hostPointer = const_cast<void*>(ptr);
  }
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  return copy(dst, src, count, kind, nullptr, "cudaMemcpy", true);
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  return copy(dst, src, count, kind, stream, "cudaMemcpyAsync", false);
}

cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  return set(ptr, value, count, nullptr, "cudaMemset");
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  return set(ptr, value, count, stream, "cudaMemsetAsync");
}

}  // extern "C"
