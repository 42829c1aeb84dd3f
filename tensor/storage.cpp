#include "tensor/storage.h"

#include "core/error.h"
#include "tensor/cuda.h"

namespace strata::tensor {

Storage::Storage(size_t nbytes, Device device, offload::Allocator* allocator,
                 offload::Category category)
    : nbytes_(nbytes), device_(device), allocator_(allocator) {
  block_ = allocator_->allocate(nbytes, category);
  data_ = block_.ptr;
}

Storage::Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter)
    : data_(data), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)) {}

Storage::~Storage() {
  if (allocator_ != nullptr) {
    allocator_->deallocate(block_);
  } else if (deleter_) {
    deleter_(data_);
  }
}

namespace {
offload::Allocator* g_cuda_allocator = nullptr;
}

void register_device_allocator(DeviceType type, offload::Allocator* allocator) {
  STRATA_CHECK(type == DeviceType::CUDA, "only the CUDA allocator is registered at run time");
  g_cuda_allocator = allocator;
}

offload::Allocator& allocator_for(Device device) {
  if (device.is_cpu()) return offload::HostAllocator::instance();
  if (g_cuda_allocator == nullptr) init_cuda(device.index);  // Note [CUDA backend registration]
  STRATA_CHECK(g_cuda_allocator != nullptr, "init_cuda did not register an allocator");
  return *g_cuda_allocator;
}

}  // namespace strata::tensor
