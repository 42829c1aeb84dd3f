// CPU fused attention (flash-attention style, forward and backward) and rotary embedding.
//
// Note [CPU flash attention]
// Forward walks key blocks of kBk keys for each block of kBq query rows, keeping per row the
// running max m, the running denominator l and an unnormalised output o (the online softmax):
// with a new block's scaled scores s, m' = max(m, max s), o = o e^(m - m') + sum_j e^(s_j - m')
// v_j, l = l e^(m - m') + sum_j e^(s_j - m'). At the end out = o / l and lse = m + log l. Only lse
// [B, H, Tq] is kept for backward, never a Tq x Tk matrix.
// Backward (per (b, h), key blocks outer, query blocks inner, as in FlashAttention-2)
// recomputes P = exp(s - lse) block by block and with D_i = <dout_i, out_i>:
//   dV += P^T dO,  dP = dO V^T,  dS = P * (dP - D) * scale,  dQ += dS K,  dK += dS^T Q.
// Masking: the causal mask lets query i see keys j <= i + (Tk - Tq) (bottom-right aligned, so
// decoding a suffix of queries against a longer cache works). Every row's allowed keys are a
// prefix, so masked entries are simply never computed. A row with no allowed key (only
// possible when causal and Tq > Tk) has no distribution: its output and gradients are 0 and its
// lse is -inf (the log of an empty sum); backward never reads that lse.
// Determinism: one thread owns each (b, h, query block) in forward and each (b, h) in backward,
// and walks blocks in a fixed order; no sum is split by thread count, so the bits do not depend
// on it. The block products are the kernels of Note [Attention tile kernels].
// Layout: q, k, v, out, dout, dq, dk, dv are read and written through their strides (Note
// [Strided attention operands] in tensor/backend.h); only the addresses depend on them, never
// the order of any sum, so a strided call gives the bits of the contiguous one.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/cpu_features.h"
#include "offload/memory_stats.h"
#include "tensor/cpu/attention_tiles.h"
#include "tensor/cpu/cpu_backend.h"
#include "tensor/cpu/vec4.h"
#include "tensor/cpu/widen.h"

namespace strata::tensor::cpu {

namespace {

constexpr int64_t kBq = 64;                   // query rows per block
constexpr int64_t kBk = kAttentionTileWidth;  // keys per block: the width of a score tile
constexpr int64_t kW = kAttentionStrip;       // columns a tile kernel keeps in registers
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

// Number of keys query row i may see: a prefix of the keys (Note [CPU flash attention]).
int64_t key_limit(int64_t i, int64_t tq, int64_t tk, bool causal) {
  if (!causal) return tk;
  return std::clamp<int64_t>(i + tk - tq + 1, 0, tk);
}

// See Note [Attention tile kernels] in attention_tiles.h.
#define STRATA_TILE_INLINE inline __attribute__((always_inline))

typedef float F8 __attribute__((vector_size(32)));
typedef int32_t I8 __attribute__((vector_size(32)));

template <typename V>
constexpr int kLanes = static_cast<int>(sizeof(V) / sizeof(float));

// Loads and stores by reference: a 32-byte vector passed by value outside AVX code would change
// the calling convention (these are always inlined, but GCC warns all the same).
template <typename V>
STRATA_TILE_INLINE void vload(V& v, const float* p) {
  std::memcpy(&v, p, sizeof(V));
}
template <typename V>
STRATA_TILE_INLINE void vstore(float* p, const V& v) {
  std::memcpy(p, &v, sizeof(V));
}
// A broadcast as a shuffle with an all-zero mask: GCC turns a plain lane-by-lane fill or a
// V{x, x, ...} initialiser into a chain of inserts inside target("avx2") functions.
template <typename V>
STRATA_TILE_INLINE void vsplat(V& v, float x) {
  using Mask = std::conditional_t<kLanes<V> == 4, I4, I8>;
  V t{};
  t[0] = x;
  v = __builtin_shuffle(t, Mask{});
}

// c[r][jc..jc+kW) = sum_{d < kd} a[r][d] * bt[d][jc..] for r < R and every strip jc < kBk.
template <typename V, int R>
STRATA_TILE_INLINE void scores_rows(const float* a, int64_t lda, int64_t kd, const float* bt,
                                    float* c) {
  constexpr int kU = kW / kLanes<V>;
  for (int64_t jc = 0; jc < kBk; jc += kW) {
    V acc[R][kU] = {};
    for (int64_t d = 0; d < kd; ++d) {
      V b[kU];
#pragma GCC unroll 4
      for (int u = 0; u < kU; ++u) vload(b[u], bt + d * kBk + jc + u * kLanes<V>);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        V x;
        vsplat(x, a[r * lda + d]);
#pragma GCC unroll 4
        for (int u = 0; u < kU; ++u) acc[r][u] += x * b[u];
      }
    }
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < kU; ++u) vstore(c + r * kBk + jc + u * kLanes<V>, acc[r][u]);
  }
}

