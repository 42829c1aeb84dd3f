#include "tensor/ops.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>

namespace strata::tensor {

namespace {

Backend& be(const Tensor& t) {
  STRATA_CHECK(t.defined(), "op on an undefined tensor");
  return backend_for(t.device());
}

void same_device(const Tensor& a, const Tensor& b, const char* op) {
  if (!(a.device() == b.device()))
    user_error("{}: tensors on different devices ({} and {})", op, a.device().str(),
               b.device().str());
}

// same_device for every defined operand of an op against the first.
void same_devices(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor& first = **ts.begin();
  for (const Tensor* t : ts)
    if (t->defined()) same_device(first, *t, op);
}

void require_float(const Tensor& t, const char* op) {
  STRATA_CHECK(is_floating(t.dtype()), "{}: expected a float tensor, got {}", op, t.str());
}

// Note [Low-precision ops]: the float operands of an op share one dtype, its compute dtype,
// which is returned. A mismatch names the op and every operand.
DType compute_dtype(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor& first = **ts.begin();
  bool ok = true;
  for (const Tensor* t : ts) ok = ok && is_floating(t->dtype()) && t->dtype() == first.dtype();
  if (!ok) {
    std::string all;
    for (const Tensor* t : ts) all += (all.empty() ? "" : ", ") + t->str();
    user_error(
        "{}: operands must be float tensors of one dtype (f32, bf16 or f16), got {}; cast with "
        "Tensor::to (autograd::to for variables) so they agree (Note [Low-precision ops])",
        op, all);
  }
  return first.dtype();
}

// Tensors the contract keeps in f32 whatever the compute dtype (statistics, lse, per-row losses).
void require_f32(const Tensor& t, const char* op, const char* what) {
  if (t.dtype() != DType::F32)
    user_error("{}: {} must be f32 whatever the compute dtype, got {} (Note [Low-precision ops])",
               op, what, t.str());
}

void require_int(const Tensor& t, const char* op) {
  STRATA_CHECK(t.dtype() == DType::I32 || t.dtype() == DType::I64,
               "{}: expected i32/i64 ids, got {}", op, t.str());
}

Tensor like(const Tensor& t) {
  return Tensor::empty(t.shape(), t.dtype(), t.device());
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b, const char* name) {
  same_device(a, b, name);
  const DType dt = compute_dtype(name, {&a, &b});
  Tensor out = Tensor::empty(broadcast_shapes(a.shape(), b.shape()), dt, a.device());
  be(a).binary(op, a, b, out);
  return out;
}

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

Tensor add(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::Add, a, b, "add");
}
Tensor sub(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::Sub, a, b, "sub");
}
Tensor mul(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::Mul, a, b, "mul");
}
Tensor div(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::Div, a, b, "div");
}

Tensor scale(const Tensor& x, float alpha) {
  return affine(x, alpha, 0.f);
}

Tensor affine(const Tensor& x, float alpha, float beta) {
  const DType dt = compute_dtype("affine", {&x});
  Tensor out = Tensor::empty(x.shape(), dt, x.device());
  be(x).affine(x, alpha, beta, out);
  return out;
}

void axpy_(float alpha, const Tensor& x, Tensor& y) {
  same_device(x, y, "axpy");
  STRATA_CHECK(x.shape() == y.shape(), "axpy: {} vs {}", x.str(), y.str());
  STRATA_CHECK(y.is_contiguous(), "axpy: destination must be contiguous");
  // x and y may differ in dtype (Note [Low-precision ops]): gradient accumulation.
  require_float(x, "axpy");
  require_float(y, "axpy");
  be(y).axpy(alpha, x.contiguous(), y);
}

Tensor unary(UnaryOp op, const Tensor& x) {
  compute_dtype("unary", {&x});
  Tensor xc = x.contiguous();
  Tensor out = like(xc);
  be(x).unary(op, xc, out);
  return out;
}

Tensor unary_backward(UnaryOp op, const Tensor& x, const Tensor& dy) {
  STRATA_CHECK(x.shape() == dy.shape(), "unary_backward: {} vs {}", x.str(), dy.str());
  same_device(x, dy, "unary_backward");
  compute_dtype("unary_backward", {&x, &dy});
  Tensor xc = x.contiguous(), dyc = dy.contiguous();
  Tensor dx = like(xc);
  be(x).unary_backward(op, xc, dyc, dx);
  return dx;
}

Tensor bias_add(const Tensor& x, const Tensor& bias) {
  same_device(x, bias, "bias_add");
  STRATA_CHECK(bias.ndim() == 1 && x.ndim() >= 1 && bias.size(0) == x.size(-1),
               "bias_add: bias {} does not match the last dim of {}", bias.str(), x.str());
  compute_dtype("bias_add", {&x, &bias});
  Tensor xc = x.contiguous(), bc = bias.contiguous();
  Tensor out = like(xc);
  be(x).bias_add(xc, bc, out);
  return out;
}

