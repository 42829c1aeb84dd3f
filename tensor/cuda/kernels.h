#pragma once
// Launchers for the CUDA kernels, callable from C++20 code (Note [CUDA build] in
// third_party/cmake/StrataDependencies.cmake: the .cu files are C++17 and include no other Strata
// header, so this interface speaks in pointers, sizes and small descriptors). Every launcher
// enqueues on `stream` and returns at once; the caller checks launch errors. Pointers already
// include the tensor's offset. Float arithmetic is f32 (accumulations f32 or f64 as noted);
// `dtype` arguments use strata::DType's numbering (F32, BF16, F16, I32, I64, U16, U8).
#include <cstdint>

struct CUstream_st;

namespace strata::tensor::cuda {

using Stream = CUstream_st*;

inline constexpr int kMaxDims = 8;

// A strided view: element i (row-major over shape) lives at ptr + sum(idx_d * strides[d]).
struct Strided {
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
};

// ---- copy_elementwise.cu ----
void launch_copy(const void* src, int src_dtype, const Strided& src_view, void* dst, int dst_dtype,
                 const Strided& dst_view, int64_t n, Stream stream);
void launch_fill(void* dst, int dtype, const Strided& view, int64_t n, double value, Stream stream);
void launch_arange(void* dst, int dtype, int64_t n, double start, double step, Stream stream);
// f32, contiguous; element i is element i of the Philox stream (Note [Deterministic RNG]).
void launch_random_uniform(float* dst, int64_t n, uint64_t seed, uint64_t stream_id, float lo,
                           float hi, Stream stream);
void launch_random_normal(float* dst, int64_t n, uint64_t seed, uint64_t stream_id, float mean,
                          float stddev, Stream stream);
// op: 0 add, 1 sub, 2 mul, 3 div (BinaryOp). a and b are viewed in out's shape (broadcast
// strides may be 0); out is contiguous.
void launch_binary(int op, const float* a, const Strided& a_view, const float* b,
                   const Strided& b_view, float* out, int64_t n, Stream stream);
void launch_affine(const float* x, const Strided& x_view, float alpha, float beta, float* out,
                   int64_t n, Stream stream);
void launch_axpy(float alpha, const float* x, float* y, int64_t n, Stream stream);
// op: UnaryOp numbering (Gelu, Silu, Relu, Exp, Log, Neg, Sqrt, Square, Tanh).
void launch_unary(int op, const float* x, float* out, int64_t n, Stream stream);
void launch_unary_backward(int op, const float* x, const float* dy, float* dx, int64_t n,
                           Stream stream);
void launch_bias_add(const float* x, const float* bias, float* out, int64_t rows, int64_t cols,
                     Stream stream);
void launch_dropout(const float* x, float* out, int64_t n, float p, uint64_t seed,
                    uint64_t stream_id, Stream stream);
void launch_rotary(const float* x, const float* cos, const float* sin, bool inverse, float* out,
                   int64_t b, int64_t t, int64_t h, int64_t d, Stream stream);

// ---- reduce_norm.cu ----
// out[o] = op over the reduced index space of x, for each out element o. x_outer views x in
// out's (full-rank) shape with x's strides; x_red describes the reduced dims. op: 0 sum, 1 mean,
// 2 max (indices, if not null, get the argmax as a flat index into x_red, first on ties).
// Sums accumulate in f64, in a fixed order (deterministic).
void launch_reduce(int op, const void* x, int x_dtype, const Strided& x_outer, const Strided& x_red,
                   void* out, int out_dtype, int64_t n_out, int64_t* indices, Stream stream);
// partial[blocks] then total: sum of squares of n contiguous elements, in f64, into *result
// (device). `scratch` holds at least kSumSquaresBlocks doubles.
inline constexpr int kSumSquaresBlocks = 256;
void launch_sum_squares(const void* x, int dtype, int64_t n, double* scratch, double* result,
                        Stream stream);
void launch_layernorm_forward(const float* x, const float* w, const float* b, float eps, float* y,
                              float* mean, float* rstd, int64_t n, int64_t c, Stream stream);
// scratch: 2 * ceil(n / kNormRowChunk) * c floats (per-chunk partial dweight/dbias).
inline constexpr int64_t kNormRowChunk = 128;
void launch_layernorm_backward(const float* dy, const float* x, const float* w, const float* mean,
                               const float* rstd, float* dx, float* dw, float* db, float* scratch,
                               int64_t n, int64_t c, Stream stream);
void launch_rmsnorm_forward(const float* x, const float* w, float eps, float* y, float* rstd,
                            int64_t n, int64_t c, Stream stream);
void launch_rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd,
                             float* dx, float* dw, float* scratch, int64_t n, int64_t c,
                             Stream stream);
void launch_softmax_forward(const float* x, float* y, int64_t n, int64_t c, Stream stream);
void launch_softmax_backward(const float* y, const float* dy, float* dx, int64_t n, int64_t c,
                             Stream stream);
// Rows of `row_bytes` bytes; *bad (device int) is set to 1 when an id is outside [0, v).
void launch_embedding_forward(const void* weight, const void* ids, bool ids_i64, void* out,
                              int64_t n, int64_t v, int64_t row_bytes, int* bad, Stream stream);
// dweight[v, c] += dout rows by id; each thread owns a column and walks rows in order.
void launch_embedding_backward(const void* ids, bool ids_i64, const float* dout, float* dweight,
                               int64_t n, int64_t c, Stream stream);
void launch_cross_entropy_forward(const float* logits, const void* targets, bool targets_i64,
                                  int64_t ignore_index, float* losses, float* lse, int64_t n,
                                  int64_t v, int* bad, Stream stream);
void launch_cross_entropy_backward(const float* logits, const void* targets, bool targets_i64,
                                   const float* lse, const float* dloss, int64_t ignore_index,
                                   float* dlogits, int64_t n, int64_t v, Stream stream);

// ---- attention.cu (Strata's own kernel; cuDNN's fused attention is preferred when present) ----
// q [B, H, Tq, D], k, v [B, H, Tk, D], contiguous f32, any D <= kAttentionMaxHeadDim; bh = B*H.
inline constexpr int64_t kAttentionMaxHeadDim = 256;
void launch_attention_forward(const float* q, const float* k, const float* v, bool causal,
                              float scale, float* out, float* lse, int64_t bh, int64_t tq,
                              int64_t tk, int64_t d, Stream stream);
// scratch: bh * tq floats (D_i = <dout_i, out_i>).
void launch_attention_backward(const float* q, const float* k, const float* v, const float* out,
                               const float* lse, const float* dout, bool causal, float scale,
                               float* dq, float* dk, float* dv, float* scratch, int64_t bh,
                               int64_t tq, int64_t tk, int64_t d, Stream stream);

}  // namespace strata::tensor::cuda
