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

Storage::Storage(Released, size_t nbytes, Device device, offload::Allocator* allocator,
                 offload::Category category)
    : nbytes_(nbytes), device_(device), allocator_(allocator), released_(true) {
  block_.category = category;
}

Storage::Storage(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter)
    : data_(data), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)) {}

Storage::~Storage() {
  if (released_) return;
  if (allocator_ != nullptr) {
    allocator_->deallocate(block_);
  } else if (deleter_) {
    deleter_(data_);
  }
}

void Storage::release() {
  STRATA_CHECK(allocator_ != nullptr, "only allocator-owned storage can be released");
  if (released_) return;
  allocator_->deallocate(block_);
  block_.ptr = nullptr;
  data_ = nullptr;
  released_ = true;
}

void Storage::materialize() {
  materialize(block_.category);
}

void Storage::materialize(offload::Category category) {
  STRATA_CHECK(allocator_ != nullptr, "only allocator-owned storage can be materialized");
  if (!released_) return;
  block_ = allocator_->allocate(nbytes_, category);
  data_ = block_.ptr;
  released_ = false;
}

void Storage::fail_released() const {
  STRATA_CHECK(false,
               "use of a released storage ({} bytes, {}): its memory was freed (Note [Released "
               "storage]); the owner must materialize it first (a ZeRO-3 unit used outside its "
               "hooked modules?)",
               nbytes_, offload::category_name(block_.category));
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