Tensor dropout(const Tensor& x, float p, RngKey key) {
  STRATA_CHECK(p >= 0.f && p < 1.f, "dropout probability {} must be in [0, 1)", p);
  compute_dtype("dropout", {&x});
  Tensor xc = x.contiguous();
  Tensor out = like(xc);
  be(x).dropout(xc, p, key, out);
  return out;
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  STRATA_CHECK(broadcast_shapes(shape, x.shape()) == x.shape(),
               "sum_to: {} is not broadcastable to {}", shape.str(), x.shape().str());
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  be(x).sum_to(x, out);
  return out;
}

namespace {
Tensor reduce(ReduceOp op, const Tensor& x, int dim, bool keepdim, Tensor* indices) {
  dim = x.shape().normalize(dim);
  Shape s = x.shape();
  s[dim] = 1;
  Tensor out = Tensor::empty(s, x.dtype(), x.device());
  if (indices) *indices = Tensor::empty(s, DType::I64, x.device());
  be(x).reduce(op, x, dim, out, indices);
  if (!keepdim) {
    out = out.squeeze(dim);
    if (indices) *indices = indices->squeeze(dim);
  }
  return out;
}
}  // namespace

Tensor sum(const Tensor& x, int dim, bool keepdim) {
  return reduce(ReduceOp::Sum, x, dim, keepdim, nullptr);
}
Tensor mean(const Tensor& x, int dim, bool keepdim) {
  return reduce(ReduceOp::Mean, x, dim, keepdim, nullptr);
}
MaxResult max(const Tensor& x, int dim, bool keepdim) {
  // The maximum of no elements has no value (and no index): checked here, for every backend.
  STRATA_CHECK(x.size(x.shape().normalize(dim)) > 0, "max over dim {} of {}, which has size 0", dim,
               x.str());
  MaxResult r;
  r.values = reduce(ReduceOp::Max, x, dim, keepdim, &r.indices);
  return r;
}

TopKResult top_k(const Tensor& x, int64_t k) {
  STRATA_CHECK(x.ndim() >= 1 && is_floating(x.dtype()),
               "top_k of {}: needs a float tensor of at "
               "least one dim",
               x.str());
  const int64_t n = x.size(-1);
  STRATA_CHECK(k >= 0 && k <= n, "top_k: k = {} is outside [0, {}] for {}", k, n, x.str());
  Shape s = x.shape();
  s[x.ndim() - 1] = k;
  TopKResult r;
  r.values = Tensor::empty(s, x.dtype(), x.device());
  r.indices = Tensor::empty(s, DType::I64, x.device());
  if (r.values.numel() == 0) return r;
  // Rows of unit-stride elements, one stride apart: a 2-D view with a unit inner stride as it is
  // (a sampler's [rows, vocab] slice of padded logits), anything else as a contiguous copy.
  Tensor rows = x.ndim() == 2 && x.stride(1) == 1 ? x : x.contiguous().view({-1, n});
  Tensor v2 = r.values.view({-1, k}), i2 = r.indices.view({-1, k});
  be(x).top_k(rows, v2, i2);
  return r;
}

Tensor sum_all(const Tensor& x) {
  Tensor flat = x.reshape({x.numel()});
  Tensor out = Tensor::empty({1}, x.dtype(), x.device());
  be(x).reduce(ReduceOp::Sum, flat, 0, out, nullptr);
  return out.view(Shape{});
}

double sum_squares(const Tensor& x) {
  return be(x).sum_squares(x);
}
std::vector<double> sum_squares_many(const std::vector<Tensor>& xs) {
  if (xs.empty()) return {};
  for (const Tensor& x : xs) same_device(xs.front(), x, "sum_squares_many");
  return be(xs.front()).sum_squares_many(xs);
}
double l2_norm(const Tensor& x) {
  return std::sqrt(sum_squares(x));
}
double global_l2_norm(const std::vector<Tensor>& xs) {
  double s = 0;
  for (const Tensor& x : xs) s += sum_squares(x);
  return std::sqrt(s);
}

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  STRATA_CHECK(a.ndim() >= 2 && b.ndim() >= 2, "matmul needs at least 2-d inputs: {} and {}",
               a.str(), b.str());
  Shape s = a.shape();
  int64_t m = trans_a ? a.size(-1) : a.size(-2);
  int64_t n = trans_b ? b.size(-2) : b.size(-1);
  s[s.ndim() - 2] = m;
  s[s.ndim() - 1] = n;
  // Note [Low-precision ops]: bf16 @ bf16 -> bf16 (f32 accumulation inside).
  Tensor out = Tensor::empty(s, compute_dtype("matmul", {&a, &b}), a.device());
  matmul_out(a, b, out, trans_a, trans_b, 1.f, 0.f);
  return out;
}

