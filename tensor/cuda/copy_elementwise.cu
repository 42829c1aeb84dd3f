// CUDA copy (strided, casting), fill, arange, random draws and the elementwise ops.
// Every output element depends only on its own inputs, so results are deterministic; contiguous
// f32 paths move 128 bits per load and store (float4) where the pointers allow.
#include <cmath>

#include "tensor/cuda/common.cuh"

namespace strata::tensor::cuda {

namespace {

constexpr int kThreads = 256;

#define STRATA_GRID_LOOP(i, n)                                              \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += int64_t{gridDim.x} * blockDim.x)

__global__ void copy_kernel(const void* src, int sdt, Strided sv, void* dst, int ddt, Strided dv,
                            int64_t n) {
  STRATA_GRID_LOOP(i, n) {
    const int64_t so = strided_offset(sv, i), d_o = strided_offset(dv, i);
    if (is_float_dtype(sdt) && is_float_dtype(ddt)) {
      store_float(dst, ddt, d_o, load_float(src, sdt, so));
    } else if (is_float_dtype(sdt)) {
      store_int(dst, ddt, d_o, static_cast<int64_t>(load_float(src, sdt, so)));
    } else if (is_float_dtype(ddt)) {
      store_float(dst, ddt, d_o, static_cast<float>(load_int(src, sdt, so)));
    } else {
      store_int(dst, ddt, d_o, load_int(src, sdt, so));
    }
  }
}

__device__ inline void store_double(void* p, int dt, int64_t i, double v) {
  if (is_float_dtype(dt)) {
    store_float(p, dt, i, static_cast<float>(v));
  } else {
    store_int(p, dt, i, static_cast<int64_t>(v));
  }
}

__global__ void fill_kernel(void* dst, int dt, Strided v, int64_t n, double value) {
  STRATA_GRID_LOOP(i, n) store_double(dst, dt, strided_offset(v, i), value);
}

__global__ void arange_kernel(void* dst, int dt, int64_t n, double start, double step) {
  STRATA_GRID_LOOP(i, n) store_double(dst, dt, i, start + static_cast<double>(i) * step);
}

__global__ void uniform_kernel(float* dst, int64_t n, uint64_t seed, uint64_t sid, float lo,
                               float hi) {
  const float span = hi - lo;
  STRATA_GRID_LOOP(i, n) {
    const U4 r = philox(seed, sid, static_cast<uint64_t>(i) >> 2);
    dst[i] = lo + span * unit_float(lane_of(r, static_cast<int>(i & 3)));
  }
}

__global__ void normal_kernel(float* dst, int64_t n, uint64_t seed, uint64_t sid, float mean,
                              float stddev) {
  STRATA_GRID_LOOP(i, n) {
    const U4 r = philox(seed, sid, static_cast<uint64_t>(i) >> 2);
    const int pair = static_cast<int>((i >> 1) & 1);
    const float u1 = (static_cast<float>(lane_of(r, 2 * pair) >> 8) + 1.0f) * (1.0f / 16777216.0f);
    const float u2 = unit_float(lane_of(r, 2 * pair + 1));
    // Full-precision libm-equivalents (no fast-math), so the values match the CPU's to ~1 ulp.
    const float rad = sqrtf(-2.0f * logf(u1));
    const float theta = 6.283185307179586f * u2;
    const float z = (i & 1) ? rad * sinf(theta) : rad * cosf(theta);
    dst[i] = mean + stddev * z;
  }
}

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

template <int OP>
__global__ void binary_kernel(const float* a, Strided av, const float* b, Strided bv, float* out,
                              int64_t n) {
  STRATA_GRID_LOOP(i, n) {
    out[i] = binop(OP, a[strided_offset(av, i)], b[strided_offset(bv, i)]);
  }
}

template <int OP>
__global__ void binary_contig_kernel(const float4* a, const float4* b, float4* out, int64_t n4) {
  STRATA_GRID_LOOP(i, n4) {
    const float4 x = a[i], y = b[i];
    out[i] = make_float4(binop(OP, x.x, y.x), binop(OP, x.y, y.y), binop(OP, x.z, y.z),
                         binop(OP, x.w, y.w));
  }
}

__global__ void affine_kernel(const float* x, Strided xv, float alpha, float beta, float* out,
                              int64_t n) {
  STRATA_GRID_LOOP(i, n) out[i] = alpha * x[strided_offset(xv, i)] + beta;
}

__global__ void axpy_kernel(float alpha, const float* x, float* y, int64_t n) {
  const int64_t n4 = n / 4;
  const float4* x4 = reinterpret_cast<const float4*>(x);
  float4* y4 = reinterpret_cast<float4*>(y);
  STRATA_GRID_LOOP(i, n4) {
    const float4 a = x4[i];
    float4 b = y4[i];
    b.x += alpha * a.x;
    b.y += alpha * a.y;
    b.z += alpha * a.z;
    b.w += alpha * a.w;
    y4[i] = b;
  }
  STRATA_GRID_LOOP(j, n - n4 * 4) y[n4 * 4 + j] += alpha * x[n4 * 4 + j];
}

__global__ void axpy_scalar_kernel(float alpha, const float* x, float* y, int64_t n) {
  STRATA_GRID_LOOP(i, n) y[i] += alpha * x[i];
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

__global__ void unary_kernel(int op, const float* x, float* out, int64_t n) {
  STRATA_GRID_LOOP(i, n) out[i] = unary_f(op, x[i]);
}

__global__ void unary_backward_kernel(int op, const float* x, const float* dy, float* dx,
                                      int64_t n) {
  STRATA_GRID_LOOP(i, n) dx[i] = unary_grad(op, x[i], dy[i]);
}

__global__ void bias_add_kernel(const float* x, const float* bias, float* out, int64_t n,
                                int64_t cols) {
  STRATA_GRID_LOOP(i, n) out[i] = x[i] + bias[i % cols];
}

__global__ void dropout_kernel(const float* x, float* out, int64_t n, float keep, uint64_t seed,
                               uint64_t sid) {
  // One Philox block feeds four consecutive elements, as on the CPU.
  STRATA_GRID_LOOP(blk, (n + 3) / 4) {
    const U4 r = philox(seed, sid, static_cast<uint64_t>(blk));
    for (int l = 0; l < 4 && blk * 4 + l < n; ++l) {
      const float m = unit_float(lane_of(r, l)) < keep ? 1.f : 0.f;
      out[blk * 4 + l] = x[blk * 4 + l] * m / keep;
    }
  }
}

__global__ void rotary_kernel(const float* x, const float* cs, const float* sn, float sign,
                              float* out, int64_t pairs, int64_t t, int64_t h, int64_t half) {
  STRATA_GRID_LOOP(i, pairs) {
    const int64_t row = i / half, k = i % half;
    const int64_t pos = (row / h) % t;
    const float c = cs[pos * half + k], s = sign * sn[pos * half + k];
    const float a = x[2 * i], b = x[2 * i + 1];
    out[2 * i] = a * c - b * s;
    out[2 * i + 1] = a * s + b * c;
  }
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

}  // namespace

void launch_copy(const void* src, int src_dtype, const Strided& src_view, void* dst, int dst_dtype,
                 const Strided& dst_view, int64_t n, Stream stream) {
  copy_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(src, src_dtype, src_view, dst,
                                                                dst_dtype, dst_view, n);
}

void launch_fill(void* dst, int dtype, const Strided& view, int64_t n, double value,
                 Stream stream) {
  fill_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(dst, dtype, view, n, value);
}

void launch_arange(void* dst, int dtype, int64_t n, double start, double step, Stream stream) {
  arange_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(dst, dtype, n, start, step);
}

void launch_random_uniform(float* dst, int64_t n, uint64_t seed, uint64_t stream_id, float lo,
                           float hi, Stream stream) {
  uniform_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(dst, n, seed, stream_id, lo, hi);
}

void launch_random_normal(float* dst, int64_t n, uint64_t seed, uint64_t stream_id, float mean,
                          float stddev, Stream stream) {
  normal_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(dst, n, seed, stream_id, mean,
                                                                  stddev);
}

void launch_binary(int op, const float* a, const Strided& a_view, const float* b,
                   const Strided& b_view, float* out, int64_t n, Stream stream) {
  auto contiguous = [&](const Strided& v) {
    int64_t expect = 1;
    for (int d = v.ndim - 1; d >= 0; --d) {
      if (v.shape[d] != 1 && v.strides[d] != expect) return false;
      expect *= v.shape[d];
    }
    return true;
  };
  const bool vec = n % 4 == 0 && contiguous(a_view) && contiguous(b_view) && aligned16(a) &&
                   aligned16(b) && aligned16(out);
  const int grid = blocks_for(vec ? n / 4 : n, kThreads);
#define STRATA_BINARY_CASE(OP)                                                        \
  case OP:                                                                            \
    if (vec)                                                                          \
      binary_contig_kernel<OP><<<grid, kThreads, 0, stream>>>(                        \
          reinterpret_cast<const float4*>(a), reinterpret_cast<const float4*>(b),     \
          reinterpret_cast<float4*>(out), n / 4);                                     \
    else                                                                              \
      binary_kernel<OP><<<grid, kThreads, 0, stream>>>(a, a_view, b, b_view, out, n); \
    break;
  switch (op) {
    STRATA_BINARY_CASE(0)
    STRATA_BINARY_CASE(1)
    STRATA_BINARY_CASE(2)
    STRATA_BINARY_CASE(3)
  }
#undef STRATA_BINARY_CASE
}

void launch_affine(const float* x, const Strided& x_view, float alpha, float beta, float* out,
                   int64_t n, Stream stream) {
  affine_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(x, x_view, alpha, beta, out, n);
}

void launch_axpy(float alpha, const float* x, float* y, int64_t n, Stream stream) {
  if (!aligned16(x) || !aligned16(y)) {  // a float4 access would fault on these views
    axpy_scalar_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(alpha, x, y, n);
    return;
  }
  axpy_kernel<<<blocks_for((n + 3) / 4, kThreads), kThreads, 0, stream>>>(alpha, x, y, n);
}

void launch_unary(int op, const float* x, float* out, int64_t n, Stream stream) {
  unary_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(op, x, out, n);
}

void launch_unary_backward(int op, const float* x, const float* dy, float* dx, int64_t n,
                           Stream stream) {
  unary_backward_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(op, x, dy, dx, n);
}

void launch_bias_add(const float* x, const float* bias, float* out, int64_t rows, int64_t cols,
                     Stream stream) {
  const int64_t n = rows * cols;
  bias_add_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(x, bias, out, n, cols);
}

void launch_dropout(const float* x, float* out, int64_t n, float p, uint64_t seed,
                    uint64_t stream_id, Stream stream) {
  dropout_kernel<<<blocks_for((n + 3) / 4, kThreads), kThreads, 0, stream>>>(x, out, n, 1.f - p,
                                                                             seed, stream_id);
}

void launch_rotary(const float* x, const float* cos, const float* sin, bool inverse, float* out,
                   int64_t b, int64_t t, int64_t h, int64_t d, Stream stream) {
  const int64_t pairs = b * t * h * (d / 2);
  rotary_kernel<<<blocks_for(pairs, kThreads), kThreads, 0, stream>>>(
      x, cos, sin, inverse ? -1.f : 1.f, out, pairs, t, h, d / 2);
}

}  // namespace strata::tensor::cuda
