// CUDA softmax over the last dim, forward and backward (Note [CUDA softmax]). The kernels are
// templates on the element type (Note [CUDA low-precision kernels] in common.cuh); every sum is
// f32.
#include <initializer_list>

#include "tensor/cuda/common.cuh"

namespace strata::tensor::cuda {

namespace {

// Note [CUDA softmax]: one block per row, three passes (max, sum of exp, write) for the forward,
// two (sum of y * dy, write) for the backward. With kPacked (c a multiple of the pack and every
// row 16-byte aligned, which the launcher checks) each thread reads and writes 128-bit packs of
// 4 f32 or 8 bf16/f16; otherwise one element at a time. Each thread's subset is fixed by c and
// the block size, so the sums (and the bits) are the same on every run.
template <typename T, bool kPacked, typename F>
__device__ __forceinline__ void for_row(const T* r, int64_t c, F f) {
  if (kPacked) {
    constexpr int P = Pack<T>::kN;
    const Pack<T>* rp = reinterpret_cast<const Pack<T>*>(r);
    for (int64_t k = threadIdx.x; k < c / P; k += blockDim.x) {
      const Pack<T> pk = rp[k];
#pragma unroll
      for (int e = 0; e < P; ++e) f(to_f32(pk.v[e]));
    }
  } else {
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) f(to_f32(r[j]));
  }
}

template <typename T, bool kPacked>
__global__ void softmax_fwd(const T* x, T* y, int64_t c) {
  __shared__ float sh[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * c;
  float m = -INFINITY;
  for_row<T, kPacked>(xr, c, [&](float v) { m = fmaxf(m, v); });
  m = block_max(m, sh);
  float s = 0;
  for_row<T, kPacked>(xr, c, [&](float v) { s += expf(v - m); });
  const float inv = 1.f / block_sum(s, sh);
  T* yr = y + row * c;
  if (kPacked) {
    constexpr int P = Pack<T>::kN;
    const Pack<T>* xp = reinterpret_cast<const Pack<T>*>(xr);
    Pack<T>* yp = reinterpret_cast<Pack<T>*>(yr);
    for (int64_t k = threadIdx.x; k < c / P; k += blockDim.x) {
      const Pack<T> in = xp[k];
      Pack<T> out;
#pragma unroll
      for (int e = 0; e < P; ++e) out.v[e] = from_f32<T>(expf(to_f32(in.v[e]) - m) * inv);
      yp[k] = out;
    }
  } else {
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
      yr[j] = from_f32<T>(expf(to_f32(xr[j]) - m) * inv);
  }
}

template <typename T, bool kPacked>
__global__ void softmax_bwd(const T* y, const T* dy, T* dx, int64_t c) {
  __shared__ float sh[32];
  const int64_t row = blockIdx.x;
  const T* yr = y + row * c;
  const T* gr = dy + row * c;
  T* dr = dx + row * c;
  float s = 0;
  if (kPacked) {
    constexpr int P = Pack<T>::kN;
    const Pack<T>*yp = reinterpret_cast<const Pack<T>*>(yr),
          *gp = reinterpret_cast<const Pack<T>*>(gr);
    for (int64_t k = threadIdx.x; k < c / P; k += blockDim.x) {
      const Pack<T> a = yp[k], b = gp[k];
#pragma unroll
      for (int e = 0; e < P; ++e) s += to_f32(a.v[e]) * to_f32(b.v[e]);
    }
    s = block_sum(s, sh);
    Pack<T>* dp = reinterpret_cast<Pack<T>*>(dr);
    for (int64_t k = threadIdx.x; k < c / P; k += blockDim.x) {
      const Pack<T> a = yp[k], b = gp[k];
      Pack<T> out;
#pragma unroll
      for (int e = 0; e < P; ++e) out.v[e] = from_f32<T>(to_f32(a.v[e]) * (to_f32(b.v[e]) - s));
      dp[k] = out;
    }
  } else {
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) s += to_f32(yr[j]) * to_f32(gr[j]);
    s = block_sum(s, sh);
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
      dr[j] = from_f32<T>(to_f32(yr[j]) * (to_f32(gr[j]) - s));
  }
}

}  // namespace

#define STRATA_FLOAT_TYPE(tag) typename decltype(tag)::type

// Note [CUDA softmax]: packs when every row starts 16-byte aligned.
template <typename T>
bool softmax_packs(int64_t c, std::initializer_list<const void*> ptrs) {
  if (c % Pack<T>::kN != 0) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}

bool launch_softmax_forward(int dt, const void* x, void* y, int64_t n, int64_t c, Stream stream) {
  return dispatch_float(dt, [&](auto tag) {
    using T = STRATA_FLOAT_TYPE(tag);
    if (n == 0) return;
    const auto* xt = static_cast<const T*>(x);
    auto* yt = static_cast<T*>(y);
    if (softmax_packs<T>(c, {x, y}))
      STRATA_LAUNCH(static_cast<unsigned>(n), row_threads(c), 0, stream, softmax_fwd<T, true>)
    (xt, yt, c);
    else STRATA_LAUNCH(static_cast<unsigned>(n), row_threads(c), 0, stream, softmax_fwd<T, false>)(
        xt, yt, c);
  });
}

bool launch_softmax_backward(int dt, const void* y, const void* dy, void* dx, int64_t n, int64_t c,
                             Stream stream) {
  return dispatch_float(dt, [&](auto tag) {
    using T = STRATA_FLOAT_TYPE(tag);
    if (n == 0) return;
    const auto* yt = static_cast<const T*>(y);
    const auto* gt = static_cast<const T*>(dy);
    auto* dt_ = static_cast<T*>(dx);
    if (softmax_packs<T>(c, {y, dy, dx}))
      STRATA_LAUNCH(static_cast<unsigned>(n), row_threads(c), 0, stream, softmax_bwd<T, true>)
    (yt, gt, dt_, c);
    else STRATA_LAUNCH(static_cast<unsigned>(n), row_threads(c), 0, stream, softmax_bwd<T, false>)(
        yt, gt, dt_, c);
  });
}

#undef STRATA_FLOAT_TYPE

}  // namespace strata::tensor::cuda
