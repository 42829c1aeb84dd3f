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
//
// Lane l holds the row elements [P (l + 32 g), P (l + 32 g) + P) for g = 0, 1, ..., P the
// elements of 128 bits (4 f32, 8 bf16/f16). They are read and written as one 128-bit pack when
// every pointer is 16-byte aligned and D and every stride are multiples of P, otherwise one
// element at a time; a launch picks once for all its operands (attention_pack, the template
// parameter V). Which elements a lane holds and the order of every sum are the same either way,
// so a view gives the bits of a contiguous tensor (Note [Strided attention operands]).
//
// Note [Explicit FMAs in attention]
// The same order is not enough for the same bits: nvcc contracts a * b + c into one FMA by
// default, and where it does may differ between the packed and the element-wise instantiation
// (the emulator showed it, Note [Emulated FMA contraction]). Every product added into a sum is
// therefore an explicit fmaf (one rounding, what the contraction would give), and every other
// product an explicitly rounded __fmul_rn, in both instantiations and in the decode kernel.
#include <cmath>
#include <initializer_list>
#include <type_traits>

#include "tensor/cuda/attention_common.cuh"

namespace strata::tensor::cuda {

namespace {

constexpr int kPer = kAttentionMaxHeadDim / 32;  // elements per lane
constexpr int kWarpsPerBlock = 4;

template <typename T>
inline constexpr int kPackOf = Pack<T>::kN;

// Row p's elements as this lane holds them (0 beyond d); V: 128-bit loads (d % P == 0 and p
// 16-byte aligned).
template <typename T, bool V>
__device__ inline void load_row(const T* p, int64_t d, int lane, float (&r)[kPer]) {
  constexpr int P = kPackOf<T>;
#pragma unroll
  for (int g = 0; g < kPer / P; ++g) {
    const int64_t base = (lane + 32 * int64_t{g}) * P;
    if constexpr (V) {
      if (base < d) {
        const Pack<T> pk = *reinterpret_cast<const Pack<T>*>(p + base);
#pragma unroll
        for (int c = 0; c < P; ++c) r[g * P + c] = to_f32(pk.v[c]);
      } else {
#pragma unroll
        for (int c = 0; c < P; ++c) r[g * P + c] = 0.f;
      }
    } else {
#pragma unroll
      for (int c = 0; c < P; ++c) r[g * P + c] = base + c < d ? to_f32(p[base + c]) : 0.f;
    }
  }
}

// o = r * mul, rounded once per element, as this lane holds r.
template <typename T, bool V>
__device__ inline void store_row(T* o, int64_t d, int lane, const float (&r)[kPer], float mul) {
  constexpr int P = kPackOf<T>;
#pragma unroll
  for (int g = 0; g < kPer / P; ++g) {
    const int64_t base = (lane + 32 * int64_t{g}) * P;
    if constexpr (V) {
      if (base >= d) continue;
      Pack<T> pk;
#pragma unroll
      for (int c = 0; c < P; ++c) pk.v[c] = from_f32<T>(r[g * P + c] * mul);
      *reinterpret_cast<Pack<T>*>(o + base) = pk;
    } else {
#pragma unroll
      for (int c = 0; c < P; ++c)
        if (base + c < d) o[base + c] = from_f32<T>(r[g * P + c] * mul);
    }
  }
}

template <typename T, bool V>
__device__ inline float dot_row(const float (&a)[kPer], const T* p, int64_t d, int lane) {
  float x[kPer];
  load_row<T, V>(p, d, lane, x);
  float s = 0;
#pragma unroll
  for (int e = 0; e < kPer; ++e) s = fmaf(a[e], x[e], s);  // both 0 beyond d
  return attn_warp_sum(s);
}

template <typename T, bool V>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    attn_fwd(const T* q, const T* k, const T* v, bool causal, float scale, T* out, float* lse,
             AttentionShape s) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  const int64_t tq = s.tq, tk = s.tk, d = s.d;
  if (row >= s.b * s.h * tq) return;
  const int64_t head = row / tq, i = row % tq, hb = head / s.h, hh = head % s.h;
  const T* kh = k + row_at(s.k, hb, hh, 0);
  const T* vh = v + row_at(s.v, hb, hh, 0);
  const int64_t ks = s.k.t, vs = s.v.t;
  float qr[kPer], acc[kPer], vr[kPer];
  load_row<T, V>(q + row_at(s.q, hb, hh, i), d, lane, qr);
#pragma unroll
  for (int e = 0; e < kPer; ++e) acc[e] = 0.f;
  float m = -INFINITY, l = 0.f;
  const int64_t jmax = last_key(causal, i, tq, tk);
  for (int64_t j = 0; j <= jmax; ++j) {
    const float sc = scale * dot_row<T, V>(qr, kh + j * ks, d, lane);
    const float mn = fmaxf(m, sc);
    const float corr = expf(m - mn), p = expf(sc - mn);
    l = fmaf(l, corr, p);
    load_row<T, V>(vh + j * vs, d, lane, vr);
#pragma unroll
    for (int e = 0; e < kPer; ++e) acc[e] = fmaf(p, vr[e], __fmul_rn(acc[e], corr));
    m = mn;
  }
  store_row<T, V>(out + row_at(s.out, hb, hh, i), d, lane, acc, jmax >= 0 ? 1.f / l : 0.f);
  if (lane == 0) lse[row] = jmax >= 0 ? m + logf(l) : -INFINITY;
}

// D_i and dq_i for one query row per warp.
template <typename T, bool V>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    attn_bwd_dq(const T* q, const T* k, const T* v, const T* out, const float* lse, const T* dout,
                bool causal, float scale, T* dq, float* dsum, AttentionShape s) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  const int64_t tq = s.tq, tk = s.tk, d = s.d;
  if (row >= s.b * s.h * tq) return;
  const int64_t head = row / tq, i = row % tq, hb = head / s.h, hh = head % s.h;
  const T* kh = k + row_at(s.k, hb, hh, 0);
  const T* vh = v + row_at(s.v, hb, hh, 0);
  const int64_t ks = s.k.t, vs = s.v.t;
  float qr[kPer], gr[kPer], acc[kPer], kr[kPer];
  load_row<T, V>(q + row_at(s.q, hb, hh, i), d, lane, qr);
  load_row<T, V>(dout + row_at(s.dout, hb, hh, i), d, lane, gr);
  const float di = dot_row<T, V>(gr, out + row_at(s.out, hb, hh, i), d, lane);
  if (lane == 0) dsum[row] = di;
#pragma unroll
  for (int e = 0; e < kPer; ++e) acc[e] = 0.f;
  const int64_t jmax = last_key(causal, i, tq, tk);
  const float li = lse[row];
  for (int64_t j = 0; j <= jmax; ++j) {
    load_row<T, V>(kh + j * ks, d, lane, kr);
    float sk = 0;
#pragma unroll
    for (int e = 0; e < kPer; ++e) sk = fmaf(qr[e], kr[e], sk);
    const float p = expf(fmaf(scale, attn_warp_sum(sk), -li));
    const float ds = p * (dot_row<T, V>(gr, vh + j * vs, d, lane) - di);
#pragma unroll
    for (int e = 0; e < kPer; ++e) acc[e] = fmaf(ds, kr[e], acc[e]);
  }
  store_row<T, V>(dq + row_at(s.dq, hb, hh, i), d, lane, acc, scale);
}

