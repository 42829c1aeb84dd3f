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
// scratch are f32, and each output element is rounded once when written. Every operand but lse
// is addressed through its (B, H, T) strides (Note [Strided attention operands] in
// tensor/backend.h): q, k, v may be views of one packed qkv buffer, out a [B, T, H, D] buffer.
#include <cmath>

#include "tensor/cuda/attention_common.cuh"

namespace strata::tensor::cuda {

namespace {

constexpr int kPer = kAttentionMaxHeadDim / 32;  // elements per lane
constexpr int kWarpsPerBlock = 4;

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
  return attn_warp_sum(s);
}

template <typename T>
__global__ void attn_fwd(const T* q, const T* k, const T* v, bool causal, float scale, T* out,
                         float* lse, AttentionShape s) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  const int64_t tq = s.tq, tk = s.tk, d = s.d;
  if (row >= s.b * s.h * tq) return;
  const int64_t head = row / tq, i = row % tq, hb = head / s.h, hh = head % s.h;
  const T* kh = k + row_at(s.k, hb, hh, 0);
  const T* vh = v + row_at(s.v, hb, hh, 0);
  const int64_t ks = s.k.t, vs = s.v.t;
  float qr[kPer], acc[kPer];
  load_row(q + row_at(s.q, hb, hh, i), d, lane, qr);
#pragma unroll
  for (int e = 0; e < kPer; ++e) acc[e] = 0.f;
  float m = -INFINITY, l = 0.f;
  const int64_t jmax = last_key(causal, i, tq, tk);
  for (int64_t j = 0; j <= jmax; ++j) {
    const float sc = scale * dot_row(qr, kh + j * ks, d, lane);
    const float mn = fmaxf(m, sc);
    const float corr = expf(m - mn), p = expf(sc - mn);
    l = l * corr + p;
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int64_t kk = lane + 32 * e;
      acc[e] = acc[e] * corr + (kk < d ? p * to_f32(vh[j * vs + kk]) : 0.f);
    }
    m = mn;
  }
  T* o = out + row_at(s.out, hb, hh, i);
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
                            const T* dout, bool causal, float scale, T* dq, float* dsum,
                            AttentionShape s) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  const int64_t tq = s.tq, tk = s.tk, d = s.d;
  if (row >= s.b * s.h * tq) return;
  const int64_t head = row / tq, i = row % tq, hb = head / s.h, hh = head % s.h;
  const T* kh = k + row_at(s.k, hb, hh, 0);
  const T* vh = v + row_at(s.v, hb, hh, 0);
  const int64_t ks = s.k.t, vs = s.v.t;
  float qr[kPer], gr[kPer], acc[kPer];
  load_row(q + row_at(s.q, hb, hh, i), d, lane, qr);
  load_row(dout + row_at(s.dout, hb, hh, i), d, lane, gr);
  const float di = dot_row(gr, out + row_at(s.out, hb, hh, i), d, lane);
  if (lane == 0) dsum[row] = di;
#pragma unroll
  for (int e = 0; e < kPer; ++e) acc[e] = 0.f;
  const int64_t jmax = last_key(causal, i, tq, tk);
  const float li = lse[row];
  for (int64_t j = 0; j <= jmax; ++j) {
    const float p = expf(scale * dot_row(qr, kh + j * ks, d, lane) - li);
    const float ds = p * (dot_row(gr, vh + j * vs, d, lane) - di);
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int64_t kk = lane + 32 * e;
      if (kk < d) acc[e] += ds * to_f32(kh[j * ks + kk]);
    }
  }
  T* o = dq + row_at(s.dq, hb, hh, i);
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int64_t kk = lane + 32 * e;
    if (kk < d) o[kk] = from_f32<T>(scale * acc[e]);
  }
}

// dk_j and dv_j for one key row per warp (needs D_i from attn_bwd_dq).
template <typename T>
__global__ void attn_bwd_dkv(const T* q, const T* k, const T* v, const float* lse, const T* dout,
                             const float* dsum, bool causal, float scale, T* dk, T* dv,
                             AttentionShape s) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  const int64_t tq = s.tq, tk = s.tk, d = s.d;
  if (row >= s.b * s.h * tk) return;
  const int64_t head = row / tk, j = row % tk, hb = head / s.h, hh = head % s.h;
  const T* qh = q + row_at(s.q, hb, hh, 0);
  const T* gh = dout + row_at(s.dout, hb, hh, 0);
  const int64_t qs = s.q.t, gs = s.dout.t;
  float kr[kPer], vr[kPer], ak[kPer], av[kPer];
  load_row(k + row_at(s.k, hb, hh, j), d, lane, kr);
  load_row(v + row_at(s.v, hb, hh, j), d, lane, vr);
#pragma unroll
  for (int e = 0; e < kPer; ++e) ak[e] = av[e] = 0.f;
  // Query i sees key j when j <= i + (tk - tq), i.e. i >= j - (tk - tq).
  int64_t i0 = causal ? j - (tk - tq) : 0;
  if (i0 < 0) i0 = 0;
  for (int64_t i = i0; i < tq; ++i) {
    const float p = expf(scale * dot_row(kr, qh + i * qs, d, lane) - lse[head * tq + i]);
    const float ds = p * (dot_row(vr, gh + i * gs, d, lane) - dsum[head * tq + i]);
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int64_t kk = lane + 32 * e;
      if (kk < d) {
        av[e] += p * to_f32(gh[i * gs + kk]);
        ak[e] += ds * to_f32(qh[i * qs + kk]);
      }
    }
  }
  T* ok = dk + row_at(s.dk, hb, hh, j);
  T* ov = dv + row_at(s.dv, hb, hh, j);
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int64_t kk = lane + 32 * e;
    if (kk < d) {
      ok[kk] = from_f32<T>(scale * ak[e]);
      ov[kk] = from_f32<T>(av[e]);
    }
  }
}

unsigned warps_grid(int64_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

bool launch_attention_forward(int dt, const void* q, const void* k, const void* v, bool causal,
                              float scale, void* out, float* lse, const AttentionShape& s,
                              Stream stream) {
  return dispatch_float(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t rows = s.b * s.h * s.tq;
    if (rows == 0) return;
    STRATA_LAUNCH(warps_grid(rows), 32 * kWarpsPerBlock, 0, stream, attn_fwd<T>)
    (static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), causal, scale,
     static_cast<T*>(out), lse, s);
  });
}

bool launch_attention_backward(int dt, const void* q, const void* k, const void* v, const void* out,
                               const float* lse, const void* dout, bool causal, float scale,
                               void* dq, void* dk, void* dv, float* scratch,
                               const AttentionShape& s, Stream stream) {
  const int64_t bh = s.b * s.h, tq = s.tq, tk = s.tk;
  return dispatch_float(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pq = static_cast<const T*>(q);
    const T* pk = static_cast<const T*>(k);
    const T* pv = static_cast<const T*>(v);
    const T* pg = static_cast<const T*>(dout);
    if (bh * tq > 0)
      STRATA_LAUNCH(warps_grid(bh * tq), 32 * kWarpsPerBlock, 0, stream, attn_bwd_dq<T>)
    (pq, pk, pv, static_cast<const T*>(out), lse, pg, causal, scale, static_cast<T*>(dq), scratch,
     s);
    if (bh * tk > 0)
      STRATA_LAUNCH(warps_grid(bh * tk), 32 * kWarpsPerBlock, 0, stream, attn_bwd_dkv<T>)
    (pq, pk, pv, lse, pg, scratch, causal, scale, static_cast<T*>(dk), static_cast<T*>(dv), s);
  });
}

}  // namespace strata::tensor::cuda
