// CPU layernorm, rmsnorm (also fused with the residual add before them) and softmax over the
// last dim of a contiguous [N, C] tensor.
//
// Note [Deterministic column reductions]
// dweight and dbias are sums over rows. Rows are split into chunks whose count depends only on N
// (never on the thread count); each chunk sums its rows in order into its own partial row, and
// the partials are then added in chunk order. Whichever thread runs a chunk, every bit of the
// result is the same. Row statistics (mean, variance, dot products) are accumulated in double
// by one thread per row, so they are deterministic too.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "offload/memory_stats.h"
#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu/vec4.h"
#include "tensor/cpu/widen.h"

namespace strata::tensor::cpu {

namespace {

// Parallelise only when the work pays for waking the threads.
constexpr int64_t kParallelMin = 1 << 14;
// See Note [Deterministic column reductions].
constexpr int64_t kMaxChunks = 64;

double row_sum(const float* x, int64_t n) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += x[i];
  return s;
}

double row_dot(const float* a, const float* b, int64_t n) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

double row_centered_squares(const float* x, int64_t n, double mean) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) {
    const double d = x[i] - mean;
    s += d * d;
  }
  return s;
}

// Scratch rows for per-chunk partial sums, charged to the workspace category.
Tensor workspace(int64_t n) {
  offload::CategoryScope scope(offload::Category::Workspace);
  return Tensor::empty({n}, DType::F32);
}

// Runs body(row_begin, row_end, partial) once per chunk of rows, then writes
// out_k[c] = sum over chunks of partial_k[c], in chunk order (Note [Deterministic column
// reductions]). `outs` partial rows of length c are handed to each chunk, zeroed.
template <typename Body>
void chunked_column_sums(int64_t n, int64_t c, std::initializer_list<float*> outs, Body body) {
  const int64_t k = static_cast<int64_t>(outs.size());
  const int64_t chunks = std::max<int64_t>(1, std::min(n, kMaxChunks));
  const int64_t rows_per_chunk = (n + chunks - 1) / std::max<int64_t>(chunks, 1);
  Tensor partial = workspace(chunks * k * c);
  float* p = partial.data<float>();
#pragma omp parallel for schedule(static) if (n * c >= kParallelMin)
  for (int64_t ch = 0; ch < chunks; ++ch) {
    float* mine = p + ch * k * c;
    std::fill(mine, mine + k * c, 0.0f);
    const int64_t r0 = std::min(n, ch * rows_per_chunk), r1 = std::min(n, r0 + rows_per_chunk);
    body(r0, r1, mine);
  }
  int64_t which = 0;
  for (float* out : outs) {
#pragma omp parallel for schedule(static) if (chunks * c >= kParallelMin)
    for (int64_t j = 0; j < c; ++j) {
      double s = 0;
      for (int64_t ch = 0; ch < chunks; ++ch) s += p[(ch * k + which) * c + j];
      out[j] = static_cast<float>(s);
    }
    ++which;
  }
}

// One row of layernorm, shared by layernorm_forward and add_layernorm_forward so that the fused
// op's y, mean and rstd are the unfused ones bit for bit (Note [Fused residual norm]).
void layernorm_row(const float* xr, const float* w, const float* b, float eps, int64_t c, float* yr,
                   float* mean, float* rstd) {
  // Two passes (mean, then centred squares): no cancellation when |mean| >> std.
  const double m = row_sum(xr, c) / static_cast<double>(c);
  const double var = row_centered_squares(xr, c, m) / static_cast<double>(c);
  const float s = static_cast<float>(1.0 / std::sqrt(var + eps));
  const float mf = static_cast<float>(m);
  for (int64_t j = 0; j < c; ++j) yr[j] = (xr[j] - mf) * s * w[j] + b[j];
  *mean = mf;
  *rstd = s;
}

