// CPU elementwise kernels: binary (broadcasting), affine, axpy, unary (+ backward), bias_add,
// dropout. Every output element depends on its own inputs only, so any split across threads
// gives the same bits; simple loops over contiguous floats are left to the auto-vectoriser, and
// those calling exp or tanh are written on 4-lane vectors (Note [Vectorised exp]).
#include <cmath>
#include <cstring>

#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu/strided.h"
#include "tensor/cpu/vec4.h"
#include "tensor/cpu/widen.h"

namespace strata::tensor::cpu {

namespace {

// Work per element is higher for transcendental kernels, so they go parallel sooner.
constexpr int64_t kHeavyGrain = kParallelGrain / 8;

template <BinaryOp OP>
inline float apply(float a, float b) {
  if constexpr (OP == BinaryOp::Add) return a + b;
  if constexpr (OP == BinaryOp::Sub) return a - b;
  if constexpr (OP == BinaryOp::Mul) return a * b;
  if constexpr (OP == BinaryOp::Div) return a / b;
}

// True when t holds exactly out's elements in out's order (t may lack leading size-1 dims).
bool is_full(const Tensor& t, const Tensor& out) {
  return t.is_contiguous() && t.numel() == out.numel();
}

// If t is contiguous and its shape (less leading 1s) equals out's trailing dims, returns its
// numel: t then repeats along out's leading dims as a row. Otherwise 0.
int64_t row_length(const Tensor& t, const Tensor& out) {
  if (!t.is_contiguous()) return 0;
  int first = 0;
  while (first < t.ndim() && t.size(first) == 1) ++first;
  const int k = t.ndim() - first;
  if (k > out.ndim()) return 0;
  for (int i = 0; i < k; ++i)
    if (t.size(first + i) != out.size(out.ndim() - k + i)) return 0;
  return t.numel();
}

template <BinaryOp OP>
void binary_kernel(const Tensor& a, const Tensor& b, Tensor& out) {
  const float* ap = a.data<float>();
  const float* bp = b.data<float>();
  float* op = out.data<float>();
  const int64_t n = out.numel();
  if (n == 0) return;
  const bool a_full = is_full(a, out), b_full = is_full(b, out);
  if (a_full && b_full) {
    parallel_range(n, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) op[i] = apply<OP>(ap[i], bp[i]);
    });
    return;
  }
  if (a_full && b.numel() == 1) {
    const float s = bp[0];
    parallel_range(n, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) op[i] = apply<OP>(ap[i], s);
    });
    return;
  }
  if (b_full && a.numel() == 1) {
    const float s = ap[0];
    parallel_range(n, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) op[i] = apply<OP>(s, bp[i]);
    });
    return;
  }
  // One side full, the other a row repeated over the leading dims (bias-like).
  const int64_t b_row = a_full ? row_length(b, out) : 0;
  const int64_t a_row = b_full ? row_length(a, out) : 0;
  if (b_row > 0 || a_row > 0) {
    const int64_t c = b_row > 0 ? b_row : a_row;
    const int64_t rows = n / c;
    parallel_range(
        rows,
        [&](int64_t lo, int64_t hi) {
          for (int64_t r = lo; r < hi; ++r) {
            float* o = op + r * c;
            if (b_row > 0) {
              const float* x = ap + r * c;
              for (int64_t j = 0; j < c; ++j) o[j] = apply<OP>(x[j], bp[j]);
            } else {
              const float* y = bp + r * c;
              for (int64_t j = 0; j < c; ++j) o[j] = apply<OP>(ap[j], y[j]);
            }
          }
        },
        std::max<int64_t>(1, kParallelGrain / c));
    return;
  }
  // General: any strides, broadcasting through zero strides.
  const Shape& s = out.shape();
  auto loop = make_strided_loop<3>(s, {out.strides(), broadcast_strides(a.shape(), a.strides(), s),
                                       broadcast_strides(b.shape(), b.strides(), s)});
  for_each_row(loop,
               [&](const std::array<int64_t, 3>& off, int64_t m, const std::array<int64_t, 3>& in) {
                 float* o = op + off[0];
                 const float* x = ap + off[1];
                 const float* y = bp + off[2];
                 if (in[0] == 1 && in[1] == 1 && in[2] == 1) {
                   for (int64_t i = 0; i < m; ++i) o[i] = apply<OP>(x[i], y[i]);
                 } else if (in[0] == 1 && in[1] == 1 && in[2] == 0) {
                   const float v = y[0];
                   for (int64_t i = 0; i < m; ++i) o[i] = apply<OP>(x[i], v);
                 } else if (in[0] == 1 && in[1] == 0 && in[2] == 1) {
                   const float v = x[0];
                   for (int64_t i = 0; i < m; ++i) o[i] = apply<OP>(v, y[i]);
                 } else {
                   for (int64_t i = 0; i < m; ++i)
                     o[i * in[0]] = apply<OP>(x[i * in[1]], y[i * in[2]]);
                 }
               });
}

