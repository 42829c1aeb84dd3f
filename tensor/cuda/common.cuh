#pragma once
// Device helpers shared by the .cu files: dtype loads/stores, strided indexing, Philox (the same
// function as core/rng.cpp, so a GPU draw gives the CPU's bits), block reductions.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "tensor/cuda/kernels.h"
#include "tensor/cuda/launch.cuh"

namespace strata::tensor::cuda {

enum DT : int { kF32 = 0, kBF16, kF16, kI32, kI64, kU16, kU8 };

inline int blocks_for(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 65535 * 32 ? (b < 1 ? 1 : b) : 65535 * 32);
}

// Note [Row chunks on grid.y]: the column reductions (bias, norm weight gradients) give each
// chunk of rows a blockIdx.y, but grid.y holds at most 65535, which [N, C] with N above 65535
// chunks (4.2M rows at 64 rows a chunk) would pass. The launch takes chunk_grid(chunks) blocks
// in y and each block loops over the chunks blockIdx.y, + gridDim.y, ...: every chunk is still
// summed alone in row order, so the partials, and the bits, do not depend on the grid.
inline unsigned chunk_grid(int64_t chunks) {
  return static_cast<unsigned>(chunks < 65535 ? (chunks < 1 ? 1 : chunks) : 65535);
}

// The block size of a one-block-per-row kernel over rows of c elements (softmax, cross-entropy).
inline int row_threads(int64_t c) {
  return c >= 1024 ? 1024 : c >= 512 ? 512 : c >= 256 ? 256 : c >= 128 ? 128 : 64;
}

// Loads element i of a typed array as double (exact for every Strata dtype but i64 > 2^53).
__device__ inline double load_as_double(const void* p, int dtype, int64_t i) {
  switch (dtype) {
    case kF32:
      return static_cast<const float*>(p)[i];
    case kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case kF16:
      return __half2float(static_cast<const __half*>(p)[i]);
    case kI32:
      return static_cast<const int32_t*>(p)[i];
    case kI64:
      return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case kU16:
      return static_cast<const uint16_t*>(p)[i];
    default:
      return static_cast<const uint8_t*>(p)[i];
  }
}

__device__ inline float load_float(const void* p, int dtype, int64_t i) {
  switch (dtype) {
    case kF32:
      return static_cast<const float*>(p)[i];
    case kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case kF16:
      return __half2float(static_cast<const __half*>(p)[i]);
    default:
      return static_cast<float>(load_as_double(p, dtype, i));
  }
}

__device__ inline void store_float(void* p, int dtype, int64_t i, float v) {
  switch (dtype) {
    case kF32:
      static_cast<float*>(p)[i] = v;
      break;
    case kBF16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
      break;
    case kF16:
      static_cast<__half*>(p)[i] = __float2half_rn(v);
      break;
    // Float to integer truncates through int64, then wraps (Note [Dtype conversion]).
    case kI32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(static_cast<int64_t>(v));
      break;
    case kI64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      break;
    case kU16:
      static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(static_cast<int64_t>(v));
      break;
    default:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(static_cast<int64_t>(v));
      break;
  }
}

// v rounded to a float dtype and widened back: what a store_float and load_float round trip gives.
__device__ inline float round_to(int dtype, float v) {
  switch (dtype) {
    case kBF16:
      return __bfloat162float(__float2bfloat16_rn(v));
    case kF16:
      return __half2float(__float2half_rn(v));
    default:
      return v;
  }
}

__device__ inline bool is_float_dtype(int dtype) {
  return dtype <= kF16;
}

__device__ inline int64_t load_int(const void* p, int dtype, int64_t i) {
  switch (dtype) {
    case kI32:
      return static_cast<const int32_t*>(p)[i];
    case kI64:
      return static_cast<const int64_t*>(p)[i];
    case kU16:
      return static_cast<const uint16_t*>(p)[i];
    case kU8:
      return static_cast<const uint8_t*>(p)[i];
    default:
      return static_cast<int64_t>(load_float(p, dtype, i));
  }
}

__device__ inline void store_int(void* p, int dtype, int64_t i, int64_t v) {
  switch (dtype) {
    case kI32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      break;
    case kI64:
      static_cast<int64_t*>(p)[i] = v;
      break;
    case kU16:
      static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(v);
      break;
    case kU8:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v);
      break;
    default:
      store_float(p, dtype, i, static_cast<float>(v));
      break;
  }
}

