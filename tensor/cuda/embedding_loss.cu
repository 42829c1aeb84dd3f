// CUDA embedding (forward and backward) and the fused softmax + cross-entropy (forward,
// backward, both in one kernel, and the mean's divisor). The cross-entropy never writes the
// softmax: forward keeps only lse per row, backward recomputes exp(x - lse) while writing
// dlogits (Note [CUDA cross-entropy]). No kernel here uses atomics (Note [CUDA reduction
// determinism] in reduce.cu).
//
// Note [CUDA embedding backward]
// dweight += scatter(dout) must add each id's rows in row order (the CPU's order, so the f32 bits
// agree) and, for a BF16/F16 dweight, round once per element (Note [Low-precision ops]). It runs
// on the device alone, so the host never waits for it (grouping the ids on the host would cost a
// wait per step and stall the GPU while the host worked):
//   1. keys: row r with id i becomes the 64-bit key (i << 32 | r); a bad id, and the padding up
//      to a power of two, become kNoKey (all ones), which sorts last and is skipped.
//   2. a bitonic sort of the keys (kSortTile keys per block in shared memory, then for each
//      larger merge stage global compare-exchange passes down to the tile, then the tile's
//      passes in shared memory again). Keys are distinct (rows are), so the sorted order is
//      fixed: the rows of each id in increasing order, ids in increasing order.
//   3. a thread per (column group, segment start) starts from the old dweight values, adds that
//      id's dout rows in order in f32 and stores once: no atomics, no f32 scratch. A group is K
//      consecutive columns moved as 128-bit words when the row length and both arrays allow
//      (Note [CUDA element groups] in common.cuh), else one column. The walk reads several keys
//      and rows at a time (independent loads), then adds the matching ones in order, so a
//      frequent token's long run is not one dependent load after another.
// Untouched rows are never written. Ids are below 2^32 - 1 and rows below 2^32 (checked).
// The norm-gradient, softmax, cross-entropy and embedding kernels are templates on the element type
// (Note [CUDA low-precision kernels] in common.cuh); mean/rstd/lse/losses/dloss and every partial
// sum stay f32.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "tensor/cuda/common.cuh"

namespace strata::tensor::cuda {

namespace {

__device__ inline int64_t load_id(const void* ids, bool i64, int64_t i) {
  return i64 ? static_cast<const int64_t*>(ids)[i] : static_cast<const int32_t*>(ids)[i];
}

__global__ void embedding_fwd(const char* w, const void* ids, bool i64, char* out, int64_t v,
                              int64_t row_bytes, int* bad) {
  const int64_t row = blockIdx.x;
  const int64_t id = load_id(ids, i64, row);
  char* dst = out + row * row_bytes;
  if (id < 0 || id >= v) {  // reported later (Note [Deferred device checks]); the row reads 0
    if (threadIdx.x == 0) *bad = 1;
    for (int64_t k = threadIdx.x; k < row_bytes; k += blockDim.x) dst[k] = 0;
    return;
  }
  const char* src = w + id * row_bytes;
  if (row_bytes % 16 == 0 && (reinterpret_cast<uintptr_t>(src) & 15) == 0 &&
      (reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
    for (int64_t k = threadIdx.x; k < row_bytes / 16; k += blockDim.x)
      reinterpret_cast<float4*>(dst)[k] = reinterpret_cast<const float4*>(src)[k];
  } else {
    for (int64_t k = threadIdx.x; k < row_bytes; k += blockDim.x) dst[k] = src[k];
  }
}

// Note [CUDA embedding backward].
constexpr uint64_t kNoKey = ~uint64_t{0};
constexpr int kSortTile = 2048;  // keys sorted per block in shared memory (two per thread)
constexpr int kEmbedUnroll = 8;
constexpr int64_t kEmbedStartsPerBlock = 16;

__global__ void embedding_keys(const void* ids, bool i64, int64_t n, int64_t vocab, uint64_t* keys,
                               int64_t padded, int* bad) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < padded;
       r += int64_t{gridDim.x} * blockDim.x) {
    uint64_t key = kNoKey;
    if (r < n) {
      const int64_t id = load_id(ids, i64, r);
      if (id >= 0 && id < vocab)
        key = static_cast<uint64_t>(id) << 32 | static_cast<uint64_t>(r);
      else
        *bad = 1;
    }
    keys[r] = key;
  }
}

__device__ __forceinline__ void order_pair(uint64_t& a, uint64_t& b, bool ascending) {
  if ((a > b) == ascending) {
    const uint64_t t = a;
    a = b;
    b = t;
  }
}

// Stage k of the bitonic network orders position i with i + j ascending when (i & k) == 0.
// merge_k == 0: sorts each tile of `tile` keys (stages 2 .. tile). merge_k > tile: the strides
// below the tile of stage merge_k (the larger ones were done by bitonic_pass).
__global__ void bitonic_tile(uint64_t* keys, int tile, int64_t merge_k) {
  __shared__ uint64_t s[kSortTile];
  const int64_t base = blockIdx.x * int64_t{tile};
  for (int t = threadIdx.x; t < tile; t += blockDim.x) s[t] = keys[base + t];
  __syncthreads();
  const int64_t k_first = merge_k > 0 ? merge_k : 2, k_last = merge_k > 0 ? merge_k : tile;
  for (int64_t k = k_first; k <= k_last; k <<= 1) {
    for (int j = static_cast<int>(merge_k > 0 ? tile : k) / 2; j > 0; j /= 2) {
      for (int t = threadIdx.x; t < tile / 2; t += blockDim.x) {
        const int i = (t / j) * 2 * j + t % j;
        order_pair(s[i], s[i + j], ((base + i) & k) == 0);
      }
      __syncthreads();
    }
  }
  for (int t = threadIdx.x; t < tile; t += blockDim.x) keys[base + t] = s[t];
}

// One compare-exchange pass of stride j (>= the tile) of stage k over all padded keys.
__global__ void bitonic_pass(uint64_t* keys, int64_t padded, int64_t j, int64_t k) {
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < padded / 2;
       t += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = (t / j) * 2 * j + t % j;
    order_pair(keys[i], keys[i + j], (i & k) == 0);
  }
}

