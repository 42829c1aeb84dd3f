#include "tensor/tensor.h"

#include <fmt/format.h>

#include <algorithm>

#include "tensor/backend.h"

namespace strata::tensor {

Tensor::Tensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset,
               DType dtype)
    : storage_(std::move(storage)),
      shape_(shape),
      strides_(strides),
      offset_(offset),
      dtype_(dtype),
      device_(storage_ ? storage_->device() : Device::cpu()) {
  STRATA_CHECK(shape_.ndim() == strides_.ndim(), "shape {} vs strides {}", shape_.str(),
               strides_.str());
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int i = 0; i < shape.ndim(); ++i)
    STRATA_CHECK(shape[i] >= 0, "negative dimension in shape {}", shape.str());
  size_t nbytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  auto storage = std::make_shared<Storage>(nbytes, device, &allocator_for(device),
                                           offload::current_category());
  return Tensor(std::move(storage), shape, shape.contiguous_strides(), 0, dtype);
}

Tensor Tensor::empty_released(const Shape& shape, DType dtype, Device device) {
  for (int i = 0; i < shape.ndim(); ++i)
    STRATA_CHECK(shape[i] >= 0, "negative dimension in shape {}", shape.str());
  size_t nbytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  auto storage = std::make_shared<Storage>(Storage::Released{}, nbytes, device,
                                           &allocator_for(device), offload::current_category());
  return Tensor(std::move(storage), shape, shape.contiguous_strides(), 0, dtype);
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, Device device) {
  size_t nbytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  auto storage = std::make_shared<Storage>(data, nbytes, device);
  return Tensor(std::move(storage), shape, shape.contiguous_strides(), 0, dtype);
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int i = ndim() - 1; i >= 0; --i) {
    if (shape_[i] == 1) continue;
    if (strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

bool Tensor::is_same(const Tensor& o) const {
  return storage_ == o.storage_ && offset_ == o.offset_ && shape_ == o.shape_ &&
         strides_ == o.strides_ && dtype_ == o.dtype_;
}

void* Tensor::data_ptr() const {
  STRATA_CHECK(defined(), "data of an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(element_size());
}

template <typename T>
T Tensor::item() const {
  STRATA_CHECK(numel() == 1, "item() of a tensor with {} elements", numel());
  Tensor host = to(Device::cpu());
  if (is_floating(dtype_)) return static_cast<T>(to_float_vector(host)[0]);
  return static_cast<T>(to_int_vector(host)[0]);
}
template float Tensor::item<float>() const;
template double Tensor::item<double>() const;
template int64_t Tensor::item<int64_t>() const;
template int32_t Tensor::item<int32_t>() const;

namespace {
Shape infer_shape(const Shape& shape, int64_t numel, const Shape& from) {
  Shape out = shape;
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < out.ndim(); ++i) {
    if (out[i] == -1) {
      STRATA_CHECK(infer < 0, "more than one -1 in shape {}", shape.str());
      infer = i;
    } else {
      known *= out[i];
    }
  }
  if (infer >= 0) {
    STRATA_CHECK(known > 0 && numel % known == 0, "cannot reshape {} to {}", from.str(),
                 shape.str());
    out[infer] = numel / known;
  }
  STRATA_CHECK(out.numel() == numel, "cannot reshape {} ({} elements) to {}", from.str(), numel,
               shape.str());
  return out;
}

// Strides for viewing (shape, strides) as new_shape without copying, if possible
// (the chunking rule: each run of merged/split dims must be contiguous within itself).
bool view_strides(const Shape& shape, const Shape& strides, const Shape& new_shape, Shape& out) {
  out.resize(new_shape.ndim());
  // Empty and 0-d tensors: any layout of the same numel is a view.
  if (shape.numel() == 0 || shape.ndim() == 0) {
    out = new_shape.contiguous_strides();
    return true;
  }
  int view_d = new_shape.ndim() - 1;
  int64_t chunk_base_stride = shape.ndim() ? strides[shape.ndim() - 1] : 1;
  int64_t tensor_numel = 1, view_numel = 1;
  for (int d = shape.ndim() - 1; d >= 0; --d) {
    tensor_numel *= shape[d];
    if (d == 0 || (shape[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}
}  // namespace

Tensor Tensor::view(const Shape& shape) const {
  Shape ns = infer_shape(shape, numel(), shape_);
  Shape st;
  STRATA_CHECK(view_strides(shape_, strides_, ns, st),
               "view {} of non-contiguous tensor {} is impossible; use reshape", ns.str(), str());
  return Tensor(storage_, ns, st, offset_, dtype_);
}

Tensor Tensor::reshape(const Shape& shape) const {
  Shape ns = infer_shape(shape, numel(), shape_);
  Shape st;
  if (view_strides(shape_, strides_, ns, st)) return Tensor(storage_, ns, st, offset_, dtype_);
  return contiguous().view(ns);
}

Tensor Tensor::transpose(int d0, int d1) const {
  d0 = shape_.normalize(d0);
  d1 = shape_.normalize(d1);
  Shape s = shape_, st = strides_;
  std::swap(s[d0], s[d1]);
  std::swap(st[d0], st[d1]);
  return Tensor(storage_, s, st, offset_, dtype_);
}

Tensor Tensor::permute(const std::vector<int>& dims) const {
  STRATA_CHECK(static_cast<int>(dims.size()) == ndim(), "permute needs {} dims, got {}", ndim(),
               dims.size());
  Shape s, st;
  std::vector<bool> seen(ndim(), false);
  for (int d : dims) {
    int n = shape_.normalize(d);
    STRATA_CHECK(!seen[n], "dim {} repeated in permute", d);
    seen[n] = true;
    s.push_back(shape_[n]);
    st.push_back(strides_[n]);
  }
  return Tensor(storage_, s, st, offset_, dtype_);
}

Tensor Tensor::narrow(int dim, int64_t start, int64_t length) const {
  dim = shape_.normalize(dim);
  STRATA_CHECK(start >= 0 && length >= 0 && start + length <= shape_[dim],
               "narrow({}, {}, {}) out of range for {}", dim, start, length, shape_.str());
  Shape s = shape_;
  s[dim] = length;
  return Tensor(storage_, s, strides_, offset_ + start * strides_[dim], dtype_);
}

Tensor Tensor::slice(int dim, int64_t start, int64_t end, int64_t step) const {
  dim = shape_.normalize(dim);
  int64_t n = shape_[dim];
  if (start < 0) start += n;
  if (end < 0) end += n;
  end = std::min(end, n);
  STRATA_CHECK(step > 0 && start >= 0 && start <= end, "bad slice [{}:{}:{}] of dim of size {}",
               start, end, step, n);
  Shape s = shape_, st = strides_;
  s[dim] = (end - start + step - 1) / step;
  st[dim] = strides_[dim] * step;
  return Tensor(storage_, s, st, offset_ + start * strides_[dim], dtype_);
}

Tensor Tensor::select(int dim, int64_t index) const {
  dim = shape_.normalize(dim);
  if (index < 0) index += shape_[dim];
  STRATA_CHECK(index >= 0 && index < shape_[dim], "index {} out of range for dim of size {}", index,
               shape_[dim]);
  Shape s = shape_, st = strides_;
  s.erase(dim);
  st.erase(dim);
  return Tensor(storage_, s, st, offset_ + index * strides_[dim], dtype_);
}

Tensor Tensor::unsqueeze(int dim) const {
  if (dim < 0) dim += ndim() + 1;
  STRATA_CHECK(dim >= 0 && dim <= ndim(), "unsqueeze dim {} out of range", dim);
  Shape s = shape_, st = strides_;
  int64_t stride = dim < ndim() ? strides_[dim] * shape_[dim] : 1;
  s.insert(dim, 1);
  st.insert(dim, stride);
  return Tensor(storage_, s, st, offset_, dtype_);
}

Tensor Tensor::squeeze(int dim) const {
  dim = shape_.normalize(dim);
  STRATA_CHECK(shape_[dim] == 1, "squeeze of dim {} with size {}", dim, shape_[dim]);
  Shape s = shape_, st = strides_;
  s.erase(dim);
  st.erase(dim);
  return Tensor(storage_, s, st, offset_, dtype_);
}

Tensor Tensor::expand(const Shape& shape) const {
  STRATA_CHECK(shape.ndim() >= ndim(), "expand {} to fewer dims {}", shape_.str(), shape.str());
  Shape st;
  st.resize(shape.ndim());
  int lead = shape.ndim() - ndim();
  for (int i = 0; i < shape.ndim(); ++i) {
    if (i < lead) {
      st[i] = 0;
      continue;
    }
    int64_t d = shape_[i - lead];
    STRATA_CHECK(d == shape[i] || d == 1, "cannot expand {} to {}", shape_.str(), shape.str());
    st[i] = d == shape[i] ? strides_[i - lead] : 0;
  }
  return Tensor(storage_, shape, st, offset_, dtype_);
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = Tensor::empty(shape_, dtype_, device_);
  backend_for(device_).copy(*this, out);
  return out;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return *this;
  Tensor out = Tensor::empty(shape_, dtype, device_);
  backend_for(device_).copy(*this, out);
  return out;
}

Tensor Tensor::to(Device device) const {
  if (device == device_) return *this;
  Tensor out = Tensor::empty(shape_, dtype_, device);
  // Cross-device copies go through the non-CPU side's backend.
  backend_for(device.is_cpu() ? device_ : device).copy(*this, out);
  return out;
}

Tensor& Tensor::copy_(const Tensor& src) {
  STRATA_CHECK(src.shape() == shape_, "copy_ from {} into {}", src.str(), str());
  backend_for(device_.is_cpu() ? src.device() : device_).copy(src, *this);
  return *this;
}

Tensor& Tensor::fill_(double value) {
  backend_for(device_).fill(*this, value);
  return *this;
}

std::string Tensor::str() const {
  if (!defined()) return "undefined";
  return fmt::format("{}{} {}", dtype_name(dtype_), shape_.str(), device_.str());
}

// ---- creation ----

Tensor zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}
Tensor ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}
Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = Tensor::empty(shape, dtype, device);
  backend_for(device).fill(t, value);
  return t;
}
Tensor arange(int64_t n, DType dtype, Device device) {
  Tensor t = Tensor::empty({n}, dtype, device);
  backend_for(device).arange(t, 0.0, 1.0);
  return t;
}
Tensor randn(const Shape& shape, RngKey key, float mean, float stddev, Device device) {
  Tensor t = Tensor::empty(shape, DType::F32, device);
  backend_for(device).random_normal(t, key, mean, stddev);
  return t;
}
Tensor uniform(const Shape& shape, RngKey key, float lo, float hi, Device device) {
  Tensor t = Tensor::empty(shape, DType::F32, device);
  backend_for(device).random_uniform(t, key, lo, hi);
  return t;
}

Tensor from_vector(const std::vector<float>& values, const Shape& shape, DType dtype) {
  STRATA_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), "{} values for shape {}",
               values.size(), shape.str());
  Tensor src = Tensor::from_blob(const_cast<float*>(values.data()), shape, DType::F32);
  Tensor out = Tensor::empty(shape, dtype);
  backend_for(Device::cpu()).copy(src, out);
  return out;
}

Tensor from_ints(const std::vector<int64_t>& values, const Shape& shape, DType dtype) {
  STRATA_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), "{} values for shape {}",
               values.size(), shape.str());
  Tensor src = Tensor::from_blob(const_cast<int64_t*>(values.data()), shape, DType::I64);
  Tensor out = Tensor::empty(shape, dtype);
  backend_for(Device::cpu()).copy(src, out);
  return out;
}

std::vector<float> to_float_vector(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  Tensor dst = Tensor::from_blob(out.data(), t.shape(), DType::F32);
  backend_for(t.device()).copy(t, dst);
  return out;
}

std::vector<int64_t> to_int_vector(const Tensor& t) {
  std::vector<int64_t> out(static_cast<size_t>(t.numel()));
  Tensor dst = Tensor::from_blob(out.data(), t.shape(), DType::I64);
  backend_for(t.device()).copy(t, dst);
  return out;
}

}  // namespace strata::tensor
