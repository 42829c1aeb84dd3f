// Every op family on shapes drawn at random (fixed seeds): the CUDA backend against the CPU
// backend, forward and backward, in f32, bf16 and f16. cuda_ops_test.cpp checks each kernel on
// hand-picked shapes; these draws reach the sizes nobody picked: row lengths that are not a
// multiple of a 128-bit pack or a warp, one-element dims, tails of every tile and block, causal
// attention with more queries than keys, vocabularies narrowed to any number of classes, and
// transposed or narrowed views as operands. 8 draws per family by default (about 15 s on the
// emulator); STRATA_RANDOM_SHAPES_DRAWS=N draws N (250 per family passed, in 5.5 minutes on the
// emulator). Skips itself without a GPU (CTest label `cuda`).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tensor/cuda.h"
#include "tensor/ops.h"

namespace strata::tensor {
namespace {

const Device kGpu = Device::cuda(0);
const Device kCpu = Device::cpu();

// Strata's own attention kernels, held to one rounding of tolerance (cuDNN's, which round
// intermediates to the compute dtype, have their own test).
struct OwnAttentionKernel {
  OwnAttentionKernel() { ::setenv("STRATA_ATTENTION", "own", 1); }
  ~OwnAttentionKernel() { ::unsetenv("STRATA_ATTENTION"); }
};

class Draw {
 public:
  explicit Draw(uint64_t seed) : rng_(seed), stream_(seed * 1000) {}
  int64_t size(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  bool coin() { return size(0, 1) == 1; }
  template <typename T>
  T pick(const std::vector<T>& xs) {
    return xs[static_cast<size_t>(size(0, static_cast<int64_t>(xs.size()) - 1))];
  }
  // F32 values on the host; each case converts them to its dtype and device.
  Tensor values(const Shape& s, float lo = -2.f, float hi = 2.f) {
    return uniform(s, {99, stream_++}, lo, hi);
  }
  // Integer ids in [0, n), or ignore (-100) where `ignore` says, as I64 on the host.
  Tensor ids(int64_t count, int64_t n, bool ignore = false) {
    std::vector<float> v(static_cast<size_t>(count));
    for (float& x : v) x = ignore && size(0, 7) == 0 ? -100.f : static_cast<float>(size(0, n - 1));
    return from_vector(v, {count}).to(DType::I64);
  }

 private:
  std::mt19937_64 rng_;
  uint64_t stream_;
};

// A view of `t` with the same shape but another layout, half the time: the transpose of a
// contiguous transposed copy (strided), or a narrow of a wider buffer (an offset). The ops take
// any layout; both backends make what they need of it.
Tensor some_layout(Draw& r, const Tensor& t) {
  if (t.ndim() < 2 || !r.coin()) return t;
  if (r.coin()) return t.transpose(0, 1).contiguous().transpose(0, 1);
  Shape wide = t.shape();
  const int64_t extra = r.size(1, 3);
  wide[0] += extra;
  Tensor buf = zeros(wide, t.dtype(), t.device());
  Tensor view = buf.narrow(0, extra, t.size(0));
  view.copy_(t);
  return view;
}

struct Case {
  std::string name;
  // The outputs for inputs converted to `dt` on `d`.
  std::function<std::vector<Tensor>(DType dt, Device d)> run;
  double f32_rtol = 1e-4, f32_atol = 1e-5;
  // Outputs that are a sum of two rounded terms (index, the other term's values): their error
  // is relative to the terms' magnitudes, not the sum's, which may cancel.
  std::vector<std::pair<size_t, Tensor>> terms = {};
  // In bf16/f16, the tensor-core attention kernel rounds P and dS to the compute dtype as
  // FlashAttention does (Note [CUDA tensor-core attention]): its outputs are held to the
  // tolerance of attention_strided_cuda_test.cpp, relative to the largest |reference| value.
  // dq and dk (outputs 2 and 3) cancel to zero when every query sees one key (the softmax is 1,
  // so dS = dP - D_i = 0): their reference is then rounding noise, and the scale is at least
  // dv's, which carries the same dO and P and no cancellation.
  bool rounds_intermediates = false;
};

Tensor on(const Tensor& t, DType dt, Device d) {
  return t.to(dt).to(d);
}

Case draw_case(Draw& r, int family) {
  switch (family) {
    case 0: {  // broadcasting binary ops, unary ops and their backward, bias_add
      const Shape s{r.size(1, 9), r.size(1, 70), r.size(1, 70)};
      Shape sb = s;
      for (int i = 0; i < 3; ++i)
        if (r.coin()) sb[i] = 1;
      const Tensor a = r.values(s), b = r.values(sb), pos = r.values(s, 0.1f, 3.f);
      const Tensor bias = r.values({s[2]});
      const UnaryOp op =
          r.pick<UnaryOp>({UnaryOp::Gelu, UnaryOp::Silu, UnaryOp::Relu, UnaryOp::Exp, UnaryOp::Log,
                           UnaryOp::Neg, UnaryOp::Sqrt, UnaryOp::Square, UnaryOp::Tanh});
      return {"elementwise " + s.str() + " with " + sb.str(), [=](DType dt, Device d) {
                const Tensor x = on(a, dt, d), y = on(b, dt, d), p = on(pos, dt, d);
                return std::vector<Tensor>{add(x, y),
                                           mul(y, x),
                                           div(x, p),
                                           unary(op, p),
                                           unary_backward(op, p, x),
                                           bias_add(x, on(bias, dt, d)),
                                           add(x.transpose(1, 2), x.transpose(1, 2))};
              }};
    }
    case 1: {  // reductions over any dim, sum_to, max
      const Shape s{r.size(1, 40), r.size(1, 300), r.size(1, 40)};
      const Tensor a = r.values(s);
      const int dim = static_cast<int>(r.size(0, 2));
      return {"reductions " + s.str() + " dim " + std::to_string(dim),
              [=](DType dt, Device d) {
                const Tensor x = on(a, dt, d);
                MaxResult m = max(x, dim);
                return std::vector<Tensor>{sum(x, dim),       mean(x, dim, true),
                                           sum_to(x, {s[2]}), sum_to(x, {s[0], 1, s[2]}),
                                           m.values,          m.indices.to(DType::F32)};
              },
              1e-4, 1e-4};
    }
    case 2: {  // matmul, batched or not, either operand transposed, beta reading out
      const int64_t m = r.size(1, 150), n = r.size(1, 150), k = r.size(1, 150);
      const int64_t batch = r.size(1, 3);
      const bool ta = r.coin(), tb = r.coin(), batched_b = r.coin();
      const Tensor a = r.values(ta ? Shape{batch, k, m} : Shape{batch, m, k});
      const Shape bs = tb ? Shape{n, k} : Shape{k, n};
      const Tensor b = batched_b ? r.values({batch, bs[0], bs[1]}) : r.values(bs);
      const Tensor o = r.values({batch, m, n});
      return {"matmul m=" + std::to_string(m) + " n=" + std::to_string(n) +
                  " k=" + std::to_string(k) + (ta ? " a^T" : "") + (tb ? " b^T" : ""),
              [=](DType dt, Device d) {
                Tensor out = on(o, dt, d).clone();  // written in place: not an alias of o
                matmul_out(on(a, dt, d), on(b, dt, d), out, ta, tb, 0.5f, 1.5f);
                return std::vector<Tensor>{matmul(on(a, dt, d), on(b, dt, d), ta, tb), out};
              },
              1e-4, 1e-4};
    }
    case 3: {  // linear with its epilogues, and its backward pieces
      const int64_t rows = r.size(1, 200), kin = r.size(1, 150), nout = r.size(1, 150);
      const bool gelu = r.coin(), with_bias = r.coin();
      const Tensor x = r.values({rows, kin}), w = r.values({nout, kin}), b = r.values({nout});
      const Tensor dz = r.values({rows, nout}), dw0 = r.values({nout, kin});
      return {"linear rows=" + std::to_string(rows) + " k=" + std::to_string(kin) +
                  " n=" + std::to_string(nout) + (gelu ? " gelu" : "") + (with_bias ? " bias" : ""),
              [=](DType dt, Device d) {
                const Tensor xd = on(x, dt, d), wd = on(w, dt, d);
                LinearResult y = linear(xd, wd, with_bias ? on(b, dt, d) : Tensor(),
                                        gelu ? Activation::Gelu : Activation::None, gelu);
                std::vector<Tensor> out{y.y};
                // The backward pieces on the CPU's pre, so each kernel sees the same input.
                const Tensor pre =
                    gelu ? linear(on(x, dt, kCpu), on(w, dt, kCpu),
                                  with_bias ? on(b, dt, kCpu) : Tensor(), Activation::Gelu, true)
                               .pre.to(d)
                         : Tensor();
                if (gelu) out.push_back(y.pre);
                LinearWeightGrads wg = linear_backward_weight(on(dz, dt, d), xd, true);
                Tensor into = on(dw0, dt, d).clone();
                Tensor db = linear_backward_weight_into(on(dz, dt, d), xd, into, with_bias);
                out.insert(out.end(), {wg.dweight, wg.dbias, into});
                if (with_bias) out.push_back(db);
                if (gelu) {
                  // dz here is the gradient of y [rows, nout]; linear_backward_gelu takes the
                  // gradient of the next layer's output through a weight [P, nout].
                  const Tensor w2 = on(w, dt, d).transpose(0, 1).contiguous();  // [kin, nout]
                  LinearGeluGrads gg = linear_backward_gelu(xd, w2, pre, true);
                  out.insert(out.end(), {gg.dpre, gg.dbias});
                }
                return out;
              },
              1e-4, 1e-4};
    }
    case 4: {  // the four norms, forward and backward (output 12: ds + round(dx))
      const int64_t rows = r.size(1, 300), c = r.size(1, 700);
      const Tensor x = r.values({rows, c}), res = r.values({rows, c}), w = r.values({c}),
                   b = r.values({c}), dy = r.values({rows, c}), ds = r.values({rows, c});
      return {"norms rows=" + std::to_string(rows) + " c=" + std::to_string(c),
              [=, &r](DType dt, Device d) {
                const Tensor xd = some_layout(r, on(x, dt, d)), wd = on(w, dt, d),
                             bd = on(b, dt, d), dyd = on(dy, dt, d);
                NormResult ln = layernorm(xd, wd, bd, 1e-5f);
                NormResult lc = layernorm(on(x, dt, kCpu), on(w, dt, kCpu), on(b, dt, kCpu), 1e-5f);
                LayerNormGrads lg = layernorm_backward(dyd, xd, wd, lc.mean.to(d), lc.rstd.to(d));
                NormResult rn = rmsnorm(xd, wd, 1e-6f);
                NormResult rc = rmsnorm(on(x, dt, kCpu), on(w, dt, kCpu), 1e-6f);
                RmsNormGrads rg = rmsnorm_backward(dyd, xd, wd, rc.rstd.to(d));
                AddNormResult al = add_layernorm(xd, on(res, dt, d), wd, bd, 1e-5f);
                AddNormResult ac = add_layernorm(on(x, dt, kCpu), on(res, dt, kCpu),
                                                 on(w, dt, kCpu), on(b, dt, kCpu), 1e-5f);
                LayerNormGrads alg = add_layernorm_backward(dyd, on(ds, dt, d), ac.s.to(d), wd,
                                                            ac.mean.to(d), ac.rstd.to(d));
                AddNormResult ar = add_rmsnorm(xd, on(res, dt, d), wd, 1e-6f);
                AddNormResult arc =
                    add_rmsnorm(on(x, dt, kCpu), on(res, dt, kCpu), on(w, dt, kCpu), 1e-6f);
                RmsNormGrads arg =
                    add_rmsnorm_backward(dyd, Tensor(), arc.s.to(d), wd, arc.rstd.to(d));
                return std::vector<Tensor>{ln.y,     ln.mean, ln.rstd, lg.dx,       lg.dweight,
                                           lg.dbias, rn.y,    rn.rstd, rg.dx,       rg.dweight,
                                           al.s,     al.y,    alg.dx,  alg.dweight, alg.dbias,
                                           ar.y,     ar.rstd, arg.dx,  arg.dweight};
              },
              1e-4,
              1e-4,
              {{12, ds}}};
    }
    case 5: {  // softmax, forward and backward
      const int64_t rows = r.size(1, 200), c = r.size(1, 1500);
      const Tensor x = r.values({rows, c}, -8.f, 8.f), dy = r.values({rows, c});
      return {"softmax rows=" + std::to_string(rows) + " c=" + std::to_string(c),
              [=, &r](DType dt, Device d) {
                const Tensor y = softmax(on(x, dt, kCpu));
                return std::vector<Tensor>{softmax(some_layout(r, on(x, dt, d))),
                                           softmax_backward(y.to(d), on(dy, dt, d))};
              }};
    }
    case 6: {  // attention, forward and backward, with the tensor-core head dims and others
      const int64_t b = r.size(1, 2), h = r.size(1, 3), tq = r.size(1, 80);
      const bool causal = r.coin();
      const int64_t tk = r.coin() ? tq : r.size(1, 80);
      const int64_t dh = r.pick<int64_t>({8, 16, 24, 32, 40, 64, 80, 96, 128});
      const Tensor q = r.values({b, h, tq, dh}), k = r.values({b, h, tk, dh}),
                   v = r.values({b, h, tk, dh}), dout = r.values({b, h, tq, dh});
      return {"attention B=" + std::to_string(b) + " H=" + std::to_string(h) +
                  " Tq=" + std::to_string(tq) + " Tk=" + std::to_string(tk) +
                  " D=" + std::to_string(dh) + (causal ? " causal" : ""),
              [=](DType dt, Device d) {
                AttentionResult a = attention(on(q, dt, d), on(k, dt, d), on(v, dt, d), causal);
                AttentionResult ac =
                    attention(on(q, dt, kCpu), on(k, dt, kCpu), on(v, dt, kCpu), causal);
                AttentionGrads g =
                    attention_backward(on(q, dt, d), on(k, dt, d), on(v, dt, d), ac.out.to(d),
                                       ac.lse.to(d), on(dout, dt, d), causal);
                return std::vector<Tensor>{a.out, a.lse, g.dq, g.dk, g.dv};
              },
              1e-4,
              1e-4,
              {},
              dh == 64 || dh == 128};
    }
    case 7: {  // rotary, embedding forward and backward
      const int64_t b = r.size(1, 3), t = r.size(1, 40), h = r.size(1, 4), dh = 2 * r.size(1, 40);
      const int64_t vocab = r.size(1, 200), c = r.size(1, 100), n = r.size(0, 300);
      const Tensor x = r.values({b, t, h, dh}), table = r.values({vocab, c}), ids = r.ids(n, vocab),
                   dout = r.values({n, c}), dw0 = r.values({vocab, c});
      const bool inverse = r.coin();
      return {"rotary " + Shape{b, t, h, dh}.str() + ", embedding V=" + std::to_string(vocab) +
                  " C=" + std::to_string(c) + " ids=" + std::to_string(n),
              [=](DType dt, Device d) {
                auto [cs, sn] = rotary_tables(t, dh, 10000.0, 3, d);
                Tensor dw = on(dw0, dt, d).clone();
                embedding_backward(ids.to(d), on(dout, dt, d), dw);
                return std::vector<Tensor>{rotary(on(x, dt, d), cs, sn, inverse),
                                           embedding(on(table, dt, d), ids.to(d)), dw};
              }};
    }
    default: {  // cross-entropy over a narrowed vocabulary, separate and fused
      const int64_t rows = r.size(1, 100), vocab = r.size(1, 3000);
      const int64_t classes = r.coin() ? vocab : r.size(1, vocab);
      const Tensor x = r.values({rows, vocab}, -6.f, 6.f), t = r.ids(rows, classes, true),
                   dloss = r.values({rows});
      return {
          "cross_entropy rows=" + std::to_string(rows) + " V=" + std::to_string(vocab) +
              " classes=" + std::to_string(classes),
          [=](DType dt, Device d) {
            CrossEntropyResult ce = cross_entropy(on(x, dt, d), t.to(d), -100, classes);
            CrossEntropyResult cc = cross_entropy(on(x, dt, kCpu), t, -100, classes);
            Tensor fused = on(x, dt, d).clone();
            CrossEntropyResult fr = cross_entropy_fused_(fused, t.to(d), 0.75f, -100, classes);
            return std::vector<Tensor>{
                ce.losses,
                ce.lse,
                ce.norm,
                cross_entropy_backward(on(x, dt, d), t.to(d), cc.lse.to(d), dloss.to(d), -100, classes),
                fused,
                fr.losses};
          }};
    }
  }
}

constexpr int kFamilies = 9;

// One rounding of the output dtype (both backends round the f32 result once) plus the f32 noise
// of another summation order near 0, as in cuda_ops_test.cpp.
double max_abs(const Tensor& t) {
  double m = 0;
  for (float x : to_float_vector(t)) m = std::max(m, std::abs(static_cast<double>(x)));
  return m;
}

void expect_close(const Tensor& got, const Tensor& want, DType dt, const Case& c, size_t index,
                  double scale_floor) {
  ASSERT_EQ(got.shape(), want.shape());
  ASSERT_EQ(got.dtype(), want.dtype());
  EXPECT_EQ(got.device(), kGpu);
  const std::vector<float> g = to_float_vector(got.to(kCpu)), w = to_float_vector(want);
  std::vector<float> term(w.size(), 0.f);
  for (const auto& [i, t] : c.terms)
    if (i == index) term = to_float_vector(t);
  double rtol = c.f32_rtol, atol = c.f32_atol;
  if (dt == DType::BF16) rtol = 1.0 / 128, atol = 1e-3;
  if (dt == DType::F16) rtol = 1.0 / 1024, atol = 1e-4;
  if (dt != DType::F32 && c.rounds_intermediates) {
    const double scale = std::max(max_abs(want), scale_floor);
    rtol = 0, atol = (index == 1 ? 1e-3 : dt == DType::BF16 ? 2e-2 : 1e-2) * scale;
  }
  // The element furthest past its tolerance, named.
  size_t worst = 0;
  double excess = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (g[i] == w[i]) continue;  // equal infinities too
    const double diff = std::abs(static_cast<double>(g[i]) - w[i]);
    const double bound = atol + rtol * (std::abs(w[i]) + std::abs(term[i]));
    const double over = std::isnan(diff) ? 1e300 : diff - bound;
    if (over > excess) excess = over, worst = i;
  }
  EXPECT_EQ(excess, 0.0) << "element " << worst << ": got " << g[worst] << ", want " << w[worst]
                         << " (rtol " << rtol << ", atol " << atol << ")";
}

TEST(CudaRandomShapes, EveryOpFamilyAgreesWithTheCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible";
  OwnAttentionKernel own;
  const int draws = std::getenv("STRATA_RANDOM_SHAPES_DRAWS")
                        ? std::atoi(std::getenv("STRATA_RANDOM_SHAPES_DRAWS"))
                        : 8;
  for (int family = 0; family < kFamilies; ++family)
    for (int i = 0; i < draws; ++i) {
      Draw r(static_cast<uint64_t>(family * 1000 + i + 1));
      const Case c = draw_case(r, family);
      for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
        SCOPED_TRACE(c.name + " " + std::string(dtype_name(dt)) + " (family " +
                     std::to_string(family) + ", draw " + std::to_string(i) + ")");
        const std::vector<Tensor> want = c.run(dt, kCpu), got = c.run(dt, kGpu);
        ASSERT_EQ(got.size(), want.size());
        for (size_t o = 0; o < want.size(); ++o) {
          SCOPED_TRACE("output " + std::to_string(o));
          const double floor = c.rounds_intermediates && (o == 2 || o == 3) ? max_abs(want[4]) : 0;
          expect_close(got[o], want[o], dt, c, o, floor);
        }
      }
    }
}

}  // namespace
}  // namespace strata::tensor