// K consecutive columns per thread (Note [CUDA element groups]): K = 1 reads one element of a
// row at a time, kEmbedUnroll rows ahead; K > 1 (c a multiple of K, both arrays 16-byte aligned)
// reads K columns of a row as 128-bit words, kEmbedUnroll / 4 rows ahead. Each column still adds
// its id's rows in order to the old value, so both give the same bits.
template <typename TD, typename TW, int K>
__global__ void embedding_bwd(const uint64_t* keys, int64_t n, const TD* dout, TW* dw, int64_t c) {
  constexpr int U = K == 1 ? kEmbedUnroll : kEmbedUnroll / 4;
  constexpr bool kWide = K > 1;
  const int64_t j = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) * K;
  if (j >= c) return;
  for (int64_t first = blockIdx.y * kEmbedStartsPerBlock; first < n;
       first += int64_t{gridDim.y} * kEmbedStartsPerBlock) {
    const int64_t last = first + kEmbedStartsPerBlock < n ? first + kEmbedStartsPerBlock : n;
    for (int64_t s = first; s < last; ++s) {
      const uint64_t id = keys[s] >> 32;
      if (keys[s] == kNoKey || (s > 0 && keys[s - 1] >> 32 == id)) continue;  // not a start
      TW* w = dw + static_cast<int64_t>(id) * c + j;
      float acc[K];
      load_group<K>(kWide, w, K, acc);
      for (int64_t k = s;; k += U) {
        float v[U][K];
        bool hit[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const uint64_t key = k + u < n ? keys[k + u] : kNoKey;
          hit[u] = key >> 32 == id;
          if (hit[u]) {
            load_group<K>(kWide, dout + static_cast<int64_t>(key & 0xffffffffu) * c + j, K, v[u]);
          } else {
#pragma unroll
            for (int e = 0; e < K; ++e) v[u][e] = 0.f;
          }
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (hit[u]) {
#pragma unroll
            for (int e = 0; e < K; ++e) acc[e] += v[u][e];
          }
        if (!hit[U - 1]) break;  // sorted: the run ended within these keys
      }
      store_group<K>(kWide, w, K, acc);
    }
  }
}

