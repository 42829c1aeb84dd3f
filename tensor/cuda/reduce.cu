// CUDA reductions: reduce along a dim (sum, mean, max, min, argmax), the column sums of sum_to,
// the sums of squares of the gradient norm, and gradient clipping's scale_unless_equal.
//
// Note [CUDA reduction determinism]
// No reduction uses atomics. A sum is split the same way on every run: each thread accumulates a
// fixed strided subset, then a fixed shuffle tree combines them (block_sum in common.cuh). Column
// sums over many rows (layernorm's dweight/dbias) write one partial per chunk of kNormRowChunk
// rows and a second kernel adds the partials in a fixed order (Note [Chunk partial sums] in
// common.cuh). The embedding backward gives each
// thread one (id, column) and walks that id's rows in order (Note [CUDA embedding backward]).
// The fused cross-entropy never writes the softmax: forward keeps only lse per row, backward
// recomputes exp(x - lse) while writing dlogits (Note [CUDA cross-entropy]).
// The column-sum and scale kernels are templates on the element type (Note [CUDA low-precision
// kernels] in common.cuh); every partial sum is f64 or f32.
#include <algorithm>
#include <cmath>

#include "tensor/cuda/common.cuh"

namespace strata::tensor::cuda {

namespace {

struct ArgMax {
  float v;
  int64_t i;
};

__device__ inline ArgMax better(ArgMax a, ArgMax b) {
  // First NaN wins, else the larger value, ties to the smaller index: order-independent.
  const bool an = isnan(a.v), bn = isnan(b.v);
  if (an || bn) {
    if (an && bn) return a.i < b.i ? a : b;
    return an ? a : b;
  }
  if (a.v != b.v) return a.v > b.v ? a : b;
  return a.i < b.i ? a : b;
}

__global__ void reduce_kernel(int op, const void* x, int xdt, Strided outer, Strided red,
                              int64_t red_n, void* out, int odt, int64_t* indices) {
  __shared__ double sh[32];
  __shared__ float shv[32];
  __shared__ int64_t shi[32];
  const int64_t o = blockIdx.x;
  const int64_t base = strided_offset(outer, o);
  if (op == 2) {
    ArgMax best{-INFINITY, red_n};
    for (int64_t r = threadIdx.x; r < red_n; r += blockDim.x)
      best = better(best, {load_float(x, xdt, base + strided_offset(red, r)), r});
    for (int off = 16; off > 0; off >>= 1) {
      ArgMax other{__shfl_xor_sync(0xffffffffu, best.v, off),
                   __shfl_xor_sync(0xffffffffu, best.i, off)};
      best = better(best, other);
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
      shv[warp] = best.v;
      shi[warp] = best.i;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      ArgMax b = {shv[0], shi[0]};
      for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) b = better(b, {shv[w], shi[w]});
      if (b.i >= red_n) b.i = 0;  // every value was -inf: the first one is the max
      store_float(out, odt, o, b.v);
      if (indices) indices[o] = b.i;
    }
    return;
  }
  double acc = 0;
  for (int64_t r = threadIdx.x; r < red_n; r += blockDim.x)
    acc += load_float(x, xdt, base + strided_offset(red, r));
  acc = block_sum(acc, sh);
  if (threadIdx.x == 0) {
    if (op == 1) acc /= static_cast<double>(red_n);
    store_float(out, odt, o, static_cast<float>(acc));
  }
}

// Note [CUDA element groups]: thread t of the grid owns groups t, t + threads, ... of K elements
// and adds their squares in element order, packed or not.
template <typename T>
__global__ void sum_squares_partial(const T* x, int64_t n, bool wide, double* partial) {
  constexpr int K = group_width<T>;
  __shared__ double sh[32];
  double acc = 0;
  for_each_group<K>(n, wide, [&](int64_t i0, int64_t valid, bool w) {
    float v[K];
    load_group<K>(w, x + i0, valid, v);
#pragma unroll
    for (int e = 0; e < K; ++e) acc += static_cast<double>(v[e]) * static_cast<double>(v[e]);
  });
  acc = block_sum(acc, sh);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
  // The rest of the row, for the totals' pass to read as zeros.
  if (blockIdx.x == 0)
    for (int i = gridDim.x + threadIdx.x; i < kSumSquaresBlocks; i += blockDim.x) partial[i] = 0;
}

// result[b] = the sum of row b of partial (n doubles a row).
__global__ void sum_partials(const double* partial, int n, double* result) {
  __shared__ double sh[32];
  const double* row = partial + int64_t{blockIdx.x} * n;
  double acc = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) acc += row[i];
  acc = block_sum(acc, sh);
  if (threadIdx.x == 0) result[blockIdx.x] = acc;
}

