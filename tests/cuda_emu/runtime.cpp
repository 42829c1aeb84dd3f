// The CUDA runtime API of the emulated device (Note [CUDA emulator] in simt.h): one device,
// "Strata CUDA emulator" with sm_90's numbers; streams and events are handles that are checked,
// and every operation runs at once, when it is enqueued (so an event is complete as soon as it
// is recorded). Memory follows Note [Emulated device memory]. The definitions take their
// signatures from the real cuda_runtime_api.h, which maps versioned names for us.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "tests/cuda_emu/control.h"
#include "tests/cuda_emu/device_memory.h"

namespace strata::cuda_emu {

namespace {

thread_local cudaError_t t_last_error = cudaSuccess;

struct Stream {
  unsigned flags = 0;
  int priority = 0;
};

struct Event {
  unsigned flags = 0;
  bool recorded = false;
  std::chrono::steady_clock::time_point when;
};

// Handles, guarded by their own mutex (created and destroyed from any host thread).
std::mutex g_handles_mu;
std::unordered_set<Stream*> g_streams;
std::unordered_set<Event*> g_events;

cudaError_t ret(cudaError_t e) {
  if (e != cudaSuccess) record_error(e);
  return e;
}

int visible_devices() {
  static const int n = [] {
    const char* v = std::getenv("STRATA_CUDA_EMU_DEVICES");
    return v != nullptr && *v != '\0' ? static_cast<int>(std::strtol(v, nullptr, 10)) : 1;
  }();
  return n > 0 ? 1 : 0;
}

bool valid_event(cudaEvent_t e) {
  std::lock_guard<std::mutex> lock(g_handles_mu);
  return g_events.count(reinterpret_cast<Event*>(e)) > 0;
}

bool overlap(const void* a, const void* b, size_t n) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + n && y < x + n;
}

// A copy checked the way the real runtime would reject it (directions against pointer kinds,
// ranges inside one allocation), then done on the "device".
cudaError_t copy(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t s,
                 const char* what) {
  if (!valid_stream(s)) return ret(cudaErrorInvalidResourceHandle);
  if (count == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return ret(cudaErrorInvalidValue);
  DeviceOp op(what);
  DeviceMemory& mem = DeviceMemory::get();
  const bool dst_dev = mem.find_mapping(dst) != nullptr;
  const bool src_dev = mem.find_mapping(src) != nullptr;
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
  Allocation* d = dst_dev ? mem.find(dst, count) : nullptr;
  Allocation* r = src_dev ? mem.find(src, count) : nullptr;
  if ((dst_dev && d == nullptr) || (src_dev && r == nullptr)) return ret(cudaErrorInvalidValue);
  // Overlapping ranges are undefined for cudaMemcpy; a copy that needs them is a bug.
  if (src_dev == dst_dev && overlap(dst, src, count)) return ret(cudaErrorInvalidValue);
  if (d) mem.open(*d);
  if (r) mem.open(*r);
  std::memcpy(dst, src, count);
  return cudaSuccess;
}

cudaError_t set(void* dst, int value, size_t count, cudaStream_t s, const char* what) {
  if (!valid_stream(s)) return ret(cudaErrorInvalidResourceHandle);
  if (count == 0) return cudaSuccess;
  DeviceOp op(what);
  DeviceMemory& mem = DeviceMemory::get();
  Allocation* d = mem.find(dst, count);
  if (d == nullptr) return ret(cudaErrorInvalidValue);
  mem.open(*d);
  std::memset(dst, value, count);
  return cudaSuccess;
}

}  // namespace

void record_error(cudaError_t e) {
  t_last_error = e;
}

bool valid_stream(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return true;
  std::lock_guard<std::mutex> lock(g_handles_mu);
  return g_streams.count(reinterpret_cast<Stream*>(s)) > 0;
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
  return device == 0 ? cudaSuccess : ret(cudaErrorInvalidDevice);
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return ret(cudaErrorInvalidValue);
  if (visible_devices() == 0) return ret(cudaErrorNoDevice);
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return ret(cudaErrorInvalidValue);
  if (visible_devices() == 0) return ret(cudaErrorNoDevice);
  if (device != 0) return ret(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof(*prop));
  std::strncpy(prop->name, "Strata CUDA emulator", sizeof(prop->name) - 1);
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
  prop->multiProcessorCount = 132;
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
  if (device != 0 || visible_devices() == 0) return ret(cudaErrorInvalidDevice);
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
      *value = 132;
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
    default:
      // Not emulated: an error the caller sees, rather than a made-up number.
      return ret(cudaErrorInvalidValue);
  }
}

cudaError_t cudaDeviceSynchronize(void) {
  return cudaSuccess;  // every operation ran when it was enqueued
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

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  return cudaHostAlloc(ptr, size, cudaHostAllocDefault);
}

cudaError_t cudaFreeHost(void* ptr) {
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
  return copy(dst, src, count, kind, nullptr, "cudaMemcpy");
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  return copy(dst, src, count, kind, stream, "cudaMemcpyAsync");
}

cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  return set(ptr, value, count, nullptr, "cudaMemset");
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  return set(ptr, value, count, stream, "cudaMemsetAsync");
}

// ---- streams ----

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags, int priority) {
  if (stream == nullptr || (flags & ~unsigned{cudaStreamNonBlocking}) != 0)
    return ret(cudaErrorInvalidValue);
  auto* s = new Stream{flags, priority};
  std::lock_guard<std::mutex> lock(g_handles_mu);
  g_streams.insert(s);
  *stream = reinterpret_cast<cudaStream_t>(s);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  return cudaStreamCreateWithPriority(stream, flags, 0);
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithPriority(stream, 0, 0);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(g_handles_mu);
  auto* s = reinterpret_cast<Stream*>(stream);
  if (g_streams.erase(s) == 0) return ret(cudaErrorInvalidResourceHandle);
  delete s;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  return valid_stream(stream) ? cudaSuccess : ret(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  return valid_stream(stream) ? cudaSuccess : ret(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  (void)flags;
  if (!valid_stream(stream) || !valid_event(event)) return ret(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return cudaSuccess;
}

// ---- events ----

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (event == nullptr) return ret(cudaErrorInvalidValue);
  auto* e = new Event{};
  e->flags = flags;
  std::lock_guard<std::mutex> lock(g_handles_mu);
  g_events.insert(e);
  *event = reinterpret_cast<cudaEvent_t>(e);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(g_handles_mu);
  auto* e = reinterpret_cast<Event*>(event);
  if (g_events.erase(e) == 0) return ret(cudaErrorInvalidResourceHandle);
  delete e;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (!valid_stream(stream) || !valid_event(event)) return ret(cudaErrorInvalidResourceHandle);
  auto* e = reinterpret_cast<Event*>(event);
  e->recorded = true;
  e->when = std::chrono::steady_clock::now();
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  return valid_event(event) ? cudaSuccess : ret(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  return valid_event(event) ? cudaSuccess : ret(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr) return ret(cudaErrorInvalidValue);
  if (!valid_event(start) || !valid_event(end)) return ret(cudaErrorInvalidResourceHandle);
  auto* a = reinterpret_cast<Event*>(start);
  auto* b = reinterpret_cast<Event*>(end);
  if ((a->flags | b->flags) & cudaEventDisableTiming) return ret(cudaErrorInvalidResourceHandle);
  if (!a->recorded || !b->recorded) return ret(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(b->when - a->when).count();
  return cudaSuccess;
}

}  // extern "C"
