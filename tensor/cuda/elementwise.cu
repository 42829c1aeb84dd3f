// CUDA elementwise ops: binary, affine, axpy, unary and its backward, bias_add, dropout, rotary.
// Every output element depends only on its own inputs, so results are deterministic. The float
// kernels are templates on the element type (Note [CUDA low-precision kernels] in common.cuh);
// contiguous paths move 128 bits per load and store (Pack: 4 floats or 8 bf16/f16) when every
// pointer is 16-byte aligned, with a scalar tail, and fall back to one element per thread
// otherwise. The f32 instantiations compute exactly what the f32-only kernels computed before.
#include <cmath>
#include <cstring>
#include <type_traits>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/elementwise_common.cuh"

namespace strata::tensor::cuda {

namespace {

__device__ inline float binop(int op, float a, float b) {
  switch (op) {
    case 0:
      return a + b;
    case 1:
      return a - b;
    case 2:
      return a * b;
    default:
      return a / b;
  }
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi); tanh GELU as on the CPU
constexpr float kGeluCube = 0.044715f;

__device__ inline float unary_f(int op, float v) {
  switch (op) {
    case 0:
      return 0.5f * v * (1.0f + tanhf(kGeluScale * (v + kGeluCube * v * v * v)));
    case 1:
      return v / (1.0f + expf(-v));
    case 2:
      return v < 0.f ? 0.f : v;
    case 3:
      return expf(v);
    case 4:
      return logf(v);
    case 5:
      return -v;
    case 6:
      return sqrtf(v);
    case 7:
      return v * v;
    default:
      return tanhf(v);
  }
}

__device__ inline float unary_grad(int op, float v, float d) {
  switch (op) {
    case 0: {
      const float t = tanhf(kGeluScale * (v + kGeluCube * v * v * v));
      const float du = kGeluScale * (1.0f + 3.0f * kGeluCube * v * v);
      return d * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
    }
    case 1: {
      const float s = 1.0f / (1.0f + expf(-v));
      return d * (s * (1.0f + v * (1.0f - s)));
    }
    case 2:
      return v > 0.f ? d : 0.f;
    case 3:
      return d * expf(v);
    case 4:
      return d / v;
    case 5:
      return -d;
    case 6:
      return d / (2.f * sqrtf(v));
    case 7:
      return 2.f * v * d;
    default: {
      const float t = tanhf(v);
      return d * (1.f - t * t);
    }
  }
}

// The element functions of the contiguous map kernels.
template <int OP>
struct BinaryFn {
  __device__ float operator()(float a, float b) const { return binop(OP, a, b); }
};
struct UnaryFn {
  int op;
  __device__ float operator()(float v) const { return unary_f(op, v); }
};
struct UnaryGradFn {
  int op;
  __device__ float operator()(float v, float d) const { return unary_grad(op, v, d); }
};

// out[i] = f(x[i]), contiguous; `vec`: every pointer is 16-byte aligned (packs + scalar tail).
template <typename T, typename F>
__global__ void map1_kernel(F f, const T* x, T* out, int64_t n, bool vec) {
  constexpr int N = Pack<T>::kN;
  const int64_t np = vec ? n / N : 0;
  STRATA_GRID_LOOP(p, np) {
    const Pack<T> a = reinterpret_cast<const Pack<T>*>(x)[p];
    Pack<T> r;
#pragma unroll
    for (int e = 0; e < N; ++e) r.v[e] = from_f32<T>(f(to_f32(a.v[e])));
    reinterpret_cast<Pack<T>*>(out)[p] = r;
  }
  STRATA_GRID_LOOP(j, n - np * N) {
    const int64_t i = np * N + j;
    out[i] = from_f32<T>(f(to_f32(x[i])));
  }
}

// out[i] = f(x[i], y[i]), contiguous; as map1_kernel.
template <typename T, typename F>
__global__ void map2_kernel(F f, const T* x, const T* y, T* out, int64_t n, bool vec) {
  constexpr int N = Pack<T>::kN;
  const int64_t np = vec ? n / N : 0;
  STRATA_GRID_LOOP(p, np) {
    const Pack<T> a = reinterpret_cast<const Pack<T>*>(x)[p];
    const Pack<T> b = reinterpret_cast<const Pack<T>*>(y)[p];
    Pack<T> r;
#pragma unroll
    for (int e = 0; e < N; ++e) r.v[e] = from_f32<T>(f(to_f32(a.v[e]), to_f32(b.v[e])));
    reinterpret_cast<Pack<T>*>(out)[p] = r;
  }
  STRATA_GRID_LOOP(j, n - np * N) {
    const int64_t i = np * N + j;
    out[i] = from_f32<T>(f(to_f32(x[i]), to_f32(y[i])));
  }
}

template <typename T, int OP>
__global__ void binary_kernel(const T* a, Strided av, const T* b, Strided bv, T* out, int64_t n) {
  STRATA_GRID_LOOP(i, n) {
    out[i] =
        from_f32<T>(binop(OP, to_f32(a[strided_offset(av, i)]), to_f32(b[strided_offset(bv, i)])));
  }
}

template <typename T>
__global__ void affine_kernel(const T* x, Strided xv, float alpha, float beta, T* out, int64_t n) {
  STRATA_GRID_LOOP(i, n) out[i] = from_f32<T>(alpha * to_f32(x[strided_offset(xv, i)]) + beta);
}

// y = round_y(f32(y) + alpha * f32(x)), in groups of K elements (Note [CUDA element groups]):
// 128-bit words of both arrays when both are 16-byte aligned (`wide`), whether or not they share
// a dtype (gradient accumulation adds bf16 into f32 and back).
template <typename TX, typename TY>
__global__ void axpy_kernel(float alpha, const TX* x, TY* y, int64_t n, bool wide) {
  constexpr int K = group_width<TX, TY>;
  for_each_group<K>(n, wide, [&](int64_t i0, int64_t valid, bool w) {
    float a[K], b[K];
    load_group<K>(w, x + i0, valid, a);
    load_group<K>(w, y + i0, valid, b);
#pragma unroll
    for (int e = 0; e < K; ++e) b[e] += alpha * a[e];
    store_group<K>(w, y + i0, valid, b);
  });
}

// out = x + bias[i % cols]; `vec`: pointers aligned and cols a multiple of the pack width, so a
// pack never straddles a row and its bias slice is an aligned pack too.
template <typename T>
__global__ void bias_add_kernel(const T* x, const T* bias, T* out, int64_t n, int64_t cols,
                                bool vec) {
  constexpr int N = Pack<T>::kN;
  const int64_t np = vec ? n / N : 0;
  STRATA_GRID_LOOP(p, np) {
    const Pack<T> a = reinterpret_cast<const Pack<T>*>(x)[p];
    const Pack<T> b = reinterpret_cast<const Pack<T>*>(bias)[(p * N % cols) / N];
    Pack<T> r;
#pragma unroll
    for (int e = 0; e < N; ++e) r.v[e] = from_f32<T>(to_f32(a.v[e]) + to_f32(b.v[e]));
    reinterpret_cast<Pack<T>*>(out)[p] = r;
  }
  STRATA_GRID_LOOP(j, n - np * N) {
    const int64_t i = np * N + j;
    out[i] = from_f32<T>(to_f32(x[i]) + to_f32(bias[i % cols]));
  }
}

template <typename T>
__global__ void dropout_kernel(const T* x, T* out, int64_t n, float keep, uint64_t seed,
                               uint64_t sid, bool wide) {
  // One Philox block feeds four consecutive elements, as on the CPU; a group (Note [CUDA element
  // groups]) is one block's four f32 or two blocks' eight bf16/f16.
  constexpr int K = group_width<T>;
  static_assert(K % 4 == 0, "a group is whole Philox blocks");
  for_each_group<K>(n, wide, [&](int64_t i0, int64_t valid, bool w) {
    float v[K];
    load_group<K>(w, x + i0, valid, v);
#pragma unroll
    for (int q = 0; q < K / 4; ++q) {
      const U4 r = philox(seed, sid, static_cast<uint64_t>(i0 / 4 + q));
#pragma unroll
      for (int l = 0; l < 4; ++l) {
        const float m = unit_float(lane_of(r, l)) < keep ? 1.f : 0.f;
        v[q * 4 + l] = v[q * 4 + l] * m / keep;
      }
    }
    store_group<K>(w, out + i0, valid, v);
  });
}

// Rows of d = 2 * half elements, pairs (2k, 2k + 1) rotated by the angle of (position, k).
// Groups of K elements (K / 2 pairs, Note [CUDA element groups]); `wide` when x and out are
// 16-byte aligned and half is a multiple of K / 2, so that a group never straddles a row. The
// row, k and position are carried from pair to pair (one division per group and per row).
template <typename T>
__global__ void rotary_kernel(const T* x, const void* cs, const void* sn, int cs_dt, float sign,
                              T* out, int64_t pairs, int64_t t, int64_t h, int64_t half,
                              bool wide) {
  constexpr int K = group_width<T>;
  for_each_group<K>(2 * pairs, wide, [&](int64_t i0, int64_t valid, bool w) {
    float v[K];
    load_group<K>(w, x + i0, valid, v);
    int64_t row = i0 / 2 / half, k = i0 / 2 % half, pos = row / h % t;
#pragma unroll
    for (int q = 0; q < K / 2; ++q) {
      if (2 * q < valid) {
        const float c = load_float(cs, cs_dt, pos * half + k);
        const float s = sign * load_float(sn, cs_dt, pos * half + k);
        const float a = v[2 * q], b = v[2 * q + 1];
        v[2 * q] = a * c - b * s;
        v[2 * q + 1] = a * s + b * c;
      }
      if (++k == half) {
        k = 0;
        pos = ++row / h % t;
      }
    }
    store_group<K>(w, out + i0, valid, v);
  });
}

}  // namespace

bool launch_binary(int op, int dt, const void* a, const Strided& a_view, const void* b,
                   const Strided& b_view, void* out, int64_t n, Stream stream) {
  const bool contig = contiguous(a_view) && contiguous(b_view);
  const bool vec = contig && aligned16(a) && aligned16(b) && aligned16(out);
  return dispatch_float(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    T* po = static_cast<T*>(out);
    auto run = [&](auto fn, auto strided) {
      if (contig) STRATA_LAUNCH(grid_for<T>(n, vec), kThreads, 0, stream, map2_kernel)
      (fn, pa, pb, po, n, vec);
      else STRATA_LAUNCH(blocks_for(n, kThreads), kThreads, 0, stream, strided)(pa, a_view, pb,
                                                                                b_view, po, n);
    };
    switch (op) {
      case 0:
        run(BinaryFn<0>{}, binary_kernel<T, 0>);
        break;
      case 1:
        run(BinaryFn<1>{}, binary_kernel<T, 1>);
        break;
      case 2:
        run(BinaryFn<2>{}, binary_kernel<T, 2>);
        break;
      default:
        run(BinaryFn<3>{}, binary_kernel<T, 3>);
        break;
    }
  });
}