void matmul_out(const Tensor& a, const Tensor& b, Tensor& out, bool trans_a, bool trans_b,
                float alpha, float beta) {
  same_device(a, b, "matmul");
  same_device(a, out, "matmul");
  const DType dt = compute_dtype("matmul", {&a, &b});
  // Note [Low-precision ops]: out has the inputs' dtype, or is F32 (mixed output).
  if (out.dtype() != dt && out.dtype() != DType::F32)
    user_error("matmul: output {} must be {} or f32 for {} @ {} (Note [Low-precision ops])",
               out.str(), dtype_name(dt), a.str(), b.str());
  int64_t k_a = trans_a ? a.size(-2) : a.size(-1);
  int64_t k_b = trans_b ? b.size(-1) : b.size(-2);
  int64_t m = trans_a ? a.size(-1) : a.size(-2);
  int64_t n = trans_b ? b.size(-2) : b.size(-1);
  STRATA_CHECK(k_a == k_b, "matmul: inner dims differ: {}{} @ {}{}", a.str(), trans_a ? "^T" : "",
               b.str(), trans_b ? "^T" : "");
  STRATA_CHECK(
      out.ndim() == a.ndim() && out.size(-2) == m && out.size(-1) == n && out.is_contiguous(),
      "matmul: output {} does not fit {} @ {}", out.str(), a.str(), b.str());
  for (int i = 0; i + 2 < a.ndim(); ++i)
    STRATA_CHECK(out.size(i) == a.size(i), "matmul batch dims");
  if (b.ndim() > 2) {
    STRATA_CHECK(b.ndim() == a.ndim(), "matmul: batched b {} must match a {}", b.str(), a.str());
    for (int i = 0; i + 2 < a.ndim(); ++i)
      STRATA_CHECK(b.size(i) == a.size(i), "matmul: batch dims differ: {} and {}", a.str(),
                   b.str());
  }
  be(a).matmul(a.contiguous(), b.contiguous(), out, trans_a, trans_b, alpha, beta);
}

namespace {
// t [..., C] as a [rows, C] view, also when C = 0 (view({-1, 0}) cannot infer the rows): the
// linear ops take no-feature inputs (K = 0: y = bias) and no-output weights (N = 0) as matmul
// does.
int64_t rows_of(const Tensor& t) {
  int64_t rows = 1;
  for (int i = 0; i + 1 < t.ndim(); ++i) rows *= t.size(i);
  return rows;
}
Tensor rows2d(const Tensor& t) {
  return t.view({rows_of(t), t.size(-1)});
}

// Note [Norms over no features]: a norm or softmax over a last dim of size 0 has nothing to
// normalise. Its outputs are empty like the input, its weight gradients are [0], and its per-row
// statistics are those of no elements: the mean and variance of nothing are NaN (torch.mean of an
// empty tensor is NaN too), so mean and rstd are NaN. No kernel is called: they assume rows of at
// least one element.

// The shapes a norm backward reads: dy like x [..., C], weight [C], each per-row statistic [rows]
// (the kernels index them by x's rows and columns alone, so a smaller one would be read past its
// end).
void check_norm_backward(const char* op, const Tensor& dy, const Tensor& x, const Tensor& weight,
                         std::initializer_list<const Tensor*> stats) {
  same_devices(op, {&x, &dy, &weight});
  for (const Tensor* st : stats) same_device(x, *st, op);
  STRATA_CHECK(x.ndim() >= 1 && dy.shape() == x.shape(), "{}: dy {} for x {}", op, dy.str(),
               x.str());
  STRATA_CHECK(weight.shape() == Shape{x.size(-1)}, "{}: weight {} for x {}", op, weight.str(),
               x.str());
  for (const Tensor* st : stats)
    STRATA_CHECK(st->shape() == Shape{rows_of(x)}, "{}: statistics {} for x {} (one per row)", op,
                 st->str(), x.str());
}

// The parameter gradients of a norm backward: fresh tensors, or the caller's buffers `into`
// (Note [Norm gradients into their buffer]), checked. Returns whether the backend accumulates.
bool norm_param_grads(const char* op, const NormGradsInto* into, bool with_bias, int64_t c,
                      DType dt, const Tensor& x, Tensor& dweight, Tensor* dbias) {
  if (into == nullptr) {
    dweight = Tensor::empty({c}, dt, x.device());
    if (with_bias) *dbias = Tensor::empty({c}, dt, x.device());
    return false;
  }
  auto check = [&](const Tensor& t, const char* what) {
    STRATA_CHECK(t.defined() && t.dtype() == dt && t.is_contiguous() && t.shape() == Shape{c},
                 "{}: {} to add into must be a contiguous {} [{}], not {}", op, what,
                 dtype_name(dt), c, t.defined() ? t.str() : "undefined");
    same_device(x, t, op);
  };
  check(into->dweight, "dweight");
  dweight = into->dweight;
  if (with_bias) {
    check(into->dbias, "dbias");
    *dbias = into->dbias;
  } else {
    STRATA_CHECK(!into->dbias.defined(), "{}: a norm without bias takes no dbias to add into", op);
  }
  return true;
}
}  // namespace