// Note [CUDA cross-entropy]
// A row is [ld] logits of which the first v take part (Backend::cross_entropy_*: the padding
// columns of a padded vocabulary are skipped in place). One block of row_threads(v) threads per
// row; the forward reads the row once. Aligned rows are read in 128-bit packs (8 bf16/f16 or 4
// f32) with a scalar tail: thread i takes packs i, i + T, i + 2T, ... in that order, then tail
// elements. Each thread keeps an online (max, sum of exp(x - max)) pair, updated once per pack
// (max_sum_add_pack: the pack's max, at most one rescale, then the pack's exps added in element
// order), so a pack's exps are independent and only the additions are a chain; the tail and
// unaligned rows take one element at a time (max_sum_add). A fixed tree merges the pairs. A
// thread loads kCeBatch packs before it adds the first (more loads in flight; the same order of
// additions). Every exp is the accurate expf, as on the CPU.
// The backward (ce_grad_row) writes the whole row, the skipped columns as 0, in packs too:
// p = expf(x - lse), (p - 1 at the target, else p) * dloss, rounded once; an ignored row is all
// zeros, and columns at or past v are written without being read.
// Numerics: the gradient is a function of (x, lse, dloss) element by element, so its bits do not
// depend on the launch. lse (so the losses) depends on the order above: a per-element online
// update (max_sum_add on every element) adds the same expf terms but rescales the sum at each new
// maximum instead of once per pack, so it can differ in the last bits. Which thread sums which
// element, and the tree, depend only on (v, dtype, row alignment), never on the register cache of
// Note [CUDA fused cross-entropy]. A +inf logit makes lse NaN (exp(inf - inf)), as on the CPU.
constexpr int kCeBatch = 4;  // packs loaded before the first is used (streaming passes)

__device__ __forceinline__ void max_sum_add(float& m, float& s, float x) {
  if (x > m) {
    s = s * expf(m - x) + expf(x - x);  // m == -inf: expf(-inf) == 0; 1, or NaN for x == +inf
    m = x;
  } else if (x != -INFINITY) {
    s += expf(x - m);  // NaN x gives a NaN sum, as the CPU's max-then-sum does
  }
}

// A pack's elements as f32 (to_f32 of each). bf16 widens the pack's 32-bit words in place, which
// keeps ptxas from splitting cached packs into 16-bit halves in registers of their own.
template <typename T>
__device__ __forceinline__ void unpack_f32(const Pack<T>& pk, float (&x)[Pack<T>::kN]) {
#pragma unroll
  for (int e = 0; e < Pack<T>::kN; ++e) x[e] = to_f32(pk.v[e]);
}
template <>
__device__ __forceinline__ void unpack_f32(const Pack<__nv_bfloat16>& pk, float (&x)[8]) {
  uint32_t w[4];
  memcpy(w, &pk, sizeof w);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x[2 * i] = __uint_as_float(w[i] << 16);
    x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

// One pack: its max (fmaxf skips NaN, which still makes the sum NaN), one rescale if it is new,
// then each element's exp added in order; -inf adds nothing (while m is -inf its exp is NaN).
template <typename T>
__device__ __forceinline__ void max_sum_add_pack(float& m, float& s, const Pack<T>& pk) {
  constexpr int P = Pack<T>::kN;
  float x[P];
  unpack_f32(pk, x);
  float pm = -INFINITY;
#pragma unroll
  for (int e = 0; e < P; ++e) pm = fmaxf(pm, x[e]);
  if (pm > m) {
    s = s * expf(m - pm);  // m == -inf: expf(-inf) == 0
    m = pm;
  }
#pragma unroll
  for (int e = 0; e < P; ++e)
    if (x[e] != -INFINITY) s += expf(x[e] - m);
}

__device__ __forceinline__ void max_sum_merge(float& m, float& s, float m2, float s2) {
  if (m2 > m) {
    s = s * expf(m - m2) + s2;
    m = m2;
  } else if (m2 != -INFINITY) {
    s += s2 * expf(m2 - m);
  }
}

// Block-wide merge of the (max, sum) pairs, the same fixed tree as block_sum. Every thread gets
// the result.
__device__ inline void block_max_sum(float& m, float& s, float* shm, float* shs) {
  for (int o = 16; o > 0; o >>= 1)
    max_sum_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) {
    shm[warp] = m;
    shs[warp] = s;
  }
  __syncthreads();
  const int nwarps = blockDim.x / 32;
  m = lane < nwarps ? shm[lane] : -INFINITY;
  s = lane < nwarps ? shs[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1)
    max_sum_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
}