bool launch_affine(int dt, const void* x, const Strided& x_view, float alpha, float beta, void* out,
                   int64_t n, Stream stream) {
  return dispatch_float(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    STRATA_LAUNCH(blocks_for(n, kThreads), kThreads, 0, stream, affine_kernel<T>)
    (static_cast<const T*>(x), x_view, alpha, beta, static_cast<T*>(out), n);
  });
}

bool launch_axpy(float alpha, const void* x, int x_dtype, void* y, int y_dtype, int64_t n,
                 Stream stream) {
  // A pack access would fault on unaligned views: those take the one-element path.
  const bool wide = aligned16(x) && aligned16(y);
  bool ok = false;
  dispatch_float(x_dtype, [&](auto xt) {
    using TX = typename decltype(xt)::type;
    ok = dispatch_float(y_dtype, [&](auto yt) {
      using TY = typename decltype(yt)::type;
      constexpr int K = group_width<TX, TY>;
      STRATA_LAUNCH(blocks_for((n + K - 1) / K, kThreads), kThreads, 0, stream, axpy_kernel<TX, TY>)
      (alpha, static_cast<const TX*>(x), static_cast<TY*>(y), n, wide);
    });
  });
  return ok;
}

bool launch_unary(int op, int dt, const void* x, void* out, int64_t n, Stream stream) {
  const bool vec = aligned16(x) && aligned16(out);
  return dispatch_float(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    STRATA_LAUNCH(grid_for<T>(n, vec), kThreads, 0, stream, map1_kernel)
    (UnaryFn{op}, static_cast<const T*>(x), static_cast<T*>(out), n, vec);
  });
}

