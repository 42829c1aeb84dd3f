#pragma once
// Storage: a refcounted block of bytes on one device, returned to its allocator when the last
// tensor viewing it goes away. Non-owning storages wrap memory someone else frees (mmap'ed data,
// a caller's buffer).
//
// Note [Released storage]
// ZeRO-3 (and ZeRO-2's transient gradients) free a flat buffer's memory while tensors still view
// it: autograd has saved views of the parameters, and every parameter Variable's data is a view.
// As FSDP does, the Storage object stays (so every view stays valid as an object) and only its
// bytes go: `release()` returns them to the allocator, `materialize()` allocates fresh bytes —
// possibly at another address, contents unspecified — that the owner then fills. A Tensor
// computes its data pointer from the storage on every access (Tensor::data_ptr), so views see
// the new address. Touching the data of a released storage fails with a check naming it instead
// of reading freed memory. Only allocator-owned storages can be released.
#include <cstddef>
#include <functional>
#include <memory>

#include "core/device.h"
#include "offload/allocator.h"

namespace strata::tensor {

class Storage {
 public:
  // Allocates `nbytes` from `allocator`, charged to `category`.
  Storage(size_t nbytes, Device device, offload::Allocator* allocator, offload::Category category);
  // Released from the start (Note [Released storage]): no bytes until materialize(), which
  // charges them to `category`.
  struct Released {};
  Storage(Released, size_t nbytes, Device device, offload::Allocator* allocator,
          offload::Category category);
  // Wraps external memory; `deleter` (may be empty) runs on destruction.
  Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter = {});
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const {
    if (released_) [[unlikely]]
      fail_released();
    return data_;
  }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  offload::Category category() const { return block_.category; }

  // Note [Released storage]. release() of a released storage is a no-op, as is materialize()
  // of a live one.
  void release();
  // Fresh bytes charged to `category` (the one it was created with when not given).
  void materialize();
  void materialize(offload::Category category);
  bool is_released() const { return released_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  offload::Allocator* allocator_ = nullptr;
  offload::Block block_;
  std::function<void(void*)> deleter_;
  bool released_ = false;

  [[noreturn]] void fail_released() const;
};

// The allocator tensors on `device` draw from (host allocator for CPU; the CUDA backend
// registers the GPU one).
offload::Allocator& allocator_for(Device device);
void register_device_allocator(DeviceType type, offload::Allocator* allocator);

}  // namespace strata::tensor