// dx of one layernorm row into dxr, and the row's dweight/dbias terms added to dw/db.
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w: the gradient through the
// normalisation, with the two projections that the mean and the variance remove.
void layernorm_backward_row(const float* xr, const float* dyr, const float* w, float m, float s,
                            int64_t c, float* dxr, float* dw, float* db) {
  double sum_g = 0, sum_gx = 0;
#pragma omp simd reduction(+ : sum_g, sum_gx)
  for (int64_t j = 0; j < c; ++j) {
    const float xhat = (xr[j] - m) * s;
    const float g = dyr[j] * w[j];
    sum_g += g;
    sum_gx += static_cast<double>(g) * xhat;
  }
  const float mean_g = static_cast<float>(sum_g / static_cast<double>(c));
  const float mean_gx = static_cast<float>(sum_gx / static_cast<double>(c));
  for (int64_t j = 0; j < c; ++j) {
    const float xhat = (xr[j] - m) * s;
    dxr[j] = s * (dyr[j] * w[j] - mean_g - xhat * mean_gx);
    dw[j] += dyr[j] * xhat;
    db[j] += dyr[j];
  }
}

void rmsnorm_row(const float* xr, const float* w, float eps, int64_t c, float* yr, float* rstd) {
  const double ms = row_dot(xr, xr, c) / static_cast<double>(c);
  const float s = static_cast<float>(1.0 / std::sqrt(ms + eps));
  for (int64_t j = 0; j < c; ++j) yr[j] = xr[j] * s * w[j];
  *rstd = s;
}

// dx = rstd * (g - xhat * mean(g * xhat)), g = dy * w, xhat = x * rstd.
void rmsnorm_backward_row(const float* xr, const float* dyr, const float* w, float s, int64_t c,
                          float* dxr, float* dw) {
  double sum_gx = 0;
#pragma omp simd reduction(+ : sum_gx)
  for (int64_t j = 0; j < c; ++j) sum_gx += static_cast<double>(dyr[j] * w[j]) * (xr[j] * s);
  const float mean_gx = static_cast<float>(sum_gx / static_cast<double>(c));
  for (int64_t j = 0; j < c; ++j) {
    const float xhat = xr[j] * s;
    dxr[j] = s * (dyr[j] * w[j] - xhat * mean_gx);
    dw[j] += dyr[j] * xhat;
  }
}

// dsum_row += ds_row, a separate pass after dx is stored: the unfused graph adds the STORED dx to
// ds, and a compiler must not contract the add into dx's arithmetic (an FMA would round once
// where the unfused graph rounds twice).
void add_row(const float* ds, int64_t c, float* dsum) {
  for (int64_t j = 0; j < c; ++j) dsum[j] = ds[j] + dsum[j];
}

}  // namespace

void CpuBackend::layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                   float eps, Tensor& y, Tensor& mean, Tensor& rstd) {
  if (!all_f32(x, weight, bias, y, mean, rstd)) {  // Note [Widening adapter]
    F32Out oy(y), om(mean), orstd(rstd);
    layernorm_forward(widened(x), widened(weight), widened(bias), eps, oy.get(), om.get(),
                      orstd.get());
    oy.commit();
    om.commit();
    return orstd.commit();
  }
  const int64_t n = x.size(0), c = x.size(1);
  const float* xp = x.data<float>();
  const float* w = weight.data<float>();
  const float* b = bias.data<float>();
  float* yp = y.data<float>();
  float* mp = mean.data<float>();
  float* rp = rstd.data<float>();
#pragma omp parallel for schedule(static) if (n * c >= kParallelMin)
  for (int64_t r = 0; r < n; ++r)
    layernorm_row(xp + r * c, w, b, eps, c, yp + r * c, mp + r, rp + r);
}

// A norm backward with `accumulate` (tensor/backend.h): `run` computes the parameter gradients
// into fresh tensors, which are then added into dweight (and dbias) by axpy, so the CPU's bits are
// those of AccumulateGrad adding the returned gradients. Returns false without accumulate.
namespace {
template <typename Run>
bool accumulate_apart(bool accumulate, Tensor& dweight, Tensor* dbias, Run run) {
  if (!accumulate) return false;
  offload::CategoryScope scope(offload::Category::Workspace);
  Tensor w = Tensor::empty(dweight.shape(), dweight.dtype());
  Tensor b = dbias ? Tensor::empty(dbias->shape(), dbias->dtype()) : Tensor();
  run(w, b);
  CpuBackend::instance().axpy(1.f, w, dweight);
  if (dbias) CpuBackend::instance().axpy(1.f, b, *dbias);
  return true;
}
}  // namespace

