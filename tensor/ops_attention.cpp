// The op API's attention and rotary embedding (tensor/ops.h).
#include "tensor/ops.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>

#include "tensor/ops_util.h"

namespace strata::tensor {

namespace {

float default_scale(const Tensor& q, float scale) {
  return scale > 0.f ? scale : 1.0f / std::sqrt(static_cast<float>(q.size(-1)));
}

void check_attention(const Tensor& q, const Tensor& k, const Tensor& v, const char* op) {
  same_devices(op, {&q, &k, &v});
  STRATA_CHECK(q.ndim() == 4 && k.ndim() == 4 && v.ndim() == 4,
               "attention expects [B, H, T, D] tensors, got q {} k {} v {}", q.str(), k.str(),
               v.str());
  STRATA_CHECK(q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3) &&
                   k.shape() == v.shape(),
               "attention shapes disagree: q {} k {} v {}", q.str(), k.str(), v.str());
}

// An attention operand as the backend takes it (Note [Strided attention operands] in
// backend.h): the view itself when its D stride is 1 and no dim is broadcast (stride 0), else a
// contiguous copy.
Tensor attention_operand(const Tensor& t) {
  bool in_place = t.size(3) <= 1 || t.stride(3) == 1;
  for (int d = 0; d < 3; ++d) in_place = in_place && (t.size(d) <= 1 || t.stride(d) != 0);
  return in_place ? t : t.contiguous();
}

// A [B, T, H, D] buffer seen as [B, H, T, D] (`shape`): the layout attention writes its outputs
// in, so that transposing back to [B, T, H, D] and merging the heads are views.
Tensor empty_heads_view(const Shape& shape, DType dt, Device device) {
  return Tensor::empty({shape[0], shape[2], shape[1], shape[3]}, dt, device).transpose(1, 2);
}

// An attention gradient destination: `like`'s shape, the compute dtype, unit D stride.
void check_attention_grad(const Tensor& g, const Tensor& like, DType dt, const char* what) {
  STRATA_CHECK(g.shape() == like.shape() && g.dtype() == dt && g.device() == like.device() &&
                   (g.size(3) <= 1 || g.stride(3) == 1),
               "attention_backward: {} {} must be a view of {}'s shape, dtype {} and device with "
               "a unit last stride",
               what, g.str(), like.str(), dtype_name(dt));
}

}  // namespace

AttentionResult attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                          float scale) {
  check_attention(q, k, v, "attention");
  const DType dt = compute_dtype("attention", {&q, &k, &v});
  AttentionResult r;
  r.out = empty_heads_view(q.shape(), dt, q.device());
  r.lse = Tensor::empty({q.size(0), q.size(1), q.size(2)}, DType::F32, q.device());
  be(q).attention_forward(attention_operand(q), attention_operand(k), attention_operand(v), causal,
                          default_scale(q, scale), r.out, r.lse);
  return r;
}

AttentionGrads attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, const Tensor& dout,
                                  bool causal, float scale) {
  check_attention(q, k, v, "attention_backward");
  same_devices("attention_backward", {&q, &out, &lse, &dout});
  STRATA_CHECK(dout.shape() == q.shape() && out.shape() == q.shape(),
               "attention_backward: out {} and dout {} must be q's shape {}", out.str(), dout.str(),
               q.str());
  const DType dt = compute_dtype("attention_backward", {&q, &k, &v, &out, &dout});
  require_f32(lse, "attention_backward", "lse");
  STRATA_CHECK(lse.shape() == Shape({q.size(0), q.size(1), q.size(2)}),
               "attention_backward: lse {} for q {} (one per query row: [B, H, Tq])", lse.str(),
               q.str());
  AttentionGrads g;
  g.dq = empty_heads_view(q.shape(), dt, q.device());
  g.dk = empty_heads_view(k.shape(), dt, q.device());
  g.dv = empty_heads_view(v.shape(), dt, q.device());
  attention_backward_into(q, k, v, out, lse, dout, causal, scale, g.dq, g.dk, g.dv);
  return g;
}

void attention_backward_into(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                             const Tensor& lse, const Tensor& dout, bool causal, float scale,
                             Tensor dq, Tensor dk, Tensor dv) {
  check_attention(q, k, v, "attention_backward");
  same_devices("attention_backward", {&q, &out, &lse, &dout});
  STRATA_CHECK(dout.shape() == q.shape() && out.shape() == q.shape(),
               "attention_backward: out {} and dout {} must be q's shape {}", out.str(), dout.str(),
               q.str());
  const DType dt = compute_dtype("attention_backward", {&q, &k, &v, &out, &dout});
  require_f32(lse, "attention_backward", "lse");
  STRATA_CHECK(lse.shape() == Shape({q.size(0), q.size(1), q.size(2)}),
               "attention_backward: lse {} for q {} (one per query row: [B, H, Tq])", lse.str(),
               q.str());
  same_devices("attention_backward", {&q, &dq, &dk, &dv});
  check_attention_grad(dq, q, dt, "dq");
  check_attention_grad(dk, k, dt, "dk");
  check_attention_grad(dv, v, dt, "dv");
  be(q).attention_backward(attention_operand(q), attention_operand(k), attention_operand(v),
                           attention_operand(out), lse.contiguous(), attention_operand(dout),
                           causal, default_scale(q, scale), dq, dk, dv);
}

Tensor rotary(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse) {
  STRATA_CHECK(x.ndim() == 4 && x.size(3) % 2 == 0,
               "rotary expects x [B, T, H, D] with even D, got {}", x.str());
  STRATA_CHECK(cos.shape() == Shape({x.size(1), x.size(3) / 2}) && sin.shape() == cos.shape(),
               "rotary tables {} must be [T, D/2] for x {}", cos.str(), x.str());
  same_devices("rotary", {&x, &cos, &sin});
  // Note [Low-precision ops]: the tables are F32 (as rotary_tables makes them) or x's dtype.
  const DType dt = compute_dtype("rotary", {&x});
  if ((cos.dtype() != DType::F32 && cos.dtype() != dt) || sin.dtype() != cos.dtype())
    user_error("rotary: tables cos {} / sin {} must both be f32 or x's dtype {}", cos.str(),
               sin.str(), dtype_name(dt));
  Tensor xc = x.contiguous();
  Tensor out = like(xc);
  be(x).rotary(xc, cos.contiguous(), sin.contiguous(), inverse, out);
  return out;
}

std::pair<Tensor, Tensor> rotary_tables(int64_t T, int64_t head_dim, double theta, int64_t start,
                                        Device device) {
  int64_t half = head_dim / 2;
  std::vector<float> c(static_cast<size_t>(T * half)), s(c.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      double freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
      double ang = static_cast<double>(start + t) * freq;
      c[t * half + i] = static_cast<float>(std::cos(ang));
      s[t * half + i] = static_cast<float>(std::sin(ang));
    }
  return {from_vector(c, {T, half}).to(device), from_vector(s, {T, half}).to(device)};
}

}  // namespace strata::tensor
