// CUDA layernorm / rmsnorm, plain or with the residual add fused in (Note [Fused residual norm]
// in tensor/ops.h).
//
// Note [CUDA fused residual norm]
// One block per row. The plain norms are the same kernels with no residual (r null: the row is x,
// no s is written) and no ds. When every row pointer is 16-byte aligned and
// C is a multiple of the pack (8 bf16/f16 or 4 f32) each thread moves 128-bit packs, otherwise
// single elements; the host picks the path, and both compute every element the same way.
// Forward: pass 1 adds x + r in f32, rounds s ONCE to the compute dtype, stores it and sums it;
// pass 2 re-reads that stored s (the thread's own writes) for the centred squares; pass 3 writes
// y from s, w, b. The norm therefore reads the rounded s, as add then layernorm does. Backward:
// dx is the unfused kernel's formula on s, rounded to the compute dtype, then added to ds and
// rounded again (the unfused graph's two roundings), written as dsum in the same pass. All sums
// are f32 through the fixed shuffle tree of block_sum, so no atomics and the same bits every run;
// dweight/dbias are the chunked partials of launch_norm_param_grads (below), or the same
// partials summed in the dsum kernel (Note [Fused norm weight gradients], below).
#include <algorithm>
#include <initializer_list>

#include "tensor/cuda/common.cuh"

