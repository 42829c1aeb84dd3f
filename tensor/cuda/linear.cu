// The unfused fallbacks of the linear epilogues (Note [CUDA linear epilogues] in
// tensor/cuda/linear.cpp): when cuBLASLt has no algorithm for an epilogue, or its constraints
// (the GELU input's leading dimension a multiple of 8) do not hold, the GEMM writes its f32
// product and these kernels finish the job with the semantics of Note [Linear epilogues]: bias
// and GELU in f32, one rounding per output; bias gradients summed in f32 in a fixed chunk order
// (no atomics), rounded once.
#include "tensor/cuda/common.cuh"

namespace strata::tensor::cuda {

namespace {

// GPT-2's tanh GELU and its derivative, the formulas of the unary kernels and of the CPU.
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCube = 0.044715f;

__device__ __forceinline__ float gelu_f(float v) {
  return 0.5f * v * (1.0f + tanhf(kGeluScale * (v + kGeluCube * v * v * v)));
}

// Every operation explicitly rounded (Note [Explicitly rounded norm gradients] in norm.cu
// says why): gelu_backward_f32 and gelu_backward_bias_partials inline it into different code,
// and must give the same bits.
__device__ __forceinline__ float gelu_grad_f(float v) {
  const float cube = __fmul_rn(__fmul_rn(__fmul_rn(kGeluCube, v), v), v);
  const float t = tanhf(__fmul_rn(kGeluScale, __fadd_rn(v, cube)));
  const float du =
      __fmul_rn(kGeluScale, __fadd_rn(1.0f, __fmul_rn(__fmul_rn(3.0f * kGeluCube, v), v)));
  return __fadd_rn(__fmul_rn(0.5f, __fadd_rn(1.0f, t)),
                   __fmul_rn(__fmul_rn(__fmul_rn(0.5f, v), __fsub_rn(1.0f, __fmul_rn(t, t))), du));
}

// Note [CUDA element groups]: K = group_width<float, T> consecutive elements per thread; `wide`
// when cols is a multiple of K and every pointer is 16-byte aligned, so a group never straddles
// a row and its bias slice is whole packs too.
template <typename T>
__global__ void bias_act(const float* acc, const T* bias, int act, T* y, T* pre, int64_t n,
                         int64_t cols, bool wide) {
  constexpr int K = group_width<float, T>;
  for_each_group<K>(n, wide, [&](int64_t i0, int64_t valid, bool w) {
    float v[K], b[K];
    load_group<K>(w, acc + i0, valid, v);
    if (bias == nullptr) {
#pragma unroll
      for (int e = 0; e < K; ++e) b[e] = 0.f;
    } else if (w) {
      load_wide<K>(bias + i0 % cols, b);
    } else {
#pragma unroll
      for (int e = 0; e < K; ++e) b[e] = e < valid ? to_f32(bias[(i0 + e) % cols]) : 0.f;
    }
#pragma unroll
    for (int e = 0; e < K; ++e) v[e] += b[e];
    if (pre) store_group<K>(w, pre + i0, valid, v);
    if (act == 1) {
#pragma unroll
      for (int e = 0; e < K; ++e) v[e] = gelu_f(v[e]);
    }
    store_group<K>(w, y + i0, valid, v);
  });
}

template <typename T>
__global__ void gelu_backward_f32(float* dh, const T* pre, T* dpre, int64_t n, bool wide) {
  constexpr int K = group_width<float, T>;  // Note [CUDA element groups]
  for_each_group<K>(n, wide, [&](int64_t i0, int64_t valid, bool w) {
    float d[K], p[K];
    load_group<K>(w, dh + i0, valid, d);
    load_group<K>(w, pre + i0, valid, p);
#pragma unroll
    for (int e = 0; e < K; ++e) d[e] = __fmul_rn(d[e], gelu_grad_f(p[e]));
    store_group<K>(w, dh + i0, valid, d);
    store_group<K>(w, dpre + i0, valid, d);
  });
}

// Note [Linear GELU gradient kernel]
// The MLP's backward GEMM without cuBLASLt's DGELU_BGRAD (Note [CUDA linear epilogues]): the GEMM
// writes dh = dz W in f32, and this one pass computes dpre = dh * gelu'(pre) in f32, writes it
// rounded once, and sums each column's f32 values over a chunk of kNormRowChunk rows in row
// order into partial[chunk, j]; launch_chunk_column_sums adds the chunks (Note [Chunk partial
// sums]) and rounds the bias gradient once. Those are the operations of gelu_backward_f32 and
// then launch_column_sums over its f32 output, in the same order, so both give the same bits,
// with one read of dh instead of two and no write of it. K consecutive columns per thread (Note
// [CUDA element groups]); `wide` when cols is a multiple of K and every pointer is 16-byte
// aligned.
template <typename T>
__global__ void gelu_backward_bias_partials(const float* dh, const T* pre, T* dpre, float* partial,
                                            int64_t rows, int64_t cols, bool wide) {
  constexpr int K = group_width<float, T>;
  const int64_t j = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) * K;
  if (j >= cols) return;
  const int64_t valid = cols - j;
  const int64_t chunks = (rows + kNormRowChunk - 1) / kNormRowChunk;
  for (int64_t chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {
    const int64_t r0 = chunk * kNormRowChunk;
    const int64_t r1 = r0 + kNormRowChunk < rows ? r0 + kNormRowChunk : rows;
    float s[K] = {};
    for (int64_t r = r0; r < r1; ++r) {
      float d[K], p[K];
      load_group<K>(wide, dh + r * cols + j, valid, d);
      load_group<K>(wide, pre + r * cols + j, valid, p);
#pragma unroll
      for (int e = 0; e < K; ++e) {
        d[e] = __fmul_rn(d[e], gelu_grad_f(p[e]));
        s[e] = __fadd_rn(s[e], d[e]);
      }
      store_group<K>(wide, dpre + r * cols + j, valid, d);
    }
#pragma unroll
    for (int e = 0; e < K; ++e)
      if (e < valid) partial[chunk * cols + j + e] = s[e];
  }
}

// partial[chunk, j] = sum of x[r, j] over the chunk's kNormRowChunk rows, in row order, in f32;
// K consecutive columns per thread (Note [CUDA element groups]).
template <typename TX>
__global__ void column_partials(const TX* x, float* partial, int64_t rows, int64_t cols,
                                bool wide) {
  column_chunk_sums<float, kNormRowChunk>(x, rows, cols, wide, partial);
}

#define STRATA_FLOAT_TYPE(tag) typename decltype(tag)::type

}  // namespace

bool launch_bias_act(int dt, const float* acc, const void* bias, int act, void* y, void* pre,
                     int64_t rows, int64_t cols, Stream stream) {
  return dispatch_float(dt, [&](auto tag) {
    using T = STRATA_FLOAT_TYPE(tag);
    const int64_t n = rows * cols;
    if (n == 0) return;
    constexpr int K = group_width<float, T>;
    const bool wide = cols % K == 0 && aligned16(acc) && (bias == nullptr || aligned16(bias)) &&
                      aligned16(y) && (pre == nullptr || aligned16(pre));
    STRATA_LAUNCH(blocks_for((n + K - 1) / K, 256), 256, 0, stream, bias_act<T>)
    (acc, static_cast<const T*>(bias), act, static_cast<T*>(y), static_cast<T*>(pre), n, cols,
     wide);
  });
}

bool launch_gelu_backward_f32(int dt, float* dh, const void* pre, void* dpre, int64_t rows,
                              int64_t cols, Stream stream) {
  return dispatch_float(dt, [&](auto tag) {
    using T = STRATA_FLOAT_TYPE(tag);
    const int64_t n = rows * cols;
    if (n == 0) return;
    constexpr int K = group_width<float, T>;
    const bool wide = aligned16(dh) && aligned16(pre) && aligned16(dpre);
    STRATA_LAUNCH(blocks_for((n + K - 1) / K, 256), 256, 0, stream, gelu_backward_f32<T>)
    (dh, static_cast<const T*>(pre), static_cast<T*>(dpre), n, wide);
  });
}

bool launch_gelu_backward_bias(int dt, const float* dh, const void* pre, void* dpre, void* dbias,
                               float* scratch, int64_t rows, int64_t cols, Stream stream) {
  return dispatch_float(dt, [&](auto tag) {
    using T = STRATA_FLOAT_TYPE(tag);
    if (cols == 0) return;
    const int64_t chunks = (rows + kNormRowChunk - 1) / kNormRowChunk;
    constexpr int K = group_width<float, T>;
    const ColumnLaunch l = column_launch(cols, K);
    const bool wide = cols % K == 0 && aligned16(dh) && aligned16(pre) && aligned16(dpre);
    if (chunks > 0)
      STRATA_LAUNCH(dim3(l.blocks, chunk_grid(chunks)), l.threads, 0, stream,
                    gelu_backward_bias_partials<T>)
    (dh, static_cast<const T*>(pre), static_cast<T*>(dpre), scratch, rows, cols, wide);
    launch_chunk_column_sums<float>(scratch, dbias, nullptr, nullptr, dt, chunks, cols, stream);
  });
}

bool launch_column_sums(int x_dt, const void* x, int out_dt, void* out, float* scratch,
                        int64_t rows, int64_t cols, Stream stream) {
  bool ok = false;
  dispatch_float(x_dt, [&](auto xtag) {
    using TX = STRATA_FLOAT_TYPE(xtag);
    ok = dispatch_float(out_dt, [&](auto) {
      if (cols == 0) return;
      const int64_t chunks = (rows + kNormRowChunk - 1) / kNormRowChunk;
      constexpr int K = group_width<TX>;
      const ColumnLaunch l = column_launch(cols, K);
      const bool wide = cols % K == 0 && aligned16(x);
      if (chunks > 0)
        STRATA_LAUNCH(dim3(l.blocks, chunk_grid(chunks)), l.threads, 0, stream, column_partials<TX>)
      (static_cast<const TX*>(x), scratch, rows, cols, wide);
      launch_chunk_column_sums<float>(scratch, out, nullptr, nullptr, out_dt, chunks, cols, stream);
    });
  });
  return ok;
}

#undef STRATA_FLOAT_TYPE

}  // namespace strata::tensor::cuda
