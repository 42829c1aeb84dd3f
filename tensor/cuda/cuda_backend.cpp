#include "tensor/cuda/cuda_backend.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/env.h"
#include "core/error.h"
#include "core/logging.h"
#include "tensor/cuda.h"
#include "tensor/cuda/backend_util.h"
#include "tensor/cuda/cudnn_sdpa.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/profiler.h"
#include "tensor/storage.h"

namespace strata::tensor {
void register_backend(DeviceType type, Backend* backend);
}

namespace strata::tensor::cuda {

void check_cuda(int status, const char* what) {
  if (status != cudaSuccess)
    detail::throw_check_failure(__FILE__, __LINE__, what,
                                fmt::format("CUDA error {}: {}", status,
                                            cudaGetErrorString(static_cast<cudaError_t>(status))));
}

bool event_completed(CUevent_st* event, const char* what) {
  const cudaError_t r = cudaEventQuery(event);
  if (r == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  check_cuda(r, what);
  return true;
}

namespace {

// Raw device memory and events for the caching allocator (Note [GPU caching allocator]).
class CudaMemoryApi final : public offload::DeviceMemoryApi {
 public:
  void* raw_malloc(size_t bytes) override {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free out-of-memory error
      return nullptr;
    }
    return p;
  }
  void raw_free(void* ptr) override { check_cuda(cudaFree(ptr), "cudaFree"); }
  offload::EventHandle record_event(offload::StreamHandle stream) override {
    cudaEvent_t e;
    check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventRecord(e, static_cast<cudaStream_t>(stream)), "cudaEventRecord");
    return e;
  }
  bool event_completed(offload::EventHandle event) override {
    return cuda::event_completed(static_cast<cudaEvent_t>(event), "cudaEventQuery");
  }
  void destroy_event(offload::EventHandle event) override {
    cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }
  void synchronize_device() override {
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  void fill(void* ptr, size_t bytes, int byte, offload::StreamHandle stream) override {
    check_cuda(cudaMemsetAsync(ptr, byte, bytes, static_cast<cudaStream_t>(stream)),
               "cudaMemsetAsync (allocator poison)");
  }
};

// STRATA_GPU_POISON (Note [GPU caching allocator]): auto poisons in the CUDA emulator's builds,
// where the tests run, except in a dry run (Note [Emulator dry run]: nothing is written, and
// the fills would only add host time to what it measures); on a GPU it costs a memset per
// allocation, so auto leaves it off there.
bool poison_allocations() {
  const int choice = env_choice(
      "STRATA_GPU_POISON",
      {{"auto", "on in the CUDA emulator's builds, off on a GPU"},
       {"on", "fill every block the GPU allocator hands out with 0xff bytes (NaN) first"},
       {"off", "hand blocks out as their last owner left them"}});
  if (choice != 0) return choice == 1;
#if STRATA_CUDA_EMULATION
  const char* dry = std::getenv("STRATA_CUDA_EMU_DRY_RUN");
  return dry == nullptr || *dry == '\0' || std::string_view(dry) == "0";
#else
  return false;
#endif
}

}  // namespace

CudaBackend::CudaBackend(int device) : device_(device) {
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  cudaStream_t s;
  check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  stream_ = s;
  cublasLtHandle_t h;
  STRATA_CHECK(cublasLtCreate(&h) == CUBLAS_STATUS_SUCCESS, "cublasLtCreate failed");
  lt_ = h;
  allocator_ = new offload::GpuCachingAllocator(std::make_unique<CudaMemoryApi>());
  allocator_->set_default_stream(stream_);
  allocator_->set_poison(poison_allocations());
}

CudaBackend::~CudaBackend() {
  // The backend lives for the process (registered in a static); nothing to tear down early.
}

void CudaBackend::synchronize() {
  check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  raise_device_checks();
}

int CudaBackend::multiprocessors() {
  if (sms_ == 0) {
    int n = 0;
    check_cuda(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device_),
               "cudaDeviceGetAttribute (multiprocessors)");
    sms_ = std::max(n, 1);
  }
  return sms_;
}

Tensor CudaBackend::scratch(int64_t bytes) {
  offload::CategoryScope ws(offload::Category::Workspace);
  return Tensor::empty({std::max<int64_t>(bytes, 1)}, DType::U8, device());
}