void CpuBackend::layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                    const Tensor& mean, const Tensor& rstd, Tensor& dx,
                                    Tensor& dweight, Tensor& dbias, bool accumulate) {
  if (accumulate_apart(accumulate, dweight, &dbias, [&](Tensor& w, Tensor& b) {
        layernorm_backward(dy, x, weight, mean, rstd, dx, w, b, false);
      }))
    return;
  if (!all_f32(dy, x, weight, mean, rstd, dx, dweight, dbias)) {  // Note [Widening adapter]
    F32Out odx(dx), odw(dweight), odb(dbias);
    layernorm_backward(widened(dy), widened(x), widened(weight), widened(mean), widened(rstd),
                       odx.get(), odw.get(), odb.get(), false);
    odx.commit();
    odw.commit();
    return odb.commit();
  }
  const int64_t n = x.size(0), c = x.size(1);
  const float* xp = x.data<float>();
  const float* dyp = dy.data<float>();
  const float* w = weight.data<float>();
  const float* mp = mean.data<float>();
  const float* rp = rstd.data<float>();
  float* dxp = dx.data<float>();
  auto rows = [&](int64_t r0, int64_t r1, float* partial) {
    for (int64_t r = r0; r < r1; ++r)
      layernorm_backward_row(xp + r * c, dyp + r * c, w, mp[r], rp[r], c, dxp + r * c, partial,
                             partial + c);
  };
  chunked_column_sums(n, c, {dweight.data<float>(), dbias.data<float>()}, rows);
}

void CpuBackend::rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, Tensor& y,
                                 Tensor& rstd) {
  if (!all_f32(x, weight, y, rstd)) {  // Note [Widening adapter]
    F32Out oy(y), orstd(rstd);
    rmsnorm_forward(widened(x), widened(weight), eps, oy.get(), orstd.get());
    oy.commit();
    return orstd.commit();
  }
  const int64_t n = x.size(0), c = x.size(1);
  const float* xp = x.data<float>();
  const float* w = weight.data<float>();
  float* yp = y.data<float>();
  float* rp = rstd.data<float>();
#pragma omp parallel for schedule(static) if (n * c >= kParallelMin)
  for (int64_t r = 0; r < n; ++r) rmsnorm_row(xp + r * c, w, eps, c, yp + r * c, rp + r);
}

void CpuBackend::rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                  const Tensor& rstd, Tensor& dx, Tensor& dweight,
                                  bool accumulate) {
  if (accumulate_apart(accumulate, dweight, nullptr, [&](Tensor& w, Tensor&) {
        rmsnorm_backward(dy, x, weight, rstd, dx, w, false);
      }))
    return;
  if (!all_f32(dy, x, weight, rstd, dx, dweight)) {  // Note [Widening adapter]
    F32Out odx(dx), odw(dweight);
    rmsnorm_backward(widened(dy), widened(x), widened(weight), widened(rstd), odx.get(), odw.get(),
                     false);
    odx.commit();
    return odw.commit();
  }
  const int64_t n = x.size(0), c = x.size(1);
  const float* xp = x.data<float>();
  const float* dyp = dy.data<float>();
  const float* w = weight.data<float>();
  const float* rp = rstd.data<float>();
  float* dxp = dx.data<float>();
  auto rows = [&](int64_t r0, int64_t r1, float* dw) {
    for (int64_t r = r0; r < r1; ++r)
      rmsnorm_backward_row(xp + r * c, dyp + r * c, w, rp[r], c, dxp + r * c, dw);
  };
  chunked_column_sums(n, c, {dweight.data<float>()}, rows);
}

