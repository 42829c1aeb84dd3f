#include "tensor/host_tensor.h"

#include <memory>

#include "core/error.h"
#include "offload/memory_stats.h"
#include "offload/pinned_allocator.h"
#include "tensor/storage.h"

namespace strata::tensor {

Tensor empty_host(const Shape& shape, DType dtype, offload::Category category, bool pinned) {
  if (!pinned) {
    offload::CategoryScope scope(category);
    return Tensor::empty(shape, dtype);
  }
  for (int i = 0; i < shape.ndim(); ++i)
    STRATA_CHECK(shape[i] >= 0, "negative dimension in shape {}", shape.str());
  const size_t nbytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  auto storage = std::make_shared<Storage>(nbytes, Device::cpu(),
                                           &offload::PinnedAllocator::instance(), category);
  return Tensor(std::move(storage), shape, shape.contiguous_strides(), 0, dtype);
}

}  // namespace strata::tensor
