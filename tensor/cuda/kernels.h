#pragma once
// Launchers for the CUDA kernels, callable from C++20 code (Note [CUDA build] in
// third_party/cmake/StrataDependencies.cmake: the .cu files are C++17 and include no other Strata
// header, so this interface speaks in pointers, sizes and small descriptors). Every launcher
// enqueues on `stream` and returns at once; the caller checks launch errors. Pointers already
// include the tensor's offset. `dtype` arguments use strata::DType's numbering (F32, BF16, F16,
// I32, I64, U16, U8). Float operands are `void*` of the op's compute dtype `dt` (F32, BF16 or
// F16, Note [CUDA low-precision kernels] in common.cuh): arithmetic is f32 inside, rounded once
// on store; accumulations f32 or f64 as noted; operands the contract keeps in F32 are float*.
// Launchers that return bool return false, having enqueued nothing, when a dtype is not a float
// dtype (the backend validates first, so false is an internal error).
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

// ---- copy_fill.cu: copy, fill, arange, random draws ----
void launch_copy(const void* src, int src_dtype, const Strided& src_view, void* dst, int dst_dtype,
                 const Strided& dst_view, int64_t n, Stream stream);
void launch_fill(void* dst, int dtype, const Strided& view, int64_t n, double value, Stream stream);
void launch_arange(void* dst, int dtype, int64_t n, double start, double step, Stream stream);
// Contiguous dst of float dtype `dt`; element i is element i of the Philox stream (Note
// [Deterministic RNG]), drawn in f32 exactly as for F32 and rounded once.
bool launch_random_uniform(void* dst, int dt, int64_t n, uint64_t seed, uint64_t stream_id,
                           float lo, float hi, Stream stream);
bool launch_random_normal(void* dst, int dt, int64_t n, uint64_t seed, uint64_t stream_id,
                          float mean, float stddev, Stream stream);
// ---- elementwise.cu: binary, affine, axpy, unary, bias_add, dropout, rotary ----
// op: 0 add, 1 sub, 2 mul, 3 div (BinaryOp). a, b and out share dtype dt. a and b are viewed in
// out's shape (broadcast strides may be 0); out is contiguous.
bool launch_binary(int op, int dt, const void* a, const Strided& a_view, const void* b,
                   const Strided& b_view, void* out, int64_t n, Stream stream);
// out (contiguous, dtype dt) = alpha * x + beta, x of dtype dt in any layout.
bool launch_affine(int dt, const void* x, const Strided& x_view, float alpha, float beta, void* out,
                   int64_t n, Stream stream);
// y = round_y(f32(y) + alpha * f32(x)); x and y contiguous, any float dtypes (mixed allowed).
bool launch_axpy(float alpha, const void* x, int x_dtype, void* y, int y_dtype, int64_t n,
                 Stream stream);
// op: UnaryOp numbering (Gelu, Silu, Relu, Exp, Log, Neg, Sqrt, Square, Tanh). Contiguous.
bool launch_unary(int op, int dt, const void* x, void* out, int64_t n, Stream stream);
bool launch_unary_backward(int op, int dt, const void* x, const void* dy, void* dx, int64_t n,
                           Stream stream);
bool launch_bias_add(int dt, const void* x, const void* bias, void* out, int64_t rows, int64_t cols,
                     Stream stream);
bool launch_dropout(int dt, const void* x, void* out, int64_t n, float p, uint64_t seed,
                    uint64_t stream_id, Stream stream);
// x/out [b, t, h, d] of dtype dt; cos/sin [t, d/2] of dtype cs_dtype (F32 or dt).
bool launch_rotary(int dt, const void* x, const void* cos, const void* sin, int cs_dtype,
                   bool inverse, void* out, int64_t b, int64_t t, int64_t h, int64_t d,
                   Stream stream);

// ---- reduce.cu: reduce, sums of squares, column sums, scale_unless_equal ----
// out[o] = op over the reduced index space of x, for each out element o. x_outer views x in
// out's (full-rank) shape with x's strides; x_red describes the reduced dims. op: 0 sum, 1 mean,
// 2 max (indices, if not null, get the argmax as a flat index into x_red, first on ties).
// Sums accumulate in f64, in a fixed order (deterministic); any float dtypes for x and out.
void launch_reduce(int op, const void* x, int x_dtype, const Strided& x_outer, const Strided& x_red,
                   void* out, int out_dtype, int64_t n_out, int64_t* indices, Stream stream);
// ---- top_k.cu (Note [CUDA top-k]) ----
// The k largest elements of each of `rows` rows of n elements (row r at x + r * row_stride,
// elements contiguous), best first (Note [Top-k] in tensor/ops.h): values [rows, k] of dtype dt,
// indices [rows, k], both contiguous. 1 <= k <= min(n, kTopKMax), n < 2^31.
inline constexpr int64_t kTopKMax = 1024;
bool launch_top_k(int dt, const void* x, int64_t rows, int64_t n, int64_t row_stride, int64_t k,
                  void* values, int64_t* indices, Stream stream);