// ---- fused residual + norm (Note [Fused residual norm] in tensor/ops.h) ----
// In f32 one pass per row: s = x + r is stored, then the shared row kernels read it back (from
// cache). Otherwise the CPU composes its own kernels, the reference semantics by construction:
// binary add (rounds s), then the norm on the rounded s; backward rounds the norm's dx, then adds
// ds with one more rounding, exactly as the unfused graph does.

void CpuBackend::add_layernorm_forward(const Tensor& x, const Tensor& r, const Tensor& weight,
                                       const Tensor& bias, float eps, Tensor& s, Tensor& y,
                                       Tensor& mean, Tensor& rstd) {
  if (!all_f32(x, r, weight, bias, s, y)) {
    binary(BinaryOp::Add, x, r, s);
    return layernorm_forward(s, weight, bias, eps, y, mean, rstd);
  }
  const int64_t n = x.size(0), c = x.size(1);
  const float* xp = x.data<float>();
  const float* rp = r.data<float>();
  const float* w = weight.data<float>();
  const float* b = bias.data<float>();
  float* sp = s.data<float>();
  float* yp = y.data<float>();
  float* mp = mean.data<float>();
  float* sdp = rstd.data<float>();
#pragma omp parallel for schedule(static) if (n * c >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    float* sr = sp + i * c;
    for (int64_t j = 0; j < c; ++j) sr[j] = xp[i * c + j] + rp[i * c + j];
    layernorm_row(sr, w, b, eps, c, yp + i * c, mp + i, sdp + i);
  }
}

void CpuBackend::add_layernorm_backward(const Tensor& dy, const Tensor& ds, const Tensor& s,
                                        const Tensor& weight, const Tensor& mean,
                                        const Tensor& rstd, Tensor& dsum, Tensor& dweight,
                                        Tensor& dbias, bool accumulate) {
  if (accumulate_apart(accumulate, dweight, &dbias, [&](Tensor& w, Tensor& b) {
        add_layernorm_backward(dy, ds, s, weight, mean, rstd, dsum, w, b, false);
      }))
    return;
  if (!all_f32(dy, ds, s, weight, dsum, dweight, dbias)) {
    if (!ds.defined())
      return layernorm_backward(dy, s, weight, mean, rstd, dsum, dweight, dbias, false);
    offload::CategoryScope scope(offload::Category::Workspace);
    Tensor dx = Tensor::empty(dsum.shape(), dsum.dtype());
    layernorm_backward(dy, s, weight, mean, rstd, dx, dweight, dbias, false);
    return binary(BinaryOp::Add, ds, dx, dsum);
  }
  const int64_t n = s.size(0), c = s.size(1);
  const float* sp = s.data<float>();
  const float* dyp = dy.data<float>();
  const float* dsp = ds.defined() ? ds.data<float>() : nullptr;
  const float* w = weight.data<float>();
  const float* mp = mean.data<float>();
  const float* rp = rstd.data<float>();
  float* outp = dsum.data<float>();
  auto rows = [&](int64_t r0, int64_t r1, float* partial) {
    for (int64_t i = r0; i < r1; ++i) {
      layernorm_backward_row(sp + i * c, dyp + i * c, w, mp[i], rp[i], c, outp + i * c, partial,
                             partial + c);
      if (dsp) add_row(dsp + i * c, c, outp + i * c);
    }
  };
  chunked_column_sums(n, c, {dweight.data<float>(), dbias.data<float>()}, rows);
}

void CpuBackend::add_rmsnorm_forward(const Tensor& x, const Tensor& r, const Tensor& weight,
                                     float eps, Tensor& s, Tensor& y, Tensor& rstd) {
  if (!all_f32(x, r, weight, s, y)) {
    binary(BinaryOp::Add, x, r, s);
    return rmsnorm_forward(s, weight, eps, y, rstd);
  }
  const int64_t n = x.size(0), c = x.size(1);
  const float* xp = x.data<float>();
  const float* rp = r.data<float>();
  const float* w = weight.data<float>();
  float* sp = s.data<float>();
  float* yp = y.data<float>();
  float* sdp = rstd.data<float>();
#pragma omp parallel for schedule(static) if (n * c >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    float* sr = sp + i * c;
    for (int64_t j = 0; j < c; ++j) sr[j] = xp[i * c + j] + rp[i * c + j];
    rmsnorm_row(sr, w, eps, c, yp + i * c, sdp + i);
  }
}