// Note [Deferred device checks] (cuda_backend.h).
int* CudaBackend::checked_launch(std::string message) {
  std::unique_lock<std::mutex> lock(checks_mu_);
  if (check_flags_ == nullptr) {
    void* host = nullptr;
    check_cuda(cudaHostAlloc(&host, kDeviceChecks * sizeof(int), cudaHostAllocMapped),
               "cudaHostAlloc (device check flags)");
    std::memset(host, 0, kDeviceChecks * sizeof(int));
    void* dev = nullptr;
    check_cuda(cudaHostGetDevicePointer(&dev, host, 0), "cudaHostGetDevicePointer");
    check_flags_ = static_cast<int*>(host);
    check_flags_dev_ = static_cast<int*>(dev);
  }
  if (checks_used_ == kDeviceChecks) {
    lock.unlock();
    synchronize();  // frees every slot (or raises)
    lock.lock();
  }
  STRATA_CHECK(checks_used_ < kDeviceChecks, "device check slots still full after a wait");
  check_messages_[static_cast<size_t>(checks_used_)] = std::move(message);
  return check_flags_dev_ + checks_used_++;
}

void CudaBackend::raise_device_checks() {
  // Called right after a wait for the stream: every kernel given a flag so far has finished.
  std::string error;
  {
    std::lock_guard<std::mutex> lock(checks_mu_);
    const volatile int* flags = check_flags_;
    for (int i = 0; i < checks_used_; ++i) {
      if (error.empty() && flags[i] != 0) error = check_messages_[static_cast<size_t>(i)];
      check_flags_[i] = 0;
    }
    checks_used_ = 0;
  }
  if (!error.empty()) user_error("{}", error);
}

// ---- memory ----

void CudaBackend::copy_on_device(const Tensor& src, Tensor& dst) {
  if (dst.numel() == 0) return;
  if (shares_bytes(src, dst)) {
    if (src.is_same(dst)) return;
    // Possibly overlapping views of one storage: read everything first (as the CPU does).
    Tensor tmp = Tensor::empty(src.shape(), src.dtype(), device());
    copy_on_device(src, tmp);
    copy_on_device(tmp, dst);
    return;
  }
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
    check_cuda(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(),
                               cudaMemcpyDeviceToDevice, stream_),
               "cudaMemcpyAsync D2D");
    return;
  }
  launch_copy(src.data_ptr(), dt(src.dtype()), view_of(src), dst.data_ptr(), dt(dst.dtype()),
              view_of(dst), dst.numel(), stream_);
  check_launch("copy");
}

void CudaBackend::copy(const Tensor& src, Tensor& dst) {
  OpScope prof(stream_, "copy", 0, bytes_of({&src, &dst}));
  STRATA_CHECK(src.shape() == dst.shape(), "copy from {} into {}", src.str(), dst.str());
  if (dst.numel() == 0) return;
  if (src.device().is_cuda() && dst.device().is_cuda()) return copy_on_device(src, dst);
  if (src.device().is_cpu()) {
    // Host -> device: contiguous bytes across, conversion and layout on the device.
    Tensor host = src.contiguous();
    Tensor staged = dst.dtype() == src.dtype() && dst.is_contiguous()
                        ? dst
                        : Tensor::empty(src.shape(), src.dtype(), device());
    copy_from_host(host.data_ptr(), staged.data_ptr(), host.nbytes());
    if (!staged.is_same(dst)) copy_on_device(staged, dst);
    return;
  }
  // Device -> host: contiguous on the device, bytes across, conversion and layout on the host.
  Tensor dev = src.is_contiguous() ? src : Tensor::empty(src.shape(), src.dtype(), device());
  if (!dev.is_same(src)) copy_on_device(src, dev);
  Tensor host = dst.dtype() == src.dtype() && dst.is_contiguous()
                    ? dst
                    : Tensor::empty(src.shape(), src.dtype(), Device::cpu());
  check_cuda(cudaMemcpyAsync(host.data_ptr(), dev.data_ptr(), dev.nbytes(), cudaMemcpyDeviceToHost,
                             stream_),
             "cudaMemcpyAsync D2H");
  synchronize();
  if (!host.is_same(dst)) backend_for(Device::cpu()).copy(host, dst);
}