// c[r][0..w) += sum_{j < n} p[r, j] * x[j][0..w) for r < R, p[r, j] at p[r * prs + j * pcs].
template <typename V, int R>
STRATA_TILE_INLINE void accumulate_rows(const float* p, int64_t prs, int64_t pcs, int64_t n,
                                        const float* x, int64_t ldx, int64_t w, float* c,
                                        int64_t ldc) {
  constexpr int kU = kW / kLanes<V>;
  for (int64_t dc = 0; dc < w; dc += kW) {
    V acc[R][kU];
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < kU; ++u) vload(acc[r][u], c + r * ldc + dc + u * kLanes<V>);
    for (int64_t j = 0; j < n; ++j) {
      V xr[kU];
#pragma GCC unroll 4
      for (int u = 0; u < kU; ++u) vload(xr[u], x + j * ldx + dc + u * kLanes<V>);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        V s;
        vsplat(s, p[r * prs + j * pcs]);
#pragma GCC unroll 4
        for (int u = 0; u < kU; ++u) acc[r][u] += s * xr[u];
      }
    }
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < kU; ++u) vstore(c + r * ldc + dc + u * kLanes<V>, acc[r][u]);
  }
}

// c[i][j] = sum_{d < kd} a[i][d] * bt[d][j] for i < m, j < kBk; bt is [kd][kBk], c is [m][kBk].
template <typename V, int R>
STRATA_TILE_INLINE void scores_tile_impl(const float* a, int64_t lda, int64_t m, int64_t kd,
                                         const float* bt, float* c) {
  int64_t i = 0;
  for (; i + R <= m; i += R) scores_rows<V, R>(a + i * lda, lda, kd, bt, c + i * kBk);
  for (; i < m; ++i) scores_rows<V, 1>(a + i * lda, lda, kd, bt, c + i * kBk);
}

// c[i][0..w) += sum_{j < n} p[i, j] * x[j][0..w) for i < m; w is a multiple of kW.
template <typename V, int R>
STRATA_TILE_INLINE void accumulate_tile_impl(const float* p, int64_t prs, int64_t pcs, int64_t m,
                                             int64_t n, const float* x, int64_t ldx, int64_t w,
                                             float* c, int64_t ldc) {
  int64_t i = 0;
  for (; i + R <= m; i += R)
    accumulate_rows<V, R>(p + i * prs, prs, pcs, n, x, ldx, w, c + i * ldc, ldc);
  for (; i < m; ++i) accumulate_rows<V, 1>(p + i * prs, prs, pcs, n, x, ldx, w, c + i * ldc, ldc);
}

void scores_tile_base(const float* a, int64_t lda, int64_t m, int64_t kd, const float* bt,
                      float* c) {
  scores_tile_impl<F4, 2>(a, lda, m, kd, bt, c);
}
void accumulate_tile_base(const float* p, int64_t prs, int64_t pcs, int64_t m, int64_t n,
                          const float* x, int64_t ldx, int64_t w, float* c, int64_t ldc) {
  accumulate_tile_impl<F4, 2>(p, prs, pcs, m, n, x, ldx, w, c, ldc);
}
#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) void scores_tile_avx2(const float* a, int64_t lda, int64_t m,
                                                          int64_t kd, const float* bt, float* c) {
  scores_tile_impl<F8, 4>(a, lda, m, kd, bt, c);
}
__attribute__((target("avx2,fma"))) void accumulate_tile_avx2(const float* p, int64_t prs,
                                                              int64_t pcs, int64_t m, int64_t n,
                                                              const float* x, int64_t ldx,
                                                              int64_t w, float* c, int64_t ldc) {
  accumulate_tile_impl<F8, 4>(p, prs, pcs, m, n, x, ldx, w, c, ldc);
}
#endif

}  // namespace