__device__ __forceinline__ bool device_aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// This thread's (max, sum) pair over the first v elements of its row (Note [CUDA cross-entropy]).
// C > 0 keeps the thread's packs in `cache` (cache[c] is pack threadIdx.x + c * T) for the
// gradient sweep of ce_fused; the launcher guarantees C * T >= v / P then. C == 0 streams the
// packs kCeBatch at a time. Both add the same values in the same order.
template <typename T, int C>
__device__ __forceinline__ void ce_thread_max_sum(const T* xr, int64_t v, bool aligned,
                                                  Pack<T> (&cache)[C > 0 ? C : 1], float& m,
                                                  float& s) {
  constexpr int P = Pack<T>::kN;
  const int nt = static_cast<int>(blockDim.x), tid = static_cast<int>(threadIdx.x);
  m = -INFINITY;
  s = 0.f;
  int64_t done = 0;
  if (aligned) {
    const Pack<T>* xp = reinterpret_cast<const Pack<T>*>(xr);
    const int packs = static_cast<int>(v / P);
    if constexpr (C > 0) {
#pragma unroll
      for (int c = 0; c < C; ++c)
        if (tid + c * nt < packs) cache[c] = xp[tid + c * nt];
#pragma unroll
      for (int c = 0; c < C; ++c)
        if (tid + c * nt < packs) max_sum_add_pack(m, s, cache[c]);
    } else {
      for (int k = tid; k < packs; k += kCeBatch * nt) {
        Pack<T> pk[kCeBatch];
#pragma unroll
        for (int u = 0; u < kCeBatch; ++u)
          if (k + u * nt < packs) pk[u] = xp[k + u * nt];
#pragma unroll
        for (int u = 0; u < kCeBatch; ++u)
          if (k + u * nt < packs) max_sum_add_pack(m, s, pk[u]);
      }
    }
    done = packs * P;
  }
  for (int64_t j = done + threadIdx.x; j < v; j += nt) max_sum_add(m, s, to_f32(xr[j]));
}

// A row's gradient parameters in 32-bit columns (rows are under 2^31, checked by CudaBackend):
// vv columns take part (0 for an ignored row), t is the target's column or -1 if not one of them.
struct CeRow {
  int vv, t;
  float l, g;  // lse and dloss
};

__device__ __forceinline__ CeRow ce_row(int64_t t, int64_t ignore, int64_t v, float l, float g) {
  const int vv = t == ignore ? 0 : static_cast<int>(v);
  return {vv, t >= 0 && t < vv ? static_cast<int>(t) : -1, l, g};
}

// The gradient of the logit in column j: 0 at or past vv.
__device__ __forceinline__ float ce_grad(float xv, int j, const CeRow& r) {
  if (j >= r.vv) return 0.f;
  const float p = expf(xv - r.l);
  return (j == r.t ? p - 1.0f : p) * r.g;
}

// The gradient of pack k (columns k * P .. k * P + P - 1): ce_grad of each element, without the
// per-element tests where the pack lies inside [0, vv) and does not hold the target.
template <typename T>
__device__ __forceinline__ Pack<T> ce_grad_pack(const Pack<T>& x, int k, const CeRow& r) {
  constexpr int P = Pack<T>::kN;
  float xf[P];
  unpack_f32(x, xf);
  Pack<T> out;
  if (k < r.vv / P && k != r.t / P) {  // r.t == -1 gives pack 0, which takes the general path
#pragma unroll
    for (int e = 0; e < P; ++e) out.v[e] = from_f32<T>(expf(xf[e] - r.l) * r.g);
  } else {
#pragma unroll
    for (int e = 0; e < P; ++e) out.v[e] = from_f32<T>(ce_grad(xf[e], k * P + e, r));
  }
  return out;
}