LinearResult linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act,
                    bool save_pre) {
  STRATA_CHECK(x.ndim() >= 1 && weight.ndim() == 2 && weight.size(1) == x.size(-1),
               "linear: weight {} for input {}", weight.str(), x.str());
  const int64_t n = weight.size(0);
  same_device(x, weight, "linear");
  DType dt;
  if (bias.defined()) {
    STRATA_CHECK(bias.shape() == Shape{n}, "linear: bias {} for weight {}", bias.str(),
                 weight.str());
    same_device(x, bias, "linear");
    dt = compute_dtype("linear", {&x, &weight, &bias});
  } else {
    dt = compute_dtype("linear", {&x, &weight});
  }
  STRATA_CHECK(!save_pre || act != Activation::None, "linear: pre is kept only for an activation");
  Shape ys = x.shape();
  ys[ys.ndim() - 1] = n;
  Tensor x2 = rows2d(x.contiguous());
  LinearResult r;
  r.y = Tensor::empty(ys, dt, x.device());
  if (save_pre) r.pre = Tensor::empty(ys, dt, x.device());
  Tensor y2 = rows2d(r.y), pre2 = save_pre ? rows2d(r.pre) : Tensor();
  be(x).linear_forward(x2, weight.contiguous(), bias.defined() ? bias.contiguous() : Tensor(), act,
                       y2, pre2);
  return r;
}

namespace {

// A bias gradient's tensor: a new one, or `into` (written over) once checked.
Tensor bias_grad_out(const char* op, Tensor* into, int64_t n, DType dt, const Tensor& x) {
  if (into == nullptr) return Tensor::empty({n}, dt, x.device());
  STRATA_CHECK(
      into->defined() && into->dtype() == dt && into->is_contiguous() && into->shape() == Shape{n},
      "{}: dbias to write must be a contiguous {} [{}], not {}", op, dtype_name(dt), n,
      into->defined() ? into->str() : "undefined");
  same_device(x, *into, op);
  return *into;
}

// linear_backward_weight and linear_backward_weight_into: dweight given (accumulated into) or
// made.
LinearWeightGrads weight_grads(const Tensor& dy, const Tensor& x, bool with_bias,
                               Tensor* accumulate_into, Tensor* dbias_into) {
  const char* op = accumulate_into ? "linear_backward_weight_into" : "linear_backward_weight";
  STRATA_CHECK(dy.ndim() >= 1 && x.ndim() >= 1 && rows_of(dy) == rows_of(x),
               "{}: dy {} and x {} differ in rows", op, dy.str(), x.str());
  same_device(dy, x, op);
  const DType dt = compute_dtype(op, {&dy, &x});
  const int64_t n = dy.size(-1), k = x.size(-1);
  LinearWeightGrads g;
  if (accumulate_into) {
    Tensor& w = *accumulate_into;
    same_device(w, x, op);
    STRATA_CHECK(
        w.dtype() == dt && w.is_contiguous() && w.ndim() == 2 && w.size(0) == n && w.size(1) == k,
        "{}: dweight {} is not a contiguous {} [{}, {}]", op, w.str(), dtype_name(dt), n, k);
    g.dweight = w;  // a handle to the caller's buffer
  } else {
    g.dweight = Tensor::empty({n, k}, dt, x.device());
  }
  if (with_bias) g.dbias = bias_grad_out(op, dbias_into, n, dt, x);
  be(x).linear_backward_weight(rows2d(dy.contiguous()), rows2d(x.contiguous()), g.dweight, g.dbias,
                               accumulate_into != nullptr);
  return g;
}

}  // namespace

LinearWeightGrads linear_backward_weight(const Tensor& dy, const Tensor& x, bool with_bias,
                                         Tensor* dbias_into) {
  return weight_grads(dy, x, with_bias, nullptr, dbias_into);
}

Tensor linear_backward_weight_into(const Tensor& dy, const Tensor& x, Tensor& dweight,
                                   bool with_bias, Tensor* dbias_into) {
  return weight_grads(dy, x, with_bias, &dweight, dbias_into).dbias;
}

LinearGeluGrads linear_backward_gelu(const Tensor& dz, const Tensor& weight, const Tensor& pre,
                                     bool with_bias, Tensor* dbias_into) {
  STRATA_CHECK(weight.ndim() == 2 && dz.ndim() >= 1 && dz.size(-1) == weight.size(0) &&
                   pre.ndim() >= 1 && pre.size(-1) == weight.size(1) && rows_of(dz) == rows_of(pre),
               "linear_backward_gelu: dz {} @ weight {} for pre {}", dz.str(), weight.str(),
               pre.str());
  same_device(dz, weight, "linear_backward_gelu");
  same_device(dz, pre, "linear_backward_gelu");
  const DType dt = compute_dtype("linear_backward_gelu", {&dz, &weight, &pre});
  const int64_t n = pre.size(-1);
  LinearGeluGrads g;
  g.dpre = Tensor::empty(pre.shape(), dt, pre.device());
  if (with_bias) g.dbias = bias_grad_out("linear_backward_gelu", dbias_into, n, dt, pre);
  Tensor dpre2 = rows2d(g.dpre);
  be(pre).linear_backward_gelu(rows2d(dz.contiguous()), weight.contiguous(),
                               rows2d(pre.contiguous()), dpre2, g.dbias);
  return g;
}

