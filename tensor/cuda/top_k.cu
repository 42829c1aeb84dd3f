// The k largest elements of each row, best first, on the device (Note [Top-k] in tensor/ops.h).
//
// Note [CUDA top-k]
// One block per row. A row of GPT-2's vocabulary is 50257 elements and k is small (a sampler's
// top-k, or 1 for greedy), so the block selects rather than sorts:
//   1. Each element maps to a 32-bit key whose unsigned order is the op's order (order_key: the
//      float's bits flipped so larger floats give larger keys, -0 made +0, every NaN the largest
//      key). A radix select over the key's four bytes, most significant first, finds the k-th
//      largest key T and how many elements equal to T the result takes (`need`): each pass counts
//      the elements that match the bytes fixed so far into 256 bins in shared memory, and one
//      warp scans the bins from the top (a warp prefix sum over eight bins per lane) for the byte
//      where the count passes the rank still wanted. The counts are integers, so the order the
//      atomics land in changes nothing. Logits crowd into a few bins, so a warp adds each distinct
//      bin once (a leader per bin, found with ballots) instead of 32 atomics on one address. A
//      thread loads its eight elements of a tile before it counts any, so eight loads are in
//      flight rather than one: with one block per row, load latency bounds a pass, and the row is
//      read five times (four passes and the candidates' pass).
//   2. The candidates: every element with a key above T, and the first `need` elements (by index)
//      whose key is T. Those above T are all taken, in any order; when every element equal to T is
//      taken too (no tie straddles the cut, the usual case) one pass places both with atomic
//      slots. Otherwise the row is walked in tiles of the block's width, in index order, and each
//      tile's equal elements are ranked with ballots, so the smallest indices are the ones taken.
//   3. The k candidates, as 64-bit (key, ~index) words in shared memory, are sorted by a bitonic
//      network, largest first: larger keys first, equal keys by smaller index. The set is fixed by
//      the row and the order is total, so the output's bits are the same on every run, and they
//      are the CPU backend's (which sorts the same words).
// Values are copied from the row (no rounding), indices are I64. k is at most kTopKMax (the
// candidates live in shared memory); the backend takes larger k on the host.
// k = 1 (a greedy draw's candidate) needs no select: top_1_kernel reads the row once, each thread
// keeping the largest (key, ~index) word of its elements, and the block takes the largest of
// those (warp shuffles, then one warp over the warps' words). The same words as above, so the
// same element: one read of the row instead of five, and no atomics.
#include <cstdint>

#include "tensor/cuda/common.cuh"