namespace strata::tensor::cuda {

namespace {

// P elements of T moved as one access: a 128-bit pack, or a single element (P = 1).
template <typename T, int P>
struct alignas(sizeof(T) * P) Vec {
  T v[P];
};

template <typename T, int P>
__device__ __forceinline__ Vec<T, P> load_vec(const T* p, int64_t k) {
  return reinterpret_cast<const Vec<T, P>*>(p)[k];
}

template <typename T, int P>
__device__ __forceinline__ void store_vec(T* p, int64_t k, const Vec<T, P>& v) {
  reinterpret_cast<Vec<T, P>*>(p)[k] = v;
}

// s = round(x + r); y = layernorm(s) (LAYER) or rmsnorm(s). b and mean_out are null for rmsnorm.
// With r null (the plain norm) the row is x itself and s is neither needed nor written.
template <typename T, int P, bool LAYER>
__global__ void add_norm_fwd(const T* x, const T* r, const T* w, const T* b, float eps, T* s, T* y,
                             float* mean_out, float* rstd_out, int64_t c) {
  __shared__ float sh[32];
  const int64_t row = blockIdx.x;
  const int64_t units = c / P;
  const T* xr = x + row * c;
  T* yr = y + row * c;
  float acc = 0;
  if (r != nullptr) {
    const T* rr = r + row * c;
    T* out_row = s + row * c;
    for (int64_t k = threadIdx.x; k < units; k += blockDim.x) {
      const Vec<T, P> a = load_vec<T, P>(xr, k), bv = load_vec<T, P>(rr, k);
      Vec<T, P> out;
#pragma unroll
      for (int e = 0; e < P; ++e) {
        out.v[e] = from_f32<T>(to_f32(a.v[e]) + to_f32(bv.v[e]));
        const float sv = to_f32(out.v[e]);
        acc += LAYER ? sv : sv * sv;
      }
      store_vec<T, P>(out_row, k, out);
    }
  } else {
    for (int64_t k = threadIdx.x; k < units; k += blockDim.x) {
      const Vec<T, P> a = load_vec<T, P>(xr, k);
#pragma unroll
      for (int e = 0; e < P; ++e) {
        const float sv = to_f32(a.v[e]);
        acc += LAYER ? sv : sv * sv;
      }
    }
  }
  // The normalised row: the stored (rounded) sum, or x. Each thread re-reads only the packs it
  // wrote itself, so no barrier is needed before block_sum's own.
  const T* sr = r != nullptr ? s + row * c : xr;
  float mean = 0, rstd;
  if (LAYER) {
    mean = block_sum(acc, sh) / static_cast<float>(c);
    float v = 0;
    for (int64_t k = threadIdx.x; k < units; k += blockDim.x) {
      const Vec<T, P> sv = load_vec<T, P>(sr, k);
#pragma unroll
      for (int e = 0; e < P; ++e) {
        const float d = to_f32(sv.v[e]) - mean;
        v += d * d;
      }
    }
    rstd = rsqrtf(block_sum(v, sh) / static_cast<float>(c) + eps);
  } else {
    rstd = rsqrtf(block_sum(acc, sh) / static_cast<float>(c) + eps);
  }
  for (int64_t k = threadIdx.x; k < units; k += blockDim.x) {
    const Vec<T, P> sv = load_vec<T, P>(sr, k), wv = load_vec<T, P>(w, k);
    Vec<T, P> bv{};
    if (LAYER) bv = load_vec<T, P>(b, k);
    Vec<T, P> out;
#pragma unroll
    for (int e = 0; e < P; ++e) {
      const float n = (to_f32(sv.v[e]) - mean) * rstd * to_f32(wv.v[e]);
      out.v[e] = from_f32<T>(LAYER ? n + to_f32(bv.v[e]) : n);
    }
    store_vec<T, P>(yr, k, out);
  }
  if (threadIdx.x == 0) {
    if (LAYER) mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// One pack's terms of the row sums the input gradient needs: sg += dy * w, and sgx += dy * w *
// xhat (LAYER: xhat = (s - mu) * rs; rmsnorm: mu = 0).
template <typename T, int P>
__device__ __forceinline__ void add_row_terms(const Vec<T, P>& gv, const Vec<T, P>& sv,
                                              const Vec<T, P>& wv, float mu, float rs, float& sg,
                                              float& sgx) {
#pragma unroll
  for (int e = 0; e < P; ++e) {
    const float g = __fmul_rn(to_f32(gv.v[e]), to_f32(wv.v[e]));
    sg = __fadd_rn(sg, g);
    sgx = __fadd_rn(sgx, __fmul_rn(__fmul_rn(g, __fsub_rn(to_f32(sv.v[e]), mu)), rs));
  }
}

// One pack of dsum = round(ds + round(dx)) (no ds: round(dx)) from the row's means mg, mgx.
//
// Note [Explicitly rounded norm gradients]
// nvcc contracts a * b + c into one FMA by default (-fmad=true), where and whether it does
// depending on the code around it: the same source inlined into the two-kernel path and into the
// fused kernel, or in the branch with ds and the one without, compiled to different roundings,
// and in f32 (where round(dx) is no conversion) ds + rs * (...) became one FMA, skipping dx's
// rounding that the unfused graph (layernorm_backward, then the engine's add) has. Every
// operation of dx, of the row sums it needs, and of dsum is therefore an explicitly rounded
// intrinsic (__fmul_rn, __fadd_rn, __fsub_rn: never contracted), so every path computes the
// same operations; the emulator contracts where GCC can (Note [Emulated FMA contraction]).
template <typename T, int P>
__device__ __forceinline__ Vec<T, P> dsum_pack(const Vec<T, P>& gv, const Vec<T, P>& sv,
                                               const Vec<T, P>& wv, const Vec<T, P>& dv,
                                               bool has_ds, float mu, float rs, float mg,
                                               float mgx) {
  Vec<T, P> o;
#pragma unroll
  for (int e = 0; e < P; ++e) {
    const float xhat = __fmul_rn(__fsub_rn(to_f32(sv.v[e]), mu), rs);
    const float g = __fmul_rn(to_f32(gv.v[e]), to_f32(wv.v[e]));
    const T dx = from_f32<T>(__fmul_rn(rs, __fsub_rn(__fsub_rn(g, mg), __fmul_rn(xhat, mgx))));
    o.v[e] = has_ds ? from_f32<T>(__fadd_rn(to_f32(dv.v[e]), to_f32(dx))) : dx;
  }
  return o;
}

// dsum = round(ds + round(dx)) (ds null: round(dx)), dx the norm's input gradient at s.
template <typename T, int P, bool LAYER>
__global__ void add_norm_bwd(const T* dy, const T* ds, const T* s, const T* w, const float* mean,
                             const float* rstd, T* dsum, int64_t c) {
  __shared__ float sh[32];
  const int64_t row = blockIdx.x;
  const int64_t units = c / P;
  const T* gr = dy + row * c;
  const T* sr = s + row * c;
  const float mu = LAYER ? mean[row] : 0.f, rs = rstd[row];
  float sg = 0, sgx = 0;
  for (int64_t k = threadIdx.x; k < units; k += blockDim.x)
    add_row_terms<T, P>(load_vec<T, P>(gr, k), load_vec<T, P>(sr, k), load_vec<T, P>(w, k), mu, rs,
                        sg, sgx);
  const float mg = LAYER ? block_sum(sg, sh) / static_cast<float>(c) : 0.f;
  const float mgx = block_sum(sgx, sh) / static_cast<float>(c);
  const T* dsr = ds ? ds + row * c : nullptr;
  T* out = dsum + row * c;
  for (int64_t k = threadIdx.x; k < units; k += blockDim.x) {
    Vec<T, P> dv{};
    if (dsr) dv = load_vec<T, P>(dsr, k);
    store_vec<T, P>(out, k,
                    dsum_pack<T, P>(load_vec<T, P>(gr, k), load_vec<T, P>(sr, k),
                                    load_vec<T, P>(w, k), dv, dsr != nullptr, mu, rs, mg, mgx));
  }
}

// block_sum of two values at once: the same shuffle tree and shared-memory pass for each, so
// each total has the bits block_sum alone gives it, with half the barriers.
__device__ __forceinline__ float2 block_sum2(float a, float b, float2* shared /* 32 */) {
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, o);
    b += __shfl_xor_sync(0xffffffffu, b, o);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // shared may still be read by a previous call
  if (lane == 0) shared[warp] = make_float2(a, b);
  __syncthreads();
  const int nwarps = blockDim.x / 32;
  float2 t = lane < nwarps ? shared[lane] : make_float2(0.f, 0.f);
  for (int o = 16; o > 0; o >>= 1) {
    t.x += __shfl_xor_sync(0xffffffffu, t.x, o);
    t.y += __shfl_xor_sync(0xffffffffu, t.y, o);
  }
  return t;
}

// Note [Fused norm weight gradients]
// The norm backward's weight and bias gradients are column sums over all n rows of dy * xhat and
// dy. The separate path (launch_norm_param_grads, below) re-reads dy and s after the
// dsum kernel, in chunks of kNormRowChunk rows, one f32 partial per chunk and column: per bf16
// element the dsum kernel moves 8 bytes (dy, s, ds in, dsum out) and the partials 4 more. When a
// row is one pack per thread in a block of at most kFusedNormThreads, one kernel does both: a
// block takes a chunk's rows one after another, each thread keeps its pack of w and its columns'
// partials in registers, and while the block reduces a row it already has the next row's dy and
// s in flight. It writes the chunk's partial row at the end, and the same finisher adds the
// partials (Note [Chunk partial sums] in common.cuh). Every value is computed as on the separate
// path: the same block size (threads_for), the same per-thread terms and shuffle tree for the
// row sums (block_sum2 is block_sum twice), the same row order and rounding for the partials
// (add_norm_param_terms), so dsum, dweight and dbias have the same bits either way
// (CudaOps.FusedNormBackwardGivesTheSeparatePathsBits). STRATA_NORM_GRADS=separate picks the
// separate path (Note [Environment switches] in core/env.h), so one GPU run can time both.
// GPT-2's rows (C = 768 ... 1600) are 96 ... 200 packs of bf16 and 192 ... 400 of f32.
//
// Registers: the kernel holds four packs of the rows (this row's and the next's dy and s), its
// packs of w and ds, and 2 * P f32 partials: ptxas gives the bf16 layernorm 91 registers when
// free. Blocks last a whole chunk, so how many fit at once matters: GPT-2 1558M at B * T = 16K
// has 512 chunks of blocks of 224 threads, and at 91 (allocated 96) registers only 3 blocks fit
// on a multiprocessor, 396 on an H100, leaving a second wave of 116. kFusedNormRegs = 72 fits 4
// (528, one wave; 96 threads for GPT-2 124M fit 9). ptxas meets it without spilling (tests/ptx).
inline constexpr int kFusedNormThreads = 512;
inline constexpr int kFusedNormRegs = 72;

// P f32 partials at p: 128-bit stores when P is whole float4s (the launcher checks p's alignment).
template <int P>
__device__ __forceinline__ void store_partials(float* p, const float (&v)[P]) {
  if constexpr (P % 4 == 0) {
#pragma unroll
    for (int q = 0; q < P / 4; ++q)
      reinterpret_cast<float4*>(p)[q] =
          make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
  } else {
#pragma unroll
    for (int e = 0; e < P; ++e) p[e] = v[e];
  }
}

template <typename T, int P, bool LAYER>
__global__ void __maxnreg__(kFusedNormRegs)
    add_norm_bwd_fused(const T* dy, const T* ds, const T* s, const T* w, const float* mean,
                       const float* rstd, T* dsum, float* partial_w, float* partial_b, int64_t n,
                       int64_t c) {
  __shared__ float2 sh[32];
  const int64_t k = threadIdx.x;
  const bool on = k < c / P;  // this thread's pack exists
  const int64_t r0 = blockIdx.x * kNormRowChunk, r1 = min(n, r0 + kNormRowChunk);
  Vec<T, P> wv{}, gv{}, sv{};
  if (on) {
    wv = load_vec<T, P>(w, k);
    gv = load_vec<T, P>(dy + r0 * c, k);
    sv = load_vec<T, P>(s + r0 * c, k);
  }
  float mu = LAYER ? mean[r0] : 0.f, rs = rstd[r0];
  float sw[P] = {}, sb[P] = {};
  for (int64_t r = r0; r < r1; ++r) {
    // The next row's operands, loaded before this row's reduction waits at its barriers.
    Vec<T, P> gn{}, sn{};
    float mun = 0.f, rsn = 0.f;
    if (r + 1 < r1) {
      if (on) {
        gn = load_vec<T, P>(dy + (r + 1) * c, k);
        sn = load_vec<T, P>(s + (r + 1) * c, k);
      }
      if (LAYER) mun = mean[r + 1];
      rsn = rstd[r + 1];
    }
    Vec<T, P> dv{};
    if (on && ds) dv = load_vec<T, P>(ds + r * c, k);
    float sg = 0, sgx = 0;
    if (on) add_row_terms<T, P>(gv, sv, wv, mu, rs, sg, sgx);
    const float2 t = block_sum2(sg, sgx, sh);
    const float mg = LAYER ? t.x / static_cast<float>(c) : 0.f;
    const float mgx = t.y / static_cast<float>(c);
    if (on) {
      store_vec<T, P>(dsum + r * c, k,
                      dsum_pack<T, P>(gv, sv, wv, dv, ds != nullptr, mu, rs, mg, mgx));
      // rmsnorm has no bias: its sb is never stored, and keeping it would cost P registers.
      float none = 0.f;
#pragma unroll
      for (int e = 0; e < P; ++e)
        add_norm_param_terms(to_f32(gv.v[e]), to_f32(sv.v[e]), mu, rs, sw[e], LAYER ? sb[e] : none);
    }
    gv = gn;
    sv = sn;
    mu = mun;
    rs = rsn;
  }
  if (!on) return;
  store_partials<P>(partial_w + blockIdx.x * c + k * P, sw);
  if (LAYER) store_partials<P>(partial_b + blockIdx.x * c + k * P, sb);
}

// Threads per row for `units` accesses: a multiple of 32 (block_sum), at most 1024, and as few
// as spread the accesses evenly: every thread makes ceil(units / 1024) of them, or one fewer.
// GPT-2's rows in bf16 are 96, 128, 160 and 200 packs (C = 768 ... 1600): 96, 128, 160 and 224
// threads, one pack each, where powers of two gave 64, 128, 128 and 128 threads with some
// making two passes while the rest of the block waited at block_sum.
int threads_for(int64_t units) {
  const int64_t per_thread = (units + 1023) / 1024;
  const int64_t threads = (units + per_thread - 1) / per_thread;
  return static_cast<int>(std::max<int64_t>(32, (threads + 31) / 32 * 32));
}

// Whether the rows take 128-bit packs of T (Note [CUDA fused residual norm]).
template <typename T>
bool packs_fit(int64_t c, std::initializer_list<const void*> ptrs) {
  if (c % Pack<T>::kN != 0) return false;
  for (const void* p : ptrs)
    if (p != nullptr && !aligned16(p)) return false;
  return true;
}

#define STRATA_FLOAT_TYPE(tag) typename decltype(tag)::type

template <bool LAYER>
bool launch_forward(int dt, const void* x, const void* r, const void* w, const void* b, float eps,
                    void* s, void* y, float* mean, float* rstd, int64_t n, int64_t c,
                    Stream stream) {
  return dispatch_float(dt, [&](auto tag) {
    using T = STRATA_FLOAT_TYPE(tag);
    if (n == 0 || c == 0) return;
    const T* px = static_cast<const T*>(x);
    const T* pr = static_cast<const T*>(r);
    const T* pw = static_cast<const T*>(w);
    const T* pb = static_cast<const T*>(b);
    T* ps = static_cast<T*>(s);
    T* py = static_cast<T*>(y);
    const unsigned grid = static_cast<unsigned>(n);
    if (packs_fit<T>(c, {x, r, w, b, s, y})) {
      constexpr int P = Pack<T>::kN;
      STRATA_LAUNCH(grid, threads_for(c / P), 0, stream, add_norm_fwd<T, P, LAYER>)
      (px, pr, pw, pb, eps, ps, py, mean, rstd, c);
    } else {
      STRATA_LAUNCH(grid, threads_for(c), 0, stream, add_norm_fwd<T, 1, LAYER>)
      (px, pr, pw, pb, eps, ps, py, mean, rstd, c);
    }
  });
}

// partial_w[chunk, j] = sum over the chunk's rows of dy * xhat; partial_b likewise of dy (f32).
// Note [CUDA element groups]: K consecutive columns per thread, each summed alone in row order.
template <typename T>
__global__ void norm_bwd_partials(const T* dy, const T* x, const float* mean, const float* rstd,
                                  float* partial_w, float* partial_b, int64_t n, int64_t c,
                                  bool wide) {
  constexpr int K = group_width<T>;
  const int64_t j = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) * K;
  if (j >= c) return;
  const int64_t valid = c - j;
  const int64_t chunks = (n + kNormRowChunk - 1) / kNormRowChunk;
  // Note [Row chunks on grid.y]: this block's chunks are blockIdx.y, + gridDim.y, ...
  for (int64_t chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {
    const int64_t r0 = chunk * kNormRowChunk, r1 = min(n, r0 + kNormRowChunk);
    float sw[K] = {}, sb[K] = {};
    for (int64_t r = r0; r < r1; ++r) {
      float g[K], xv[K];
      load_group<K>(wide, dy + r * c + j, valid, g);
      load_group<K>(wide, x + r * c + j, valid, xv);
      const float mu = mean ? mean[r] : 0.f, rs = rstd[r];
#pragma unroll
      for (int e = 0; e < K; ++e) add_norm_param_terms(g[e], xv[e], mu, rs, sw[e], sb[e]);
    }
    store_group<K>(wide, partial_w + chunk * c + j, valid, sw);
    if (partial_b) store_group<K>(wide, partial_b + chunk * c + j, valid, sb);
  }
}

}  // namespace

bool launch_add_layernorm_forward(int dt, const void* x, const void* r, const void* w,
                                  const void* b, float eps, void* s, void* y, float* mean,
                                  float* rstd, int64_t n, int64_t c, Stream stream) {
  return launch_forward<true>(dt, x, r, w, b, eps, s, y, mean, rstd, n, c, stream);
}

bool launch_add_rmsnorm_forward(int dt, const void* x, const void* r, const void* w, float eps,
                                void* s, void* y, float* rstd, int64_t n, int64_t c,
                                Stream stream) {
  return launch_forward<false>(dt, x, r, w, nullptr, eps, s, y, nullptr, rstd, n, c, stream);
}

bool launch_add_norm_backward(int dt, const void* dy, const void* ds, const void* s, const void* w,
                              const float* mean, const float* rstd, void* dsum, int64_t n,
                              int64_t c, Stream stream) {
  return dispatch_float(dt, [&](auto tag) {
    using T = STRATA_FLOAT_TYPE(tag);
    if (n == 0 || c == 0) return;
    const T* pdy = static_cast<const T*>(dy);
    const T* pds = static_cast<const T*>(ds);
    const T* psum = static_cast<const T*>(s);
    const T* pw = static_cast<const T*>(w);
    T* out = static_cast<T*>(dsum);
    const unsigned grid = static_cast<unsigned>(n);
    const bool packed = packs_fit<T>(c, {dy, ds, s, w, dsum});
    constexpr int P = Pack<T>::kN;
    if (mean != nullptr) {
      if (packed) STRATA_LAUNCH(grid, threads_for(c / P), 0, stream, add_norm_bwd<T, P, true>)
      (pdy, pds, psum, pw, mean, rstd, out, c);
      else STRATA_LAUNCH(grid, threads_for(c), 0, stream, add_norm_bwd<T, 1, true>)(
          pdy, pds, psum, pw, mean, rstd, out, c);
    } else {
      if (packed) STRATA_LAUNCH(grid, threads_for(c / P), 0, stream, add_norm_bwd<T, P, false>)
      (pdy, pds, psum, pw, mean, rstd, out, c);
      else STRATA_LAUNCH(grid, threads_for(c), 0, stream, add_norm_bwd<T, 1, false>)(
          pdy, pds, psum, pw, mean, rstd, out, c);
    }
  });
}

// ---- the plain norms: the same kernels with no residual (and no ds) ----

bool launch_layernorm_forward(int dt, const void* x, const void* w, const void* b, float eps,
                              void* y, float* mean, float* rstd, int64_t n, int64_t c,
                              Stream stream) {
  return launch_forward<true>(dt, x, nullptr, w, b, eps, nullptr, y, mean, rstd, n, c, stream);
}

bool launch_rmsnorm_forward(int dt, const void* x, const void* w, float eps, void* y, float* rstd,
                            int64_t n, int64_t c, Stream stream) {
  return launch_forward<false>(dt, x, nullptr, w, nullptr, eps, nullptr, y, nullptr, rstd, n, c,
                               stream);
}

bool launch_norm_backward(int dt, const void* dy, const void* ds, const void* s, const void* w,
                          const float* mean, const float* rstd, void* dsum, void* dw, void* db,
                          float* scratch, int64_t n, int64_t c, bool fused, bool accumulate,
                          Stream stream) {
  const int64_t chunks = (n + kNormRowChunk - 1) / kNormRowChunk;
  float* partial_b = db ? scratch + chunks * c : nullptr;
  return dispatch_float(dt, [&](auto tag) {
    using T = STRATA_FLOAT_TYPE(tag);
    constexpr int P = Pack<T>::kN;
    const bool packed = packs_fit<T>(c, {dy, ds, s, w, dsum});
    // Note [Fused norm weight gradients]: one pack (or element) per thread, and 128-bit partial
    // stores only where the partial rows are 16-byte aligned.
    const int64_t units = packed ? c / P : c;
    const bool partials_fit =
        !packed || (aligned16(scratch) && (!partial_b || aligned16(partial_b)));
    // The fused kernel writes dbias partials exactly for layernorm (mean given).
    const bool bias_fits = (mean != nullptr) == (db != nullptr);
    if (!fused || n == 0 || c == 0 || units > kFusedNormThreads || !partials_fit || !bias_fits ||
        chunks > 0x7fffffff /* grid.x */) {
      if (!launch_add_norm_backward(dt, dy, ds, s, w, mean, rstd, dsum, n, c, stream)) return;
      launch_norm_param_grads(dt, dy, s, mean, rstd, dw, db, scratch, n, c, accumulate, stream);
      return;
    }
    const auto* pdy = static_cast<const T*>(dy);
    const auto* pds = static_cast<const T*>(ds);
    const auto* ps = static_cast<const T*>(s);
    const auto* pw = static_cast<const T*>(w);
    T* out = static_cast<T*>(dsum);
    const auto grid = static_cast<unsigned>(chunks);
    const int threads = threads_for(units);
    if (mean != nullptr) {
      if (packed) STRATA_LAUNCH(grid, threads, 0, stream, add_norm_bwd_fused<T, P, true>)
      (pdy, pds, ps, pw, mean, rstd, out, scratch, partial_b, n, c);
      else STRATA_LAUNCH(grid, threads, 0, stream, add_norm_bwd_fused<T, 1, true>)(
          pdy, pds, ps, pw, mean, rstd, out, scratch, partial_b, n, c);
    } else {
      if (packed) STRATA_LAUNCH(grid, threads, 0, stream, add_norm_bwd_fused<T, P, false>)
      (pdy, pds, ps, pw, mean, rstd, out, scratch, partial_b, n, c);
      else STRATA_LAUNCH(grid, threads, 0, stream, add_norm_bwd_fused<T, 1, false>)(
          pdy, pds, ps, pw, mean, rstd, out, scratch, partial_b, n, c);
    }
    launch_chunk_column_sums<float>(scratch, dw, partial_b, db, dt, chunks, c, stream, accumulate);
  });
}

bool launch_norm_param_grads(int dt, const void* dy, const void* x, const float* mean,
                             const float* rstd, void* dw, void* db, float* scratch, int64_t n,
                             int64_t c, bool accumulate, Stream stream) {
  return dispatch_float(dt, [&](auto tag) {
    using T = STRATA_FLOAT_TYPE(tag);
    const int64_t chunks = (n + kNormRowChunk - 1) / kNormRowChunk;
    constexpr int K = group_width<T>;
    const ColumnLaunch l = column_launch(c, K);
    float* partial_b = db ? scratch + chunks * c : nullptr;
    // The f32 partials' rows are c floats: 16-byte aligned when c is a multiple of K (>= 4).
    const bool wide = c % K == 0 && aligned16(dy) && aligned16(x) && aligned16(scratch) &&
                      (partial_b == nullptr || aligned16(partial_b));
    if (chunks > 0)
      STRATA_LAUNCH(dim3(l.blocks, chunk_grid(chunks)), l.threads, 0, stream, norm_bwd_partials<T>)
    (static_cast<const T*>(dy), static_cast<const T*>(x), mean, rstd, scratch, partial_b, n, c,
     wide);
    // Note [Chunk partial sums]: dweight and dbias in one launch.
    launch_chunk_column_sums<float>(scratch, dw, partial_b, db, dt, chunks, c, stream, accumulate);
  });
}

#undef STRATA_FLOAT_TYPE

}  // namespace strata::tensor::cuda
