#pragma once
// Host tensors placed in a tier on purpose: the offloaded optimizer's buffers, the gradient
// partitions streamed to the host, CPU-checkpointed activations. Each is charged to the category
// the caller names, so the memory report and the host-memory budget see it where it belongs.
#include "core/dtype.h"
#include "offload/allocator.h"
#include "tensor/shape.h"
#include "tensor/tensor.h"

namespace strata::tensor {

// A fresh contiguous host tensor, uninitialised, charged to `category`: from the pinned pool
// (Tier::Pinned; device copies read and write it without staging) when `pinned`, else from the
// host allocator (Tier::Host).
Tensor empty_host(const Shape& shape, DType dtype, offload::Category category, bool pinned);

}  // namespace strata::tensor