bool launch_unary_backward(int op, int dt, const void* x, const void* dy, void* dx, int64_t n,
                           Stream stream) {
  const bool vec = aligned16(x) && aligned16(dy) && aligned16(dx);
  return dispatch_float(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    STRATA_LAUNCH(grid_for<T>(n, vec), kThreads, 0, stream, map2_kernel)
    (UnaryGradFn{op}, static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dx), n,
     vec);
  });
}

bool launch_bias_add(int dt, const void* x, const void* bias, void* out, int64_t rows, int64_t cols,
                     Stream stream) {
  const int64_t n = rows * cols;
  return dispatch_float(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool vec = cols % Pack<T>::kN == 0 && aligned16(x) && aligned16(bias) && aligned16(out);
    STRATA_LAUNCH(grid_for<T>(n, vec), kThreads, 0, stream, bias_add_kernel<T>)
    (static_cast<const T*>(x), static_cast<const T*>(bias), static_cast<T*>(out), n, cols, vec);
  });
}

bool launch_dropout(int dt, const void* x, void* out, int64_t n, float p, uint64_t seed,
                    uint64_t stream_id, Stream stream) {
  return dispatch_float(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int K = group_width<T>;
    STRATA_LAUNCH(blocks_for((n + K - 1) / K, kThreads), kThreads, 0, stream, dropout_kernel<T>)
    (static_cast<const T*>(x), static_cast<T*>(out), n, 1.f - p, seed, stream_id,
     aligned16(x) && aligned16(out));
  });
}

bool launch_rotary(int dt, const void* x, const void* cos, const void* sin, int cs_dtype,
                   bool inverse, void* out, int64_t b, int64_t t, int64_t h, int64_t d,
                   Stream stream) {
  if (cs_dtype > kF16) return false;
  const int64_t pairs = b * t * h * (d / 2);
  return dispatch_float(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int K = group_width<T>;
    const bool wide = (d / 2) % (K / 2) == 0 && aligned16(x) && aligned16(out);
    STRATA_LAUNCH(blocks_for((2 * pairs + K - 1) / K, kThreads), kThreads, 0, stream,
                  rotary_kernel<T>)
    (static_cast<const T*>(x), cos, sin, cs_dtype, inverse ? -1.f : 1.f, static_cast<T*>(out),
     pairs, t, h, d / 2, wide);
  });
}

}  // namespace strata::tensor::cuda
