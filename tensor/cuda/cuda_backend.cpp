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

void check_launch(const char* what) {
  check_cuda(cudaGetLastError(), what);
}

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

// STRATA_NORM_GRADS (Note [Fused norm weight gradients] in fused_norm.cu), read once.
bool fused_norm_grads() {
  static const bool fused =
      env_choice(
          "STRATA_NORM_GRADS",
          {{"fused", "the norm backward's dx kernel also sums the weight/bias gradients"},
           {"separate", "a second kernel re-reads dy and x for the weight/bias gradients"}}) == 0;
  return fused;
}

// STRATA_DECODE_ATTENTION (Note [CUDA decode attention] in attention_decode.cu), read once.
bool split_decode_attention() {
  static const bool split =
      env_choice("STRATA_DECODE_ATTENTION",
                 {{"split", "decode steps (Tq <= 16 < Tk) split the keys over the device"},
                  {"off", "decode steps take the training kernels (tensor cores, else SIMT)"}}) ==
      0;
  return split;
}

Strided view_of(const Tensor& t) {
  STRATA_CHECK(t.ndim() <= kMaxDims, "CUDA kernels take at most {} dims, got {}", kMaxDims,
               t.str());
  Strided v;
  v.ndim = t.ndim();
  for (int d = 0; d < t.ndim(); ++d) {
    v.shape[d] = t.size(d);
    v.strides[d] = t.stride(d);
  }
  return v;
}

// t viewed in `shape` (right-aligned broadcasting: missing and size-1 dims get stride 0).
Strided broadcast_view(const Tensor& t, const Shape& shape) {
  Strided v;
  v.ndim = shape.ndim();
  STRATA_CHECK(v.ndim <= kMaxDims, "CUDA kernels take at most {} dims", kMaxDims);
  const int lead = shape.ndim() - t.ndim();
  for (int d = 0; d < shape.ndim(); ++d) {
    v.shape[d] = shape[d];
    const int td = d - lead;
    v.strides[d] = td < 0 || t.size(td) == 1 ? 0 : t.stride(td);
  }
  return v;
}

int dt(DType t) {
  return static_cast<int>(t);
}

bool shares_bytes(const Tensor& a, const Tensor& b) {
  return a.storage() == b.storage();
}

bool is_float(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F16;
}

// The compute dtype of a float op (Note [Low-precision ops] in tensor/ops.h): `first`'s dtype,
// which every tensor in `rest` must share. The op layer validated this; a mismatch here is an
// internal error, reported before a kernel reads memory as the wrong type.
template <typename... Ts>
int compute_dt(const char* op, const Tensor& first, const Ts&... rest) {
  const DType t = first.dtype();
  STRATA_CHECK(is_float(t), "CUDA {}: {} is not a float tensor", op, first.str());
  [[maybe_unused]] auto same = [&](const Tensor& x) {
    STRATA_CHECK(x.dtype() == t, "CUDA {}: {} and {} differ in dtype (Note [Low-precision ops])",
                 op, first.str(), x.str());
  };
  (same(rest), ...);
  return dt(t);
}