void CpuBackend::add_rmsnorm_backward(const Tensor& dy, const Tensor& ds, const Tensor& s,
                                      const Tensor& weight, const Tensor& rstd, Tensor& dsum,
                                      Tensor& dweight, bool accumulate) {
  if (accumulate_apart(accumulate, dweight, nullptr, [&](Tensor& w, Tensor&) {
        add_rmsnorm_backward(dy, ds, s, weight, rstd, dsum, w, false);
      }))
    return;
  if (!all_f32(dy, ds, s, weight, dsum, dweight)) {
    if (!ds.defined()) return rmsnorm_backward(dy, s, weight, rstd, dsum, dweight, false);
    offload::CategoryScope scope(offload::Category::Workspace);
    Tensor dx = Tensor::empty(dsum.shape(), dsum.dtype());
    rmsnorm_backward(dy, s, weight, rstd, dx, dweight, false);
    return binary(BinaryOp::Add, ds, dx, dsum);
  }
  const int64_t n = s.size(0), c = s.size(1);
  const float* sp = s.data<float>();
  const float* dyp = dy.data<float>();
  const float* dsp = ds.defined() ? ds.data<float>() : nullptr;
  const float* w = weight.data<float>();
  const float* rp = rstd.data<float>();
  float* outp = dsum.data<float>();
  auto rows = [&](int64_t r0, int64_t r1, float* dw) {
    for (int64_t i = r0; i < r1; ++i) {
      rmsnorm_backward_row(sp + i * c, dyp + i * c, w, rp[i], c, outp + i * c, dw);
      if (dsp) add_row(dsp + i * c, c, outp + i * c);
    }
  };
  chunked_column_sums(n, c, {dweight.data<float>()}, rows);
}

void CpuBackend::softmax_forward(const Tensor& x, Tensor& y) {
  if (!all_f32(x, y)) {  // Note [Widening adapter]
    F32Out o(y);
    softmax_forward(widened(x), o.get());
    return o.commit();
  }
  const int64_t n = x.size(0), c = x.size(1);
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
#pragma omp parallel for schedule(static) if (n * c >= kParallelMin)
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = xp + r * c;
    float* yr = yp + r * c;
    const float mx = max_row(xr, c);
    // A row of -inf (everything masked) has no distribution; give zeros, not NaN.
    if (mx == -std::numeric_limits<float>::infinity()) {
      std::fill(yr, yr + c, 0.0f);
      continue;
    }
    exp_affine(xr, yr, c, 1.0f, mx);
    const float inv = static_cast<float>(1.0 / row_sum(yr, c));
    for (int64_t j = 0; j < c; ++j) yr[j] *= inv;
  }
}

void CpuBackend::softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  if (!all_f32(y, dy, dx)) {  // Note [Widening adapter]
    F32Out o(dx);
    softmax_backward(widened(y), widened(dy), o.get());
    return o.commit();
  }
  const int64_t n = y.size(0), c = y.size(1);
  const float* yp = y.data<float>();
  const float* dyp = dy.data<float>();
  float* dxp = dx.data<float>();
  // dx = y * (dy - <y, dy>): the Jacobian diag(y) - y y^T applied to dy.
#pragma omp parallel for schedule(static) if (n * c >= kParallelMin)
  for (int64_t r = 0; r < n; ++r) {
    const float* yr = yp + r * c;
    const float* dyr = dyp + r * c;
    float* dxr = dxp + r * c;
    const float dot = static_cast<float>(row_dot(yr, dyr, c));
    for (int64_t j = 0; j < c; ++j) dxr[j] = yr[j] * (dyr[j] - dot);
  }
}

}  // namespace strata::tensor::cpu