// Note [CUDA column sums]
// sum_to of [N, C] -> [C] (every bias gradient) through the generic reduce_kernel would give each
// column a block whose threads read elements C apart: uncoalesced, one 32-byte sector per 2- or
// 4-byte value, with int64 index arithmetic per element - for GPT-2 at B*T = 16K rows, tens of
// milliseconds per step over its 48 bias gradients. Instead each thread owns a group of K
// consecutive columns of a chunk of kColumnSumRows rows (consecutive threads, consecutive groups:
// coalesced, 128-bit words when aligned, Note [CUDA element groups]), sums each column in f64, and
// a second kernel adds the chunk partials in a fixed order and rounds once (Note [Chunk partial
// sums] in common.cuh). The split depends only on N, so the bits are the same on every run.
template <typename T>
__global__ void column_sum_partials(const T* x, int64_t n, int64_t c, bool wide, double* partial) {
  column_chunk_sums<double, kColumnSumRows>(x, n, c, wide, partial);
}

// x *= g / expected unless g == expected (Backend::scale_unless_equal): every block reads g and
// returns at once when they are equal.
template <typename T>
__global__ void scale_unless_equal_kernel(T* x, int64_t n, const float* g, float expected,
                                          bool wide) {
  const float r = *g;
  if (r == expected) return;
  const float f = r / expected;
  constexpr int K = group_width<T>;  // Note [CUDA element groups]
  for_each_group<K>(n, wide, [&](int64_t i0, int64_t valid, bool w) {
    float v[K];
    load_group<K>(w, x + i0, valid, v);
#pragma unroll
    for (int e = 0; e < K; ++e) v[e] *= f;
    store_group<K>(w, x + i0, valid, v);
  });
}

}  // namespace

#define STRATA_FLOAT_TYPE(tag) typename decltype(tag)::type

void launch_reduce(int op, const void* x, int x_dtype, const Strided& x_outer, const Strided& x_red,
                   void* out, int out_dtype, int64_t n_out, int64_t* indices, Stream stream) {
  int64_t red_n = 1;
  for (int d = 0; d < x_red.ndim; ++d) red_n *= x_red.shape[d];
  if (n_out == 0) return;
  const int threads = red_n >= 256 ? 256 : red_n > 32 ? 64 : 32;
  STRATA_LAUNCH(static_cast<unsigned>(n_out), threads, 0, stream, reduce_kernel)
  (op, x, x_dtype, x_outer, x_red, red_n, out, out_dtype, indices);
}

bool launch_sum_squares_partials(const void* x, int dtype, int64_t n, double* row, Stream stream) {
  return dispatch_float(dtype, [&](auto tag) {
    using T = STRATA_FLOAT_TYPE(tag);
    // Enough blocks to fill the GPU with loads in flight for a large tensor (a 128-bit group
    // per thread per step), fewer for a small one; the count depends on n alone, so the sum
    // does too (Note [CUDA element groups]).
    const int64_t groups = (n + group_width<T> - 1) / group_width<T>;
    const int blocks =
        static_cast<int>(std::clamp<int64_t>((groups + 255) / 256, 1, kSumSquaresBlocks));
    STRATA_LAUNCH(blocks, 256, 0, stream, sum_squares_partial<T>)
    (static_cast<const T*>(x), n, aligned16(x), row);
  });
}

void launch_sum_squares_totals(const double* rows, int count, double* totals, Stream stream) {
  if (count > 0)
    STRATA_LAUNCH(count, 256, 0, stream, sum_partials)(rows, kSumSquaresBlocks, totals);
}

bool launch_column_sum(const void* x, int x_dtype, int64_t n, int64_t c, double* scratch, void* out,
                       int out_dtype, Stream stream) {
  const int64_t chunks = (n + kColumnSumRows - 1) / kColumnSumRows;
  return dispatch_float(x_dtype, [&](auto tag) {
    using T = STRATA_FLOAT_TYPE(tag);
    if (c == 0) return;
    constexpr int K = group_width<T>;
    const ColumnLaunch l = column_launch(c, K);
    if (chunks > 0)
      STRATA_LAUNCH(dim3(l.blocks, chunk_grid(chunks)), l.threads, 0, stream,
                    column_sum_partials<T>)
    (static_cast<const T*>(x), n, c, c % K == 0 && aligned16(x), scratch);
    launch_chunk_column_sums<double>(scratch, out, nullptr, nullptr, out_dtype, chunks, c, stream);
  });
}

bool launch_scale_unless_equal(int dt, void* x, int64_t n, const float* g, float expected,
                               Stream stream) {
  return dispatch_float(dt, [&](auto tag) {
    using T = STRATA_FLOAT_TYPE(tag);
    if (n == 0) return;
    const int64_t groups = (n + group_width<T> - 1) / group_width<T>;
    const int64_t blocks = std::min<int64_t>((groups + 255) / 256, 4096);
    STRATA_LAUNCH(static_cast<unsigned>(blocks), 256, 0, stream, scale_unless_equal_kernel<T>)
    (static_cast<T*>(x), n, g, expected, aligned16(x));
  });
}

#undef STRATA_FLOAT_TYPE

}  // namespace strata::tensor::cuda