// Writes the gradient of a row (Note [CUDA cross-entropy]) into dr, which may be xr (one thread
// reads, then writes, each element). packed: both rows are 16-byte aligned. The first `cached`
// packs come from the caller's registers (as ce_thread_max_sum left them); the rest are loaded
// kCeBatch at a time, packs at or past vv not at all.
template <typename T, int C>
__device__ __forceinline__ void ce_grad_row(const T* xr, T* dr, bool packed,
                                            const Pack<T> (&cache)[C > 0 ? C : 1], int cached,
                                            int ld, const CeRow& r) {
  constexpr int P = Pack<T>::kN;
  const int nt = static_cast<int>(blockDim.x), tid = static_cast<int>(threadIdx.x);
  int done = 0;
  if (packed) {
    const Pack<T>* xp = reinterpret_cast<const Pack<T>*>(xr);
    Pack<T>* dp = reinterpret_cast<Pack<T>*>(dr);
    int first = 0;
    if constexpr (C > 0) {
#pragma unroll
      for (int c = 0; c < C; ++c)
        if (tid + c * nt < cached) dp[tid + c * nt] = ce_grad_pack(cache[c], tid + c * nt, r);
      first = cached;
    }
    const int packs = ld / P;
    for (int k = first + tid; k < packs; k += kCeBatch * nt) {
      Pack<T> pk[kCeBatch] = {};
#pragma unroll
      for (int u = 0; u < kCeBatch; ++u)
        if (k + u * nt < packs && (k + u * nt) * P < r.vv) pk[u] = xp[k + u * nt];
#pragma unroll
      for (int u = 0; u < kCeBatch; ++u)
        if (k + u * nt < packs) dp[k + u * nt] = ce_grad_pack(pk[u], k + u * nt, r);
    }
    done = packs * P;
  }
  for (int j = done + tid; j < ld; j += nt)
    dr[j] = from_f32<T>(j < r.vv ? ce_grad(to_f32(xr[j]), j, r) : 0.f);
}

template <typename T>
__global__ void __launch_bounds__(1024)
    ce_fwd(const T* x, const void* targets, bool i64, int64_t ignore, float* losses, float* lse_out,
           int64_t ld, int64_t v, int* bad) {
  __shared__ float shm[32];
  __shared__ float shs[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * ld;
  float m, s;
  Pack<T> none[1];
  ce_thread_max_sum<T, 0>(xr, v, device_aligned16(xr), none, m, s);
  block_max_sum(m, s, shm, shs);
  if (threadIdx.x != 0) return;
  const float l = m + logf(s);
  lse_out[row] = l;
  const int64_t t = load_id(targets, i64, row);
  if (t == ignore) {
    losses[row] = 0.f;
  } else if (t < 0 || t >= v) {
    *bad = 1;
    losses[row] = NAN;
  } else {
    losses[row] = l - to_f32(xr[t]);
  }
}

template <typename T>
__global__ void ce_bwd(const T* x, const void* targets, bool i64, const float* lse,
                       const float* dloss, int64_t ignore, T* dx, int64_t ld, int64_t v) {
  const int64_t row = blockIdx.x;
  const int64_t t = load_id(targets, i64, row);
  const T* xr = x + row * ld;
  T* dr = dx + row * ld;
  const Pack<T> none[1] = {};
  ce_grad_row<T, 0>(xr, dr, device_aligned16(xr) && device_aligned16(dr), none, 0,
                    static_cast<int>(ld), ce_row(t, ignore, v, lse[row], dloss[row]));
}

// Note [CUDA fused cross-entropy]: ce_fwd and ce_bwd in one block per row, for a loss whose
// gradient is known before the forward (Note [Fused cross-entropy gradient] in
// autograd/functions_nn.cpp). The first pass is ce_fwd's (same pairs, same tree), every thread
// takes lane 0's merged pair (the butterfly's lanes can differ in the last bit; lane 0 of each
// warp holds what ce_fwd's thread 0 holds), and after the tree's barriers, when every thread has
// read its part of the row, the second pass is ce_bwd's (ce_grad_row) with dloss = grad /
// norm[0] (the unfused backward's division), written over the row. The target's logit is read
// before the barriers. So the losses, lse and gradient are the two kernels' bits.
// C = kCeCachePacks (where each thread's share of the row's packs fits): the packs stay in
// registers from the first pass to the second, so the row is read from device memory once and the
// second pass only writes; __launch_bounds__(1024) holds the kernel to the 64 registers a
// 1024-thread block allows. C = 0 (wider rows, STRATA_CE_ROW_CACHE=off) reads the row again, from
// the L2 cache if it is still there. Same bits: the cache only changes where a pack comes from.
template <typename T, int C>
__global__ void __launch_bounds__(1024)
    ce_fused(T* x, const void* targets, bool i64, int64_t ignore, float* losses, float* lse_out,
             int64_t ld, int64_t v, int* bad, float grad, const float* norm) {
  __shared__ float shm[32];
  __shared__ float shs[32];
  const int64_t row = blockIdx.x;
  T* xr = x + row * ld;
  const int64_t t = load_id(targets, i64, row);
  // What the second pass needs, in 32-bit registers (the row's packs take most of the 64).
  CeRow r = ce_row(t, ignore, v, 0.f, 0.f);
  const bool ignored = t == ignore;
  const float xt = threadIdx.x == 0 && r.t >= 0 ? to_f32(xr[r.t]) : 0.f;
  const bool aligned = device_aligned16(xr);
  Pack<T> cache[C > 0 ? C : 1];
  float m, s;
  ce_thread_max_sum<T, C>(xr, v, aligned, cache, m, s);
  block_max_sum(m, s, shm, shs);
  m = __shfl_sync(0xffffffffu, m, 0);
  s = __shfl_sync(0xffffffffu, s, 0);
  r.l = m + logf(s);
  if (threadIdx.x == 0) {
    lse_out[row] = r.l;
    if (ignored) {
      losses[row] = 0.f;
    } else if (r.t < 0) {  // outside [0, v)
      *bad = 1;
      losses[row] = NAN;
    } else {
      losses[row] = r.l - xt;
    }
  }
  r.g = grad / norm[0];
  ce_grad_row<T, C>(xr, xr, aligned, cache, aligned ? static_cast<int>(v / Pack<T>::kN) : 0,
                    static_cast<int>(ld), r);
}

// out = {m, 1 / m}, m = max(1, number of targets not equal to `ignore`): the mean's divisor of
// the cross-entropy loss, left on the device (Backend::cross_entropy_norm). One block; the count
// is an integer sum, so exact and the same in any order.
__global__ void ce_norm(const void* targets, bool i64, int64_t n, int64_t ignore, float* out) {
  __shared__ long long sh[32];
  long long count = 0;
  for (int64_t r = threadIdx.x; r < n; r += blockDim.x) count += load_id(targets, i64, r) != ignore;
  count = block_sum(count, sh);
  if (threadIdx.x == 0) {
    const float m = static_cast<float>(count > 0 ? count : 1);
    out[0] = m;
    out[1] = 1.f / m;
  }
}

}  // namespace