std::vector<AttentionTiles> available_attention_tiles() {
  std::vector<AttentionTiles> all = {{"baseline", scores_tile_base, accumulate_tile_base}};
#if defined(__x86_64__)
  if (cpu_features().avx2 && cpu_features().fma)
    all.push_back({"avx2", scores_tile_avx2, accumulate_tile_avx2});
#endif
  return all;
}

const AttentionTiles& attention_tiles() {
  static const AttentionTiles chosen = [] {
    const std::vector<AttentionTiles> all = available_attention_tiles();
    const char* forced = std::getenv("STRATA_ATTENTION_ISA");
    if (forced == nullptr || *forced == 0) return all.back();
    for (const AttentionTiles& t : all)
      if (std::string_view(t.isa) == forced) return t;
    user_error(
        "STRATA_ATTENTION_ISA={} is not a kernel build this binary and CPU can run (CPU "
        "has: {}); use baseline{}, or unset the variable",
        forced, cpu_features().summary(), all.size() > 1 ? " or avx2" : "");
  }();
  return chosen;
}

namespace {

// bt[d][j] = src[j][d] for j < n, and 0 for n <= j < kBk (so score tiles are always kBk wide).
void transpose_block(const float* src, int64_t lds, int64_t n, int64_t dim, float* bt) {
  for (int64_t d = 0; d < dim; ++d) {
    float* row = bt + d * kBk;
    for (int64_t j = 0; j < n; ++j) row[j] = src[j * lds + d];
    std::fill(row + n, row + kBk, 0.0f);
  }
}

// dst rows [n][ldd] = src rows [n][dim] (lds apart), zero-padded from dim to ldd.
void pad_rows(const float* src, int64_t lds, int64_t n, int64_t dim, float* dst, int64_t ldd) {
  for (int64_t r = 0; r < n; ++r) {
    std::memcpy(dst + r * ldd, src + r * lds, static_cast<size_t>(dim) * sizeof(float));
    std::fill(dst + r * ldd + dim, dst + (r + 1) * ldd, 0.0f);
  }
}

// Where the rows of one [B, H, T, D] operand live (its D stride is 1): head bh = b * H + h starts
// base(bh) elements past data(), and its rows are `row` elements apart.
struct Rows {
  explicit Rows(const Tensor& t)
      : heads(t.size(1)), b_stride(t.stride(0)), h_stride(t.stride(1)), row(t.stride(2)) {
    STRATA_CHECK(t.size(3) <= 1 || t.stride(3) == 1, "attention operand {} needs a unit D stride",
                 t.str());
  }
  int64_t base(int64_t bh) const { return bh / heads * b_stride + bh % heads * h_stride; }
  int64_t heads, b_stride, h_stride, row;
};

// Scratch memory, charged to the workspace category.
Tensor workspace(int64_t floats) {
  offload::CategoryScope scope(offload::Category::Workspace);
  return Tensor::empty({floats}, DType::F32);
}

// One scratch region per thread, carved from a single workspace tensor so it is accounted.
class ThreadScratch {
 public:
  explicit ThreadScratch(int64_t floats_per_thread)
      : per_thread_(floats_per_thread), buffer_(workspace(per_thread_ * omp_get_max_threads())) {}
  int64_t per_thread() const { return per_thread_; }
  float* mine() const { return buffer_.data<float>() + per_thread_ * omp_get_thread_num(); }

 private:
  int64_t per_thread_;
  Tensor buffer_;
};

// Bump allocator over one thread's scratch; each piece starts a multiple of 16 floats (64 bytes)
// past the region's start.
class Carve {
 public:
  explicit Carve(const ThreadScratch& s) : next_(s.mine()), end_(next_ + s.per_thread()) {}
  float* take(int64_t n) {
    float* p = next_;
    next_ += round_up(n, 16);
    STRATA_CHECK(next_ <= end_, "attention scratch too small");
    return p;
  }

 private:
  float* next_;
  float* end_;
};

}  // namespace