// A launcher of kernels.h returned `enqueued` (false: no kernel for these dtypes), then the
// launch itself must have succeeded.
void launched(bool enqueued, const char* what) {
  STRATA_CHECK(enqueued, "CUDA {}: no kernel for these dtypes", what);
  check_launch(what);
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

void CudaBackend::fill(Tensor& dst, double value) {
  OpScope prof(stream_, "fill", 0, bytes_of({&dst}));
  if (dst.numel() == 0) return;
  if (value == 0.0 && dst.is_contiguous()) {
    check_cuda(cudaMemsetAsync(dst.data_ptr(), 0, dst.nbytes(), stream_), "cudaMemsetAsync");
    return;
  }
  launch_fill(dst.data_ptr(), dt(dst.dtype()), view_of(dst), dst.numel(), value, stream_);
  check_launch("fill");
}

void CudaBackend::arange(Tensor& dst, double start, double step) {
  OpScope prof(stream_, "arange", 0, bytes_of({&dst}));
  STRATA_CHECK(dst.is_contiguous(), "arange into non-contiguous {}", dst.str());
  if (dst.numel() == 0) return;
  launch_arange(dst.data_ptr(), dt(dst.dtype()), dst.numel(), start, step, stream_);
  check_launch("arange");
}

void CudaBackend::random_uniform(Tensor& dst, RngKey key, float lo, float hi) {
  OpScope prof(stream_, "random_uniform", 0, bytes_of({&dst}));
  if (dst.numel() == 0) return;
  // Float dtypes draw in place (rounded once per value); other layouts/dtypes via an F32 draw.
  Tensor f = is_float(dst.dtype()) && dst.is_contiguous()
                 ? dst
                 : Tensor::empty(dst.shape(), DType::F32, device());
  launched(launch_random_uniform(f.data_ptr(), dt(f.dtype()), f.numel(), key.seed, key.stream, lo,
                                 hi, stream_),
           "random_uniform");
  if (!f.is_same(dst)) copy_on_device(f, dst);
}

void CudaBackend::random_normal(Tensor& dst, RngKey key, float mean, float stddev) {
  OpScope prof(stream_, "random_normal", 0, bytes_of({&dst}));
  if (dst.numel() == 0) return;
  // Float dtypes draw in place (rounded once per value); other layouts/dtypes via an F32 draw.
  Tensor f = is_float(dst.dtype()) && dst.is_contiguous()
                 ? dst
                 : Tensor::empty(dst.shape(), DType::F32, device());
  launched(launch_random_normal(f.data_ptr(), dt(f.dtype()), f.numel(), key.seed, key.stream, mean,
                                stddev, stream_),
           "random_normal");
  if (!f.is_same(dst)) copy_on_device(f, dst);
}

void CudaBackend::concat(const std::vector<Tensor>& xs, int dim, Tensor& out) {
  OpScope prof(stream_, "concat", 0, 2 * bytes_of({&out}));
  dim = out.shape().normalize(dim);
  int64_t start = 0;
  for (const Tensor& x : xs) {
    const int64_t len = x.size(dim);
    if (len > 0 && x.numel() > 0) {
      Tensor part = out.narrow(dim, start, len);
      copy_on_device(x, part);
    }
    start += len;
  }
  STRATA_CHECK(start == out.size(dim), "concat: pieces add up to {} along dim {}, out has {}",
               start, dim, out.size(dim));
}

// ---- elementwise ----

void CudaBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  OpScope prof(stream_, "binary", 0, bytes_of({&a, &b, &out}));
  if (out.numel() == 0) return;
  launched(launch_binary(static_cast<int>(op), compute_dt("binary", out, a, b), a.data_ptr(),
                         broadcast_view(a, out.shape()), b.data_ptr(),
                         broadcast_view(b, out.shape()), out.data_ptr(), out.numel(), stream_),
           "binary");
}

void CudaBackend::affine(const Tensor& x, float alpha, float beta, Tensor& out) {
  OpScope prof(stream_, "affine", 0, bytes_of({&x, &out}));
  if (out.numel() == 0) return;
  launched(launch_affine(compute_dt("affine", out, x), x.data_ptr(), view_of(x), alpha, beta,
                         out.data_ptr(), out.numel(), stream_),
           "affine");
}

void CudaBackend::axpy(float alpha, const Tensor& x, Tensor& y) {
  OpScope prof(stream_, "axpy", 0, bytes_of({&x, &y, &y}));
  if (y.numel() == 0) return;
  // x and y may differ in dtype (gradient accumulation into an f32 buffer, or the reverse).
  STRATA_CHECK(x.is_contiguous() && y.is_contiguous() && x.numel() == y.numel(), "axpy {} into {}",
               x.str(), y.str());
  launched(launch_axpy(alpha, x.data_ptr(), compute_dt("axpy", x), y.data_ptr(),
                       compute_dt("axpy", y), y.numel(), stream_),
           "axpy");
}

void CudaBackend::unary(UnaryOp op, const Tensor& x, Tensor& out) {
  OpScope prof(stream_, "unary", 0, bytes_of({&x, &out}));
  if (out.numel() == 0) return;
  launched(launch_unary(static_cast<int>(op), compute_dt("unary", out, x), x.data_ptr(),
                        out.data_ptr(), out.numel(), stream_),
           "unary");
}

void CudaBackend::unary_backward(UnaryOp op, const Tensor& x, const Tensor& dy, Tensor& dx) {
  OpScope prof(stream_, "unary_backward", 0, bytes_of({&x, &dy, &dx}));
  if (dx.numel() == 0) return;
  launched(launch_unary_backward(static_cast<int>(op), compute_dt("unary_backward", dx, x, dy),
                                 x.data_ptr(), dy.data_ptr(), dx.data_ptr(), dx.numel(), stream_),
           "unary_backward");
}

void CudaBackend::bias_add(const Tensor& x, const Tensor& bias, Tensor& out) {
  OpScope prof(stream_, "bias_add", 0, bytes_of({&x, &bias, &out}));
  if (out.numel() == 0) return;
  const int64_t c = bias.size(0);
  launched(launch_bias_add(compute_dt("bias_add", out, x, bias), x.data_ptr(), bias.data_ptr(),
                           out.data_ptr(), out.numel() / c, c, stream_),
           "bias_add");
}