NormResult layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) {
  int64_t c = x.size(-1);
  STRATA_CHECK(weight.shape() == Shape{c} && bias.shape() == Shape{c},
               "layernorm: weight {} / bias {} must be [{}]", weight.str(), bias.str(), c);
  same_device(x, weight, "layernorm");
  same_device(x, bias, "layernorm");
  const DType dt = compute_dtype("layernorm", {&x, &weight, &bias});
  Tensor x2 = rows2d(x.contiguous());
  NormResult r;
  r.y = Tensor::empty(x.shape(), dt, x.device());
  r.mean = Tensor::empty({x2.size(0)}, DType::F32, x.device());
  r.rstd = Tensor::empty({x2.size(0)}, DType::F32, x.device());
  if (c == 0) {  // Note [Norms over no features]
    r.mean.fill_(std::nan(""));
    r.rstd.copy_(r.mean);
    return r;
  }
  Tensor y2 = rows2d(r.y);
  be(x).layernorm_forward(x2, weight.contiguous(), bias.contiguous(), eps, y2, r.mean, r.rstd);
  return r;
}

LayerNormGrads layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                  const Tensor& mean, const Tensor& rstd,
                                  const NormGradsInto* into) {
  int64_t c = x.size(-1);
  const DType dt = compute_dtype("layernorm_backward", {&dy, &x, &weight});
  require_f32(mean, "layernorm_backward", "mean");
  require_f32(rstd, "layernorm_backward", "rstd");
  check_norm_backward("layernorm_backward", dy, x, weight, {&mean, &rstd});
  Tensor x2 = rows2d(x.contiguous());
  Tensor dy2 = rows2d(dy.contiguous());
  LayerNormGrads g;
  g.dx = Tensor::empty(x.shape(), dt, x.device());
  const bool acc =
      norm_param_grads("layernorm_backward", into, true, c, dt, x, g.dweight, &g.dbias);
  if (c == 0) return g;  // Note [Norms over no features]
  Tensor dx2 = rows2d(g.dx);
  be(x).layernorm_backward(dy2, x2, weight.contiguous(), mean, rstd, dx2, g.dweight, g.dbias, acc);
  return g;
}

NormResult rmsnorm(const Tensor& x, const Tensor& weight, float eps) {
  int64_t c = x.size(-1);
  STRATA_CHECK(weight.shape() == Shape{c}, "rmsnorm: weight {} must be [{}]", weight.str(), c);
  same_device(x, weight, "rmsnorm");
  const DType dt = compute_dtype("rmsnorm", {&x, &weight});
  Tensor x2 = rows2d(x.contiguous());
  NormResult r;
  r.y = Tensor::empty(x.shape(), dt, x.device());
  r.rstd = Tensor::empty({x2.size(0)}, DType::F32, x.device());
  if (c == 0) {  // Note [Norms over no features]
    r.rstd.fill_(std::nan(""));
    return r;
  }
  Tensor y2 = rows2d(r.y);
  be(x).rmsnorm_forward(x2, weight.contiguous(), eps, y2, r.rstd);
  return r;
}

RmsNormGrads rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                              const Tensor& rstd, const NormGradsInto* into) {
  int64_t c = x.size(-1);
  const DType dt = compute_dtype("rmsnorm_backward", {&dy, &x, &weight});
  require_f32(rstd, "rmsnorm_backward", "rstd");
  check_norm_backward("rmsnorm_backward", dy, x, weight, {&rstd});
  Tensor x2 = rows2d(x.contiguous());
  Tensor dy2 = rows2d(dy.contiguous());
  RmsNormGrads g;
  g.dx = Tensor::empty(x.shape(), dt, x.device());
  const bool acc = norm_param_grads("rmsnorm_backward", into, false, c, dt, x, g.dweight, nullptr);
  if (c == 0) return g;  // Note [Norms over no features]
  Tensor dx2 = rows2d(g.dx);
  be(x).rmsnorm_backward(dy2, x2, weight.contiguous(), rstd, dx2, g.dweight, acc);
  return g;
}

namespace {
// The checks add_layernorm and add_rmsnorm share: x and r of one shape, on one device.
void check_add_norm(const Tensor& x, const Tensor& r, const Tensor& weight, const char* op) {
  if (!(x.shape() == r.shape()))
    user_error("{}: x {} and r {} must have the same shape (the fused add does not broadcast)", op,
               x.str(), r.str());
  same_device(x, r, op);
  same_device(x, weight, op);
  STRATA_CHECK(x.ndim() >= 1 && weight.shape() == Shape{x.size(-1)}, "{}: weight {} for {}", op,
               weight.str(), x.str());
}

// ds for a fused norm backward: contiguous [N, C] like s, or undefined.
Tensor rows_or_none(const Tensor& ds, const Tensor& s, const char* op) {
  if (!ds.defined()) return ds;
  STRATA_CHECK(ds.shape() == s.shape() && ds.dtype() == s.dtype(), "{}: ds {} for s {}", op,
               ds.str(), s.str());
  same_device(ds, s, op);
  return rows2d(ds.contiguous());
}
}  // namespace