// Note [Pinned staging] (cuda_backend.h).
void CudaBackend::copy_from_host(const void* src, void* dst, size_t bytes) {
  if (bytes == 0) return;
  if (bytes > kPinnedStagingMax) {
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_),
               "cudaMemcpyAsync H2D");
    synchronize();  // the caller may free `src` once this returns
    return;
  }
  PinnedSlot& slot = pinned_[static_cast<size_t>(next_pinned_)];
  next_pinned_ = (next_pinned_ + 1) % static_cast<int>(pinned_.size());
  if (slot.done == nullptr) {
    cudaEvent_t e;
    check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    slot.done = e;
  } else {
    // The copy that last read this slot was enqueued pinned_.size() copies ago; normally it has
    // long finished and this returns at once.
    check_cuda(cudaEventSynchronize(slot.done), "cudaEventSynchronize");
  }
  if (slot.bytes < bytes) {
    if (slot.ptr) check_cuda(cudaFreeHost(slot.ptr), "cudaFreeHost");
    slot.ptr = nullptr;
    slot.bytes = 0;
    const size_t want = std::max<size_t>(bytes, size_t{1} << 16);
    check_cuda(cudaHostAlloc(&slot.ptr, want, cudaHostAllocDefault), "cudaHostAlloc");
    slot.bytes = want;
  }
  std::memcpy(slot.ptr, src, bytes);
  check_cuda(cudaMemcpyAsync(dst, slot.ptr, bytes, cudaMemcpyHostToDevice, stream_),
             "cudaMemcpyAsync H2D");
  check_cuda(cudaEventRecord(slot.done, stream_), "cudaEventRecord");
}

// ---- device setup and registration ----

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver / no device: report none
    return 0;
  }
  return n;
}

namespace {

// A UserError unless `device` is one of the visible devices.
void require_visible(int device) {
  const int n = device_count();
  if (n == 0)
    user_error(
        "device: cuda requested but no CUDA device is visible (check nvidia-smi, the "
        "driver, and CUDA_VISIBLE_DEVICES), or use device: cpu");
  if (device < 0 || device >= n)
    user_error(
        "device cuda:{} requested but only {} CUDA device(s) are visible (0..{}); check "
        "CUDA_VISIBLE_DEVICES and the device index",
        device, n, n - 1);
}

}  // namespace

CudaDeviceFacts device_facts(int device) {
  require_visible(device);
  CudaDeviceFacts f;
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  f.name = prop.name;
  f.major = prop.major;
  f.minor = prop.minor;
  f.sms = prop.multiProcessorCount;
  f.bus_width_bits = prop.memoryBusWidth;
  f.total_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  // The clocks left cudaDeviceProp in CUDA 13; an attribute a driver does not report stays 0.
  const auto attribute = [&](cudaDeviceAttr a) {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, a, device) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return v;
  };
  f.clock_khz = attribute(cudaDevAttrClockRate);
  f.memory_clock_khz = attribute(cudaDevAttrMemoryClockRate);
  return f;
}

void init(int device);

namespace {
std::mutex init_mu;
CudaBackend* backend = nullptr;  // this process's backend once init() ran; lives for the process
}  // namespace

void* current_stream() {
  {
    std::lock_guard<std::mutex> lock(init_mu);
    if (backend != nullptr) return backend->stream();
  }
  init(0);  // as backend_for(Device::cuda()) does on first use
  std::lock_guard<std::mutex> lock(init_mu);
  return backend->stream();
}

void init(int device) {
  std::lock_guard<std::mutex> lock(init_mu);
  if (backend != nullptr) {
    if (backend->device().index != device)
      user_error(
          "device cuda:{} requested, but this process already uses cuda:{}; Strata runs "
          "one process per GPU (launch with mpirun/srun and device: cuda)",
          device, backend->device().index);
    return;
  }
  require_visible(device);
  backend = new CudaBackend(device);  // lives for the process, like the host allocator
  register_device_allocator(DeviceType::CUDA, &backend->allocator());
  register_backend(DeviceType::CUDA, backend);
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) == cudaSuccess)
    log::info("CUDA device {}: {} (sm_{}{}, {:.1f} GiB)", device, prop.name, prop.major, prop.minor,
              static_cast<double>(prop.totalGlobalMem) / (1 << 30));
}

}  // namespace strata::tensor::cuda