void CudaBackend::dropout(const Tensor& x, float p, RngKey key, Tensor& out) {
  OpScope prof(stream_, "dropout", 0, bytes_of({&x, &out}));
  if (p == 0.f) return copy_on_device(x, out);
  if (out.numel() == 0) return;
  launched(launch_dropout(compute_dt("dropout", out, x), x.data_ptr(), out.data_ptr(), out.numel(),
                          p, key.seed, key.stream, stream_),
           "dropout");
}

void CudaBackend::rotary(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse,
                         Tensor& out) {
  OpScope prof(stream_, "rotary", 0, bytes_of({&x, &cos, &sin, &out}));
  if (out.numel() == 0) return;
  // The tables are F32 (rotary_tables) or the compute dtype (Note [Low-precision ops]).
  const int t = compute_dt("rotary", out, x);
  STRATA_CHECK(cos.dtype() == sin.dtype() && (cos.dtype() == DType::F32 || dt(cos.dtype()) == t),
               "CUDA rotary: tables {} / {} for {}", cos.str(), sin.str(), x.str());
  launched(launch_rotary(t, x.data_ptr(), cos.data_ptr(), sin.data_ptr(), dt(cos.dtype()), inverse,
                         out.data_ptr(), x.size(0), x.size(1), x.size(2), x.size(3), stream_),
           "rotary");
}

// ---- reductions ----

void CudaBackend::sum_to(const Tensor& x, Tensor& out) {
  OpScope prof(stream_, "sum_to", 0, bytes_of({&x, &out}));
  STRATA_CHECK(is_floating(x.dtype()) && is_floating(out.dtype()) && out.is_contiguous(),
               "sum_to {} -> {}", x.str(), out.str());
  // [N, C] -> [C] (a bias gradient: out is x's trailing dims, every leading dim summed):
  // Note [CUDA column sums].
  const int lead_dims = x.ndim() - out.ndim();
  bool trailing = x.is_contiguous() && lead_dims >= 0;
  for (int d = 0; trailing && d < out.ndim(); ++d) trailing = out.size(d) == x.size(d + lead_dims);
  const int64_t c = out.numel();
  // Any row count: with few rows and many columns (GPT-2 1558M's position-embedding gradient,
  // 16 rows of 1.6M) the generic reduce gave every column a block of its own.
  if (trailing && c > 0) {
    const int64_t n = x.numel() / c;
    const int64_t chunks = (n + kColumnSumRows - 1) / kColumnSumRows;
    Tensor s = scratch(chunks * c * static_cast<int64_t>(sizeof(double)));
    launched(
        launch_column_sum(x.data_ptr(), dt(x.dtype()), n, c, static_cast<double*>(s.data_ptr()),
                          out.data_ptr(), dt(out.dtype()), stream_),
        "sum_to");
    return;
  }
  // Outer: x's dims kept by out (stride 0 elsewhere); reduced: the others.
  Strided outer, red;
  outer.ndim = x.ndim();
  const int lead = x.ndim() - out.ndim();
  for (int d = 0; d < x.ndim(); ++d) {
    const int od = d - lead;
    const bool kept = od >= 0 && out.size(od) == x.size(d);
    outer.shape[d] = kept ? x.size(d) : 1;
    outer.strides[d] = kept ? x.stride(d) : 0;
    if (!kept) {
      red.shape[red.ndim] = x.size(d);
      red.strides[red.ndim] = x.stride(d);
      ++red.ndim;
    }
  }
  launch_reduce(0, x.data_ptr(), dt(x.dtype()), outer, red, out.data_ptr(), dt(out.dtype()),
                out.numel(), nullptr, stream_);
  check_launch("sum_to");
}

void CudaBackend::reduce(ReduceOp op, const Tensor& x, int dim, Tensor& out, Tensor* indices) {
  OpScope prof(stream_, "reduce", 0, bytes_of({&x, &out}));
  STRATA_CHECK(out.is_contiguous(), "reduce into non-contiguous {}", out.str());
  if (out.numel() == 0) return;
  STRATA_CHECK(x.size(dim) > 0 || op != ReduceOp::Max, "max over an empty dim of {}", x.str());
  Strided outer = view_of(x), red;
  outer.shape[dim] = 1;
  red.ndim = 1;
  red.shape[0] = x.size(dim);
  red.strides[0] = x.stride(dim);
  int64_t* ip = nullptr;
  if (indices && op == ReduceOp::Max) {
    STRATA_CHECK(indices->dtype() == DType::I64 && indices->is_contiguous(), "max indices {}",
                 indices->str());
    ip = indices->data<int64_t>();
  }
  launch_reduce(static_cast<int>(op), x.data_ptr(), dt(x.dtype()), outer, red, out.data_ptr(),
                dt(out.dtype()), out.numel(), ip, stream_);
  check_launch("reduce");
}