void CpuBackend::attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                   float scale, Tensor& out, Tensor& lse) {
  if (!all_f32(q, k, v, out, lse)) {  // Note [Widening adapter]
    F32Out o(out), ol(lse);
    attention_forward(widened(q), widened(k), widened(v), causal, scale, o.get(), ol.get());
    o.commit();
    return ol.commit();
  }
  const int64_t bh = q.size(0) * q.size(1), tq = q.size(2), tk = k.size(2), dim = q.size(3);
  const int64_t dp = round_up(dim, kW);  // padded row width of the value/output tiles
  const int64_t q_blocks = (tq + kBq - 1) / kBq;
  const float* qp = q.data<float>();
  const float* kp = k.data<float>();
  const float* vp = v.data<float>();
  float* op = out.data<float>();
  float* lp = lse.data<float>();
  const Rows q_rows(q), k_rows(k), v_src(v), o_rows(out);
  const int64_t k_blocks = (tk + kBk - 1) / kBk;
  const AttentionTiles& kern = attention_tiles();
  // Staged once for all query blocks: K transposed block by block ([dim][kBk] each, zero padded
  // to kBk keys), and V with rows padded to dp when dim is not a multiple of kW.
  const bool pad_v = dp != dim;
  Tensor staged = workspace(bh * k_blocks * dim * kBk + (pad_v ? bh * tk * dp : 0));
  float* kt_all = staged.data<float>();
  float* v_padded = kt_all + bh * k_blocks * dim * kBk;
#pragma omp parallel for schedule(static) if (bh * tk * dim >= (1 << 14))
  for (int64_t t = 0; t < bh * k_blocks; ++t) {
    const int64_t h = t / k_blocks, j0 = (t % k_blocks) * kBk, nk = std::min(kBk, tk - j0);
    transpose_block(kp + k_rows.base(h) + j0 * k_rows.row, k_rows.row, nk, dim,
                    kt_all + t * dim * kBk);
    if (pad_v)
      pad_rows(vp + v_src.base(h) + j0 * v_src.row, v_src.row, nk, dim,
               v_padded + (h * tk + j0) * dp, dp);
  }
  // Head h's value rows, ldv apart: the padded copy, or v itself.
  const int64_t ldv = pad_v ? dp : v_src.row;
  auto v_head = [&](int64_t h) { return pad_v ? v_padded + h * tk * dp : vp + v_src.base(h); };
  ThreadScratch scratch(kBq * kBk + round_up(kBq * dp, 16) + 2 * round_up(kBq, 16));

#pragma omp parallel
  {
    Carve carve(scratch);
    float* s = carve.take(kBq * kBk);  // scores, then unnormalised probabilities
    float* o = carve.take(kBq * dp);   // unnormalised output rows
    float* m = carve.take(kBq);        // running max
    float* l = carve.take(kBq);        // running denominator
    // Later query blocks see more keys under the causal mask: hand out work dynamically.
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < bh * q_blocks; ++task) {
      const int64_t h = task / q_blocks, i0 = (task % q_blocks) * kBq;
      const int64_t nq = std::min(kBq, tq - i0);
      const float* qh = qp + q_rows.base(h) + i0 * q_rows.row;
      std::fill(o, o + nq * dp, 0.0f);
      std::fill(m, m + nq, kNegInf);
      std::fill(l, l + nq, 0.0f);
      const int64_t key_end = key_limit(i0 + nq - 1, tq, tk, causal);  // the last row sees most
      for (int64_t j0 = 0; j0 < key_end; j0 += kBk) {
        const int64_t nk = std::min(kBk, tk - j0);
        kern.scores(qh, q_rows.row, nq, dim, kt_all + (h * k_blocks + j0 / kBk) * dim * kBk, s);
        for (int64_t r = 0; r < nq; ++r) {
          float* sr = s + r * kBk;
          const int64_t nv = std::clamp<int64_t>(key_limit(i0 + r, tq, tk, causal) - j0, 0, nk);
          if (nv == 0) {  // every key of this block is masked for this row
            std::fill(sr, sr + nk, 0.0f);
            continue;
          }
          const float m_new = std::max(m[r], max_row(sr, nv) * scale);
          const float corr = exp1(m[r] - m_new);
          exp_affine(sr, sr, nv, scale, m_new);
          std::fill(sr + nv, sr + nk, 0.0f);
          float sum = 0;
          for (int64_t j = 0; j < nv; ++j) sum += sr[j];
          l[r] = l[r] * corr + sum;
          m[r] = m_new;
          float* orow = o + r * dp;
          for (int64_t d = 0; d < dp; ++d) orow[d] *= corr;
        }
        kern.accumulate(s, kBk, 1, nq, nk, v_head(h) + j0 * ldv, ldv, dp, o, dp);
      }
      for (int64_t r = 0; r < nq; ++r) {
        float* dst = op + o_rows.base(h) + (i0 + r) * o_rows.row;
        const float* orow = o + r * dp;
        if (l[r] > 0.0f) {
          const float inv = 1.0f / l[r];
          for (int64_t d = 0; d < dim; ++d) dst[d] = orow[d] * inv;
          lp[h * tq + i0 + r] = m[r] + std::log(l[r]);
        } else {  // no key allowed: see Note [CPU flash attention]
          std::fill(dst, dst + dim, 0.0f);
          lp[h * tq + i0 + r] = kNegInf;
        }
      }
    }
  }
}