// ---- Note [CUDA low-precision kernels] ----
// Float kernels are templates on their element type T (float, __nv_bfloat16, __half): each
// element is widened to f32 on load (to_f32), the arithmetic is the f32 kernel's, and the result
// is rounded once, to nearest even, on store (from_f32). Accumulators stay f32 (or f64) whatever
// T is, and the outputs the contract keeps in F32 (norm mean/rstd, attention lse, cross-entropy
// losses/lse/dloss, matmul's optional F32 out) are plain float*. The host picks T from a
// strata::DType number with dispatch_float; a dtype outside F32/BF16/F16 enqueues nothing and the
// launcher returns false, which the backend turns into an internal error (it validated first).
// See Note [Low-precision ops] in tensor/ops.h for the contract shared with the CPU backend.
__device__ __forceinline__ float to_f32(float v) {
  return v;
}
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
__device__ __forceinline__ float to_f32(__half v) {
  return __half2float(v);
}
template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) {
  return __float2half_rn(v);
}

// 128 bits of T: 4 floats or 8 bf16/f16, for vectorised loads and stores of contiguous data.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kN = 16 / static_cast<int>(sizeof(T));
  T v[kN];
};

inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// Note [CUDA element groups]
// Kernels that stream contiguous data give each thread a group of K consecutive elements (K
// elements of every array the kernel touches fill whole 128-bit words: group_width). When every
// pointer is 16-byte aligned (and, for the column kernels, the row length a multiple of K) the
// group moves as 128-bit loads and stores (load_wide/store_wide); otherwise load_group and
// store_group move it one element at a time, and a group cut short by the end of the data reads
// 0 past it and writes nothing there. Which thread owns which element, and the order in which it
// combines them, is the same on both paths, so a packed and an unpacked launch give the same bits
// (CudaOps.GroupedKernelsGiveTheSameBitsPackedOrNot, CudaLinear.FallbackKernelsGive...), and
// tests/ptx/ptx_test.cpp checks in the compiled PTX that the packed paths are 128 bits wide.
template <typename... T>
inline constexpr int group_width = static_cast<int>(16 / std::min({sizeof(T)...}));

template <int K, typename T>
__device__ __forceinline__ void load_wide(const T* p, float (&out)[K]) {
  constexpr int N = Pack<T>::kN;
  static_assert(K % N == 0, "a group is whole 128-bit packs");
#pragma unroll
  for (int q = 0; q < K / N; ++q) {
    const Pack<T> pk = reinterpret_cast<const Pack<T>*>(p)[q];
#pragma unroll
    for (int e = 0; e < N; ++e) out[q * N + e] = to_f32(pk.v[e]);
  }
}

template <int K, typename T>
__device__ __forceinline__ void store_wide(T* p, const float (&in)[K]) {
  constexpr int N = Pack<T>::kN;
  static_assert(K % N == 0, "a group is whole 128-bit packs");
#pragma unroll
  for (int q = 0; q < K / N; ++q) {
    Pack<T> pk;
#pragma unroll
    for (int e = 0; e < N; ++e) pk.v[e] = from_f32<T>(in[q * N + e]);
    reinterpret_cast<Pack<T>*>(p)[q] = pk;
  }
}

// One row's terms of a norm's weight and bias gradients at one column: sw += dy * xhat with
// xhat = (x - mu) * rs, and sb += dy, all in f32. The separate partials kernel (norm.cu)
// and the fused backward (Note [Fused norm weight gradients] in norm.cu) both add through
// here, with the one rounding of the fmaf pinned, so the two give the same bits.
__device__ __forceinline__ void add_norm_param_terms(float dy, float x, float mu, float rs,
                                                     float& sw, float& sb) {
  sw = fmaf(dy * (x - mu), rs, sw);
  sb += dy;
}

// Threads and blocks for a column kernel whose threads own K columns each (Note [CUDA element
// groups]): as few threads per block as cover the row, at most 256.
struct ColumnLaunch {
  unsigned blocks;
  int threads;
};
inline ColumnLaunch column_launch(int64_t c, int k) {
  const int64_t groups = (c + k - 1) / k;
  const int64_t threads = std::min<int64_t>(256, (groups + 31) / 32 * 32);
  return {static_cast<unsigned>((groups + threads - 1) / threads), static_cast<int>(threads)};
}