AddNormResult add_layernorm(const Tensor& x, const Tensor& r, const Tensor& weight,
                            const Tensor& bias, float eps) {
  check_add_norm(x, r, weight, "add_layernorm");
  const int64_t c = x.size(-1);
  STRATA_CHECK(bias.shape() == Shape{c}, "add_layernorm: bias {} must be [{}]", bias.str(), c);
  same_device(x, bias, "add_layernorm");
  const DType dt = compute_dtype("add_layernorm", {&x, &r, &weight, &bias});
  Tensor x2 = rows2d(x.contiguous()), r2 = rows2d(r.contiguous());
  AddNormResult out;
  out.s = Tensor::empty(x.shape(), dt, x.device());
  out.y = Tensor::empty(x.shape(), dt, x.device());
  out.mean = Tensor::empty({x2.size(0)}, DType::F32, x.device());
  out.rstd = Tensor::empty({x2.size(0)}, DType::F32, x.device());
  if (c == 0) {  // Note [Norms over no features]
    out.mean.fill_(std::nan(""));
    out.rstd.copy_(out.mean);
    return out;
  }
  Tensor s2 = rows2d(out.s), y2 = rows2d(out.y);
  be(x).add_layernorm_forward(x2, r2, weight.contiguous(), bias.contiguous(), eps, s2, y2, out.mean,
                              out.rstd);
  return out;
}

LayerNormGrads add_layernorm_backward(const Tensor& dy, const Tensor& ds, const Tensor& s,
                                      const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                      const NormGradsInto* into) {
  const int64_t c = s.size(-1);
  STRATA_CHECK(dy.shape() == s.shape(), "add_layernorm_backward: dy {} for s {}", dy.str(),
               s.str());
  const DType dt = compute_dtype("add_layernorm_backward", {&dy, &s, &weight});
  require_f32(mean, "add_layernorm_backward", "mean");
  require_f32(rstd, "add_layernorm_backward", "rstd");
  check_norm_backward("add_layernorm_backward", dy, s, weight, {&mean, &rstd});
  Tensor s2 = rows2d(s.contiguous()), dy2 = rows2d(dy.contiguous());
  Tensor ds2 = rows_or_none(ds, s, "add_layernorm_backward");
  LayerNormGrads g;
  g.dx = Tensor::empty(s.shape(), dt, s.device());
  const bool acc =
      norm_param_grads("add_layernorm_backward", into, true, c, dt, s, g.dweight, &g.dbias);
  if (c == 0) return g;  // Note [Norms over no features]
  Tensor dx2 = rows2d(g.dx);
  be(s).add_layernorm_backward(dy2, ds2, s2, weight.contiguous(), mean, rstd, dx2, g.dweight,
                               g.dbias, acc);
  return g;
}

AddNormResult add_rmsnorm(const Tensor& x, const Tensor& r, const Tensor& weight, float eps) {
  check_add_norm(x, r, weight, "add_rmsnorm");
  const int64_t c = x.size(-1);
  const DType dt = compute_dtype("add_rmsnorm", {&x, &r, &weight});
  Tensor x2 = rows2d(x.contiguous()), r2 = rows2d(r.contiguous());
  AddNormResult out;
  out.s = Tensor::empty(x.shape(), dt, x.device());
  out.y = Tensor::empty(x.shape(), dt, x.device());
  out.rstd = Tensor::empty({x2.size(0)}, DType::F32, x.device());
  if (c == 0) {  // Note [Norms over no features]
    out.rstd.fill_(std::nan(""));
    return out;
  }
  Tensor s2 = rows2d(out.s), y2 = rows2d(out.y);
  be(x).add_rmsnorm_forward(x2, r2, weight.contiguous(), eps, s2, y2, out.rstd);
  return out;
}

RmsNormGrads add_rmsnorm_backward(const Tensor& dy, const Tensor& ds, const Tensor& s,
                                  const Tensor& weight, const Tensor& rstd,
                                  const NormGradsInto* into) {
  const int64_t c = s.size(-1);
  STRATA_CHECK(dy.shape() == s.shape(), "add_rmsnorm_backward: dy {} for s {}", dy.str(), s.str());
  const DType dt = compute_dtype("add_rmsnorm_backward", {&dy, &s, &weight});
  require_f32(rstd, "add_rmsnorm_backward", "rstd");
  check_norm_backward("add_rmsnorm_backward", dy, s, weight, {&rstd});
  Tensor s2 = rows2d(s.contiguous()), dy2 = rows2d(dy.contiguous());
  Tensor ds2 = rows_or_none(ds, s, "add_rmsnorm_backward");
  RmsNormGrads g;
  g.dx = Tensor::empty(s.shape(), dt, s.device());
  const bool acc =
      norm_param_grads("add_rmsnorm_backward", into, false, c, dt, s, g.dweight, nullptr);
  if (c == 0) return g;  // Note [Norms over no features]
  Tensor dx2 = rows2d(g.dx);
  be(s).add_rmsnorm_backward(dy2, ds2, s2, weight.contiguous(), rstd, dx2, g.dweight, acc);
  return g;
}