namespace strata::tensor::cuda {

namespace {

constexpr int kTopKThreads = 1024;
constexpr int kTopKWarps = kTopKThreads / 32;
constexpr int kTopKUnroll = 8;  // elements a thread loads per tile, all before using any
constexpr int64_t kTopKTile = int64_t{kTopKThreads} * kTopKUnroll;
constexpr unsigned kBins = 256;  // one byte of the key per pass
constexpr unsigned kFull = 0xffffffffu;
static_assert(kTopKWarps == 32, "top_1_kernel reduces one word per warp in one warp");

// The op's order as unsigned order: larger floats give larger keys, -0 == +0, NaN on top. A real
// key is at least order_key(-inf) = 0x007fffff, so 0 pads the sort.
__device__ __forceinline__ uint32_t order_key(float f) {
  if (f != f) return 0xffffffffu;
  uint32_t u = __float_as_uint(f);
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Larger word = earlier in the result: the key, then the smaller index.
__device__ __forceinline__ unsigned long long candidate(uint32_t key, int64_t i) {
  return (static_cast<unsigned long long>(key) << 32) |
         (0xffffffffull - static_cast<unsigned long long>(i));
}

template <typename T>
__global__ void __launch_bounds__(kTopKThreads)
    top_k_kernel(const T* x, int64_t n, int64_t row_stride, int k, T* values, int64_t* indices) {
  __shared__ unsigned hist[kBins];
  __shared__ unsigned long long cand[kTopKMax];
  __shared__ unsigned warp_eq[kTopKWarps];
  __shared__ unsigned s_prefix, s_need, s_count, s_above, s_eq;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const T* row = x + static_cast<int64_t>(blockIdx.x) * row_stride;

  // 1. Radix select: after the pass at `shift`, prefix holds the key's bytes down to shift, and
  //    need is the rank (from 1, largest first) of the wanted key among those matching it.
  uint32_t prefix = 0, mask = 0;
  unsigned need = static_cast<unsigned>(k), count_t = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (unsigned b = static_cast<unsigned>(tid); b < kBins; b += kTopKThreads) hist[b] = 0;
    __syncthreads();
    // Whole tiles, so every lane of a warp takes part in its ballots; each thread loads its
    // kTopKUnroll elements of a tile before counting any (that many loads in flight).
    for (int64_t base = 0; base < n; base += kTopKTile) {
      unsigned bins[kTopKUnroll];
#pragma unroll
      for (int u = 0; u < kTopKUnroll; ++u) {
        const int64_t i = base + u * kTopKThreads + tid;
        bins[u] = kBins;  // none
        if (i < n) {
          const uint32_t key = order_key(to_f32(row[i]));
          if ((key & mask) == prefix) bins[u] = (key >> shift) & (kBins - 1);
        }
      }
#pragma unroll
      for (int u = 0; u < kTopKUnroll; ++u) {
        const unsigned bin = bins[u];
        unsigned todo = __ballot_sync(kFull, bin != kBins);
        while (todo != 0) {
          const int leader = __ffs(static_cast<int>(todo)) - 1;
          const unsigned lb = __shfl_sync(kFull, bin, leader);
          const unsigned same = __ballot_sync(kFull, bin == lb) & todo;
          if (lane == leader) atomicAdd(&hist[lb], static_cast<unsigned>(__popc(same)));
          todo &= ~same;
        }
      }
    }
    __syncthreads();
    if (warp == 0) {
      // Lane l holds bins 255 - 8l down to 248 - 8l: a prefix sum over lanes counts from the top.
      unsigned c[8], local = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        c[j] = hist[kBins - 1 - static_cast<unsigned>(lane * 8 + j)];
        local += c[j];
      }
      unsigned incl = local;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const unsigned v = __shfl_up_sync(kFull, incl, off);
        if (lane >= off) incl += v;
      }
      const unsigned excl = incl - local;
      if (excl < need && incl >= need) {  // exactly one lane
        unsigned above = excl, digit = 0, cnt = 0;
        bool found = false;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (!found) {
            if (above + c[j] >= need) {
              found = true;
              digit = kBins - 1 - static_cast<unsigned>(lane * 8 + j);
              cnt = c[j];
            } else {
              above += c[j];
            }
          }
        }
        s_prefix = prefix | (digit << shift);
        s_need = need - above;
        s_count = cnt;
      }
    }
    __syncthreads();
    prefix = s_prefix;
    need = s_need;
    count_t = s_count;  // after the last pass: how many elements have key T
    mask |= (kBins - 1) << shift;
  }
  const uint32_t t = prefix;
  const unsigned taken_above = static_cast<unsigned>(k) - need;

  // 2. The candidates: cand[0, taken_above) those above T, cand[taken_above, k) those equal.
  if (tid == 0) {
    s_above = 0;
    s_eq = 0;
  }
  __syncthreads();
  if (count_t == need) {
    for (int64_t base = 0; base < n; base += kTopKTile) {
      uint32_t keys[kTopKUnroll];
#pragma unroll
      for (int u = 0; u < kTopKUnroll; ++u) {
        const int64_t i = base + u * kTopKThreads + tid;
        keys[u] = i < n ? order_key(to_f32(row[i])) : 0u;  // 0: below every real key
      }
#pragma unroll
      for (int u = 0; u < kTopKUnroll; ++u) {
        const int64_t i = base + u * kTopKThreads + tid;
        if (keys[u] > t) cand[atomicAdd(&s_above, 1u)] = candidate(keys[u], i);
        if (keys[u] == t) cand[taken_above + atomicAdd(&s_eq, 1u)] = candidate(keys[u], i);
      }
    }
  } else {
    // Ties straddle the cut: the equal elements are taken in index order, tile by tile.
    for (int64_t base = 0; base < n; base += kTopKThreads) {
      const int64_t i = base + tid;
      const uint32_t key = i < n ? order_key(to_f32(row[i])) : 0u;
      if (key > t) cand[atomicAdd(&s_above, 1u)] = candidate(key, i);
      const bool eq = i < n && key == t;
      const unsigned ballot = __ballot_sync(kFull, eq);
      if (lane == 0) warp_eq[warp] = static_cast<unsigned>(__popc(ballot));
      __syncthreads();
      unsigned rank = s_eq + static_cast<unsigned>(__popc(ballot & ((1u << lane) - 1u)));
      for (int w = 0; w < warp; ++w) rank += warp_eq[w];
      if (eq && rank < need) cand[taken_above + rank] = candidate(key, i);
      __syncthreads();
      if (tid == 0) {
        unsigned sum = 0;
        for (int w = 0; w < kTopKWarps; ++w) sum += warp_eq[w];
        s_eq += sum;
      }
      __syncthreads();
    }
  }

  // 3. Sort the k words, largest first (bitonic over the next power of two, zeros padding).
  int p = 1;
  while (p < k) p <<= 1;
  for (int i = k + tid; i < p; i += kTopKThreads) cand[i] = 0ull;
  __syncthreads();
  for (int size = 2; size <= p; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = tid; i < p; i += kTopKThreads) {
        const int j = i ^ stride;
        if (j > i) {
          const unsigned long long a = cand[i], b = cand[j];
          const bool descending = (i & size) == 0;
          if ((a < b) == descending) {
            cand[i] = b;
            cand[j] = a;
          }
        }
      }
      __syncthreads();
    }
  }
  T* vout = values + static_cast<int64_t>(blockIdx.x) * k;
  int64_t* iout = indices + static_cast<int64_t>(blockIdx.x) * k;
  for (int j = tid; j < k; j += kTopKThreads) {
    const auto i = static_cast<int64_t>(0xffffffffull - (cand[j] & 0xffffffffull));
    vout[j] = row[i];
    iout[j] = i;
  }
}