// The K elements at p, of which the first `valid` exist (K of them when `wide`).
template <int K, typename T>
__device__ __forceinline__ void load_group(bool wide, const T* p, int64_t valid, float (&out)[K]) {
  if constexpr (K % Pack<T>::kN == 0) {
    if (wide) {
      load_wide<K>(p, out);
      return;
    }
  }
#pragma unroll
  for (int e = 0; e < K; ++e) out[e] = e < valid ? to_f32(p[e]) : 0.f;
}

template <int K, typename T>
__device__ __forceinline__ void store_group(bool wide, T* p, int64_t valid, const float (&in)[K]) {
  if constexpr (K % Pack<T>::kN == 0) {
    if (wide) {
      store_wide<K>(p, in);
      return;
    }
  }
#pragma unroll
  for (int e = 0; e < K; ++e)
    if (e < valid) p[e] = from_f32<T>(in[e]);
}

// The groups of K elements of [0, n) this thread owns (the grid strides over groups): calls
// f(i0, valid, w) with i0 the group's first element, valid = n - i0 (K or more but in the last
// group) and w = `wide` for a whole group, false for the last one cut short.
template <int K, typename F>
__device__ __forceinline__ void for_each_group(int64_t n, bool wide, F&& f) {
  const int64_t groups = (n + K - 1) / K;
  for (int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; g < groups;
       g += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i0 = g * K, valid = n - i0;
    f(i0, valid, wide && valid >= K);
  }
}

// partial[chunk, j] = the sum in Acc, in row order, of x[r, j] over the chunk's kRows rows of
// x [n, c], for the K consecutive columns j this thread owns (columns j0 = (blockIdx.x *
// blockDim.x + threadIdx.x) * K on); `wide`: c a multiple of K and x 16-byte aligned. Note [Row
// chunks on grid.y]: this block's chunks are blockIdx.y, + gridDim.y, ...
template <typename Acc, int64_t kRows, typename T>
__device__ __forceinline__ void column_chunk_sums(const T* x, int64_t n, int64_t c, bool wide,
                                                  Acc* partial) {
  constexpr int K = group_width<T>;
  const int64_t j = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) * K;
  if (j >= c) return;
  const int64_t valid = c - j;
  const int64_t chunks = (n + kRows - 1) / kRows;
  for (int64_t chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {
    const int64_t r0 = chunk * kRows, r1 = r0 + kRows < n ? r0 + kRows : n;
    Acc s[K] = {};
    for (int64_t r = r0; r < r1; ++r) {
      float v[K];
      load_group<K>(wide, x + r * c + j, valid, v);
#pragma unroll
      for (int e = 0; e < K; ++e) s[e] += v[e];
    }
#pragma unroll
    for (int e = 0; e < K; ++e)
      if (e < valid) partial[chunk * c + j + e] = s[e];
  }
}

// Note [Chunk partial sums]
// The second pass of the column reductions (bias gradients, the norms' weight gradients): out[j]
// = the sum over chunks k of partial[k * c + j], in Acc, rounded once to out's dtype. With R =
// min(32, chunks) runs, a block of W x R threads owns W = 32 * floor(32 / R) columns: thread
// (x, y) sums, in chunk order, the y-th of R contiguous runs of ceil(chunks / R) chunks of column
// x (a warp reads 32 consecutive columns of one chunk, coalesced), and thread (x, 0) adds the R
// run sums in run order (with fewer than 32 chunks, one chunk a run: the chunks in order). The
// order depends only on the chunk count, so the bits are the same on every run; fewer runs give
// a block more columns, so it keeps about 1024 threads. blockIdx.y picks one of up to two
// (partial, out) pairs: a layernorm's dweight and dbias take one launch. One thread per column
// walking every chunk gave GPT-2 1558M's 1600 columns 7 blocks, each thread 128 or more
// dependent adds, on a device of 132 multiprocessors (bench_gpt2_cuda --launches, Note [Launch
// sites]).
// With `accumulate` each out[j] already holds a gradient and the rounded sum is added to it:
// out[j] = round(out[j] + round(sum)) in f32, the bits of AccumulateGrad's axpy_ of the sum into
// out (Note [Norm gradients into their buffer] in tensor/ops.h).
inline constexpr int kChunkRuns = 32;

template <typename Acc>
struct ChunkSums {
  const Acc* partial[2];
  void* out[2];
};