// dk_j and dv_j for one key row per warp (needs D_i from attn_bwd_dq).
template <typename T, bool V>
__global__ void __launch_bounds__(32 * kWarpsPerBlock)
    attn_bwd_dkv(const T* q, const T* k, const T* v, const float* lse, const T* dout,
                 const float* dsum, bool causal, float scale, T* dk, T* dv, AttentionShape s) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  const int64_t tq = s.tq, tk = s.tk, d = s.d;
  if (row >= s.b * s.h * tk) return;
  const int64_t head = row / tk, j = row % tk, hb = head / s.h, hh = head % s.h;
  const T* qh = q + row_at(s.q, hb, hh, 0);
  const T* gh = dout + row_at(s.dout, hb, hh, 0);
  const int64_t qs = s.q.t, gs = s.dout.t;
  float kr[kPer], vr[kPer], ak[kPer], av[kPer], qi[kPer], gi[kPer];
  load_row<T, V>(k + row_at(s.k, hb, hh, j), d, lane, kr);
  load_row<T, V>(v + row_at(s.v, hb, hh, j), d, lane, vr);
#pragma unroll
  for (int e = 0; e < kPer; ++e) ak[e] = av[e] = 0.f;
  // Query i sees key j when j <= i + (tk - tq), i.e. i >= j - (tk - tq).
  int64_t i0 = causal ? j - (tk - tq) : 0;
  if (i0 < 0) i0 = 0;
  for (int64_t i = i0; i < tq; ++i) {
    load_row<T, V>(qh + i * qs, d, lane, qi);
    load_row<T, V>(gh + i * gs, d, lane, gi);
    float sq = 0, sg = 0;
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      sq = fmaf(kr[e], qi[e], sq);
      sg = fmaf(vr[e], gi[e], sg);
    }
    const float p = expf(fmaf(scale, attn_warp_sum(sq), -lse[head * tq + i]));
    const float ds = p * (attn_warp_sum(sg) - dsum[head * tq + i]);
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      av[e] = fmaf(p, gi[e], av[e]);
      ak[e] = fmaf(ds, qi[e], ak[e]);
    }
  }
  store_row<T, V>(dk + row_at(s.dk, hb, hh, j), d, lane, ak, scale);
  store_row<T, V>(dv + row_at(s.dv, hb, hh, j), d, lane, av, 1.f);
}

