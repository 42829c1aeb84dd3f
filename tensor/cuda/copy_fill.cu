// CUDA copy (strided, casting), fill, arange and the random draws (the host side is in
// cuda_backend.cpp and copy_fill.cpp). Every output element depends only on its own inputs, so
// results are deterministic. The float kernels are templates on the element type (Note [CUDA
// low-precision kernels] in common.cuh); contiguous paths move 128 bits per load and store when
// every pointer is 16-byte aligned, with a scalar tail, and fall back to one element per thread
// otherwise.
#include <cmath>
#include <cstring>
#include <type_traits>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/elementwise_common.cuh"

namespace strata::tensor::cuda {

namespace {

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

// Note [CUDA same-dtype copies]
// Most copies are layout changes without a cast (contiguous() of a transposed or narrowed view).
// For those the host first merges dimensions that are contiguous in both views (so [B, H, T, D]
// <-> [B, T, H, D] is three dims, a narrow two), and when every index and offset fits in 31 bits
// the kernel moves raw 1/2/4/8-byte elements with 32-bit index arithmetic (a 64-bit division is
// several times the cost of a 32-bit one, and the index math dominates such a copy), writing a
// contiguous destination by its linear index.
struct Strided32 {
  int ndim;
  uint32_t shape[kMaxDims];
  uint32_t strides[kMaxDims];
};

// Unrolled over every possible dim with a guard, so shape and strides are indexed by constants
// and stay in the parameter space (a loop bounded by v.ndim made ptxas copy both arrays to local
// memory: a 136-byte stack frame per thread).
__device__ __forceinline__ uint32_t offset32(const Strided32& v, uint32_t i) {
  uint32_t off = 0;
#pragma unroll
  for (int d = kMaxDims - 1; d >= 0; --d) {
    if (d >= v.ndim) continue;
    const uint32_t s = v.shape[d];
    off += (i % s) * v.strides[d];
    i /= s;
  }
  return off;
}

template <typename E, bool kDstContiguous>
__global__ void copy_same_kernel(const E* src, Strided32 sv, E* dst, Strided32 dv, uint32_t n) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    dst[kDstContiguous ? i : offset32(dv, i)] = src[offset32(sv, i)];
}

// Contiguous float -> float cast (the master-weights -> model-copy path): same rounding as
// copy_kernel's store_float, without the per-element index arithmetic.
// Groups of K elements (Note [CUDA element groups]): 128-bit words of both arrays when `wide`.
template <typename TS, typename TD>
__global__ void cast_contig_kernel(const TS* src, TD* dst, int64_t n, bool wide) {
  constexpr int K = group_width<TS, TD>;
  for_each_group<K>(n, wide, [&](int64_t i0, int64_t valid, bool w) {
    float v[K];
    load_group<K>(w, src + i0, valid, v);
    store_group<K>(w, dst + i0, valid, v);
  });
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

__host__ __device__ inline int element_bytes(int dtype) {
  switch (dtype) {
    case kI64:
      return 8;
    case kF32:
    case kI32:
      return 4;
    case kBF16:
    case kF16:
    case kU16:
      return 2;
    default:
      return 1;
  }
}

// A contiguous fill: the element's bytes as fill_kernel stores them, repeated into a 16-byte word
// that goes out as 128-bit stores from the first 16-byte boundary on; the elements before it and
// after the last whole word are stored one at a time. dst is aligned to its element size.
__global__ void fill_contig_kernel(void* dst, int dt, int64_t n, double value) {
  const int es = element_bytes(dt);
  alignas(8) unsigned char one[8] = {};
  store_double(one, dt, 0, value);
  uint64_t bits;
  memcpy(&bits, one, sizeof bits);
  for (int shift = es * 8; shift < 64; shift *= 2) bits |= bits << shift;
  const auto lo = static_cast<uint32_t>(bits), hi = static_cast<uint32_t>(bits >> 32);
  const uint4 word = make_uint4(lo, hi, lo, hi);
  const auto addr = reinterpret_cast<uintptr_t>(dst);
  const int64_t head = min(n, static_cast<int64_t>(((16 - (addr & 15)) & 15) / es));
  const int64_t per_word = 16 / es, words = (n - head) / per_word;
  uint4* body = reinterpret_cast<uint4*>(static_cast<char*>(dst) + head * es);
  STRATA_GRID_LOOP(w, words) body[w] = word;
  const int64_t rest = n - words * per_word;  // head + tail, fewer than 2 * 16 elements
  STRATA_GRID_LOOP(r, rest) store_double(dst, dt, r < head ? r : r + words * per_word, value);
}

__global__ void arange_kernel(void* dst, int dt, int64_t n, double start, double step) {
  STRATA_GRID_LOOP(i, n) store_double(dst, dt, i, start + static_cast<double>(i) * step);
}

// The draws in groups of K elements (Note [CUDA element groups]): a Philox block gives four
// consecutive elements, so a group takes K / 4 blocks (each element's value is the one the CPU
// draws for its index) and is stored as 128-bit words when dst is 16-byte aligned.
template <typename T>
__global__ void uniform_kernel(T* dst, int64_t n, uint64_t seed, uint64_t sid, float lo, float hi,
                               bool wide) {
  constexpr int K = group_width<T>;
  const float span = hi - lo;
  for_each_group<K>(n, wide, [&](int64_t i0, int64_t valid, bool w) {
    float v[K];
#pragma unroll
    for (int q = 0; q < K / 4; ++q) {
      const U4 r = philox(seed, sid, static_cast<uint64_t>(i0 / 4 + q));
#pragma unroll
      for (int l = 0; l < 4; ++l) v[q * 4 + l] = lo + span * unit_float(lane_of(r, l));
    }
    store_group<K>(w, dst + i0, valid, v);
  });
}

// Box-Muller on the lanes of a Philox block: lanes (0, 1) give elements 4b and 4b + 1 (cos, sin),
// lanes (2, 3) elements 4b + 2 and 4b + 3.
template <typename T>
__global__ void normal_kernel(T* dst, int64_t n, uint64_t seed, uint64_t sid, float mean,
                              float stddev, bool wide) {
  constexpr int K = group_width<T>;
  for_each_group<K>(n, wide, [&](int64_t i0, int64_t valid, bool w) {
    float v[K];
#pragma unroll
    for (int q = 0; q < K / 4; ++q) {
      const U4 r = philox(seed, sid, static_cast<uint64_t>(i0 / 4 + q));
#pragma unroll
      for (int pair = 0; pair < 2; ++pair) {
        const float u1 =
            (static_cast<float>(lane_of(r, 2 * pair) >> 8) + 1.0f) * (1.0f / 16777216.0f);
        const float u2 = unit_float(lane_of(r, 2 * pair + 1));
        // Full-precision libm-equivalents (no fast-math), so the values match the CPU's to ~1 ulp.
        const float rad = sqrtf(-2.0f * logf(u1));
        const float theta = 6.283185307179586f * u2;
        v[q * 4 + 2 * pair] = mean + stddev * (rad * cosf(theta));
        v[q * 4 + 2 * pair + 1] = mean + stddev * (rad * sinf(theta));
      }
    }
    store_group<K>(w, dst + i0, valid, v);
  });
}

// Note [CUDA same-dtype copies]: drops size-1 dims and merges dim d into d + 1 when both views
// step over d as over one longer d + 1. False if the result does not fit Strided32.
bool collapse_views(const Strided& a, const Strided& b, Strided32& ca, Strided32& cb) {
  int64_t shape[kMaxDims], sa[kMaxDims], sb[kMaxDims];
  int nd = 0;
  for (int d = 0; d < a.ndim; ++d) {
    if (a.shape[d] == 1) continue;
    if (a.shape[d] < 1 || a.strides[d] < 0 || b.strides[d] < 0) return false;
    if (nd > 0 && sa[nd - 1] == a.strides[d] * a.shape[d] &&
        sb[nd - 1] == b.strides[d] * a.shape[d]) {
      shape[nd - 1] *= a.shape[d];
      sa[nd - 1] = a.strides[d];
      sb[nd - 1] = b.strides[d];
      continue;
    }
    shape[nd] = a.shape[d];
    sa[nd] = a.strides[d];
    sb[nd] = b.strides[d];
    ++nd;
  }
  if (nd == 0) {  // a single element
    shape[0] = 1;
    sa[0] = sb[0] = 0;
    nd = 1;
  }
  constexpr int64_t kMax = int64_t{1} << 31;
  int64_t reach_a = 0, reach_b = 0, total = 1;
  for (int d = 0; d < nd; ++d) {
    reach_a += (shape[d] - 1) * sa[d];
    reach_b += (shape[d] - 1) * sb[d];
    total *= shape[d];
  }
  if (total >= kMax || reach_a >= kMax || reach_b >= kMax) return false;
  ca.ndim = cb.ndim = nd;
  for (int d = 0; d < nd; ++d) {
    ca.shape[d] = cb.shape[d] = static_cast<uint32_t>(shape[d]);
    ca.strides[d] = static_cast<uint32_t>(sa[d]);
    cb.strides[d] = static_cast<uint32_t>(sb[d]);
  }
  return true;
}

template <typename E>
void copy_same(const void* src, const Strided32& sv, void* dst, const Strided32& dv,
               bool dst_contig, int64_t n, Stream stream) {
  const auto s = static_cast<const E*>(src);
  const auto d = static_cast<E*>(dst);
  const auto count = static_cast<uint32_t>(n);
  if (dst_contig) {
    STRATA_LAUNCH(blocks_for(n, kThreads), kThreads, 0, stream, copy_same_kernel<E, true>)
    (s, sv, d, dv, count);
  } else {
    STRATA_LAUNCH(blocks_for(n, kThreads), kThreads, 0, stream, copy_same_kernel<E, false>)
    (s, sv, d, dv, count);
  }
}

}  // namespace

void launch_copy(const void* src, int src_dtype, const Strided& src_view, void* dst, int dst_dtype,
                 const Strided& dst_view, int64_t n, Stream stream) {
  if (src_dtype <= kF16 && dst_dtype <= kF16 && contiguous(src_view) && contiguous(dst_view)) {
    dispatch_float(src_dtype, [&](auto s) {
      using TS = typename decltype(s)::type;
      dispatch_float(dst_dtype, [&](auto d) {
        using TD = typename decltype(d)::type;
        constexpr int K = group_width<TS, TD>;
        STRATA_LAUNCH(blocks_for((n + K - 1) / K, kThreads), kThreads, 0, stream,
                      cast_contig_kernel<TS, TD>)
        (static_cast<const TS*>(src), static_cast<TD*>(dst), n, aligned16(src) && aligned16(dst));
      });
    });
    return;
  }
  Strided32 sv, dv;
  if (src_dtype == dst_dtype && collapse_views(src_view, dst_view, sv, dv)) {
    const bool dst_contig = contiguous(dst_view);
    switch (element_bytes(src_dtype)) {
      case 8:
        return copy_same<uint64_t>(src, sv, dst, dv, dst_contig, n, stream);
      case 4:
        return copy_same<uint32_t>(src, sv, dst, dv, dst_contig, n, stream);
      case 2:
        return copy_same<uint16_t>(src, sv, dst, dv, dst_contig, n, stream);
      default:
        return copy_same<uint8_t>(src, sv, dst, dv, dst_contig, n, stream);
    }
  }
  STRATA_LAUNCH(blocks_for(n, kThreads), kThreads, 0, stream, copy_kernel)
  (src, src_dtype, src_view, dst, dst_dtype, dst_view, n);
}

void launch_fill(void* dst, int dtype, const Strided& view, int64_t n, double value,
                 Stream stream) {
  if (contiguous(view)) {
    STRATA_LAUNCH(blocks_for(n * element_bytes(dtype) / 16 + 1, kThreads), kThreads, 0, stream,
                  fill_contig_kernel)
    (dst, dtype, n, value);
    return;
  }
  STRATA_LAUNCH(blocks_for(n, kThreads), kThreads, 0, stream, fill_kernel)
  (dst, dtype, view, n, value);
}

void launch_arange(void* dst, int dtype, int64_t n, double start, double step, Stream stream) {
  STRATA_LAUNCH(blocks_for(n, kThreads), kThreads, 0, stream, arange_kernel)
  (dst, dtype, n, start, step);
}

bool launch_random_uniform(void* dst, int dt, int64_t n, uint64_t seed, uint64_t stream_id,
                           float lo, float hi, Stream stream) {
  return dispatch_float(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int K = group_width<T>;
    STRATA_LAUNCH(blocks_for((n + K - 1) / K, kThreads), kThreads, 0, stream, uniform_kernel<T>)
    (static_cast<T*>(dst), n, seed, stream_id, lo, hi, aligned16(dst));
  });
}

bool launch_random_normal(void* dst, int dt, int64_t n, uint64_t seed, uint64_t stream_id,
                          float mean, float stddev, Stream stream) {
  return dispatch_float(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int K = group_width<T>;
    STRATA_LAUNCH(blocks_for((n + K - 1) / K, kThreads), kThreads, 0, stream, normal_kernel<T>)
    (static_cast<T*>(dst), n, seed, stream_id, mean, stddev, aligned16(dst));
  });
}

}  // namespace strata::tensor::cuda