template <typename Acc>
__global__ void __launch_bounds__(32 * kChunkRuns)
    chunk_column_sums(ChunkSums<Acc> sums, int64_t chunks, int64_t c, int out_dtype,
                      bool accumulate) {
  __shared__ Acc runs[32 * kChunkRuns];  // [y][x], blockDim.x * blockDim.y <= 1024
  // Selected, not indexed: a parameter indexed by a run-time value is copied to local memory.
  const bool second = blockIdx.y != 0;
  const Acc* partial = second ? sums.partial[1] : sums.partial[0];
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t per_run = (chunks + blockDim.y - 1) / blockDim.y;
  const int64_t k0 = threadIdx.y * per_run, k1 = k0 + per_run < chunks ? k0 + per_run : chunks;
  Acc acc = 0;
  if (j < c)
    for (int64_t k = k0; k < k1; ++k) acc += partial[k * c + j];
  runs[threadIdx.y * blockDim.x + threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || j >= c) return;
  Acc total = 0;
  for (unsigned y = 0; y < blockDim.y; ++y) total += runs[y * blockDim.x + threadIdx.x];
  void* out = second ? sums.out[1] : sums.out[0];
  float v = static_cast<float>(total);
  if (accumulate) v = load_float(out, out_dtype, j) + round_to(out_dtype, v);
  store_float(out, out_dtype, j, v);
}

// out0 (and out1 when partial1 is given) from `chunks` rows of c partials each; added into them
// when `accumulate` (Note [Chunk partial sums]).
template <typename Acc>
void launch_chunk_column_sums(const Acc* partial0, void* out0, const Acc* partial1, void* out1,
                              int out_dtype, int64_t chunks, int64_t c, Stream stream,
                              bool accumulate = false) {
  if (c == 0) return;
  const ChunkSums<Acc> sums{{partial0, partial1}, {out0, out1}};
  const auto runs = static_cast<unsigned>(std::clamp<int64_t>(chunks, 1, kChunkRuns));
  const unsigned width = 32 * (kChunkRuns / runs);
  const dim3 grid(static_cast<unsigned>((c + width - 1) / width), partial1 != nullptr ? 2u : 1u);
  STRATA_LAUNCH(grid, dim3(width, runs), 0, stream, chunk_column_sums<Acc>)
  (sums, chunks, c, out_dtype, accumulate);
}

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with T the element type of float dtype `dtype`; false (nothing called)
// for any other dtype.
template <typename F>
bool dispatch_float(int dtype, F&& f) {
  switch (dtype) {
    case kF32:
      f(TypeTag<float>{});
      return true;
    case kBF16:
      f(TypeTag<__nv_bfloat16>{});
      return true;
    case kF16:
      f(TypeTag<__half>{});
      return true;
    default:
      return false;
  }
}

// Element offset of logical (row-major) index i in a strided view.
__device__ inline int64_t strided_offset(const Strided& v, int64_t i) {
  int64_t off = 0;
  for (int d = v.ndim - 1; d >= 0; --d) {
    const int64_t s = v.shape[d];
    off += (i % s) * v.strides[d];
    i /= s;
  }
  return off;
}

// Philox4x32-10, exactly core/rng.cpp's philox4x32.
struct U4 {
  uint32_t x, y, z, w;
};
__device__ inline U4 philox(uint64_t seed, uint64_t stream_id, uint64_t counter) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = static_cast<uint32_t>(stream_id), c3 = static_cast<uint32_t>(stream_id >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {c0, c1, c2, c3};
}
__device__ inline uint32_t lane_of(const U4& r, int l) {
  return l == 0 ? r.x : l == 1 ? r.y : l == 2 ? r.z : r.w;
}
__device__ inline float unit_float(uint32_t x) {
  return static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
}

// Deterministic block-wide sum (fixed tree: warp shuffles, then warp 0 over the warp sums).
// blockDim.x must be a multiple of 32, at most 1024. Every thread gets the result.
template <typename T>
__device__ inline T block_sum(T v, T* shared /* 32 elements */) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // shared may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int nwarps = blockDim.x / 32;
  T t = lane < nwarps ? shared[lane] : T(0);
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  return t;
}

__device__ inline float block_max(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int nwarps = blockDim.x / 32;
  float t = lane < nwarps ? shared[lane] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1) t = fmaxf(t, __shfl_xor_sync(0xffffffffu, t, o));
  return t;
}

}  // namespace strata::tensor::cuda