void CpuBackend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& out, const Tensor& lse, const Tensor& dout,
                                    bool causal, float scale, Tensor& dq, Tensor& dk, Tensor& dv) {
  if (!all_f32(q, k, v, out, lse, dout, dq, dk, dv)) {  // Note [Widening adapter]
    F32Out odq(dq), odk(dk), odv(dv);
    attention_backward(widened(q), widened(k), widened(v), widened(out), widened(lse),
                       widened(dout), causal, scale, odq.get(), odk.get(), odv.get());
    odq.commit();
    odk.commit();
    return odv.commit();
  }
  const int64_t bh = q.size(0) * q.size(1), tq = q.size(2), tk = k.size(2), dim = q.size(3);
  const int64_t dp = round_up(dim, kW);
  const float* qp = q.data<float>();
  const float* kp = k.data<float>();
  const float* vp = v.data<float>();
  const float* outp = out.data<float>();
  const float* lp = lse.data<float>();
  const float* dop = dout.data<float>();
  float* dqp = dq.data<float>();
  float* dkp = dk.data<float>();
  float* dvp = dv.data<float>();
  const Rows q_rows(q), k_rows(k), v_rows(v), o_rows(out), do_rows(dout);
  const Rows dq_rows(dq), dk_rows(dk), dv_rows(dv);
  const int64_t per_thread = 3 * round_up(tq * dp, 16) + round_up(tk * dp, 16) +
                             2 * round_up(dim * kBk, 16) + 2 * kBq * kBk +
                             2 * round_up(kBk * dp, 16) + round_up(tq, 16);
  const AttentionTiles& kern = attention_tiles();
  ThreadScratch scratch(per_thread);

#pragma omp parallel
  {
    Carve carve(scratch);
    float* qpad = carve.take(tq * dp);   // Q, dO and the dQ accumulator of this (b, h),
    float* dopad = carve.take(tq * dp);  // rows padded to dp
    float* dqacc = carve.take(tq * dp);
    float* kpad = carve.take(tk * dp);
    float* kt = carve.take(dim * kBk);
    float* vt = carve.take(dim * kBk);
    float* s = carve.take(kBq * kBk);    // scores, then P
    float* dps = carve.take(kBq * kBk);  // dP, then dS
    float* dkacc = carve.take(kBk * dp);
    float* dvacc = carve.take(kBk * dp);
    float* drow = carve.take(tq);  // D_i = <dO_i, O_i>
#pragma omp for schedule(dynamic, 1)
    for (int64_t h = 0; h < bh; ++h) {
      const float* qh = qp + q_rows.base(h);
      const float* kh = kp + k_rows.base(h);
      const float* vh = vp + v_rows.base(h);
      const float* oh = outp + o_rows.base(h);
      const float* doh = dop + do_rows.base(h);
      const float* lh = lp + h * tq;
      pad_rows(qh, q_rows.row, tq, dim, qpad, dp);
      pad_rows(doh, do_rows.row, tq, dim, dopad, dp);
      pad_rows(kh, k_rows.row, tk, dim, kpad, dp);
      std::fill(dqacc, dqacc + tq * dp, 0.0f);
      for (int64_t i = 0; i < tq; ++i) {
        double acc = 0;
        for (int64_t d = 0; d < dim; ++d)
          acc += static_cast<double>(doh[i * do_rows.row + d]) * oh[i * o_rows.row + d];
        drow[i] = static_cast<float>(acc);
      }
      for (int64_t j0 = 0; j0 < tk; j0 += kBk) {
        const int64_t nk = std::min(kBk, tk - j0);
        transpose_block(kh + j0 * k_rows.row, k_rows.row, nk, dim, kt);
        transpose_block(vh + j0 * v_rows.row, v_rows.row, nk, dim, vt);
        std::fill(dkacc, dkacc + kBk * dp, 0.0f);
        std::fill(dvacc, dvacc + kBk * dp, 0.0f);
        // The first query row that sees key j0 under the causal mask.
        const int64_t i_first = causal ? std::max<int64_t>(0, j0 - (tk - tq)) : 0;
        for (int64_t i0 = i_first / kBq * kBq; i0 < tq; i0 += kBq) {
          const int64_t nq = std::min(kBq, tq - i0);
          kern.scores(qpad + i0 * dp, dp, nq, dim, kt, s);
          kern.scores(dopad + i0 * dp, dp, nq, dim, vt, dps);
          for (int64_t r = 0; r < nq; ++r) {
            float* sr = s + r * kBk;
            float* dr = dps + r * kBk;
            const int64_t i = i0 + r;
            const int64_t nv = std::clamp<int64_t>(key_limit(i, tq, tk, causal) - j0, 0, nk);
            exp_affine(sr, sr, nv, scale, lh[i]);
            const float di = drow[i];
            for (int64_t j = 0; j < nv; ++j) dr[j] = sr[j] * (dr[j] - di) * scale;
            std::fill(sr + nv, sr + kBk, 0.0f);
            std::fill(dr + nv, dr + kBk, 0.0f);
          }
          // P^T and dS^T are read in place, by swapping the strides.
          kern.accumulate(s, 1, kBk, nk, nq, dopad + i0 * dp, dp, dp, dvacc, dp);
          kern.accumulate(dps, 1, kBk, nk, nq, qpad + i0 * dp, dp, dp, dkacc, dp);
          kern.accumulate(dps, kBk, 1, nq, nk, kpad + j0 * dp, dp, dp, dqacc + i0 * dp, dp);
        }
        for (int64_t j = 0; j < nk; ++j) {
          std::memcpy(dkp + dk_rows.base(h) + (j0 + j) * dk_rows.row, dkacc + j * dp,
                      static_cast<size_t>(dim) * sizeof(float));
          std::memcpy(dvp + dv_rows.base(h) + (j0 + j) * dv_rows.row, dvacc + j * dp,
                      static_cast<size_t>(dim) * sizeof(float));
        }
      }
      for (int64_t i = 0; i < tq; ++i)
        std::memcpy(dqp + dq_rows.base(h) + i * dq_rows.row, dqacc + i * dp,
                    static_cast<size_t>(dim) * sizeof(float));
    }
  }
}

