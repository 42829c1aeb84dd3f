// CPU fused attention and rotary embedding. The reference is attention written the naive way in
// double (an explicit Tq x Tk softmax); backward is checked against central differences of it on
// small odd shapes, and against its analytic gradient on shapes that cross block boundaries.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "tensor/cpu/attention_tiles.h"
#include "tensor/ops.h"
#include "tests/support/kernel_check.h"

namespace strata::tensor {
namespace {

using strata::testing::all_close;
using strata::testing::dot;
using strata::testing::finite_differences;
using strata::testing::make_tensor;
using strata::testing::random_normal;
using strata::testing::same_bits;
using strata::testing::to_double;
using strata::testing::values;
using strata::testing::with_threads;

struct Config {
  int64_t b, h, tq, tk, d;
  bool causal;
  float scale;
};

std::string name(const Config& c) {
  return fmt::format("B={} H={} Tq={} Tk={} D={} causal={}", c.b, c.h, c.tq, c.tk, c.d, c.causal);
}

bool allowed(const Config& c, int64_t i, int64_t j) {
  return !c.causal || j <= i + c.tk - c.tq;
}

struct Ref {
  std::vector<double> out, lse;
  std::vector<double> dq, dk, dv;  // filled by attention_backward_ref
};

// Probabilities of row (bh, i), or an empty vector when every key is masked.
std::vector<double> probs(const Config& c, const std::vector<double>& q,
                          const std::vector<double>& k, int64_t bh, int64_t i, double* lse) {
  std::vector<double> s(c.tk, -INFINITY);
  double mx = -INFINITY;
  for (int64_t j = 0; j < c.tk; ++j) {
    if (!allowed(c, i, j)) continue;
    double acc = 0;
    for (int64_t e = 0; e < c.d; ++e)
      acc += q[(bh * c.tq + i) * c.d + e] * k[(bh * c.tk + j) * c.d + e];
    s[j] = acc * c.scale;
    mx = std::max(mx, s[j]);
  }
  if (mx == -INFINITY) {
    *lse = -INFINITY;
    return {};
  }
  double sum = 0;
  for (double x : s) sum += std::exp(x - mx);
  *lse = mx + std::log(sum);
  for (double& x : s) x = std::exp(x - *lse);
  return s;
}

Ref attention_ref(const Config& c, const std::vector<double>& q, const std::vector<double>& k,
                  const std::vector<double>& v) {
  Ref r;
  r.out.assign(c.b * c.h * c.tq * c.d, 0.0);
  r.lse.assign(c.b * c.h * c.tq, 0.0);
  for (int64_t bh = 0; bh < c.b * c.h; ++bh)
    for (int64_t i = 0; i < c.tq; ++i) {
      auto p = probs(c, q, k, bh, i, &r.lse[bh * c.tq + i]);
      for (size_t j = 0; j < p.size(); ++j)
        for (int64_t e = 0; e < c.d; ++e)
          r.out[(bh * c.tq + i) * c.d + e] += p[j] * v[(bh * c.tk + j) * c.d + e];
    }
  return r;
}

// The textbook gradient through the explicit softmax: dV = P^T dO, dS = P * (dP - rowsum(P dP)).
void attention_backward_ref(const Config& c, const std::vector<double>& q,
                            const std::vector<double>& k, const std::vector<double>& v,
                            const std::vector<double>& dout, Ref& r) {
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0);
  r.dv.assign(v.size(), 0.0);
  for (int64_t bh = 0; bh < c.b * c.h; ++bh)
    for (int64_t i = 0; i < c.tq; ++i) {
      double lse;
      auto p = probs(c, q, k, bh, i, &lse);
      if (p.empty()) continue;
      std::vector<double> dp(c.tk, 0.0);
      double di = 0;
      for (int64_t j = 0; j < c.tk; ++j) {
        for (int64_t e = 0; e < c.d; ++e)
          dp[j] += dout[(bh * c.tq + i) * c.d + e] * v[(bh * c.tk + j) * c.d + e];
        di += p[j] * dp[j];
      }
      for (int64_t j = 0; j < c.tk; ++j) {
        const double ds = p[j] * (dp[j] - di) * c.scale;
        for (int64_t e = 0; e < c.d; ++e) {
          r.dq[(bh * c.tq + i) * c.d + e] += ds * k[(bh * c.tk + j) * c.d + e];
          r.dk[(bh * c.tk + j) * c.d + e] += ds * q[(bh * c.tq + i) * c.d + e];
          r.dv[(bh * c.tk + j) * c.d + e] += p[j] * dout[(bh * c.tq + i) * c.d + e];
        }
      }
    }
}

struct Inputs {
  std::vector<float> q, k, v, g;
  Tensor qt, kt, vt, gt;
};

Inputs make_inputs(const Config& c, uint64_t seed) {
  Inputs in;
  in.q = random_normal(c.b * c.h * c.tq * c.d, seed, 0.f, 1.5f);
  in.k = random_normal(c.b * c.h * c.tk * c.d, seed + 1, 0.f, 1.5f);
  in.v = random_normal(c.b * c.h * c.tk * c.d, seed + 2);
  in.g = random_normal(c.b * c.h * c.tq * c.d, seed + 3);
  in.qt = make_tensor(in.q, {c.b, c.h, c.tq, c.d});
  in.kt = make_tensor(in.k, {c.b, c.h, c.tk, c.d});
  in.vt = make_tensor(in.v, {c.b, c.h, c.tk, c.d});
  in.gt = make_tensor(in.g, {c.b, c.h, c.tq, c.d});
  return in;
}

// lse: -inf must match exactly (fully masked rows), the rest closely.
void expect_lse(const std::vector<float>& got, const std::vector<double>& want, const Config& c) {
  std::vector<double> w = want;
  std::vector<float> g = got;
  for (size_t i = 0; i < w.size(); ++i)
    if (std::isinf(w[i])) {
      EXPECT_TRUE(std::isinf(g[i]) && g[i] < 0) << name(c) << " row " << i << ": " << g[i];
      w[i] = 0;
      g[i] = 0;
    }
  EXPECT_TRUE(all_close(g, w, 2e-6, 2e-6)) << name(c);
}

// Small odd shapes: equal and unequal lengths, both masks, Tq > Tk (fully masked rows).
const std::vector<Config> kSmall = {
    {2, 3, 7, 7, 4, true, 0.6f},  {2, 3, 7, 7, 4, false, 0.6f}, {2, 3, 5, 9, 4, true, 0.5f},
    {2, 3, 5, 9, 4, false, 0.5f}, {2, 3, 9, 5, 4, true, 0.7f},  {2, 3, 8, 6, 4, false, 0.7f},
    {1, 1, 1, 1, 2, true, 1.0f},
};
// Shapes that cross the 64-row and 64-key blocks, with D not a multiple of the 16-wide tiles.
const std::vector<Config> kLarge = {
    {1, 2, 130, 130, 20, true, 0.25f}, {1, 2, 130, 130, 20, false, 0.25f},
    {1, 2, 70, 150, 64, true, 0.125f}, {2, 1, 150, 70, 16, true, 0.25f},
    {1, 1, 1, 65, 8, true, 0.35f},     {1, 1, 129, 64, 33, false, 0.2f},
};

TEST(Attention, ForwardMatchesReference) {
  uint64_t seed = 100;
  for (const auto* set : {&kSmall, &kLarge})
    for (const Config& c : *set) {
      Inputs in = make_inputs(c, seed += 10);
      AttentionResult r = attention(in.qt, in.kt, in.vt, c.causal, c.scale);
      Ref ref = attention_ref(c, to_double(in.q), to_double(in.k), to_double(in.v));
      EXPECT_TRUE(all_close(values(r.out), ref.out, 2e-6, 1e-5)) << name(c);
      expect_lse(values(r.lse), ref.lse, c);
    }
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  uint64_t seed = 200;
  for (const Config& c : kSmall) {
    Inputs in = make_inputs(c, seed += 10);
    auto q = to_double(in.q), k = to_double(in.k), v = to_double(in.v), g = to_double(in.g);
    AttentionResult f = attention(in.qt, in.kt, in.vt, c.causal, c.scale);
    AttentionGrads grads =
        attention_backward(in.qt, in.kt, in.vt, f.out, f.lse, in.gt, c.causal, c.scale);
    auto fd_q =
        finite_differences([&](const auto& x) { return dot(attention_ref(c, x, k, v).out, g); }, q);
    auto fd_k =
        finite_differences([&](const auto& x) { return dot(attention_ref(c, q, x, v).out, g); }, k);
    auto fd_v =
        finite_differences([&](const auto& x) { return dot(attention_ref(c, q, k, x).out, g); }, v);
    EXPECT_TRUE(all_close(values(grads.dq), fd_q, 1e-5, 1e-5)) << name(c);
    EXPECT_TRUE(all_close(values(grads.dk), fd_k, 1e-5, 1e-5)) << name(c);
    EXPECT_TRUE(all_close(values(grads.dv), fd_v, 1e-5, 1e-5)) << name(c);
    // The analytic reference used on the large shapes must agree with the differences too.
    Ref ref;
    attention_backward_ref(c, q, k, v, g, ref);
    for (auto [got, want] : {std::pair{&ref.dq, &fd_q}, {&ref.dk, &fd_k}, {&ref.dv, &fd_v}})
      for (size_t i = 0; i < got->size(); ++i) EXPECT_NEAR((*got)[i], (*want)[i], 1e-8) << name(c);
  }
}

TEST(Attention, BackwardMatchesReferenceAcrossBlocks) {
  uint64_t seed = 300;
  for (const Config& c : kLarge) {
    Inputs in = make_inputs(c, seed += 10);
    AttentionResult f = attention(in.qt, in.kt, in.vt, c.causal, c.scale);
    AttentionGrads grads =
        attention_backward(in.qt, in.kt, in.vt, f.out, f.lse, in.gt, c.causal, c.scale);
    Ref ref;
    attention_backward_ref(c, to_double(in.q), to_double(in.k), to_double(in.v), to_double(in.g),
                           ref);
    EXPECT_TRUE(all_close(values(grads.dq), ref.dq, 1e-5, 1e-5)) << name(c);
    EXPECT_TRUE(all_close(values(grads.dk), ref.dk, 1e-5, 1e-5)) << name(c);
    EXPECT_TRUE(all_close(values(grads.dv), ref.dv, 1e-5, 1e-5)) << name(c);
  }
}

TEST(Attention, FullyMaskedRowsGiveZerosNotNaN) {
  // Causal with Tq > Tk: query i sees keys j <= i - 4, so rows 0..3 see nothing.
  const Config c{1, 2, 9, 5, 4, true, 0.5f};
  Inputs in = make_inputs(c, 400);
  AttentionResult f = attention(in.qt, in.kt, in.vt, c.causal, c.scale);
  AttentionGrads grads =
      attention_backward(in.qt, in.kt, in.vt, f.out, f.lse, in.gt, c.causal, c.scale);
  auto out = values(f.out), lse = values(f.lse), dq = values(grads.dq);
  for (int64_t h = 0; h < c.h; ++h)
    for (int64_t i = 0; i < c.tq; ++i) {
      const bool empty = i < 4;
      EXPECT_EQ(std::isinf(lse[h * c.tq + i]), empty) << i;
      for (int64_t e = 0; e < c.d; ++e) {
        const size_t at = (h * c.tq + i) * c.d + e;
        if (empty) {
          EXPECT_EQ(out[at], 0.f);
          EXPECT_EQ(dq[at], 0.f);
        }
      }
    }
  for (const Tensor& t : {f.out, grads.dq, grads.dk, grads.dv})
    for (float x : values(t)) ASSERT_TRUE(std::isfinite(x));
}

TEST(Attention, NoKeysGiveZerosNotNaN) {
  for (bool causal : {false, true}) {
    const Config c{1, 2, 3, 0, 4, causal, 0.5f};
    Inputs in = make_inputs(c, 450);
    AttentionResult f = attention(in.qt, in.kt, in.vt, c.causal, c.scale);
    AttentionGrads grads =
        attention_backward(in.qt, in.kt, in.vt, f.out, f.lse, in.gt, c.causal, c.scale);
    for (float x : values(f.out)) EXPECT_EQ(x, 0.f);
    for (float x : values(f.lse)) EXPECT_TRUE(std::isinf(x) && x < 0);
    for (float x : values(grads.dq)) EXPECT_EQ(x, 0.f);
    EXPECT_EQ(grads.dk.numel(), 0);
  }
}

// The backward reads one lse per query row ([B, H, Tq]) and out, dout of q's shape: others are
// refused, not read past their ends.
TEST(Attention, BackwardRefusesLseOrOutputsOfOtherShapes) {
  const Config c{1, 2, 5, 5, 4, true, 0.5f};
  Inputs in = make_inputs(c, 470);
  AttentionResult f = attention(in.qt, in.kt, in.vt, c.causal, c.scale);
  EXPECT_THROW(attention_backward(in.qt, in.kt, in.vt, f.out, f.lse.narrow(2, 0, 4), in.gt,
                                  c.causal, c.scale),
               InternalError);
  EXPECT_THROW(attention_backward(in.qt, in.kt, in.vt, f.out, f.lse, in.gt.narrow(2, 0, 4),
                                  c.causal, c.scale),
               InternalError);
  EXPECT_EQ(
      attention_backward(in.qt, in.kt, in.vt, f.out, f.lse, in.gt, c.causal, c.scale).dq.shape(),
      in.qt.shape());
}

TEST(Attention, DefaultScaleIsInverseSqrtHeadDim) {
  const Config c{1, 2, 6, 6, 9, true, 1.f / 3.f};
  Inputs in = make_inputs(c, 500);
  AttentionResult a = attention(in.qt, in.kt, in.vt, true);
  AttentionResult b = attention(in.qt, in.kt, in.vt, true, 1.f / 3.f);
  EXPECT_TRUE(same_bits(values(a.out), values(b.out)));
}

TEST(Attention, DeterministicAcrossThreadCounts) {
  for (const Config& c :
       {Config{2, 3, 200, 200, 24, true, 0.2f}, Config{1, 3, 100, 190, 32, false, 0.2f}}) {
    Inputs in = make_inputs(c, 600);
    auto run = [&] {
      AttentionResult f = attention(in.qt, in.kt, in.vt, c.causal, c.scale);
      AttentionGrads g =
          attention_backward(in.qt, in.kt, in.vt, f.out, f.lse, in.gt, c.causal, c.scale);
      return std::vector<std::vector<float>>{values(f.out), values(f.lse), values(g.dq),
                                             values(g.dk), values(g.dv)};
    };
    auto one = with_threads(1, run);
    for (int threads : {2, 3, 5}) {
      auto many = with_threads(threads, run);
      for (size_t i = 0; i < one.size(); ++i)
        EXPECT_TRUE(same_bits(one[i], many[i]))
            << name(c) << " output " << i << ", " << threads << " threads";
    }
  }
}

// Every kernel build this CPU can run (not only the one attention picks) against plain loops,
// including leftover rows, which must give the same bits as rows computed in a group.
TEST(AttentionTiles, EveryBuildMatchesPlainLoops) {
  using cpu::AttentionTiles;
  constexpr int64_t kTile = cpu::kAttentionTileWidth;
  for (const AttentionTiles& t : cpu::available_attention_tiles()) {
    for (int64_t m : {1, 2, 3, 5, 8, 64})
      for (int64_t kd : {1, 4, 20, 64}) {
        const int64_t lda = kd + 3;
        auto a = random_normal(m * lda, 800 + m), bt = random_normal(kd * kTile, 900 + kd);
        std::vector<float> c(m * kTile, NAN);
        t.scores(a.data(), lda, m, kd, bt.data(), c.data());
        std::vector<double> want(m * kTile, 0.0);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < kTile; ++j)
            for (int64_t d = 0; d < kd; ++d)
              want[i * kTile + j] += double(a[i * lda + d]) * bt[d * kTile + j];
        EXPECT_TRUE(all_close(c, want, 1e-5, 1e-5)) << t.isa << " scores m=" << m << " kd=" << kd;
        std::vector<float> last(kTile);
        t.scores(a.data() + (m - 1) * lda, lda, 1, kd, bt.data(), last.data());
        EXPECT_TRUE(same_bits(last, std::vector<float>(c.end() - kTile, c.end()))) << t.isa;
      }
    for (int64_t m : {1, 3, 4, 7})
      for (int64_t n : {1, 7, 64})
        for (int64_t w : {16, 48}) {
          const int64_t ldp = n + 1, ldx = w + 5, ldc = w + 2;
          auto p = random_normal(m * ldp, 1000 + n), x = random_normal(n * ldx, 1100 + w),
               c = random_normal(m * ldc, 1200 + m);
          std::vector<double> want = to_double(c);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t e = 0; e < w; ++e)
              for (int64_t j = 0; j < n; ++j)
                want[i * ldc + e] += double(p[i * ldp + j]) * x[j * ldx + e];
          std::vector<float> one(c.begin() + (m - 1) * ldc, c.end()), c_t = c;
          t.accumulate(p.data(), ldp, 1, m, n, x.data(), ldx, w, c.data(), ldc);
          EXPECT_TRUE(all_close(c, want, 1e-5, 1e-5))
              << t.isa << " accumulate m=" << m << " n=" << n;
          // p given transposed (p_t[j][i] = p[i][j]) through swapped strides: the same sums.
          const int64_t ldpt = m + 2;
          std::vector<float> p_t(n * ldpt);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) p_t[j * ldpt + i] = p[i * ldp + j];
          t.accumulate(p_t.data(), 1, ldpt, m, n, x.data(), ldx, w, c_t.data(), ldc);
          EXPECT_TRUE(same_bits(c_t, c)) << t.isa;
          t.accumulate(p.data() + (m - 1) * ldp, ldp, 1, 1, n, x.data(), ldx, w, one.data(), ldc);
          EXPECT_TRUE(same_bits(one, std::vector<float>(c.begin() + (m - 1) * ldc, c.end())))
              << t.isa;
        }
  }
}

