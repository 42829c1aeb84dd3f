#include "tests/support/op_table.h"

#include <cmath>

namespace strata::testing {

namespace tops = ::strata::tensor;

autograd::Variable make_grad_input(const InputSpec& spec, uint64_t salt) {
  Shape s = spec.shape;
  Tensor base;
  if (spec.layout == Layout::Transposed && s.ndim() >= 2) {
    Shape t = s;
    std::swap(t[t.ndim() - 1], t[t.ndim() - 2]);
    base = tops::randn(t, {99, salt}).transpose(-1, -2);
  } else if (spec.layout == Layout::Strided) {
    Shape wide = s;
    wide[wide.ndim() - 1] *= 2;
    base = tops::randn(wide, {99, salt}).slice(-1, 0, wide.back(), 2);
  } else {
    base = tops::randn(s, {99, salt});
  }
  if (spec.values != Values::Normal) {
    // Positive: |x| + 0.5 (log, div). AwayFromZero: sign(x) * (|x| + 0.2) (relu's kink, max ties).
    std::vector<float> v = tops::to_float_vector(base);
    for (float& f : v) {
      f = spec.values == Values::Positive ? std::fabs(f) + 0.5f : (f < 0 ? f - 0.2f : f + 0.2f);
    }
    Tensor fixed = tops::from_vector(v, s);
    base.copy_(fixed);
  }
  return autograd::Variable(base, true);
}

Tensor Draw::values(const Shape& s, float lo, float hi) {
  return tops::uniform(s, {99, stream_++}, lo, hi);
}

Tensor Draw::ids(int64_t count, int64_t n, bool ignore) {
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) x = ignore && size(0, 7) == 0 ? -100.f : static_cast<float>(size(0, n - 1));
  return tops::from_vector(v, {count}).to(DType::I64);
}

Tensor some_layout(Draw& r, const Tensor& t) {
  if (t.ndim() < 2 || !r.coin()) return t;
  if (r.coin()) return t.transpose(0, 1).contiguous().transpose(0, 1);
  Shape wide = t.shape();
  const int64_t extra = r.size(1, 3);
  wide[0] += extra;
  Tensor buf = tops::zeros(wide, t.dtype(), t.device());
  Tensor view = buf.narrow(0, extra, t.size(0));
  view.copy_(t);
  return view;
}

Tensor lowp_rand(const Shape& s, uint64_t seed, float lo, float hi) {
  return tops::uniform(s, RngKey{seed, 0x7e57}, lo, hi);
}

Tensor lp(const Shape& s, uint64_t seed, DType dt, float lo, float hi) {
  return lowp_rand(s, seed, lo, hi).to(dt);
}

Tensor rnd(const Shape& s, uint64_t stream, float lo, float hi) {
  return tops::uniform(s, {42, stream}, lo, hi);
}

Tensor mixed_operand(const Shape& s, uint64_t stream, Device d) {
  return tops::uniform(s, {11, stream}, -1.f, 1.f).to(d);
}

Tensor mixed_ids(const Shape& s, int64_t n, Device d) {
  std::vector<float> v(static_cast<size_t>(s.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(static_cast<int64_t>(i) % n);
  return tops::from_vector(v, s).to(DType::I64).to(d);
}

const std::vector<OpInfo>& op_table() {
  static const std::vector<OpInfo> table = [] {
    std::vector<OpInfo> t;
    add_elementwise_ops(t);
    add_reduction_and_memory_ops(t);
    add_linalg_ops(t);
    add_norm_ops(t);
    add_attention_ops(t);
    add_embedding_loss_ops(t);
    add_shape_ops(t);
    return t;
  }();
  return table;
}

std::vector<OpInfo> op_entries(const std::function<bool(const OpInfo&)>& has) {
  std::vector<OpInfo> out;
  for (const OpInfo& e : op_table())
    if (has(e)) out.push_back(e);
  return out;
}

}  // namespace strata::testing