Tensor softmax(const Tensor& x) {
  const DType dt = compute_dtype("softmax", {&x});
  int64_t c = x.size(-1);
  Tensor x2 = rows2d(x.contiguous());
  Tensor y = Tensor::empty(x.shape(), dt, x.device());
  if (c == 0) return y;  // Note [Norms over no features]
  Tensor y2 = rows2d(y);
  be(x).softmax_forward(x2, y2);
  return y;
}

Tensor softmax_backward(const Tensor& y, const Tensor& dy) {
  int64_t c = y.size(-1);
  same_device(y, dy, "softmax_backward");
  const DType dt = compute_dtype("softmax_backward", {&y, &dy});
  STRATA_CHECK(y.ndim() >= 1 && dy.shape() == y.shape(), "softmax_backward: dy {} for y {}",
               dy.str(), y.str());
  Tensor y2 = rows2d(y.contiguous());
  Tensor dy2 = rows2d(dy.contiguous());
  Tensor dx = Tensor::empty(y.shape(), dt, y.device());
  if (c == 0) return dx;  // Note [Norms over no features]
  Tensor dx2 = rows2d(dx);
  be(y).softmax_backward(y2, dy2, dx2);
  return dx;
}

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

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  same_device(weight, ids, "embedding");
  require_int(ids, "embedding");
  STRATA_CHECK(weight.ndim() == 2, "embedding weight must be [V, C], got {}", weight.str());
  Tensor flat = ids.contiguous().reshape({ids.numel()});
  Shape s = ids.shape();
  s.push_back(weight.size(1));
  Tensor out = Tensor::empty(s, weight.dtype(), weight.device());
  Tensor out2 = out.view({ids.numel(), weight.size(1)});
  be(weight).embedding_forward(weight.contiguous(), flat, out2);
  return out;
}

void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dweight) {
  STRATA_CHECK(dweight.is_contiguous() && dweight.ndim() == 2, "embedding_backward: dweight {}",
               dweight.str());
  same_devices("embedding_backward", {&dweight, &ids, &dout});
  require_int(ids, "embedding_backward");
  compute_dtype("embedding_backward", {&dout, &dweight});
  Tensor flat = ids.contiguous().reshape({ids.numel()});
  Tensor d2 = dout.contiguous().reshape({ids.numel(), dweight.size(1)});
  be(dweight).embedding_backward(flat, d2, dweight);
}

namespace {
// What a cross-entropy backward reads per logit row: a target, an lse and a dloss, all on the
// logits' device (the kernels index them by row, so a shorter one would be read past its end).
void check_ce_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                       const Tensor& dloss, const char* op) {
  same_devices(op, {&logits, &targets, &lse, &dloss});
  require_int(targets, op);
  require_f32(lse, op, "lse");
  require_f32(dloss, op, "dloss");
  const int64_t rows = rows_of(logits);
  STRATA_CHECK(
      logits.ndim() >= 1 && targets.numel() == rows && lse.numel() == rows && dloss.numel() == rows,
      "{}: logits {} need one target, lse and dloss per row, got targets {}, lse {}, "
      "dloss {}",
      op, logits.str(), targets.str(), lse.str(), dloss.str());
}

int64_t ce_classes(int64_t classes, int64_t v, const char* op) {
  if (classes < 0) return v;
  STRATA_CHECK(classes >= 1 && classes <= v, "{}: classes {} must be in [1, {}]", op, classes, v);
  return classes;
}
}  // namespace

CrossEntropyResult cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                 int64_t classes) {
  same_device(logits, targets, "cross_entropy");
  require_int(targets, "cross_entropy");
  compute_dtype("cross_entropy", {&logits});  // losses and lse are F32 whatever it is
  int64_t v = logits.size(-1);
  classes = ce_classes(classes, v, "cross_entropy");
  Tensor l2 = logits.contiguous().reshape({-1, v});
  Tensor t = targets.contiguous().reshape({targets.numel()});
  STRATA_CHECK(l2.size(0) == t.size(0), "cross_entropy: {} logit rows but {} targets", l2.size(0),
               t.size(0));
  CrossEntropyResult r;
  r.losses = Tensor::empty({t.size(0)}, DType::F32, logits.device());
  r.lse = Tensor::empty({t.size(0)}, DType::F32, logits.device());
  be(logits).cross_entropy_forward(l2, t, ignore_index, classes, r.losses, r.lse);
  r.norm = Tensor::empty({2}, DType::F32, logits.device());
  be(logits).cross_entropy_norm(t, ignore_index, r.norm);
  return r;
}