#define STRATA_FLOAT_TYPE(tag) typename decltype(tag)::type

void launch_embedding_forward(const void* weight, const void* ids, bool ids_i64, void* out,
                              int64_t n, int64_t v, int64_t row_bytes, int* bad, Stream stream) {
  if (n == 0) return;
  STRATA_LAUNCH(static_cast<unsigned>(n), 128, 0, stream, embedding_fwd)
  (static_cast<const char*>(weight), ids, ids_i64, static_cast<char*>(out), v, row_bytes, bad);
}

int64_t embedding_sort_keys(int64_t n) {
  int64_t padded = 2;
  while (padded < n) padded *= 2;
  return padded;
}

bool launch_embedding_backward(const void* ids, bool ids_i64, int64_t n, int64_t vocab,
                               uint64_t* keys, const void* dout, int dout_dtype, void* dweight,
                               int dw_dtype, int64_t c, int* bad, Stream stream) {
  if (n == 0 || c == 0) return true;
  const int64_t padded = embedding_sort_keys(n);
  const int tile = static_cast<int>(padded < kSortTile ? padded : kSortTile);
  const auto blocks = [](int64_t threads) {
    return static_cast<unsigned>(std::min<int64_t>((threads + 255) / 256, 4096));
  };
  STRATA_LAUNCH(blocks(padded), 256, 0, stream, embedding_keys)
  (ids, ids_i64, n, vocab, keys, padded, bad);
  const auto tiles = static_cast<unsigned>(padded / tile);
  STRATA_LAUNCH(tiles, tile / 2, 0, stream, bitonic_tile)(keys, tile, 0);
  for (int64_t k = 2 * int64_t{tile}; k <= padded; k *= 2) {
    for (int64_t j = k / 2; j >= tile; j /= 2)
      STRATA_LAUNCH(blocks(padded / 2), 256, 0, stream, bitonic_pass)(keys, padded, j, k);
    STRATA_LAUNCH(tiles, tile / 2, 0, stream, bitonic_tile)(keys, tile, k);
  }
  const int64_t groups = (n + kEmbedStartsPerBlock - 1) / kEmbedStartsPerBlock;
  const unsigned grid_y = static_cast<unsigned>(groups < 65535 ? groups : 65535);
  bool ok = false;
  dispatch_float(dout_dtype, [&](auto dtag) {
    using TD = STRATA_FLOAT_TYPE(dtag);
    ok = dispatch_float(dw_dtype, [&](auto wtag) {
      using TW = STRATA_FLOAT_TYPE(wtag);
      constexpr int K = group_width<TD, TW>;
      const auto* d = static_cast<const TD*>(dout);
      auto* w = static_cast<TW*>(dweight);
      if (c % K == 0 && aligned16(dout) && aligned16(dweight)) {
        const dim3 grid(static_cast<unsigned>((c / K + 127) / 128), grid_y);
        STRATA_LAUNCH(grid, 128, 0, stream, embedding_bwd<TD, TW, K>)(keys, n, d, w, c);
      } else {
        const dim3 grid(static_cast<unsigned>((c + 127) / 128), grid_y);
        STRATA_LAUNCH(grid, 128, 0, stream, embedding_bwd<TD, TW, 1>)(keys, n, d, w, c);
      }
    });
  });
  return ok;
}