void CudaBackend::top_k(const Tensor& x, Tensor& values, Tensor& indices) {
  OpScope prof(stream_, "top_k", 0, bytes_of({&x, &values, &indices}));
  STRATA_CHECK(x.ndim() == 2 && x.stride(1) == 1 && values.is_contiguous() &&
                   indices.is_contiguous() && indices.dtype() == DType::I64 &&
                   values.dtype() == x.dtype() && values.size(0) == x.size(0) &&
                   values.size(1) >= 1 && values.size(1) <= x.size(1),
               "top_k of {} into {} and {}", x.str(), values.str(), indices.str());
  const int64_t k = values.size(1);
  if (k > kTopKMax || x.size(1) >= (int64_t{1} << 31)) {
    // Past the kernel's shared-memory candidates (Note [CUDA top-k]): the CPU backend's result,
    // which is the same by Note [Top-k], copied back (a wait for the device).
    const Tensor h = x.to(Device::cpu());
    Tensor hv = Tensor::empty(values.shape(), values.dtype());
    Tensor hi = Tensor::empty(indices.shape(), DType::I64);
    backend_for(Device::cpu()).top_k(h, hv, hi);
    values.copy_(hv);
    indices.copy_(hi);
    return;
  }
  STRATA_CHECK(launch_top_k(dt(x.dtype()), x.data_ptr(), x.size(0), x.size(1), x.stride(0), k,
                            values.data_ptr(), indices.data<int64_t>(), stream_),
               "top_k of {}: not a float dtype", x.str());
  check_launch("top_k");
}

double CudaBackend::sum_squares(const Tensor& x) {
  return sum_squares_many({x}).front();
}

namespace {
double bytes_of_all(const std::vector<Tensor>& xs) {
  double b = 0;
  for (const Tensor& x : xs) b += bytes_of({&x});
  return b;
}
}  // namespace

std::vector<double> CudaBackend::sum_squares_many(const std::vector<Tensor>& xs) {
  OpScope prof(stream_, "sum_squares", 0, bytes_of_all(xs));
  // Each tensor's total lands in its own slot of one device array; one copy back of those, one
  // wait. The tensors go in groups of up to kGroup: each writes its row of block partials, then
  // one launch adds every row of the group into its slot. The stream runs the groups in order,
  // so they share the rows.
  constexpr int64_t kGroup = 64;
  const auto n = static_cast<int64_t>(xs.size());
  Tensor s = scratch((n + kGroup * kSumSquaresBlocks) * static_cast<int64_t>(sizeof(double)));
  double* totals = static_cast<double*>(s.data_ptr());
  double* rows = totals + n;
  for (int64_t g0 = 0; g0 < n; g0 += kGroup) {
    const int64_t g1 = std::min(n, g0 + kGroup);
    for (int64_t i = g0; i < g1; ++i) {
      const Tensor& x = xs[static_cast<size_t>(i)];
      STRATA_CHECK(is_floating(x.dtype()), "sum_squares of {}", x.str());
      // An empty tensor's one block reads nothing and writes a row of zeros: its total is 0.
      const bool as_is = x.is_contiguous() || x.numel() == 0;
      Tensor xc = as_is ? x : Tensor::empty(x.shape(), x.dtype(), device());
      if (!as_is) copy_on_device(x, xc);
      launched(launch_sum_squares_partials(xc.data_ptr(), dt(xc.dtype()), xc.numel(),
                                           rows + (i - g0) * kSumSquaresBlocks, stream_),
               "sum_squares");
    }
    launch_sum_squares_totals(rows, static_cast<int>(g1 - g0), totals + g0, stream_);
    check_launch("sum_squares");
  }
  std::vector<double> r(xs.size(), 0.0);
  check_cuda(
      cudaMemcpyAsync(r.data(), totals, r.size() * sizeof(double), cudaMemcpyDeviceToHost, stream_),
      "cudaMemcpyAsync");
  synchronize();
  return r;
}

// ---- normalisation ----

void CudaBackend::layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                    float eps, Tensor& y, Tensor& mean, Tensor& rstd) {
  OpScope prof(stream_, "layernorm_forward", 0, bytes_of({&x, &weight, &bias, &y}));
  launched(launch_layernorm_forward(compute_dt("layernorm", x, weight, bias, y), x.data_ptr(),
                                    weight.data_ptr(), bias.data_ptr(), eps, y.data_ptr(),
                                    mean.data<float>(), rstd.data<float>(), x.size(0), x.size(1),
                                    stream_),
           "layernorm_forward");
}

