#pragma once
// Storage: a refcounted block of bytes on one device, returned to its allocator when the last
// tensor viewing it goes away. Non-owning storages wrap memory someone else frees (mmap'ed data,
// a caller's buffer).
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
  // Wraps external memory; `deleter` (may be empty) runs on destruction.
  Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter = {});
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  offload::Category category() const { return block_.category; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  offload::Allocator* allocator_ = nullptr;
  offload::Block block_;
  std::function<void(void*)> deleter_;
};

// The allocator tensors on `device` draw from (host allocator for CPU; the CUDA backend
// registers the GPU one).
offload::Allocator& allocator_for(Device device);
void register_device_allocator(DeviceType type, offload::Allocator* allocator);

}  // namespace strata::tensor
