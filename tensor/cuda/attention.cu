// Strata's own CUDA attention (the fallback when cuDNN's fused attention is not available).
//
// Note [CUDA fallback attention]
// One warp owns one query row (forward, dq) or one key row (dk, dv), and walks the other side's
// rows in index order with the online softmax of Note [CPU flash attention]; each lane holds
// ceil(D / 32) elements of the row, dot products are warp shuffles. Only lse [B, H, Tq] is kept
// for backward; P is recomputed as exp(s - lse). Every sum has one owner and a fixed order, so
// the results are deterministic. It is simple rather than fast (no shared-memory tiling, no
// tensor cores): the fast path is cuDNN's flash attention. The kernels are templates on the
// element type of q, k, v, out, dout, dq, dk, dv (Note [CUDA low-precision kernels] in
// common.cuh): rows are widened to f32 as they are read, every sum is f32, lse and the D_i
// scratch are f32, and each output element is rounded once when written.
#include <cmath>

#include "tensor/cuda/common.cuh"

namespace strata::tensor::cuda {

namespace {

constexpr int kPer = kAttentionMaxHeadDim / 32;  // elements per lane
constexpr int kWarpsPerBlock = 4;

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T>
__device__ inline void load_row(const T* p, int64_t d, int lane, float (&r)[kPer]) {
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int64_t k = lane + 32 * e;
    r[e] = k < d ? to_f32(p[k]) : 0.f;
  }
}

template <typename T>
__device__ inline float dot_row(const float (&a)[kPer], const T* p, int64_t d, int lane) {
  float s = 0;
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int64_t k = lane + 32 * e;
    if (k < d) s += a[e] * to_f32(p[k]);
  }
  return warp_sum(s);
}

// Last key query i may see (-1: none).
__device__ inline int64_t last_key(bool causal, int64_t i, int64_t tq, int64_t tk) {
  if (!causal) return tk - 1;
  const int64_t j = i + (tk - tq);
  return j < tk - 1 ? j : tk - 1;
}

template <typename T>
__global__ void attn_fwd(const T* q, const T* k, const T* v, bool causal, float scale, T* out,
                         float* lse, int64_t bh, int64_t tq, int64_t tk, int64_t d) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  if (row >= bh * tq) return;
  const int64_t head = row / tq, i = row % tq;
  const T* kh = k + head * tk * d;
  const T* vh = v + head * tk * d;
  float qr[kPer], acc[kPer];
  load_row(q + row * d, d, lane, qr);
#pragma unroll
  for (int e = 0; e < kPer; ++e) acc[e] = 0.f;
  float m = -INFINITY, l = 0.f;
  const int64_t jmax = last_key(causal, i, tq, tk);
  for (int64_t j = 0; j <= jmax; ++j) {
    const float s = scale * dot_row(qr, kh + j * d, d, lane);
    const float mn = fmaxf(m, s);
    const float corr = expf(m - mn), p = expf(s - mn);
    l = l * corr + p;
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int64_t kk = lane + 32 * e;
      acc[e] = acc[e] * corr + (kk < d ? p * to_f32(vh[j * d + kk]) : 0.f);
    }
    m = mn;
  }
  T* o = out + row * d;
  const float inv = jmax >= 0 ? 1.f / l : 0.f;
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int64_t kk = lane + 32 * e;
    if (kk < d) o[kk] = from_f32<T>(acc[e] * inv);
  }
  if (lane == 0) lse[row] = jmax >= 0 ? m + logf(l) : -INFINITY;
}

// D_i and dq_i for one query row per warp.
template <typename T>
__global__ void attn_bwd_dq(const T* q, const T* k, const T* v, const T* out, const float* lse,
                            const T* dout, bool causal, float scale, T* dq, float* dsum, int64_t bh,
                            int64_t tq, int64_t tk, int64_t d) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  if (row >= bh * tq) return;
  const int64_t head = row / tq, i = row % tq;
  const T* kh = k + head * tk * d;
  const T* vh = v + head * tk * d;
  float qr[kPer], gr[kPer], acc[kPer];
  load_row(q + row * d, d, lane, qr);
  load_row(dout + row * d, d, lane, gr);
  const float di = dot_row(gr, out + row * d, d, lane);
  if (lane == 0) dsum[row] = di;
