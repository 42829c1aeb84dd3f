#pragma once
// Tensor: a view (shape, strides, offset, dtype) into a shared Storage.
//
// Note [Small tensor]
// A Tensor is a value: copying one copies a shared_ptr and two inline shapes, never data. Views
// (reshape of contiguous data, transpose, permute, slice, narrow, expand) share storage;
// `contiguous()` copies only when needed. Kernels may require contiguous inputs: the op layer
// (tensor/ops.h) makes inputs contiguous before calling a backend that says so. Autograd state
// lives outside, in autograd::Variable, so this type stays small (see the static_assert).
#include <memory>
#include <span>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "tensor/shape.h"
#include "tensor/storage.h"

namespace strata::tensor {

class Tensor {
 public:
  Tensor() = default;  // undefined tensor
  Tensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset, DType dtype);

  // A fresh contiguous tensor, uninitialised, charged to the current category
  // (see offload::CategoryScope).
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  // The same, with its storage released (Note [Released storage]): no bytes until the storage is
  // materialized, then charged to the current category as of this call.
  static Tensor empty_released(const Shape& shape, DType dtype = DType::F32,
                               Device device = Device::cpu());
  // Wraps caller-owned memory without copying; the caller keeps it alive.
  static Tensor from_blob(void* data, const Shape& shape, DType dtype,
                          Device device = Device::cpu());

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t size(int dim) const { return shape_.at(dim); }
  int64_t stride(int dim) const { return strides_.at(dim); }
  int ndim() const { return shape_.ndim(); }
  int64_t numel() const { return shape_.numel(); }
  int64_t offset() const { return offset_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  size_t element_size() const { return dtype_size(dtype_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  bool is_contiguous() const;
  // True when both tensors view the same bytes with the same layout.
  bool is_same(const Tensor& o) const;

  // Pointer to the first element (storage base + offset).
  void* data_ptr() const;
  template <typename T>
  T* data() const {
    STRATA_CHECK(DTypeOf<T>::value == dtype_, "tensor is {}, accessed as {}", dtype_name(dtype_),
                 dtype_name(DTypeOf<T>::value));
    return static_cast<T*>(data_ptr());
  }
  // Value of a one-element tensor, converted to T (any dtype, any device).
  template <typename T>
  T item() const;

  // ---- views (share storage) ----
  Tensor view(const Shape& shape) const;     // requires a compatible layout; one dim may be -1
  Tensor reshape(const Shape& shape) const;  // view when possible, else a contiguous copy
  Tensor transpose(int d0, int d1) const;
  Tensor permute(const std::vector<int>& dims) const;
  Tensor narrow(int dim, int64_t start, int64_t length) const;
  Tensor slice(int dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int dim, int64_t index) const;  // drops `dim`
  Tensor unsqueeze(int dim) const;
  Tensor squeeze(int dim) const;
  Tensor expand(const Shape& shape) const;  // broadcast view with zero strides
  Tensor flatten() const { return reshape({numel()}); }

  // ---- copies ----
  Tensor contiguous() const;  // self if already contiguous
  Tensor clone() const;       // always a fresh contiguous copy
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  Tensor& copy_(const Tensor& src);  // same shape; casts dtype; any layouts and devices
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0.0); }

  std::string str() const;  // "f32[2, 3] cpu" — for error messages

 private:
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  Shape strides_;
  int64_t offset_ = 0;  // in elements
  DType dtype_ = DType::F32;
  Device device_;
};

static_assert(sizeof(Tensor) <= 144, "Tensor must stay small (Note [Small tensor])");

// ---- creation ----
Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
Tensor ones(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
Tensor full(const Shape& shape, double value, DType dtype = DType::F32,
            Device device = Device::cpu());
Tensor arange(int64_t n, DType dtype = DType::F32, Device device = Device::cpu());
Tensor randn(const Shape& shape, RngKey key, float mean = 0.f, float stddev = 1.f,
             Device device = Device::cpu());
Tensor uniform(const Shape& shape, RngKey key, float lo = 0.f, float hi = 1.f,
               Device device = Device::cpu());

// Builds a CPU tensor from host values (converted to `dtype`), and reads one back.
Tensor from_vector(const std::vector<float>& values, const Shape& shape, DType dtype = DType::F32);
Tensor from_ints(const std::vector<int64_t>& values, const Shape& shape, DType dtype = DType::I64);
std::vector<float> to_float_vector(const Tensor& t);  // any float dtype, any device, any layout
std::vector<int64_t> to_int_vector(const Tensor& t);

}  // namespace strata::tensor