CrossEntropyResult cross_entropy_fused_(Tensor& logits, const Tensor& targets, float grad,
                                        int64_t ignore_index, int64_t classes) {
  same_device(logits, targets, "cross_entropy_fused_");
  require_int(targets, "cross_entropy_fused_");
  compute_dtype("cross_entropy_fused_", {&logits});
  STRATA_CHECK(logits.is_contiguous(), "cross_entropy_fused_: logits {} are not contiguous",
               logits.str());
  int64_t v = logits.size(-1);
  classes = ce_classes(classes, v, "cross_entropy_fused_");
  Tensor l2 = logits.view({-1, v});
  Tensor t = targets.contiguous().reshape({targets.numel()});
  STRATA_CHECK(l2.size(0) == t.size(0), "cross_entropy_fused_: {} logit rows but {} targets",
               l2.size(0), t.size(0));
  CrossEntropyResult r;
  r.losses = Tensor::empty({t.size(0)}, DType::F32, logits.device());
  r.lse = Tensor::empty({t.size(0)}, DType::F32, logits.device());
  r.norm = Tensor::empty({2}, DType::F32, logits.device());
  be(logits).cross_entropy_norm(t, ignore_index, r.norm);
  be(logits).cross_entropy_fused(l2, t, ignore_index, classes, grad, r.norm, r.losses, r.lse);
  return r;
}

void scale_unless_equal_(Tensor& x, const Tensor& g, float expected) {
  same_device(x, g, "scale_unless_equal_");
  compute_dtype("scale_unless_equal_", {&x});
  require_f32(g, "scale_unless_equal_", "g");
  STRATA_CHECK(g.numel() == 1, "scale_unless_equal_: g {} is not one element", g.str());
  be(x).scale_unless_equal(x, g, expected);
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              const Tensor& dloss, int64_t ignore_index, int64_t classes) {
  int64_t v = logits.size(-1);
  classes = ce_classes(classes, v, "cross_entropy_backward");
  const DType dt = compute_dtype("cross_entropy_backward", {&logits});
  check_ce_backward(logits, targets, lse, dloss, "cross_entropy_backward");
  Tensor l2 = logits.contiguous().reshape({-1, v});
  Tensor t = targets.contiguous().reshape({targets.numel()});
  Tensor dlogits = Tensor::empty(logits.shape(), dt, logits.device());
  Tensor d2 = dlogits.view({-1, v});
  be(logits).cross_entropy_backward(l2, t, lse.contiguous(), dloss.contiguous(), ignore_index,
                                    classes, d2);
  return dlogits;
}

void cross_entropy_backward_(Tensor& logits, const Tensor& targets, const Tensor& lse,
                             const Tensor& dloss, int64_t ignore_index, int64_t classes) {
  int64_t v = logits.size(-1);
  classes = ce_classes(classes, v, "cross_entropy_backward_");
  compute_dtype("cross_entropy_backward_", {&logits});
  check_ce_backward(logits, targets, lse, dloss, "cross_entropy_backward_");
  STRATA_CHECK(logits.is_contiguous(), "cross_entropy_backward_: logits {} are not contiguous",
               logits.str());
  Tensor l2 = logits.view({-1, v});
  Tensor t = targets.contiguous().reshape({targets.numel()});
  // Backend::cross_entropy_backward allows dlogits to be logits (each element is read, then its
  // gradient written, by the same thread).
  be(logits).cross_entropy_backward(l2, t, lse.contiguous(), dloss.contiguous(), ignore_index,
                                    classes, l2);
}

Tensor concat(const std::vector<Tensor>& xs, int dim) {
  STRATA_CHECK(!xs.empty(), "concat of no tensors");
  dim = xs[0].shape().normalize(dim);
  Shape s = xs[0].shape();
  s[dim] = 0;
  for (const Tensor& x : xs) {
    same_device(xs[0], x, "concat");
    STRATA_CHECK(x.ndim() == s.ndim() && x.dtype() == xs[0].dtype(), "concat: {} vs {}", x.str(),
                 xs[0].str());
    for (int i = 0; i < s.ndim(); ++i)
      if (i != dim)
        STRATA_CHECK(x.size(i) == xs[0].size(i), "concat: {} vs {} off dim {}", x.str(),
                     xs[0].str(), dim);
    s[dim] += x.size(dim);
  }
  Tensor out = Tensor::empty(s, xs[0].dtype(), xs[0].device());
  be(out).concat(xs, dim, out);
  return out;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int dim) {
  dim = x.shape().normalize(dim);
  std::vector<Tensor> out;
  int64_t start = 0;
  for (int64_t s : sizes) {
    out.push_back(x.narrow(dim, start, s));
    start += s;
  }
  STRATA_CHECK(start == x.size(dim), "split sizes add up to {}, dim has {}", start, x.size(dim));
  return out;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  STRATA_CHECK(a.shape() == b.shape(), "max_abs_diff: {} vs {}", a.str(), b.str());
  std::vector<float> va = to_float_vector(a), vb = to_float_vector(b);
  double m = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    double d = std::fabs(static_cast<double>(va[i]) - vb[i]);
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  if (!(a.shape() == b.shape())) return false;
  std::vector<float> va = to_float_vector(a), vb = to_float_vector(b);
  for (size_t i = 0; i < va.size(); ++i) {
    double d = std::fabs(static_cast<double>(va[i]) - vb[i]);
    if (!(d <= atol + rtol * std::fabs(static_cast<double>(vb[i])))) return false;
  }
  return true;
}

}  // namespace strata::tensor
