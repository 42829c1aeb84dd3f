#include "offload/copy_stream.h"

#include <cstring>
#include <utility>

#include "core/error.h"

#ifdef STRATA_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace strata::offload {

#ifdef STRATA_HAVE_CUDA
namespace {
void check(cudaError_t rc, const char* what) {
  STRATA_CHECK(rc == cudaSuccess, "CopyStream: {} failed: {}", what, cudaGetErrorString(rc));
}
cudaStream_t as_stream(void* s) {
  return static_cast<cudaStream_t>(s);
}
cudaEvent_t as_event(void* e) {
  return static_cast<cudaEvent_t>(e);
}
}  // namespace
#endif

CopyStream::CopyStream(bool cuda) {
  if (!cuda) return;
#ifdef STRATA_HAVE_CUDA
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  stream_ = s;
  event_ = e;
#else
  user_error("a copy stream to a CUDA device needs a build with the CUDA toolkit (docs/gpu.md)");
#endif
}

CopyStream::~CopyStream() {
#ifdef STRATA_HAVE_CUDA
  if (stream_ == nullptr) return;
  // A destructor must not throw: a failure here is reported by the next CUDA call anyway.
  cudaStreamSynchronize(as_stream(stream_));
  cudaEventDestroy(as_event(event_));
  cudaStreamDestroy(as_stream(stream_));
#endif
}

void CopyStream::wait_for(void* stream) {
#ifdef STRATA_HAVE_CUDA
  if (stream_ == nullptr) return;
  check(cudaEventRecord(as_event(event_), as_stream(stream)), "cudaEventRecord");
  check(cudaStreamWaitEvent(as_stream(stream_), as_event(event_), 0), "cudaStreamWaitEvent");
#else
  (void)stream;
#endif
}

void CopyStream::order_before(void* stream) {
#ifdef STRATA_HAVE_CUDA
  if (stream_ == nullptr) return;
  check(cudaEventRecord(as_event(event_), as_stream(stream_)), "cudaEventRecord");
  check(cudaStreamWaitEvent(as_stream(stream), as_event(event_), 0), "cudaStreamWaitEvent");
#else
  (void)stream;
#endif
}

void CopyStream::to_host(void* host, const void* device, size_t bytes) {
  if (bytes == 0) return;
#ifdef STRATA_HAVE_CUDA
  if (stream_ != nullptr) {
    check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, as_stream(stream_)),
          "cudaMemcpyAsync (device to host)");
    return;
  }
#endif
  std::memcpy(host, device, bytes);
}

void CopyStream::to_device(void* device, const void* host, size_t bytes) {
  if (bytes == 0) return;
#ifdef STRATA_HAVE_CUDA
  if (stream_ != nullptr) {
    check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, as_stream(stream_)),
          "cudaMemcpyAsync (host to device)");
    return;
  }
#endif
  std::memcpy(device, host, bytes);
}

void CopyStream::synchronize() {
#ifdef STRATA_HAVE_CUDA
  if (stream_ != nullptr) check(cudaStreamSynchronize(as_stream(stream_)), "cudaStreamSynchronize");
#endif
}

CopyMark::~CopyMark() {
#ifdef STRATA_HAVE_CUDA
  if (event_ != nullptr) {
    // A destructor must not throw: a failure here is reported by the next CUDA call anyway.
    if (pending_) cudaEventSynchronize(as_event(event_));
    cudaEventDestroy(as_event(event_));
  }
#endif
}

CopyMark::CopyMark(CopyMark&& other) noexcept
    : event_(std::exchange(other.event_, nullptr)),
      pending_(std::exchange(other.pending_, false)) {}

CopyMark& CopyMark::operator=(CopyMark&& other) noexcept {
  if (this != &other) {
    CopyMark gone(std::move(*this));
    event_ = std::exchange(other.event_, nullptr);
    pending_ = std::exchange(other.pending_, false);
  }
  return *this;
}

void CopyMark::record(CopyStream& s) {
#ifdef STRATA_HAVE_CUDA
  if (!s.cuda()) return;
  if (event_ == nullptr) {
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    event_ = e;
  }
  check(cudaEventRecord(as_event(event_), as_stream(s.stream())), "cudaEventRecord");
  pending_ = true;
#else
  (void)s;
#endif
}

void CopyMark::wait() {
  if (!pending_) return;
#ifdef STRATA_HAVE_CUDA
  check(cudaEventSynchronize(as_event(event_)), "cudaEventSynchronize");
#endif
  pending_ = false;
}

}  // namespace strata::offload