// out[i] = f(x[i]) over contiguous floats.
template <typename F>
void map1(const float* x, float* out, int64_t n, int64_t grain, F f) {
  parallel_range(
      n,
      [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) out[i] = f(x[i]);
      },
      grain);
}

// dx[i] = f(x[i], dy[i]) over contiguous floats.
template <typename F>
void map2(const float* x, const float* dy, float* dx, int64_t n, int64_t grain, F f) {
  parallel_range(
      n,
      [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) dx[i] = f(x[i], dy[i]);
      },
      grain);
}

// out[i] = f(x[i]) with f on 4 lanes. The tail runs through a zero-padded vector, so element i
// gets the same bits wherever the thread split or the end of the array falls (Note [Vectorised
// exp]).
template <typename F>
void map1_4(const float* x, float* out, int64_t n, F f) {
  parallel_range(
      n,
      [&](int64_t lo, int64_t hi) {
        int64_t i = lo;
        for (; i + 4 <= hi; i += 4) store4(out + i, f(load4(x + i)));
        if (i < hi) {
          const size_t bytes = static_cast<size_t>(hi - i) * sizeof(float);
          float t[4] = {};
          std::memcpy(t, x + i, bytes);
          store4(t, f(load4(t)));
          std::memcpy(out + i, t, bytes);
        }
      },
      kHeavyGrain);
}

// dx[i] = f(x[i], dy[i]) with f on 4 lanes, tails as in map1_4.
template <typename F>
void map2_4(const float* x, const float* dy, float* dx, int64_t n, F f) {
  parallel_range(
      n,
      [&](int64_t lo, int64_t hi) {
        int64_t i = lo;
        for (; i + 4 <= hi; i += 4) store4(dx + i, f(load4(x + i), load4(dy + i)));
        if (i < hi) {
          const size_t bytes = static_cast<size_t>(hi - i) * sizeof(float);
          float tx[4] = {}, tg[4] = {};
          std::memcpy(tx, x + i, bytes);
          std::memcpy(tg, dy + i, bytes);
          store4(tx, f(load4(tx), load4(tg)));
          std::memcpy(dx + i, tx, bytes);
        }
      },
      kHeavyGrain);
}

// GPT-2's GELU: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCube = 0.044715f;

inline F4 gelu_arg4(F4 x) {
  return kGeluScale * (x + kGeluCube * x * x * x);
}

inline F4 gelu4(F4 x) {
  return 0.5f * x * (1.0f + tanh4(gelu_arg4(x)));
}

inline F4 gelu_grad4(F4 x) {
  const TanhSech2 ts = tanh4_sech2(gelu_arg4(x));
  const F4 du = kGeluScale * (1.0f + 3.0f * kGeluCube * x * x);
  return 0.5f * (1.0f + ts.t) + 0.5f * x * ts.s2 * du;
}

}  // namespace

void CpuBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  if (!all_f32(a, b, out)) {  // Note [Widening adapter]
    F32Out o(out);
    binary(op, widened(a), widened(b), o.get());
    return o.commit();
  }
  switch (op) {
    case BinaryOp::Add:
      return binary_kernel<BinaryOp::Add>(a, b, out);
    case BinaryOp::Sub:
      return binary_kernel<BinaryOp::Sub>(a, b, out);
    case BinaryOp::Mul:
      return binary_kernel<BinaryOp::Mul>(a, b, out);
    case BinaryOp::Div:
      return binary_kernel<BinaryOp::Div>(a, b, out);
  }
  STRATA_UNREACHABLE("binary op {}", static_cast<int>(op));
}

