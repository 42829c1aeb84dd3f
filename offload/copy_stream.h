#pragma once
// CopyStream: host <-> device byte copies on a stream of their own, ordered against the compute
// stream by events (docs/design.md decision 8), for ZeRO-Offload's gradient and parameter
// traffic.
//
// Note [Copy stream]
// A CopyStream owns one non-blocking CUDA stream and one event. Copies are enqueued, never
// waited for, unless the caller asks:
//   - wait_for(s): copies enqueued from now start after everything enqueued so far on stream s
//     (a gradient is read only after the backward that wrote it);
//   - order_before(s): work enqueued on s from now starts after every copy enqueued so far (the
//     next forward reads parameters only after they have arrived, and the next backward writes
//     gradients only after they have left), without blocking the host;
//   - synchronize(): the host waits for every copy (before the CPU optimizer reads gradients).
// Host buffers must be pinned for the copies to be asynchronous (offload/pinned_allocator.h);
// from pageable memory the runtime copies synchronously, which is correct but does not overlap.
//   - a CopyMark recorded after some copies lets the host wait for those alone (a pinned buffer
//     is written again only after the copies that read it are done).
// A CopyStream made for the host (cuda = false: the "device" is the CPU, as in CPU-only runs of
// the same code) copies with memcpy at once and its ordering calls do nothing.
// Not thread-safe: one thread enqueues.
#include <cstddef>

namespace strata::offload {

class CopyStream {
 public:
  // cuda: the device side is the current CUDA device (a strata::user_error when this build has
  // no CUDA runtime).
  explicit CopyStream(bool cuda);
  ~CopyStream();
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;

  bool cuda() const { return stream_ != nullptr; }
  // The cudaStream_t (null for the host).
  void* stream() const { return stream_; }

  void wait_for(void* stream);
  void order_before(void* stream);
  void to_host(void* host, const void* device, size_t bytes);
  void to_device(void* device, const void* host, size_t bytes);
  void synchronize();

 private:
  void* stream_ = nullptr;
  void* event_ = nullptr;
};

// A point in a CopyStream's order (Note [Copy stream]).
class CopyMark {
 public:
  CopyMark() = default;
  ~CopyMark();
  CopyMark(CopyMark&& other) noexcept;
  CopyMark& operator=(CopyMark&& other) noexcept;
  CopyMark(const CopyMark&) = delete;
  CopyMark& operator=(const CopyMark&) = delete;

  // After the copies enqueued on `s` so far (on a host stream they are done already).
  void record(CopyStream& s);
  // The host waits until they are done; returns at once when nothing is pending.
  void wait();
  bool pending() const { return pending_; }

 private:
  void* event_ = nullptr;
  bool pending_ = false;
};

}  // namespace strata::offload
