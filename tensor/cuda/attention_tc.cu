// Strata's own attention on the tensor cores: bf16/f16, head dim 64 or 128.
//
// Note [CUDA tensor-core attention]
// The fallback under cuDNN (Note [cuDNN SDPA]) for GPT-2's and LLaMA's shapes, so that a missing
// or refusing cuDNN costs speed, not the warp-per-row kernel's order of magnitude (Note [CUDA
// fallback attention], which still serves f32 and other head dims). Flash-attention tiling on
// CUDA's warp matrix functions (mma.h: 16x16x16 bf16/f16 tiles, f32 accumulators), which run
// on sm_80 and sm_90 alike:
//   - Forward: a block owns kRows query rows of one (b, h), 16 per warp; it walks the keys in
//     tiles of 32 (up to the causal limit of its last row). Per tile each warp computes its
//     S = Q K^T (16 x 32) into shared memory, one lane per key column updates the running row max
//     and sum (the online softmax of the SIMT kernel, per tile instead of per key), rescales its
//     rows of the f32 output O (kept in shared memory: a fragment's element-to-row mapping is
//     not specified, so per-row scaling cannot be done in registers), writes P = exp(S - max)
//     rounded to the io dtype, and adds P V into O. The epilogue divides by the sum and writes
//     out and lse = max + log(sum), as the SIMT kernel does.
//   - Backward, in three kernels and no atomics: D_i = <dO_i, O_i>; dQ per query block (walking
//     key tiles: S and dP = dO V^T recomputed, dS = P (dP - D_i) rounded to the io dtype,
//     dQ += dS K); dK and dV per key block (walking query tiles of 16: S^T = K Q^T, dP^T =
//     V dO^T, dV += P^T dO, dK += dS^T Q). Each output element has one owner that adds in a fixed
//     order, so the bits are the same every run (docs/design.md decision 9); the price is
//     computing S and dP twice.
//   - P and dS are rounded to the io dtype before their products, as FlashAttention and cuDNN do,
//     which the f32 CPU reference does not: agreement is to the tolerance of the cuDNN tests, not
//     one ulp. Every other sum is f32.
//   - Operands are strided views (Note [Strided attention operands]); tiles are loaded with
//     128-bit accesses when an operand's base is 16-byte aligned and its B, H and T strides are
//     multiples of 8 elements, else element by element (same values either way). Rows past the
//     end are zeros and masked.
//   - Shared memory stays under the 48 KiB of static allocation (no opt-in). ptxas -v for sm_90:
//     44.5 / 46.3 KiB in forward (D 64 / 128), 44.5 / 42.3 KiB for dQ, 36.1 / 34.1 KiB for dK, dV;
//     68-128 registers at D 64, up to 238 at D 128, no spills.
// Speed has not been measured (no GPU yet). STRATA_ATTENTION=simt runs the SIMT kernel instead.
#include <cmath>
#include <type_traits>

#if !defined(STRATA_CUDA_EMULATION)
#include <mma.h>  // the emulation build gets nvcuda::wmma from cuda_emu/wmma.h
#endif

#include "tensor/cuda/attention_common.cuh"