// Note [CUDA top-k], k = 1.
template <typename T>
__global__ void __launch_bounds__(kTopKThreads)
    top_1_kernel(const T* x, int64_t n, int64_t row_stride, T* values, int64_t* indices) {
  __shared__ unsigned long long warp_best[kTopKWarps];
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const T* row = x + static_cast<int64_t>(blockIdx.x) * row_stride;
  unsigned long long best = 0;  // below every real element's word
  for (int64_t base = 0; base < n; base += kTopKTile) {
    uint32_t keys[kTopKUnroll];
#pragma unroll
    for (int u = 0; u < kTopKUnroll; ++u) {
      const int64_t i = base + u * kTopKThreads + tid;
      keys[u] = i < n ? order_key(to_f32(row[i])) : 0u;
    }
#pragma unroll
    for (int u = 0; u < kTopKUnroll; ++u) {
      const int64_t i = base + u * kTopKThreads + tid;
      if (i < n) {
        const unsigned long long w = candidate(keys[u], i);
        if (w > best) best = w;
      }
    }
  }
  for (int off = 16; off > 0; off >>= 1) {
    const unsigned long long o = __shfl_xor_sync(kFull, best, off);
    if (o > best) best = o;
  }
  if (lane == 0) warp_best[warp] = best;
  __syncthreads();
  if (warp != 0) return;
  best = warp_best[lane];  // kTopKWarps == 32: one word per lane
  for (int off = 16; off > 0; off >>= 1) {
    const unsigned long long o = __shfl_xor_sync(kFull, best, off);
    if (o > best) best = o;
  }
  if (lane == 0) {
    const auto i = static_cast<int64_t>(0xffffffffull - (best & 0xffffffffull));
    values[blockIdx.x] = row[i];
    indices[blockIdx.x] = i;
  }
}

}  // namespace

bool launch_top_k(int dt, const void* x, int64_t rows, int64_t n, int64_t row_stride, int64_t k,
                  void* values, int64_t* indices, Stream stream) {
  return dispatch_float(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (rows == 0 || k == 0) return;
    if (k == 1) {
      STRATA_LAUNCH(static_cast<unsigned>(rows), kTopKThreads, 0, stream, top_1_kernel<T>)
      (static_cast<const T*>(x), n, row_stride, static_cast<T*>(values), indices);
      return;
    }
    STRATA_LAUNCH(static_cast<unsigned>(rows), kTopKThreads, 0, stream, top_k_kernel<T>)
    (static_cast<const T*>(x), n, row_stride, static_cast<int>(k), static_cast<T*>(values),
     indices);
  });
}

}  // namespace strata::tensor::cuda
