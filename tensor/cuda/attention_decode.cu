// Strata's own attention for decode steps: a few queries against a long KV cache.
//
// Note [CUDA decode attention]
// A decode step against a KV cache (Note [KV cache] in models/kv_cache.h) asks for Tq <= 16
// queries per head against Tk cached keys, and under auto it comes to the own kernels without
// trying cuDNN (Note [cuDNN SDPA], decoding). The training kernels parallelise over query rows:
// the tensor-core kernel gives each (b, h) one block that walks every key tile in turn, and the
// SIMT kernel one warp per query row that walks every key, one load latency per key. With one
// sample of GPT-2 1558M that is 25 blocks (or 25 warps) on 132 multiprocessors, each walking the
// whole cache alone. This kernel splits the keys instead (the "flash-decoding" split-K scheme):
//   - A query row's keys [0, Tk) are cut into `splits` runs of `keys` keys each (a multiple of 32;
//     attention_decode_splits picks enough runs to give the device about kDecodeWarpsPerSm warps
//     per multiprocessor, never a run under 32 keys). One warp takes one (row, run).
//   - The warp walks its run 32 keys at a time, one key per lane: each lane computes its key's
//     whole dot product with the query (the query row in shared memory, read by every lane at
//     once; the key row in 128-bit packs when the operand allows), so 32 keys cost one round of
//     loads rather than 32. The chunk's max and sum are warp reductions (a fixed tree), the
//     running (max, sum, output) are rescaled once per chunk as the SIMT kernel does per key,
//     and P V goes key by key in key order: lane l owns output elements l, l + 32, ... and reads
//     them from each value row (32 lanes, consecutive elements), with eight rows' loads in flight.
//   - The run's unnormalised output, max and sum go to an f32 scratch [rows, splits, D + 2]. A
//     second kernel, one warp per row, merges the runs in run order: M = max m_r, L = sum
//     l_r exp(m_r - M), O = sum o_r exp(m_r - M) / L, rounded once to the output dtype, lse =
//     M + log L. A run past a causal row's last key holds m = -inf, l = 0, and adds nothing.
// Every sum has one owner and a fixed order, so the bits are the same on every run and for any
// layout of the operands (packed loads or not, the same arithmetic); they are not those of the
// SIMT or tensor-core kernels, which add in other groupings (agreement is to the attention tests'
// tolerance). Head dims 32, 64 and 128, any float dtype; lse is written as by the other kernels,
// so a backward can follow (it runs the training kernels).
#include <algorithm>
#include <cmath>

#include "tensor/cuda/attention_common.cuh"

namespace strata::tensor::cuda {

namespace {

constexpr int kDecodeWarps = 4;        // warps per block, one (row, run) each
constexpr int kDecodeChunk = 32;       // keys per chunk: one per lane
constexpr int kDecodeWarpsPerSm = 16;  // the warps attention_decode_splits aims for
constexpr int kValueRows = 8;          // value rows whose loads are in flight together

// <q, key row>, q the f32 row in shared memory; V: the key row in 128-bit packs. Elements are
// added in index order either way, each product added with one explicit fmaf (Note [Explicit
// FMAs in attention], attention.cu).
template <typename T, int D, bool V>
__device__ inline float key_dot(const float* q, const T* key) {
  float s = 0.f;
  if constexpr (V) {
    constexpr int P = Pack<T>::kN;
    Pack<T> pk[D / P];
#pragma unroll
    for (int c = 0; c < D / P; ++c) pk[c] = *reinterpret_cast<const Pack<T>*>(key + c * P);
#pragma unroll
    for (int c = 0; c < D / P; ++c)
#pragma unroll
      for (int e = 0; e < P; ++e) s = fmaf(q[c * P + e], to_f32(pk[c].v[e]), s);
  } else {
#pragma unroll 8
    for (int e = 0; e < D; ++e) s = fmaf(q[e], to_f32(key[e]), s);
  }
  return s;
}

template <typename T, int D, bool V>
__global__ void __launch_bounds__(32 * kDecodeWarps)
    attn_decode_part(const T* q, const T* k, const T* v, bool causal, float scale, AttentionShape s,
                     int64_t splits, int64_t keys, float* part) {
  constexpr int E = D / 32;  // output elements per lane
  __shared__ float qs[kDecodeWarps][D];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t item = blockIdx.x * int64_t{kDecodeWarps} + warp;
  if (item >= s.b * s.h * s.tq * splits) return;  // the whole warp
  const int64_t row = item / splits, run = item % splits;
  const int64_t head = row / s.tq, i = row % s.tq, hb = head / s.h, hh = head % s.h;
  const T* qrow = q + row_at(s.q, hb, hh, i);
  for (int c = lane; c < D; c += 32) qs[warp][c] = to_f32(qrow[c]);
  __syncwarp();
  const int64_t row_end = last_key(causal, i, s.tq, s.tk) + 1;
  const int64_t j_begin = run * keys;
  const int64_t j_end = j_begin + keys < row_end ? j_begin + keys : row_end;
  const T* kh = k + row_at(s.k, hb, hh, 0);
  const T* vh = v + row_at(s.v, hb, hh, 0);
  float m = -INFINITY, l = 0.f, acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = 0.f;
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kDecodeChunk) {
    const int64_t j = j0 + lane;
    const bool valid = j < j_end;
    const float sc = valid ? scale * key_dot<T, D, V>(qs[warp], kh + j * s.k.t) : -INFINITY;
    const float mn = fmaxf(m, attn_warp_max(sc));  // lane 0's key is always valid
    const float corr = expf(m - mn);
    const float p = valid ? expf(sc - mn) : 0.f;
    l = fmaf(l, corr, attn_warp_sum(p));
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] *= corr;
    const int n = static_cast<int>(j_end - j0 < kDecodeChunk ? j_end - j0 : kDecodeChunk);
    for (int u0 = 0; u0 < n; u0 += kValueRows) {  // n is the same in every lane
      float vv[kValueRows][E];
#pragma unroll
      for (int u = 0; u < kValueRows; ++u) {
        const T* vr = vh + (j0 + u0 + u) * s.v.t + lane;
#pragma unroll
        for (int e = 0; e < E; ++e) vv[u][e] = u0 + u < n ? to_f32(vr[32 * e]) : 0.f;
      }
#pragma unroll
      for (int u = 0; u < kValueRows; ++u) {
        const float pu = __shfl_sync(0xffffffffu, p, u0 + u);
        if (u0 + u < n) {
#pragma unroll
          for (int e = 0; e < E; ++e) acc[e] = fmaf(pu, vv[u][e], acc[e]);
        }
      }
    }
    m = mn;
  }
  float* out = part + item * (D + 2);
  if (lane == 0) out[0] = m, out[1] = l;
#pragma unroll
  for (int e = 0; e < E; ++e) out[2 + lane + 32 * e] = acc[e];
}