namespace strata::tensor::cuda {

namespace {

using namespace nvcuda;

// Tiles per head dim: kWarps warps of 16 rows; kCols keys per tile (forward, dQ), kQCols queries
// per tile (dK, dV).
template <int D>
struct Tc {
  static constexpr int kWarps = D <= 64 ? 4 : 2;
  static constexpr int kRows = 16 * kWarps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kCols = 32;  // one lane per key column
  static constexpr int kQCols = 16;
};

template <typename T>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <typename T>
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
template <typename T>
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Which operands take 128-bit tile loads (bits of the kernels' `packed` argument).
enum : unsigned { kPackQ = 1, kPackK = 2, kPackV = 4, kPackDout = 8 };

// Rows [r0, r0 + rows) of one head (base: its row 0, ts: the T stride) into tile [rows][D] in
// shared memory; rows at or past `limit` are zeros. Called by every thread of the block.
template <typename T, int D>
__device__ inline void load_rows(T* tile, const T* base, int64_t ts, int64_t r0, int rows,
                                 int64_t limit, bool packed) {
  if (packed) {
    constexpr int P = Pack<T>::kN, U = D / P;
    for (int idx = threadIdx.x; idx < rows * U; idx += blockDim.x) {
      const int r = idx / U, c = (idx % U) * P;
      const int64_t t = r0 + r;
      Pack<T> v;
      if (t < limit) {
        v = *reinterpret_cast<const Pack<T>*>(base + t * ts + c);
      } else {
#pragma unroll
        for (int e = 0; e < P; ++e) v.v[e] = from_f32<T>(0.f);
      }
      *reinterpret_cast<Pack<T>*>(tile + r * D + c) = v;
    }
  } else {
    for (int idx = threadIdx.x; idx < rows * D; idx += blockDim.x) {
      const int r = idx / D, c = idx % D;
      const int64_t t = r0 + r;
      tile[idx] = t < limit ? base[t * ts + c] : from_f32<T>(0.f);
    }
  }
}

// Keys [j0, j0 + BC) of head (hb, hh): K rows into ks, V rows into vs, between block barriers
// (the previous tile is no longer read; the new one is complete when this returns).
template <typename T, int D, int BC>
__device__ inline void load_kv_tile(T* ks, T* vs, const T* k, const T* v, const AttentionShape& s,
                                    int64_t hb, int64_t hh, int64_t j0, unsigned packed) {
  __syncthreads();
  load_rows<T, D>(ks, k + row_at(s.k, hb, hh, 0), s.k.t, j0, BC, s.tk, packed & kPackK);
  load_rows<T, D>(vs, v + row_at(s.v, hb, hh, 0), s.v.t, j0, BC, s.tk, packed & kPackV);
  __syncthreads();
}

// out[16 x 16 * nb..] = a (16 x D, row-major at a, ldm D) times the transpose of the 16 rows of
// b starting at b (row-major, ldm D): one 16 x 16 tile of A B^T into acc.
template <typename T, int D>
__device__ inline void tile_abt(FragC& acc, const FragA<T> (&a)[D / 16], const T* b) {
  wmma::fill_fragment(acc, 0.f);
#pragma unroll
  for (int kb = 0; kb < D / 16; ++kb) {
    FragBCol<T> f;
    wmma::load_matrix_sync(f, b + kb * 16, D);
    wmma::mma_sync(acc, a[kb], f, acc);
  }
}

template <typename T, int D>
__device__ inline void load_frags(FragA<T> (&f)[D / 16], const T* rows) {
#pragma unroll
  for (int kb = 0; kb < D / 16; ++kb) wmma::load_matrix_sync(f[kb], rows + kb * 16, D);
}

// Writes a warp's 16 f32 rows (at st, ldm D) times `mul`, rounded, to rows r0.. of an operand.
template <typename T, int D>
__device__ inline void write_rows(T* base, int64_t ts, int64_t r0, int64_t limit, const float* st,
                                  float mul) {
  const int lane = threadIdx.x % 32;
  for (int r = 0; r < 16 && r0 + r < limit; ++r) {
    T* o = base + (r0 + r) * ts;
    for (int c = lane; c < D; c += 32) o[c] = from_f32<T>(mul * st[r * D + c]);
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(Tc<D>::kThreads)
    attn_fwd_tc(const T* q, const T* k, const T* v, bool causal, float scale, T* out, float* lse,
                AttentionShape s, unsigned packed) {
  constexpr int BR = Tc<D>::kRows, BC = Tc<D>::kCols;
  __shared__ __align__(32) T qs[BR * D];
  __shared__ __align__(32) T ks[BC * D];
  __shared__ __align__(32) T vs[BC * D];
  __shared__ __align__(32) float ss[BR * BC];
  __shared__ __align__(32) T ps[BR * BC];
  __shared__ __align__(32) float os[BR * D];
  __shared__ float row_m[BR], row_l[BR];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t hb = blockIdx.z, hh = blockIdx.y, q0 = int64_t{blockIdx.x} * BR;
  const int64_t tq = s.tq, tk = s.tk;
  load_rows<T, D>(qs, q + row_at(s.q, hb, hh, 0), s.q.t, q0, BR, tq, packed & kPackQ);
  for (int idx = threadIdx.x; idx < BR * D; idx += blockDim.x) os[idx] = 0.f;
  if (threadIdx.x < BR) {
    row_m[threadIdx.x] = -INFINITY;
    row_l[threadIdx.x] = 0.f;
  }
  __syncthreads();
  FragA<T> qa[D / 16];
  load_frags<T, D>(qa, qs + warp * 16 * D);
  float* srow = ss + warp * 16 * BC;
  T* prow = ps + warp * 16 * BC;
  float* orow = os + warp * 16 * D;
  const int64_t rows_end = q0 + BR < tq ? q0 + BR : tq;
  const int64_t key_end = last_key(causal, rows_end - 1, tq, tk) + 1;
  for (int64_t j0 = 0; j0 < key_end; j0 += BC) {
    load_kv_tile<T, D, BC>(ks, vs, k, v, s, hb, hh, j0, packed);
#pragma unroll
    for (int nb = 0; nb < BC / 16; ++nb) {
      FragC acc;
      tile_abt<T, D>(acc, qa, ks + nb * 16 * D);
      wmma::store_matrix_sync(srow + nb * 16, acc, BC, wmma::mem_row_major);
    }
    __syncwarp();
    // The online softmax, one lane per key of the tile, one row at a time.
    for (int r = 0; r < 16; ++r) {
      const int64_t i = q0 + warp * 16 + r, j = j0 + lane;
      const int64_t lim = i < tq ? last_key(causal, i, tq, tk) : -1;
      const float sc = j <= lim ? srow[r * BC + lane] * scale : -INFINITY;
      const float m_old = row_m[warp * 16 + r];
      const float m_new = fmaxf(m_old, attn_warp_max(sc));
      const bool none = m_new == -INFINITY;  // no key of this row seen yet
      const float p = none ? 0.f : expf(sc - m_new);
      const float corr = none ? 1.f : expf(m_old - m_new);
      const float sum = attn_warp_sum(p);
      prow[r * BC + lane] = from_f32<T>(p);
      for (int c = lane; c < D; c += 32) orow[r * D + c] *= corr;
      __syncwarp();  // every lane has read row_m before lane 0 moves it on
      if (lane == 0) {
        row_m[warp * 16 + r] = m_new;
        row_l[warp * 16 + r] = row_l[warp * 16 + r] * corr + sum;
      }
    }
    __syncwarp();
#pragma unroll
    for (int nb = 0; nb < D / 16; ++nb) {
      FragC acc;
      wmma::load_matrix_sync(acc, orow + nb * 16, D, wmma::mem_row_major);
#pragma unroll
      for (int kb = 0; kb < BC / 16; ++kb) {
        FragA<T> pf;
        FragBRow<T> vf;
        wmma::load_matrix_sync(pf, prow + kb * 16, BC);
        wmma::load_matrix_sync(vf, vs + kb * 16 * D + nb * 16, D);
        wmma::mma_sync(acc, pf, vf, acc);
      }
      wmma::store_matrix_sync(orow + nb * 16, acc, D, wmma::mem_row_major);
    }
    __syncwarp();
  }
  for (int r = 0; r < 16; ++r) {
    const int64_t i = q0 + warp * 16 + r;
    if (i >= tq) break;
    const float l = row_l[warp * 16 + r], m = row_m[warp * 16 + r];
    const float inv = l > 0.f ? 1.f / l : 0.f;  // l > 0 iff the row saw a key (its max gives 1)
    T* o = out + row_at(s.out, hb, hh, i);
    for (int c = lane; c < D; c += 32) o[c] = from_f32<T>(orow[r * D + c] * inv);
    if (lane == 0) lse[(hb * s.h + hh) * tq + i] = l > 0.f ? m + logf(l) : -INFINITY;
  }
}

// D_i = <dout_i, out_i> in f32, one warp per query row.
template <typename T>
__global__ void attn_bwd_di(const T* out, const T* dout, float* di, AttentionShape s) {
  const int lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
  if (row >= s.b * s.h * s.tq) return;  // whole warps
  const int64_t head = row / s.tq, i = row % s.tq, hb = head / s.h, hh = head % s.h;
  const T* o = out + row_at(s.out, hb, hh, i);
  const T* g = dout + row_at(s.dout, hb, hh, i);
  float acc = 0.f;
  for (int64_t c = lane; c < s.d; c += 32) acc += to_f32(o[c]) * to_f32(g[c]);
  acc = attn_warp_sum(acc);
  if (lane == 0) di[row] = acc;
}

template <typename T, int D>
__global__ void __launch_bounds__(Tc<D>::kThreads)
    attn_bwd_dq_tc(const T* q, const T* k, const T* v, const float* lse, const T* dout,
                   const float* di, bool causal, float scale, T* dq, AttentionShape s,
                   unsigned packed) {
  constexpr int BR = Tc<D>::kRows, BC = Tc<D>::kCols;
  // Q and dO tiles on the way in (as T: exactly its bytes), the warps' f32 dQ rows on the way out.
  __shared__ __align__(32) float stage[BR * D];
  __shared__ __align__(32) T ks[BC * D];
  __shared__ __align__(32) T vs[BC * D];
  __shared__ __align__(32) float ss[BR * BC];
  __shared__ __align__(32) float dps[BR * BC];
  __shared__ __align__(32) T dss[BR * BC];
  __shared__ float row_lse[BR], row_di[BR];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t hb = blockIdx.z, hh = blockIdx.y, q0 = int64_t{blockIdx.x} * BR;
  const int64_t tq = s.tq, tk = s.tk, head = hb * s.h + hh;
  T* qs = reinterpret_cast<T*>(stage);
  T* gs = qs + BR * D;
  load_rows<T, D>(qs, q + row_at(s.q, hb, hh, 0), s.q.t, q0, BR, tq, packed & kPackQ);
  load_rows<T, D>(gs, dout + row_at(s.dout, hb, hh, 0), s.dout.t, q0, BR, tq, packed & kPackDout);
  if (threadIdx.x < BR) {
    const int64_t i = q0 + threadIdx.x;
    row_lse[threadIdx.x] = i < tq ? lse[head * tq + i] : 0.f;
    row_di[threadIdx.x] = i < tq ? di[head * tq + i] : 0.f;
  }
  __syncthreads();
  FragA<T> qa[D / 16], ga[D / 16];
  load_frags<T, D>(qa, qs + warp * 16 * D);
  load_frags<T, D>(ga, gs + warp * 16 * D);
  FragC acc[D / 16];
#pragma unroll
  for (int nb = 0; nb < D / 16; ++nb) wmma::fill_fragment(acc[nb], 0.f);
  float* srow = ss + warp * 16 * BC;
  float* dprow = dps + warp * 16 * BC;
  T* dsrow = dss + warp * 16 * BC;
  const int64_t rows_end = q0 + BR < tq ? q0 + BR : tq;
  const int64_t key_end = last_key(causal, rows_end - 1, tq, tk) + 1;
  for (int64_t j0 = 0; j0 < key_end; j0 += BC) {
    load_kv_tile<T, D, BC>(ks, vs, k, v, s, hb, hh, j0, packed);
#pragma unroll
    for (int nb = 0; nb < BC / 16; ++nb) {
      FragC t;
      tile_abt<T, D>(t, qa, ks + nb * 16 * D);
      wmma::store_matrix_sync(srow + nb * 16, t, BC, wmma::mem_row_major);
      tile_abt<T, D>(t, ga, vs + nb * 16 * D);
      wmma::store_matrix_sync(dprow + nb * 16, t, BC, wmma::mem_row_major);
    }
    __syncwarp();
    for (int r = 0; r < 16; ++r) {
      const int64_t i = q0 + warp * 16 + r, j = j0 + lane;
      const bool seen = i < tq && j <= last_key(causal, i, tq, tk);
      const int w = warp * 16 + r;
      const float p = seen ? expf(srow[r * BC + lane] * scale - row_lse[w]) : 0.f;
      dsrow[r * BC + lane] = from_f32<T>(p * (dprow[r * BC + lane] - row_di[w]));
    }
    __syncwarp();
#pragma unroll
    for (int nb = 0; nb < D / 16; ++nb) {
#pragma unroll
      for (int kb = 0; kb < BC / 16; ++kb) {
        FragA<T> df;
        FragBRow<T> kf;
        wmma::load_matrix_sync(df, dsrow + kb * 16, BC);
        wmma::load_matrix_sync(kf, ks + kb * 16 * D + nb * 16, D);
        wmma::mma_sync(acc[nb], df, kf, acc[nb]);
      }
    }
  }
  __syncthreads();  // every warp is past its Q and dO loads: the stage holds dQ now
  float* st = stage + warp * 16 * D;
#pragma unroll
  for (int nb = 0; nb < D / 16; ++nb)
    wmma::store_matrix_sync(st + nb * 16, acc[nb], D, wmma::mem_row_major);
  __syncwarp();
  write_rows<T, D>(dq + row_at(s.dq, hb, hh, 0), s.dq.t, q0 + warp * 16, tq, st, scale);
}

template <typename T, int D>
__global__ void __launch_bounds__(Tc<D>::kThreads)
    attn_bwd_dkv_tc(const T* q, const T* k, const T* v, const float* lse, const T* dout,
                    const float* di, bool causal, float scale, T* dk, T* dv, AttentionShape s,
                    unsigned packed) {
  constexpr int BR = Tc<D>::kRows, BQ = Tc<D>::kQCols;
  __shared__ __align__(32) T kvs[2 * BR * D];  // this block's K rows, then its V rows
  // Per query tile: Q and dO [BQ][D] (T), S^T and dP^T [BR][BQ] (f32); at the end dK, dV rows.
  __shared__ __align__(32) float stage[BR * D];
  __shared__ __align__(32) T pts[BR * BQ];
  __shared__ __align__(32) T dsts[BR * BQ];
  __shared__ float tile_lse[BQ], tile_di[BQ];
  static_assert(2 * BQ * D * sizeof(T) + 2 * BR * BQ * sizeof(float) <= sizeof(float) * BR * D,
                "the stage holds a query tile's operands");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t hb = blockIdx.z, hh = blockIdx.y, k0 = int64_t{blockIdx.x} * BR;
  const int64_t tq = s.tq, tk = s.tk, head = hb * s.h + hh;
  T* qs = reinterpret_cast<T*>(stage);
  T* gs = qs + BQ * D;
  float* sts = reinterpret_cast<float*>(gs + BQ * D);
  float* dpts = sts + BR * BQ;
  load_rows<T, D>(kvs, k + row_at(s.k, hb, hh, 0), s.k.t, k0, BR, tk, packed & kPackK);
  load_rows<T, D>(kvs + BR * D, v + row_at(s.v, hb, hh, 0), s.v.t, k0, BR, tk, packed & kPackV);
  const T* kw = kvs + warp * 16 * D;
  const T* vw = kvs + BR * D + warp * 16 * D;
  float* st_w = sts + warp * 16 * BQ;
  float* dp_w = dpts + warp * 16 * BQ;
  T* p_w = pts + warp * 16 * BQ;
  T* ds_w = dsts + warp * 16 * BQ;
  FragC dka[D / 16], dva[D / 16];
#pragma unroll
  for (int nb = 0; nb < D / 16; ++nb) {
    wmma::fill_fragment(dka[nb], 0.f);
    wmma::fill_fragment(dva[nb], 0.f);
  }
  // Queries before i_begin see none of this block's keys (j <= i + tk - tq).
  int64_t i_begin = causal ? k0 - (tk - tq) : 0;
  i_begin = i_begin < 0 ? 0 : i_begin / BQ * BQ;
  for (int64_t i0 = i_begin; i0 < tq; i0 += BQ) {
    __syncthreads();  // K, V loaded (first pass); the previous tile is no longer read
    load_rows<T, D>(qs, q + row_at(s.q, hb, hh, 0), s.q.t, i0, BQ, tq, packed & kPackQ);
    load_rows<T, D>(gs, dout + row_at(s.dout, hb, hh, 0), s.dout.t, i0, BQ, tq, packed & kPackDout);
    if (threadIdx.x < BQ) {
      const int64_t i = i0 + threadIdx.x;
      tile_lse[threadIdx.x] = i < tq ? lse[head * tq + i] : 0.f;
      tile_di[threadIdx.x] = i < tq ? di[head * tq + i] : 0.f;
    }
    __syncthreads();
    {
      FragA<T> kf[D / 16], vf[D / 16];
      load_frags<T, D>(kf, kw);
      load_frags<T, D>(vf, vw);
      FragC t;
      tile_abt<T, D>(t, kf, qs);  // S^T = K Q^T: 16 keys x 16 queries
      wmma::store_matrix_sync(st_w, t, BQ, wmma::mem_row_major);
      tile_abt<T, D>(t, vf, gs);  // dP^T = V dO^T
      wmma::store_matrix_sync(dp_w, t, BQ, wmma::mem_row_major);
    }
    __syncwarp();
    for (int e = 0; e < 16 * BQ / 32; ++e) {
      const int idx = lane + 32 * e, r = idx / BQ, c = idx % BQ;
      const int64_t j = k0 + warp * 16 + r, i = i0 + c;
      const bool seen = j < tk && i < tq && j <= last_key(causal, i, tq, tk);
      const float p = seen ? expf(st_w[idx] * scale - tile_lse[c]) : 0.f;
      p_w[idx] = from_f32<T>(p);
      ds_w[idx] = from_f32<T>(p * (dp_w[idx] - tile_di[c]));
    }
    __syncwarp();
    FragA<T> pf, dsf;
    wmma::load_matrix_sync(pf, p_w, BQ);
    wmma::load_matrix_sync(dsf, ds_w, BQ);
#pragma unroll
    for (int nb = 0; nb < D / 16; ++nb) {
      FragBRow<T> f;
      wmma::load_matrix_sync(f, gs + nb * 16, D);
      wmma::mma_sync(dva[nb], pf, f, dva[nb]);  // dV += P^T dO
      wmma::load_matrix_sync(f, qs + nb * 16, D);
      wmma::mma_sync(dka[nb], dsf, f, dka[nb]);  // dK += dS^T Q
    }
  }
  __syncthreads();  // the stage holds the warps' dK, then dV rows now
  float* st = stage + warp * 16 * D;
#pragma unroll
  for (int nb = 0; nb < D / 16; ++nb)
    wmma::store_matrix_sync(st + nb * 16, dka[nb], D, wmma::mem_row_major);
  __syncwarp();
  write_rows<T, D>(dk + row_at(s.dk, hb, hh, 0), s.dk.t, k0 + warp * 16, tk, st, scale);
  __syncwarp();
#pragma unroll
  for (int nb = 0; nb < D / 16; ++nb)
    wmma::store_matrix_sync(st + nb * 16, dva[nb], D, wmma::mem_row_major);
  __syncwarp();
  write_rows<T, D>(dv + row_at(s.dv, hb, hh, 0), s.dv.t, k0 + warp * 16, tk, st, 1.f);
}

// 128-bit tile loads for an operand (Note [CUDA tensor-core attention]).
bool packs(const void* p, const AttentionStrides& st) {
  return aligned16(p) && st.b % 8 == 0 && st.h % 8 == 0 && st.t % 8 == 0;
}

template <int D>
dim3 tc_grid(int64_t rows, const AttentionShape& s) {
  return dim3(static_cast<unsigned>((rows + Tc<D>::kRows - 1) / Tc<D>::kRows),
              static_cast<unsigned>(s.h), static_cast<unsigned>(s.b));
}

// Calls f(TypeTag<T>{}, std::integral_constant<int, D>{}) for the (dtype, head dim) pairs the
// kernels are built for; false for any other.
template <typename F>
bool dispatch_tc(int dt, const AttentionShape& s, F&& f) {
  const int64_t d = s.d;
  auto by_d = [&](auto tag) {
    if (d == 64) f(tag, std::integral_constant<int, 64>{});
    if (d == 128) f(tag, std::integral_constant<int, 128>{});
  };
  if (!attention_tc_fits(dt, d, s.b, s.h)) return false;
  if (dt == kBF16) by_d(TypeTag<__nv_bfloat16>{});
  if (dt == kF16) by_d(TypeTag<__half>{});
  return true;
}

}  // namespace

bool attention_tc_fits(int dt, int64_t d, int64_t b, int64_t h) {
  // tc_grid puts the heads in grid.y and the batch in grid.z, which hold at most 65535 each.
  return (dt == kBF16 || dt == kF16) && (d == 64 || d == 128) && b <= 65535 && h <= 65535;
}

bool launch_attention_tc_forward(int dt, const void* q, const void* k, const void* v, bool causal,
                                 float scale, void* out, float* lse, const AttentionShape& s,
                                 Stream stream) {
  const unsigned packed =
      (packs(q, s.q) ? kPackQ : 0u) | (packs(k, s.k) ? kPackK : 0u) | (packs(v, s.v) ? kPackV : 0u);
  return dispatch_tc(dt, s, [&](auto tag, auto dim) {
    using T = typename decltype(tag)::type;
    constexpr int D = decltype(dim)::value;
    if (s.b * s.h * s.tq == 0) return;
    STRATA_LAUNCH(tc_grid<D>(s.tq, s), Tc<D>::kThreads, 0, stream, attn_fwd_tc<T, D>)
    (static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), causal, scale,
     static_cast<T*>(out), lse, s, packed);
  });
}

bool launch_attention_tc_backward(int dt, const void* q, const void* k, const void* v,
                                  const void* out, const float* lse, const void* dout, bool causal,
                                  float scale, void* dq, void* dk, void* dv, float* scratch,
                                  const AttentionShape& s, Stream stream) {
  const unsigned packed = (packs(q, s.q) ? kPackQ : 0u) | (packs(k, s.k) ? kPackK : 0u) |
                          (packs(v, s.v) ? kPackV : 0u) | (packs(dout, s.dout) ? kPackDout : 0u);
  return dispatch_tc(dt, s, [&](auto tag, auto dim) {
    using T = typename decltype(tag)::type;
    constexpr int D = decltype(dim)::value;
    const T* pq = static_cast<const T*>(q);
    const T* pk = static_cast<const T*>(k);
    const T* pv = static_cast<const T*>(v);
    const T* pg = static_cast<const T*>(dout);
    const int64_t rows = s.b * s.h * s.tq;
    if (rows > 0) {
      constexpr int kWarps = 4;
      STRATA_LAUNCH(static_cast<unsigned>((rows + kWarps - 1) / kWarps), 32 * kWarps, 0, stream,
                    attn_bwd_di<T>)
      (static_cast<const T*>(out), pg, scratch, s);
      STRATA_LAUNCH(tc_grid<D>(s.tq, s), Tc<D>::kThreads, 0, stream, attn_bwd_dq_tc<T, D>)
      (pq, pk, pv, lse, pg, scratch, causal, scale, static_cast<T*>(dq), s, packed);
    }
    if (s.b * s.h * s.tk > 0)
      STRATA_LAUNCH(tc_grid<D>(s.tk, s), Tc<D>::kThreads, 0, stream, attn_bwd_dkv_tc<T, D>)
    (pq, pk, pv, lse, pg, scratch, causal, scale, static_cast<T*>(dk), static_cast<T*>(dv), s,
     packed);
  });
}

}  // namespace strata::tensor::cuda