void CpuBackend::affine(const Tensor& x, float alpha, float beta, Tensor& out) {
  if (!all_f32(x, out)) {  // Note [Widening adapter]
    F32Out o(out);
    affine(widened(x), alpha, beta, o.get());
    return o.commit();
  }
  const float* xp = x.data<float>();
  float* op = out.data<float>();
  if (x.is_contiguous()) {
    map1(xp, op, out.numel(), kParallelGrain, [=](float v) { return alpha * v + beta; });
    return;
  }
  auto loop = make_strided_loop<2>(out.shape(), {out.strides(), x.strides()});
  for_each_row(loop,
               [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& in) {
                 float* o = op + off[0];
                 const float* v = xp + off[1];
                 if (in[0] == 1 && in[1] == 1) {
                   for (int64_t i = 0; i < n; ++i) o[i] = alpha * v[i] + beta;
                 } else {
                   for (int64_t i = 0; i < n; ++i) o[i * in[0]] = alpha * v[i * in[1]] + beta;
                 }
               });
}

void CpuBackend::axpy(float alpha, const Tensor& x, Tensor& y) {
  if (!all_f32(x, y)) {  // Note [Widening adapter]; y accumulates, and x, y may differ in dtype
    F32Out o(y, /*load=*/true);
    axpy(alpha, widened(x), o.get());
    return o.commit();
  }
  STRATA_CHECK(x.is_contiguous() && y.is_contiguous() && x.numel() == y.numel(), "axpy {} into {}",
               x.str(), y.str());
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  parallel_range(y.numel(), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) yp[i] += alpha * xp[i];
  });
}

void CpuBackend::unary(UnaryOp op, const Tensor& x, Tensor& out) {
  if (!all_f32(x, out)) {  // Note [Widening adapter]
    F32Out o(out);
    unary(op, widened(x), o.get());
    return o.commit();
  }
  STRATA_CHECK(x.is_contiguous() && out.is_contiguous(), "unary on non-contiguous {}", x.str());
  const float* xp = x.data<float>();
  float* o = out.data<float>();
  const int64_t n = x.numel();
  switch (op) {
    case UnaryOp::Gelu:
      return map1_4(xp, o, n, [](F4 v) { return gelu4(v); });
    case UnaryOp::Silu:
      return map1_4(xp, o, n, [](F4 v) { return v * sigmoid4(v); });
    case UnaryOp::Relu:
      return map1(xp, o, n, kParallelGrain, [](float v) { return v < 0.f ? 0.f : v; });
    case UnaryOp::Exp:
      return map1_4(xp, o, n, [](F4 v) { return exp4(v); });
    case UnaryOp::Log:
      return map1(xp, o, n, kHeavyGrain, [](float v) { return std::log(v); });
    case UnaryOp::Neg:
      return map1(xp, o, n, kParallelGrain, [](float v) { return -v; });
    case UnaryOp::Sqrt:
      return map1(xp, o, n, kHeavyGrain, [](float v) { return std::sqrt(v); });
    case UnaryOp::Square:
      return map1(xp, o, n, kParallelGrain, [](float v) { return v * v; });
    case UnaryOp::Tanh:
      return map1_4(xp, o, n, [](F4 v) { return tanh4(v); });
  }
  STRATA_UNREACHABLE("unary op {}", static_cast<int>(op));
}