template <typename T, int D>
__global__ void __launch_bounds__(32 * kDecodeWarps)
    attn_decode_combine(const float* part, int64_t splits, T* out, float* lse, AttentionShape s) {
  constexpr int E = D / 32;
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kDecodeWarps} + threadIdx.x / 32;
  if (row >= s.b * s.h * s.tq) return;
  const int64_t head = row / s.tq, i = row % s.tq, hb = head / s.h, hh = head % s.h;
  const float* pr = part + row * splits * (D + 2);
  float mx = -INFINITY;
  for (int64_t r = 0; r < splits; ++r) mx = fmaxf(mx, pr[r * (D + 2)]);
  float l = 0.f, acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = 0.f;
  const bool any = mx != -INFINITY;  // false: a causal row that sees no key
  if (any)
    for (int64_t r = 0; r < splits; ++r) {
      const float* p = pr + r * (D + 2);
      const float w = expf(p[0] - mx);
      l = fmaf(w, p[1], l);
#pragma unroll
      for (int e = 0; e < E; ++e) acc[e] = fmaf(w, p[2 + lane + 32 * e], acc[e]);
    }
  const float mul = any ? 1.f / l : 0.f;
  T* o = out + row_at(s.out, hb, hh, i);
#pragma unroll
  for (int e = 0; e < E; ++e) o[lane + 32 * e] = from_f32<T>(acc[e] * mul);
  if (lane == 0) lse[row] = any ? mx + logf(l) : -INFINITY;
}

// Whether the key rows can be read as 128-bit packs of T.
template <typename T>
bool keys_pack(const void* k, const AttentionStrides& st) {
  constexpr int64_t P = Pack<T>::kN;
  return aligned16(k) && st.b % P == 0 && st.h % P == 0 && st.t % P == 0;
}

unsigned decode_blocks(int64_t warps) {
  return static_cast<unsigned>((warps + kDecodeWarps - 1) / kDecodeWarps);
}

}  // namespace

bool attention_decode_fits(int64_t tq, int64_t tk, int64_t d) {
  return tq >= 1 && tq <= kAttentionDecodeQueries && tq < tk && (d == 32 || d == 64 || d == 128);
}

DecodeSplits attention_decode_splits(int64_t rows, int64_t tk, int sms) {
  DecodeSplits r;
  const int64_t chunks = std::max<int64_t>(1, (tk + kDecodeChunk - 1) / kDecodeChunk);
  const int64_t want = int64_t{std::max(sms, 1)} * kDecodeWarpsPerSm;
  const int64_t per_row =
      std::max<int64_t>(1, (want + std::max<int64_t>(rows, 1) - 1) / std::max<int64_t>(rows, 1));
  const int64_t runs = std::min(chunks, per_row);
  r.keys = (chunks + runs - 1) / runs * kDecodeChunk;
  r.splits = std::max<int64_t>(1, (tk + r.keys - 1) / r.keys);
  return r;
}

bool launch_attention_decode_forward(int dt, const void* q, const void* k, const void* v,
                                     bool causal, float scale, void* out, float* lse,
                                     const AttentionShape& s, const DecodeSplits& sp,
                                     float* scratch, Stream stream) {
  if (!attention_decode_fits(s.tq, s.tk, s.d)) return false;
  return dispatch_float(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t rows = s.b * s.h * s.tq;
    if (rows == 0) return;
    const auto run = [&](auto dim, auto packed) {
      constexpr int D = decltype(dim)::value;
      constexpr bool V = decltype(packed)::value;
      STRATA_LAUNCH(decode_blocks(rows * sp.splits), 32 * kDecodeWarps, 0, stream,
                    attn_decode_part<T, D, V>)
      (static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), causal, scale,
       s, sp.splits, sp.keys, scratch);
      STRATA_LAUNCH(decode_blocks(rows), 32 * kDecodeWarps, 0, stream, attn_decode_combine<T, D>)
      (scratch, sp.splits, static_cast<T*>(out), lse, s);
    };
    const auto by_pack = [&](auto dim) {
      if (keys_pack<T>(k, s.k))
        run(dim, std::true_type{});
      else
        run(dim, std::false_type{});
    };
    if (s.d == 32) by_pack(std::integral_constant<int, 32>{});
    if (s.d == 64) by_pack(std::integral_constant<int, 64>{});
    if (s.d == 128) by_pack(std::integral_constant<int, 128>{});
  });
}

}  // namespace strata::tensor::cuda