// ---- reduce.cu, continued ----
// The sum of squares of n contiguous elements, in f64, in two passes. The first writes one
// partial per block into `row` (kSumSquaresBlocks doubles: the blocks, whose count and so the
// order of the sum depend on n alone, then zeros). The second adds each of `count` such rows,
// kSumSquaresBlocks doubles apart, into totals[i] (device), in one launch for all of them: the
// gradient norm's 50 tensors of GPT-2 1558M took 50 one-block launches (Note [Launch sites]).
// The zeros change no bits: the second pass adds them to sums of squares, never -0.
inline constexpr int kSumSquaresBlocks = 1024;
bool launch_sum_squares_partials(const void* x, int dtype, int64_t n, double* row, Stream stream);
void launch_sum_squares_totals(const double* rows, int count, double* totals, Stream stream);
// ---- norm.cu: layernorm, rmsnorm, plain and fused with the residual add ----
// The norms (layernorm, rmsnorm) are the residual-free case of the fused
// kernels (Note [CUDA fused residual norm]): 128-bit packs when the rows allow; their backward
// is launch_norm_backward (below, with the residual norms').
// x, w, b, y of dtype dt; mean, rstd F32.
bool launch_layernorm_forward(int dt, const void* x, const void* w, const void* b, float eps,
                              void* y, float* mean, float* rstd, int64_t n, int64_t c,
                              Stream stream);
// A norm backward's scratch: 2 * ceil(n / kNormRowChunk) * c floats (per-chunk f32 partial
// dweight/dbias, summed in a fixed order and rounded once into dw/db: Note [Chunk partial sums] in
// common.cuh). dy, x, w, dx, dw, db of dtype dt. 32 rows a chunk: GPT-2 1558M's rows of 1600
// columns (one block of 224 threads across) at B*T = 16K make 512 blocks, about four per
// multiprocessor of an H100; chunks of 128 rows made 128 blocks, one per multiprocessor and 4 of
// the 132 idle (Note [Launch sites] in cuda_emu/control.h). The partials then move 2 * 4
// bytes per column per 32 rows against the 2 * 2 bytes per element of dy and x a bf16 chunk reads:
// 1/16 more.
inline constexpr int64_t kNormRowChunk = 32;
bool launch_rmsnorm_forward(int dt, const void* x, const void* w, float eps, void* y, float* rstd,
                            int64_t n, int64_t c, Stream stream);
// dweight (and dbias unless db is null) of layernorm (mean given) or rmsnorm (mean null) at the
// rows x [n, c]: the chunked f32 partials of layernorm_backward (scratch as there), rounded once;
// with `accumulate` added into what dw and db hold (Note [Chunk partial sums] in common.cuh).
bool launch_norm_param_grads(int dt, const void* dy, const void* x, const float* mean,
                             const float* rstd, void* dw, void* db, float* scratch, int64_t n,
                             int64_t c, bool accumulate, Stream stream);
// ---- softmax.cu (Note [CUDA softmax]) ----
bool launch_softmax_forward(int dt, const void* x, void* y, int64_t n, int64_t c, Stream stream);
bool launch_softmax_backward(int dt, const void* y, const void* dy, void* dx, int64_t n, int64_t c,
                             Stream stream);
// ---- embedding_loss.cu: embedding, cross-entropy ----
// Rows of `row_bytes` bytes (any dtype); *bad (device int) is set to 1 when an id is outside
// [0, v).
void launch_embedding_forward(const void* weight, const void* ids, bool ids_i64, void* out,
                              int64_t n, int64_t v, int64_t row_bytes, int* bad, Stream stream);
// dweight[v, c] += dout rows by id, deterministically, on the device alone (Note [CUDA embedding
// backward] in embedding_loss.cu). ids (n, I32 or I64) below `vocab`; a bad one is skipped and sets
// *bad. `keys` is device scratch of embedding_sort_keys(n) 64-bit words. dout and dweight are
// F32/BF16/F16.
int64_t embedding_sort_keys(int64_t n);
bool launch_embedding_backward(const void* ids, bool ids_i64, int64_t n, int64_t vocab,
                               uint64_t* keys, const void* dout, int dout_dtype, void* dweight,
                               int dw_dtype, int64_t c, int* bad, Stream stream);
// logits [n, ld] of dtype dt of which the first v columns take part; losses, lse F32.
bool launch_cross_entropy_forward(int dt, const void* logits, const void* targets, bool targets_i64,
                                  int64_t ignore_index, float* losses, float* lse, int64_t n,
                                  int64_t ld, int64_t v, int* bad, Stream stream);