void CpuBackend::unary_backward(UnaryOp op, const Tensor& x, const Tensor& dy, Tensor& dx) {
  if (!all_f32(x, dy, dx)) {  // Note [Widening adapter]
    F32Out o(dx);
    unary_backward(op, widened(x), widened(dy), o.get());
    return o.commit();
  }
  STRATA_CHECK(x.is_contiguous() && dy.is_contiguous() && dx.is_contiguous(),
               "unary_backward on non-contiguous tensors");
  const float* xp = x.data<float>();
  const float* g = dy.data<float>();
  float* o = dx.data<float>();
  const int64_t n = x.numel();
  switch (op) {
    case UnaryOp::Gelu:
      return map2_4(xp, g, o, n, [](F4 v, F4 d) { return d * gelu_grad4(v); });
    case UnaryOp::Silu:
      return map2_4(xp, g, o, n, [](F4 v, F4 d) {
        const F4 s = sigmoid4(v);
        return d * (s * (1.0f + v * (1.0f - s)));
      });
    case UnaryOp::Relu:
      return map2(xp, g, o, n, kParallelGrain, [](float v, float d) { return v > 0.f ? d : 0.f; });
    case UnaryOp::Exp:
      return map2_4(xp, g, o, n, [](F4 v, F4 d) { return d * exp4(v); });
    case UnaryOp::Log:
      return map2(xp, g, o, n, kParallelGrain, [](float v, float d) { return d / v; });
    case UnaryOp::Neg:
      return map2(xp, g, o, n, kParallelGrain, [](float, float d) { return -d; });
    case UnaryOp::Sqrt:
      return map2(xp, g, o, n, kHeavyGrain,
                  [](float v, float d) { return d / (2.f * std::sqrt(v)); });
    case UnaryOp::Square:
      return map2(xp, g, o, n, kParallelGrain, [](float v, float d) { return d * (2.f * v); });
    case UnaryOp::Tanh:
      return map2_4(xp, g, o, n, [](F4 v, F4 d) { return d * tanh4_sech2(v).s2; });
  }
  STRATA_UNREACHABLE("unary op {}", static_cast<int>(op));
}

void CpuBackend::bias_add(const Tensor& x, const Tensor& bias, Tensor& out) {
  if (!all_f32(x, bias, out)) {  // Note [Widening adapter]
    F32Out o(out);
    bias_add(widened(x), widened(bias), o.get());
    return o.commit();
  }
  const int64_t c = bias.numel();
  if (x.numel() == 0) return;
  STRATA_CHECK(x.is_contiguous() && out.is_contiguous() && bias.is_contiguous() && c > 0 &&
                   x.numel() % c == 0,
               "bias_add {} + {}", x.str(), bias.str());
  const float* xp = x.data<float>();
  const float* bp = bias.data<float>();
  float* op = out.data<float>();
  parallel_range(
      x.numel() / c,
      [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r) {
          const float* xr = xp + r * c;
          float* orow = op + r * c;
          for (int64_t j = 0; j < c; ++j) orow[j] = xr[j] + bp[j];
        }
      },
      std::max<int64_t>(1, kParallelGrain / c));
}

// Note [Dropout mask]
// Element i is kept iff u32_to_unit_float(philox4x32(key, i / 4)[i % 4]) < 1 - p, exactly the
// mask rng_bernoulli(key, 1 - p) draws, and out[i] = x[i] * mask[i] / (1 - p) evaluated in f32 in
// that order (so a dropped inf/NaN gives NaN, as x * 0 does). Backward calls this with dy and the
// same key; other backends must match it bit for bit.
void CpuBackend::dropout(const Tensor& x, float p, RngKey key, Tensor& out) {
  if (!all_f32(x, out)) {  // Note [Widening adapter]: the same mask, one rounding per element
    F32Out o(out);
    dropout(widened(x), p, key, o.get());
    return o.commit();
  }
  STRATA_CHECK(x.is_contiguous() && out.is_contiguous(), "dropout on non-contiguous {}", x.str());
  const int64_t n = x.numel();
  if (p == 0.f) {
    copy(x, out);
    return;
  }
  const float keep = 1.f - p;
  const float* xp = x.data<float>();
  float* op = out.data<float>();
  // One Philox block feeds four consecutive elements.
  parallel_range((n + 3) / 4,
                 [&](int64_t lo, int64_t hi) {
                   for (int64_t blk = lo; blk < hi; ++blk) {
                     const auto r = philox4x32(key, static_cast<uint64_t>(blk));
                     const int64_t base = blk * 4;
                     const int lanes = static_cast<int>(std::min<int64_t>(4, n - base));
                     for (int l = 0; l < lanes; ++l) {
                       const float m = u32_to_unit_float(r[l]) < keep ? 1.f : 0.f;
                       op[base + l] = xp[base + l] * m / keep;
                     }
                   }
                 },
                 kParallelGrain / 16);
}

}  // namespace strata::tensor::cpu