void CudaBackend::layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                     const Tensor& mean, const Tensor& rstd, Tensor& dx,
                                     Tensor& dweight, Tensor& dbias, bool accumulate) {
  OpScope prof(stream_, "layernorm_backward", 0,
               bytes_of({&dy, &x, &weight, &dx, &dweight, &dbias}));
  const int64_t n = x.size(0), c = x.size(1);
  const int64_t chunks = (n + kNormRowChunk - 1) / kNormRowChunk;
  Tensor s = scratch(2 * chunks * c * 4);
  launched(launch_norm_backward(
               compute_dt("layernorm_backward", x, dy, weight, dx, dweight, dbias), dy.data_ptr(),
               nullptr, x.data_ptr(), weight.data_ptr(), mean.data<float>(), rstd.data<float>(),
               dx.data_ptr(), dweight.data_ptr(), dbias.data_ptr(),
               static_cast<float*>(s.data_ptr()), n, c, fused_norm_grads(), accumulate, stream_),
           "layernorm_backward");
}

void CudaBackend::rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, Tensor& y,
                                  Tensor& rstd) {
  OpScope prof(stream_, "rmsnorm_forward", 0, bytes_of({&x, &weight, &y}));
  launched(
      launch_rmsnorm_forward(compute_dt("rmsnorm", x, weight, y), x.data_ptr(), weight.data_ptr(),
                             eps, y.data_ptr(), rstd.data<float>(), x.size(0), x.size(1), stream_),
      "rmsnorm_forward");
}

void CudaBackend::rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                   const Tensor& rstd, Tensor& dx, Tensor& dweight,
                                   bool accumulate) {
  OpScope prof(stream_, "rmsnorm_backward", 0, bytes_of({&dy, &x, &weight, &dx, &dweight}));
  const int64_t n = x.size(0), c = x.size(1);
  const int64_t chunks = (n + kNormRowChunk - 1) / kNormRowChunk;
  Tensor s = scratch(chunks * c * 4);
  launched(launch_norm_backward(compute_dt("rmsnorm_backward", x, dy, weight, dx, dweight),
                                dy.data_ptr(), nullptr, x.data_ptr(), weight.data_ptr(), nullptr,
                                rstd.data<float>(), dx.data_ptr(), dweight.data_ptr(), nullptr,
                                static_cast<float*>(s.data_ptr()), n, c, fused_norm_grads(),
                                accumulate, stream_),
           "rmsnorm_backward");
}

// Note [CUDA fused residual norm] (fused_norm.cu).
void CudaBackend::add_layernorm_forward(const Tensor& x, const Tensor& r, const Tensor& weight,
                                        const Tensor& bias, float eps, Tensor& s, Tensor& y,
                                        Tensor& mean, Tensor& rstd) {
  OpScope prof(stream_, "add_layernorm_forward", 0, bytes_of({&x, &r, &weight, &bias, &s, &y}));
  launched(launch_add_layernorm_forward(
               compute_dt("add_layernorm", x, r, weight, bias, s, y), x.data_ptr(), r.data_ptr(),
               weight.data_ptr(), bias.data_ptr(), eps, s.data_ptr(), y.data_ptr(),
               mean.data<float>(), rstd.data<float>(), x.size(0), x.size(1), stream_),
           "add_layernorm_forward");
}

void CudaBackend::add_layernorm_backward(const Tensor& dy, const Tensor& ds, const Tensor& s,
                                         const Tensor& weight, const Tensor& mean,
                                         const Tensor& rstd, Tensor& dsum, Tensor& dweight,
                                         Tensor& dbias, bool accumulate) {
  OpScope prof(stream_, "add_layernorm_backward", 0,
               bytes_of({&dy, &ds, &s, &weight, &dsum, &dweight, &dbias}));
  const int64_t n = s.size(0), c = s.size(1);
  const int t = compute_dt("add_layernorm_backward", s, dy, weight, dsum, dweight, dbias);
  if (ds.defined()) compute_dt("add_layernorm_backward", s, ds);
  const int64_t chunks = (n + kNormRowChunk - 1) / kNormRowChunk;
  Tensor sc = scratch(2 * chunks * c * 4);
  launched(launch_norm_backward(t, dy.data_ptr(), ds.defined() ? ds.data_ptr() : nullptr,
                                s.data_ptr(), weight.data_ptr(), mean.data<float>(),
                                rstd.data<float>(), dsum.data_ptr(), dweight.data_ptr(),
                                dbias.data_ptr(), static_cast<float*>(sc.data_ptr()), n, c,
                                fused_norm_grads(), accumulate, stream_),
           "add_layernorm_backward");
}