unsigned warps_grid(int64_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

// Whether every operand can be read and written in 128-bit packs of T (Note [CUDA fallback
// attention]): D and the given strides multiples of the pack, the pointers 16-byte aligned.
template <typename T>
bool attention_pack(const AttentionShape& s, std::initializer_list<const AttentionStrides*> strides,
                    std::initializer_list<const void*> ptrs) {
  constexpr int64_t P = Pack<T>::kN;
  if (s.d % P != 0) return false;
  for (const AttentionStrides* st : strides)
    if (st->b % P != 0 || st->h % P != 0 || st->t % P != 0) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}

}  // namespace

bool launch_attention_forward(int dt, const void* q, const void* k, const void* v, bool causal,
                              float scale, void* out, float* lse, const AttentionShape& s,
                              Stream stream) {
  return dispatch_float(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t rows = s.b * s.h * s.tq;
    if (rows == 0) return;
    // Note [CUDA fallback attention]: 128-bit packs, or one element at a time.
    const auto launch = [&](auto packed) {
      constexpr bool V = decltype(packed)::value;
      STRATA_LAUNCH(warps_grid(rows), 32 * kWarpsPerBlock, 0, stream, attn_fwd<T, V>)
      (static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), causal, scale,
       static_cast<T*>(out), lse, s);
    };
    if (attention_pack<T>(s, {&s.q, &s.k, &s.v, &s.out}, {q, k, v, out}))
      launch(std::true_type{});
    else
      launch(std::false_type{});
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
    const auto launch = [&](auto packed) {
      constexpr bool V = decltype(packed)::value;
      if (bh * tq > 0)
        STRATA_LAUNCH(warps_grid(bh * tq), 32 * kWarpsPerBlock, 0, stream, attn_bwd_dq<T, V>)
      (pq, pk, pv, static_cast<const T*>(out), lse, pg, causal, scale, static_cast<T*>(dq), scratch,
       s);
      if (bh * tk > 0)
        STRATA_LAUNCH(warps_grid(bh * tk), 32 * kWarpsPerBlock, 0, stream, attn_bwd_dkv<T, V>)
      (pq, pk, pv, lse, pg, scratch, causal, scale, static_cast<T*>(dk), static_cast<T*>(dv), s);
    };
    // Note [CUDA fallback attention]: 128-bit packs, or one element at a time.
    if (attention_pack<T>(s, {&s.q, &s.k, &s.v, &s.out, &s.dout, &s.dq, &s.dk, &s.dv},
                          {q, k, v, out, dout, dq, dk, dv}))
      launch(std::true_type{});
    else
      launch(std::false_type{});
  });
}

}  // namespace strata::tensor::cuda
