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
// dweight/dbias reuse the chunked partials of reduce_norm.cu (launch_norm_param_grads).
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
  for (int64_t k = threadIdx.x; k < units; k += blockDim.x) {
    const Vec<T, P> gv = load_vec<T, P>(gr, k), sv = load_vec<T, P>(sr, k),
                    wv = load_vec<T, P>(w, k);
#pragma unroll
    for (int e = 0; e < P; ++e) {
      const float g = to_f32(gv.v[e]) * to_f32(wv.v[e]);
      sg += g;
      sgx += g * (to_f32(sv.v[e]) - mu) * rs;
    }
  }
  const float mg = LAYER ? block_sum(sg, sh) / static_cast<float>(c) : 0.f;
  const float mgx = block_sum(sgx, sh) / static_cast<float>(c);
  const T* dsr = ds ? ds + row * c : nullptr;
  T* out = dsum + row * c;
  for (int64_t k = threadIdx.x; k < units; k += blockDim.x) {
    const Vec<T, P> gv = load_vec<T, P>(gr, k), sv = load_vec<T, P>(sr, k),
                    wv = load_vec<T, P>(w, k);
    Vec<T, P> dv{};
    if (dsr) dv = load_vec<T, P>(dsr, k);
    Vec<T, P> o;
#pragma unroll
    for (int e = 0; e < P; ++e) {
      const float xhat = (to_f32(sv.v[e]) - mu) * rs;
      const T dx = from_f32<T>(rs * (to_f32(gv.v[e]) * to_f32(wv.v[e]) - mg - xhat * mgx));
      o.v[e] = dsr ? from_f32<T>(to_f32(dv.v[e]) + to_f32(dx)) : dx;
    }
    store_vec<T, P>(out, k, o);
  }
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

bool launch_layernorm_backward(int dt, const void* dy, const void* x, const void* w,
                               const float* mean, const float* rstd, void* dx, void* dw, void* db,
                               float* scratch, int64_t n, int64_t c, Stream stream) {
  return launch_add_norm_backward(dt, dy, nullptr, x, w, mean, rstd, dx, n, c, stream) &&
         launch_norm_param_grads(dt, dy, x, mean, rstd, dw, db, scratch, n, c, stream);
}

bool launch_rmsnorm_backward(int dt, const void* dy, const void* x, const void* w,
                             const float* rstd, void* dx, void* dw, float* scratch, int64_t n,
                             int64_t c, Stream stream) {
  return launch_add_norm_backward(dt, dy, nullptr, x, w, nullptr, rstd, dx, n, c, stream) &&
         launch_norm_param_grads(dt, dy, x, nullptr, rstd, dw, nullptr, scratch, n, c, stream);
}

#undef STRATA_FLOAT_TYPE

}  // namespace strata::tensor::cuda