void CudaBackend::add_rmsnorm_forward(const Tensor& x, const Tensor& r, const Tensor& weight,
                                      float eps, Tensor& s, Tensor& y, Tensor& rstd) {
  OpScope prof(stream_, "add_rmsnorm_forward", 0, bytes_of({&x, &r, &weight, &s, &y}));
  launched(
      launch_add_rmsnorm_forward(compute_dt("add_rmsnorm", x, r, weight, s, y), x.data_ptr(),
                                 r.data_ptr(), weight.data_ptr(), eps, s.data_ptr(), y.data_ptr(),
                                 rstd.data<float>(), x.size(0), x.size(1), stream_),
      "add_rmsnorm_forward");
}

void CudaBackend::add_rmsnorm_backward(const Tensor& dy, const Tensor& ds, const Tensor& s,
                                       const Tensor& weight, const Tensor& rstd, Tensor& dsum,
                                       Tensor& dweight, bool accumulate) {
  OpScope prof(stream_, "add_rmsnorm_backward", 0,
               bytes_of({&dy, &ds, &s, &weight, &dsum, &dweight}));
  const int64_t n = s.size(0), c = s.size(1);
  const int t = compute_dt("add_rmsnorm_backward", s, dy, weight, dsum, dweight);
  if (ds.defined()) compute_dt("add_rmsnorm_backward", s, ds);
  const int64_t chunks = (n + kNormRowChunk - 1) / kNormRowChunk;
  Tensor sc = scratch(chunks * c * 4);
  launched(
      launch_norm_backward(t, dy.data_ptr(), ds.defined() ? ds.data_ptr() : nullptr, s.data_ptr(),
                           weight.data_ptr(), nullptr, rstd.data<float>(), dsum.data_ptr(),
                           dweight.data_ptr(), nullptr, static_cast<float*>(sc.data_ptr()), n, c,
                           fused_norm_grads(), accumulate, stream_),
      "add_rmsnorm_backward");
}

void CudaBackend::softmax_forward(const Tensor& x, Tensor& y) {
  OpScope prof(stream_, "softmax_forward", 0, bytes_of({&x, &y}));
  launched(launch_softmax_forward(compute_dt("softmax", x, y), x.data_ptr(), y.data_ptr(),
                                  x.size(0), x.size(1), stream_),
           "softmax_forward");
}

void CudaBackend::softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  OpScope prof(stream_, "softmax_backward", 0, bytes_of({&y, &dy, &dx}));
  launched(launch_softmax_backward(compute_dt("softmax_backward", y, dy, dx), y.data_ptr(),
                                   dy.data_ptr(), dx.data_ptr(), y.size(0), y.size(1), stream_),
           "softmax_backward");
}

// ---- attention ----

namespace {
// The kernel's view of the operands (Note [Strided attention operands] in tensor/backend.h).
AttentionStrides strides_of(const Tensor& t) {
  return {t.stride(0), t.stride(1), t.stride(2)};
}
AttentionShape attention_shape(const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& out) {
  AttentionShape s;
  s.b = q.size(0), s.h = q.size(1), s.tq = q.size(2), s.tk = k.size(2), s.d = q.size(3);
  s.q = strides_of(q), s.k = strides_of(k), s.v = strides_of(v), s.out = strides_of(out);
  return s;
}
}  // namespace

namespace {
// FLOPs of the attention matmuls (Note [CUDA op profiler]): 2 per multiply-add over the (query,
// key) pairs a row sees (bottom-right causal: Tq * Tk - Tq * (Tq - 1) / 2), two matmuls of depth D
// forward, five backward (the recomputed scores, dV, dP, dK, dQ).
double attention_flops(const Tensor& q, const Tensor& k, bool causal, bool backward) {
  const double tq = static_cast<double>(q.size(2)), tk = static_cast<double>(k.size(2));
  double pairs = tq * tk;
  if (causal) pairs = std::max(0.0, tq <= tk ? tq * tk - tq * (tq - 1) / 2 : tk * (tk + 1) / 2);
  const double per_pair_matmul = 2.0 * static_cast<double>(q.size(3));
  return static_cast<double>(q.size(0) * q.size(1)) * pairs * per_pair_matmul *
         (backward ? 5.0 : 2.0);
}

// Names the profiled attention op after the path that ran, when the op's scope ends.
struct NamePath {
  OpScope& prof;
  ~NamePath() { prof.detail(attention_path_name(last_attention_path())); }
};
}  // namespace