#pragma unroll
  for (int e = 0; e < kPer; ++e) acc[e] = 0.f;
  const int64_t jmax = last_key(causal, i, tq, tk);
  const float li = lse[row];
  for (int64_t j = 0; j <= jmax; ++j) {
    const float p = expf(scale * dot_row(qr, kh + j * d, d, lane) - li);
    const float ds = p * (dot_row(gr, vh + j * d, d, lane) - di);
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int64_t kk = lane + 32 * e;
      if (kk < d) acc[e] += ds * to_f32(kh[j * d + kk]);
    }
  }
  T* o = dq + row * d;
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int64_t kk = lane + 32 * e;
    if (kk < d) o[kk] = from_f32<T>(scale * acc[e]);
  }
}

// dk_j and dv_j for one key row per warp (needs D_i from attn_bwd_dq).
template <typename T>
__global__ void attn_bwd_dkv(const T* q, const T* k, const T* v, const float* lse, const T* dout,
                             const float* dsum, bool causal, float scale, T* dk, T* dv, int64_t bh,
                             int64_t tq, int64_t tk, int64_t d) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  if (row >= bh * tk) return;
  const int64_t head = row / tk, j = row % tk;
  const T* qh = q + head * tq * d;
  const T* gh = dout + head * tq * d;
  float kr[kPer], vr[kPer], ak[kPer], av[kPer];
  load_row(k + row * d, d, lane, kr);
  load_row(v + row * d, d, lane, vr);
#pragma unroll
  for (int e = 0; e < kPer; ++e) ak[e] = av[e] = 0.f;
  // Query i sees key j when j <= i + (tk - tq), i.e. i >= j - (tk - tq).
  int64_t i0 = causal ? j - (tk - tq) : 0;
  if (i0 < 0) i0 = 0;
  for (int64_t i = i0; i < tq; ++i) {
    const float p = expf(scale * dot_row(kr, qh + i * d, d, lane) - lse[head * tq + i]);
    const float ds = p * (dot_row(vr, gh + i * d, d, lane) - dsum[head * tq + i]);
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int64_t kk = lane + 32 * e;
      if (kk < d) {
        av[e] += p * to_f32(gh[i * d + kk]);
        ak[e] += ds * to_f32(qh[i * d + kk]);
      }
    }
  }
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int64_t kk = lane + 32 * e;
    if (kk < d) {
      dk[row * d + kk] = from_f32<T>(scale * ak[e]);
      dv[row * d + kk] = from_f32<T>(av[e]);
    }
  }
}

unsigned warps_grid(int64_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

bool launch_attention_forward(int dt, const void* q, const void* k, const void* v, bool causal,
                              float scale, void* out, float* lse, int64_t bh, int64_t tq,
                              int64_t tk, int64_t d, Stream stream) {
  return dispatch_float(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (bh * tq == 0) return;
    STRATA_LAUNCH(warps_grid(bh * tq), 32 * kWarpsPerBlock, 0, stream, attn_fwd<T>)
    (static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), causal, scale,
     static_cast<T*>(out), lse, bh, tq, tk, d);
  });
}

bool launch_attention_backward(int dt, const void* q, const void* k, const void* v, const void* out,
                               const float* lse, const void* dout, bool causal, float scale,
                               void* dq, void* dk, void* dv, float* scratch, int64_t bh, int64_t tq,
                               int64_t tk, int64_t d, Stream stream) {
  return dispatch_float(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pq = static_cast<const T*>(q);
    const T* pk = static_cast<const T*>(k);
    const T* pv = static_cast<const T*>(v);
    const T* pg = static_cast<const T*>(dout);
    if (bh * tq > 0)
      STRATA_LAUNCH(warps_grid(bh * tq), 32 * kWarpsPerBlock, 0, stream, attn_bwd_dq<T>)
      (pq, pk, pv, static_cast<const T*>(out), lse, pg, causal, scale, static_cast<T*>(dq), scratch,
       bh, tq, tk, d);
    if (bh * tk > 0)
      STRATA_LAUNCH(warps_grid(bh * tk), 32 * kWarpsPerBlock, 0, stream, attn_bwd_dkv<T>)
      (pq, pk, pv, lse, pg, scratch, causal, scale, static_cast<T*>(dk), static_cast<T*>(dv), bh,
       tq, tk, d);
  });
}

}  // namespace strata::tensor::cuda