bool launch_cross_entropy_forward(int dt, const void* logits, const void* targets, bool targets_i64,
                                  int64_t ignore_index, float* losses, float* lse, int64_t n,
                                  int64_t ld, int64_t v, int* bad, Stream stream) {
  return dispatch_float(dt, [&](auto tag) {
    using T = STRATA_FLOAT_TYPE(tag);
    if (n == 0) return;
    STRATA_LAUNCH(static_cast<unsigned>(n), row_threads(v), 0, stream, ce_fwd<T>)
    (static_cast<const T*>(logits), targets, targets_i64, ignore_index, losses, lse, ld, v, bad);
  });
}

void launch_cross_entropy_norm(const void* targets, bool targets_i64, int64_t n,
                               int64_t ignore_index, float* out, Stream stream) {
  STRATA_LAUNCH(1, 1024, 0, stream, ce_norm)(targets, targets_i64, n, ignore_index, out);
}

bool launch_cross_entropy_backward(int dt, const void* logits, const void* targets,
                                   bool targets_i64, const float* lse, const float* dloss,
                                   int64_t ignore_index, void* dlogits, int64_t n, int64_t ld,
                                   int64_t v, Stream stream) {
  return dispatch_float(dt, [&](auto tag) {
    using T = STRATA_FLOAT_TYPE(tag);
    if (n == 0) return;
    STRATA_LAUNCH(static_cast<unsigned>(n), 512, 0, stream, ce_bwd<T>)
    (static_cast<const T*>(logits), targets, targets_i64, lse, dloss, ignore_index,
     static_cast<T*>(dlogits), ld, v);
  });
}

bool launch_cross_entropy_fused(int dt, void* logits, const void* targets, bool targets_i64,
                                int64_t ignore_index, float* losses, float* lse, int64_t n,
                                int64_t ld, int64_t v, int* bad, float grad, const float* norm,
                                bool row_cache, Stream stream) {
  return dispatch_float(dt, [&](auto tag) {
    using T = STRATA_FLOAT_TYPE(tag);
    if (n == 0) return;
    const int threads = row_threads(v);
    const auto grid = static_cast<unsigned>(n);
    auto* x = static_cast<T*>(logits);
    // Note [CUDA fused cross-entropy]: the register cache when each thread's share of the row's
    // packs fits in it.
    if (row_cache && ce_row_cache_fits(v, static_cast<int>(sizeof(T)))) {
      STRATA_LAUNCH(grid, threads, 0, stream, ce_fused<T, kCeCachePacks>)
      (x, targets, targets_i64, ignore_index, losses, lse, ld, v, bad, grad, norm);
    } else {
      STRATA_LAUNCH(grid, threads, 0, stream, ce_fused<T, 0>)
      (x, targets, targets_i64, ignore_index, losses, lse, ld, v, bad, grad, norm);
    }
  });
}

bool ce_row_cache_fits(int64_t v, int element_size) {
  const int64_t packs = v / (16 / element_size), threads = row_threads(v);
  return (packs + threads - 1) / threads <= kCeCachePacks;
}

#undef STRATA_FLOAT_TYPE

}  // namespace strata::tensor::cuda