void CudaBackend::attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                    float scale, Tensor& out, Tensor& lse) {
  OpScope prof(stream_, "attention_forward", attention_flops(q, k, causal, false),
               bytes_of({&q, &k, &v, &out, &lse}));
  const NamePath name_path{prof};
  // cuDNN flash attention first (bf16/f16), else the own kernel (Note [cuDNN SDPA]).
  if (try_cudnn_attention_forward(stream_, q, k, v, causal, scale, out, lse)) return;
  const int64_t d = q.size(3);
  if (d > kAttentionMaxHeadDim)
    user_error(
        "attention head_dim {} is larger than the CUDA kernel's limit {}; use a smaller "
        "head size (n_embd / n_head)",
        d, kAttentionMaxHeadDim);
  const int dt = compute_dt("attention", q, k, v, out);
  const AttentionShape shape = attention_shape(q, k, v, out);
  // Note [CUDA decode attention]: a decode step's keys split over the whole device.
  if (attention_mode() != AttentionMode::Simt && attention_decode_fits(shape.tq, shape.tk, d) &&
      split_decode_attention()) {
    set_last_attention_path(AttentionPath::OwnDecode);
    const int64_t rows = shape.b * shape.h * shape.tq;
    const DecodeSplits sp = attention_decode_splits(rows, shape.tk, multiprocessors());
    Tensor part = scratch(rows * sp.splits * (d + 2) * 4);
    launched(launch_attention_decode_forward(dt, q.data_ptr(), k.data_ptr(), v.data_ptr(), causal,
                                             scale, out.data_ptr(), lse.data<float>(), shape, sp,
                                             static_cast<float*>(part.data_ptr()), stream_),
             "attention_forward");
    return;
  }
  // Note [CUDA tensor-core attention]: the own kernel on the tensor cores where it is built for.
  const bool tc =
      attention_mode() != AttentionMode::Simt && attention_tc_fits(dt, d, q.size(0), q.size(1));
  if (tc) set_last_attention_path(AttentionPath::OwnTensorCore);
  const auto launch = tc ? &launch_attention_tc_forward : &launch_attention_forward;
  launched(launch(dt, q.data_ptr(), k.data_ptr(), v.data_ptr(), causal, scale, out.data_ptr(),
                  lse.data<float>(), shape, stream_),
           "attention_forward");
}

void CudaBackend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& out, const Tensor& lse, const Tensor& dout,
                                     bool causal, float scale, Tensor& dq, Tensor& dk, Tensor& dv) {
  OpScope prof(stream_, "attention_backward", attention_flops(q, k, causal, true),
               bytes_of({&q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv}));
  const NamePath name_path{prof};
  if (try_cudnn_attention_backward(stream_, q, k, v, out, lse, dout, causal, scale, dq, dk, dv))
    return;
  const int64_t bh = q.size(0) * q.size(1), tq = q.size(2), d = q.size(3);
  if (d > kAttentionMaxHeadDim)
    user_error("attention head_dim {} is larger than the CUDA kernel's limit {}", d,
               kAttentionMaxHeadDim);
  AttentionShape shape = attention_shape(q, k, v, out);
  shape.dout = strides_of(dout), shape.dq = strides_of(dq), shape.dk = strides_of(dk),
  shape.dv = strides_of(dv);
  Tensor s = scratch(bh * tq * 4);
  const int dt = compute_dt("attention_backward", q, k, v, out, dout, dq, dk, dv);
  const bool tc =
      attention_mode() != AttentionMode::Simt && attention_tc_fits(dt, d, q.size(0), q.size(1));
  if (tc) set_last_attention_path(AttentionPath::OwnTensorCore);
  const auto launch = tc ? &launch_attention_tc_backward : &launch_attention_backward;
  launched(launch(dt, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data<float>(),
                  dout.data_ptr(), causal, scale, dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                  static_cast<float*>(s.data_ptr()), shape, stream_),
           "attention_backward");
}

// ---- embedding and loss ----

void CudaBackend::embedding_forward(const Tensor& weight, const Tensor& ids, Tensor& out) {
  OpScope prof(stream_, "embedding_forward", 0, bytes_of({&ids, &out, &out}));
  const int64_t n = ids.numel();
  if (n == 0) return;
  int* bad = checked_launch(fmt::format(
      "embedding: a token id is outside [0, {}); the data does not fit this model's vocab_size "
      "(check the tokenizer and the dataset)",
      weight.size(0)));
  launch_embedding_forward(
      weight.data_ptr(), ids.data_ptr(), ids.dtype() == DType::I64, out.data_ptr(), n,
      weight.size(0), weight.size(1) * static_cast<int64_t>(weight.element_size()), bad, stream_);
  check_launch("embedding_forward");
}