// x [B, T, H, D]; rotation of pair (2i, 2i + 1) at position t by the tables' angle.
std::vector<double> rotary_ref(const std::vector<double>& x, const std::vector<double>& cs,
                               const std::vector<double>& sn, int64_t b, int64_t t, int64_t h,
                               int64_t d, double sign) {
  std::vector<double> out(x.size());
  for (int64_t row = 0; row < b * t * h; ++row) {
    const int64_t pos = row / h % t;
    for (int64_t i = 0; i < d / 2; ++i) {
      const double c = cs[pos * d / 2 + i], s = sign * sn[pos * d / 2 + i];
      const double x0 = x[row * d + 2 * i], x1 = x[row * d + 2 * i + 1];
      out[row * d + 2 * i] = x0 * c - x1 * s;
      out[row * d + 2 * i + 1] = x0 * s + x1 * c;
    }
  }
  return out;
}

TEST(Rotary, MatchesReferenceAndInverseIsBackward) {
  const int64_t b = 2, t = 5, h = 3, d = 6;
  auto x = random_normal(b * t * h * d, 700), y = random_normal(b * t * h * d, 701);
  auto c = random_normal(t * d / 2, 702), s = random_normal(t * d / 2, 703);
  Tensor xt = make_tensor(x, {b, t, h, d}), yt = make_tensor(y, {b, t, h, d});
  Tensor ct = make_tensor(c, {t, d / 2}), st = make_tensor(s, {t, d / 2});
  EXPECT_TRUE(all_close(values(rotary(xt, ct, st)),
                        rotary_ref(to_double(x), to_double(c), to_double(s), b, t, h, d, 1), 1e-6,
                        1e-6));
  EXPECT_TRUE(all_close(values(rotary(xt, ct, st, true)),
                        rotary_ref(to_double(x), to_double(c), to_double(s), b, t, h, d, -1), 1e-6,
                        1e-6));
  // With real tables (cos^2 + sin^2 = 1), the inverse undoes the rotation, and it is the
  // adjoint: <rot(x), y> = <x, rot^-1(y)>, which makes it the backward.
  auto [cos, sin] = rotary_tables(t, d);
  Tensor rx = rotary(xt, cos, sin);
  EXPECT_TRUE(all_close(values(rotary(rx, cos, sin, true)), to_double(x), 1e-6, 1e-6));
  const double lhs = dot(to_double(values(rx)), to_double(y));
  const double rhs = dot(to_double(x), to_double(values(rotary(yt, cos, sin, true))));
  EXPECT_NEAR(lhs, rhs, 1e-4);
}

}  // namespace
}  // namespace strata::tensor
