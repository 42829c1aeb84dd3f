#include "tensor/shape.h"

#include <fmt/format.h>

namespace strata::tensor {

void Shape::insert(int pos, int64_t v) {
  STRATA_CHECK(ndim_ < kMaxDims && pos >= 0 && pos <= ndim_, "bad insert at {}", pos);
  for (int i = ndim_; i > pos; --i) d_[i] = d_[i - 1];
  d_[pos] = v;
  ++ndim_;
}

void Shape::erase(int pos) {
  STRATA_CHECK(pos >= 0 && pos < ndim_, "bad erase at {}", pos);
  for (int i = pos; i + 1 < ndim_; ++i) d_[i] = d_[i + 1];
  --ndim_;
}

std::string Shape::str() const {
  return fmt::format("[{}]", fmt::join(begin(), end(), ", "));
}

Shape Shape::contiguous_strides() const {
  Shape s;
  s.resize(ndim_);
  int64_t acc = 1;
  for (int i = ndim_ - 1; i >= 0; --i) {
    s[i] = acc;
    acc *= d_[i];
  }
  return s;
}

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  int n = std::max(a.ndim(), b.ndim());
  Shape out;
  out.resize(n);
  for (int i = 0; i < n; ++i) {
    int ia = a.ndim() - n + i, ib = b.ndim() - n + i;
    int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    if (da != db && da != 1 && db != 1)
      user_error("shapes {} and {} cannot be broadcast together", a.str(), b.str());
    out[i] = da == 1 ? db : da;
  }
  return out;
}

}  // namespace strata::tensor