// Note [CUDA embedding backward] (reduce_norm.cu): sorted on the device, no host wait.
void CudaBackend::embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight) {
  OpScope prof(stream_, "embedding_backward", 0, bytes_of({&ids, &dout, &dout}));
  const int64_t n = ids.numel(), vocab = dweight.size(0);
  if (n == 0) return;
  STRATA_CHECK(n <= (int64_t{1} << 32) && vocab < (int64_t{1} << 32) - 1,
               "CUDA embedding_backward: {} rows of a vocabulary of {}; the sort keys hold at "
               "most 2^32 of each",
               n, vocab);
  Tensor keys = scratch(embedding_sort_keys(n) * static_cast<int64_t>(sizeof(uint64_t)));
  int* bad = checked_launch(
      fmt::format("embedding_backward: a token id is outside [0, {}); the data does not fit this "
                  "model's vocab_size",
                  vocab));
  launched(launch_embedding_backward(ids.data_ptr(), ids.dtype() == DType::I64, n, vocab,
                                     static_cast<uint64_t*>(keys.data_ptr()), dout.data_ptr(),
                                     compute_dt("embedding_backward", dout), dweight.data_ptr(),
                                     compute_dt("embedding_backward", dweight), dweight.size(1),
                                     bad, stream_),
           "embedding_backward");
}

void CudaBackend::cross_entropy_forward(const Tensor& logits, const Tensor& targets,
                                        int64_t ignore_index, int64_t classes, Tensor& losses,
                                        Tensor& lse) {
  OpScope prof(stream_, "cross_entropy_forward", 0, bytes_of({&logits, &targets, &losses, &lse}));
  const int64_t n = logits.size(0), v = logits.size(1);
  if (n == 0) return;
  int* bad = checked_launch(fmt::format(
      "cross_entropy: a target is outside [0, {}) and is not the ignore_index {}; check the "
      "dataset against vocab_size",
      classes, ignore_index));
  launched(launch_cross_entropy_forward(compute_dt("cross_entropy", logits), logits.data_ptr(),
                                        targets.data_ptr(), targets.dtype() == DType::I64,
                                        ignore_index, losses.data<float>(), lse.data<float>(), n, v,
                                        classes, bad, stream_),
           "cross_entropy_forward");
}

void CudaBackend::cross_entropy_norm(const Tensor& targets, int64_t ignore_index, Tensor& out) {
  OpScope prof(stream_, "cross_entropy_norm", 0, bytes_of({&targets, &out}));
  launch_cross_entropy_norm(targets.data_ptr(), targets.dtype() == DType::I64, targets.numel(),
                            ignore_index, out.data<float>(), stream_);
  check_launch("cross_entropy_norm");
}

void CudaBackend::cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                                         const Tensor& lse, const Tensor& dloss,
                                         int64_t ignore_index, int64_t classes, Tensor& dlogits) {
  OpScope prof(stream_, "cross_entropy_backward", 0, bytes_of({&logits, &targets, &lse, &dlogits}));
  // Targets were validated by the forward; an out-of-range one here only misses its one-hot.
  launched(launch_cross_entropy_backward(compute_dt("cross_entropy_backward", logits, dlogits),
                                         logits.data_ptr(), targets.data_ptr(),
                                         targets.dtype() == DType::I64, lse.data<float>(),
                                         dloss.data<float>(), ignore_index, dlogits.data_ptr(),
                                         logits.size(0), logits.size(1), classes, stream_),
           "cross_entropy_backward");
}

void CudaBackend::cross_entropy_fused(Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                      int64_t classes, float grad, const Tensor& norm,
                                      Tensor& losses, Tensor& lse) {
  // Reads the logits once and writes them once (Note [CUDA fused cross-entropy]).
  OpScope prof(stream_, "cross_entropy_fused", 0,
               bytes_of({&logits, &targets, &losses, &lse, &logits}));
  const int64_t n = logits.size(0), v = logits.size(1);
  if (n == 0) return;
  int* bad = checked_launch(fmt::format(
      "cross_entropy: a target is outside [0, {}) and is not the ignore_index {}; check the "
      "dataset against vocab_size",
      classes, ignore_index));
  launched(launch_cross_entropy_fused(compute_dt("cross_entropy", logits), logits.data_ptr(),
                                      targets.data_ptr(), targets.dtype() == DType::I64,
                                      ignore_index, losses.data<float>(), lse.data<float>(), n, v,
                                      classes, bad, grad, norm.data<float>(), stream_),
           "cross_entropy_fused");
}

void CudaBackend::scale_unless_equal(Tensor& x, const Tensor& g, float expected) {
  if (!x.is_contiguous()) return Backend::scale_unless_equal(x, g, expected);
  OpScope prof(stream_, "scale_unless_equal", 0, bytes_of({&g}));
  launched(launch_scale_unless_equal(compute_dt("scale_unless_equal", x), x.data_ptr(), x.numel(),
                                     g.data<float>(), expected, stream_),
           "scale_unless_equal");
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