// out (F32, 2) = {m, 1 / m}, m = max(1, number of the n targets not equal to ignore_index).
void launch_cross_entropy_norm(const void* targets, bool targets_i64, int64_t n,
                               int64_t ignore_index, float* out, Stream stream);
// logits, dlogits [n, ld] of dtype dt (columns from v on get 0); lse, dloss F32.
bool launch_cross_entropy_backward(int dt, const void* logits, const void* targets,
                                   bool targets_i64, const float* lse, const float* dloss,
                                   int64_t ignore_index, void* dlogits, int64_t n, int64_t ld,
                                   int64_t v, Stream stream);
// Both at once (Note [CUDA fused cross-entropy] in embedding_loss.cu): losses and lse as the
// forward, then logits [n, ld] overwritten with the backward's gradient for dloss = grad / norm[0].
// row_cache: keep each thread's part of the row in registers between the two passes where it
// fits (ce_row_cache_fits), so the row is read once; false reads it twice. Same bits either way.
bool launch_cross_entropy_fused(int dt, void* logits, const void* targets, bool targets_i64,
                                int64_t ignore_index, float* losses, float* lse, int64_t n,
                                int64_t ld, int64_t v, int* bad, float grad, const float* norm,
                                bool row_cache, Stream stream);
// Whether the fused kernel's register cache (kCeCachePacks 128-bit packs a thread, row_threads(v)
// threads) holds rows of v logits of element_size bytes.
inline constexpr int kCeCachePacks = 7;
bool ce_row_cache_fits(int64_t v, int element_size);
// ---- reduce.cu, continued ----
// x [n] (contiguous, dtype dt) *= *g / expected, unless *g == expected (then untouched).
bool launch_scale_unless_equal(int dt, void* x, int64_t n, const float* g, float expected,
                               Stream stream);
// out[j] = sum over the n rows of x[r, j] (x contiguous [n, c], dtype x_dtype; out [c] of
// out_dtype): the bias gradient. Deterministic (Note [CUDA column sums] in reduce.cu).
// scratch holds ceil(n / kColumnSumRows) * c doubles.
inline constexpr int64_t kColumnSumRows = 64;
bool launch_column_sum(const void* x, int x_dtype, int64_t n, int64_t c, double* scratch, void* out,
                       int out_dtype, Stream stream);

// ---- norm.cu (Note [CUDA fused residual norm]): also the plain norms above ----
// x, r, s, y [n, c], w, b [c] of dtype dt; mean, rstd F32 [n]. s = x + r, y = norm(s).
bool launch_add_layernorm_forward(int dt, const void* x, const void* r, const void* w,
                                  const void* b, float eps, void* s, void* y, float* mean,
                                  float* rstd, int64_t n, int64_t c, Stream stream);
bool launch_add_rmsnorm_forward(int dt, const void* x, const void* r, const void* w, float eps,
                                void* s, void* y, float* rstd, int64_t n, int64_t c, Stream stream);
// dsum = ds + round(dx) (ds may be null) for layernorm (mean given) or rmsnorm (mean null);
// dweight/dbias come from launch_norm_param_grads.
bool launch_add_norm_backward(int dt, const void* dy, const void* ds, const void* s, const void* w,
                              const float* mean, const float* rstd, void* dsum, int64_t n,
                              int64_t c, Stream stream);
// The whole backward of a norm (plain: ds null; residual: ds given) at the rows s [n, c]: dsum as
// launch_add_norm_backward, dw (and db unless null) as launch_norm_param_grads (scratch as there).
// fused: one kernel for dsum and the partials where a row fits one block of 512 threads, else
// (or !fused) those two launches; the same bits either way (Note [Fused norm weight gradients]
// in norm.cu). The plain norms pass x as s. `accumulate`: dw and db take their gradients
// added into what they hold, as launch_norm_param_grads.
bool launch_norm_backward(int dt, const void* dy, const void* ds, const void* s, const void* w,
                          const float* mean, const float* rstd, void* dsum, void* dw, void* db,
                          float* scratch, int64_t n, int64_t c, bool fused, bool accumulate,
                          Stream stream);

// ---- linear.cu: the unfused fallbacks of the linear epilogues (tensor/cuda/linear.cpp) ----
// acc [rows, cols] F32 (may be y itself when dt is F32); bias [cols] or null; act 0 none, 1 GELU.
// y = round(act(acc + bias)); pre (or null) = round(acc + bias).
bool launch_bias_act(int dt, const float* acc, const void* bias, int act, void* y, void* pre,
                     int64_t rows, int64_t cols, Stream stream);
// dh [rows, cols] F32 holds dz @ w; replaced by the f32 dpre = dh * gelu'(pre), and dpre
// (dtype dt) = round of it.
bool launch_gelu_backward_f32(int dt, float* dh, const void* pre, void* dpre, int64_t rows,
                              int64_t cols, Stream stream);