void CpuBackend::rotary(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse,
                        Tensor& out) {
  if (!all_f32(x, cos, sin, out)) {  // Note [Widening adapter]; tables may be F32 or x's dtype
    F32Out o(out);
    rotary(widened(x), widened(cos), widened(sin), inverse, o.get());
    return o.commit();
  }
  const int64_t b = x.size(0), t = x.size(1), h = x.size(2), dim = x.size(3), half = dim / 2;
  const float* xp = x.data<float>();
  const float* cp = cos.data<float>();
  const float* sp = sin.data<float>();
  float* op = out.data<float>();
  // Rotating by -theta is the inverse (and the transpose) of rotating by theta: the backward.
  const float sign = inverse ? -1.0f : 1.0f;
#pragma omp parallel for schedule(static) if (b * t * h * dim >= (1 << 14))
  for (int64_t row = 0; row < b * t * h; ++row) {
    const int64_t pos = (row / h) % t;
    const float* xr = xp + row * dim;
    float* orow = op + row * dim;
    const float* c = cp + pos * half;
    const float* s = sp + pos * half;
    for (int64_t i = 0; i < half; ++i) {
      const float x0 = xr[2 * i], x1 = xr[2 * i + 1], si = sign * s[i];
      orow[2 * i] = x0 * c[i] - x1 * si;
      orow[2 * i + 1] = x0 * si + x1 * c[i];
    }
  }
}

}  // namespace strata::tensor::cpu