// Note [Linear GELU gradient kernel] (linear.cu): dpre [rows, cols] (dtype dt) = round(dh *
// gelu'(pre)) and dbias [cols] (dtype dt) = the rounded column sums of those f32 products, the
// bits of launch_gelu_backward_f32 then launch_column_sums, in one pass over dh (left unchanged).
// scratch: ceil(rows / kNormRowChunk) * cols floats.
bool launch_gelu_backward_bias(int dt, const float* dh, const void* pre, void* dpre, void* dbias,
                               float* scratch, int64_t rows, int64_t cols, Stream stream);
// out [cols] (dtype out_dt) = column sums of x [rows, cols] (dtype x_dt), f32 partials over
// chunks of kNormRowChunk rows added in a fixed order (Note [Chunk partial sums]), rounded once.
// scratch: ceil(rows / kNormRowChunk) * cols floats.
bool launch_column_sums(int x_dt, const void* x, int out_dt, void* out, float* scratch,
                        int64_t rows, int64_t cols, Stream stream);

// ---- attention.cu (Strata's own kernel; cuDNN's fused attention is preferred when present) ----
// q [B, H, Tq, D], k, v [B, H, Tk, D], out, dout [B, H, Tq, D], dq, dk, dv as q, k, v, all of
// dtype dt; each any view whose D stride is 1 (Note [Strided attention operands] in
// tensor/backend.h): element (b, h, t, e) of q is at q + b * s.q.b + h * s.q.h + t * s.q.t + e.
// lse [B, H, Tq] F32 contiguous; any D <= kAttentionMaxHeadDim.
inline constexpr int64_t kAttentionMaxHeadDim = 256;
struct AttentionStrides {
  int64_t b = 0, h = 0, t = 0;  // in elements
};
struct AttentionShape {
  int64_t b = 0, h = 0, tq = 0, tk = 0, d = 0;
  AttentionStrides q, k, v, out, dout, dq, dk, dv;  // dout, dq, dk, dv: backward only
};
bool launch_attention_forward(int dt, const void* q, const void* k, const void* v, bool causal,
                              float scale, void* out, float* lse, const AttentionShape& s,
                              Stream stream);
// scratch: B * H * Tq floats (D_i = <dout_i, out_i>).
bool launch_attention_backward(int dt, const void* q, const void* k, const void* v, const void* out,
                               const float* lse, const void* dout, bool causal, float scale,
                               void* dq, void* dk, void* dv, float* scratch,
                               const AttentionShape& s, Stream stream);

// ---- attention_decode.cu (Note [CUDA decode attention]) ----
// A decode step: at most this many queries against more keys (also the queries up to which auto
// sends a forward to the own kernels without trying cuDNN, Note [cuDNN SDPA], decoding).
inline constexpr int64_t kAttentionDecodeQueries = 16;
// Whether the split-key decode forward takes Tq queries against Tk keys at head dim d:
// 1 <= Tq <= kAttentionDecodeQueries, Tq < Tk, d 32, 64 or 128 (any float dtype).
bool attention_decode_fits(int64_t tq, int64_t tk, int64_t d);
// How the keys of each of `rows` (B * H * Tq) query rows are cut into runs: `splits` runs of
// `keys` keys (a multiple of 32, the last run shorter), enough to give `sms` multiprocessors
// about 16 warps each, never a run under 32 keys.
struct DecodeSplits {
  int64_t splits = 1, keys = 32;
};
DecodeSplits attention_decode_splits(int64_t rows, int64_t tk, int sms);
// The forward's contract (launch_attention_forward) for shapes attention_decode_fits takes, else
// false. scratch: rows * splits * (d + 2) floats.
bool launch_attention_decode_forward(int dt, const void* q, const void* k, const void* v,
                                     bool causal, float scale, void* out, float* lse,
                                     const AttentionShape& s, const DecodeSplits& splits,
                                     float* scratch, Stream stream);

// ---- attention_tc.cu (Note [CUDA tensor-core attention]) ----
// The own kernel on the tensor cores, for dt BF16/F16 with D 64 or 128 and b, h at most 65535
// (its grid's y and z; attention_tc_fits); the contract, arguments and scratch of the two above.
// Other dtypes, head dims and shapes return false.
bool attention_tc_fits(int dt, int64_t d, int64_t b, int64_t h);
bool launch_attention_tc_forward(int dt, const void* q, const void* k, const void* v, bool causal,
                                 float scale, void* out, float* lse, const AttentionShape& s,
                                 Stream stream);
bool launch_attention_tc_backward(int dt, const void* q, const void* k, const void* v,
                                  const void* out, const float* lse, const void* dout, bool causal,
                                  float scale, void* dq, void* dk, void* dv, float* scratch,
                                  const AttentionShape& s, Stream stream);

}  // namespace strata::tensor::cuda
