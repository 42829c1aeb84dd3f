// The fused differentiable functions: gradients against finite differences, and the same bits as
// the compositions they replace where Note [Fused residual norm] and Note [Linear epilogues]
// promise them (every dtype for add + norm; f32 for linear and mlp_gelu), also under activation
// checkpointing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <string>

#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "autograd/functions.h"
#include "offload/memory_stats.h"
#include "tensor/ops.h"
#include "tests/support/gradcheck.h"

namespace strata::autograd {
namespace {

namespace tops = ::strata::tensor;
using testing::gradcheck;

bool same_bits(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  if (!(a.shape() == b.shape()) || a.dtype() != b.dtype()) return false;
  Tensor ac = a.contiguous(), bc = b.contiguous();
  return std::memcmp(ac.data_ptr(), bc.data_ptr(), ac.nbytes()) == 0;
}

Variable input(const Shape& s, uint64_t seed, DType dt = DType::F32, float lo = -1.f,
               float hi = 1.f) {
  return Variable(tops::uniform(s, {seed, 5}, lo, hi).to(dt), true);
}

// Note [Logits gradient in place]: the cross-entropy backward writes the logits' gradient over
// the logits when the node's saved copy is their only holder, with the bits of the out-of-place
// gradient; logits the caller kept (the Variable, or a view of its data) stay untouched and get
// a fresh gradient buffer. "Probe" hands the logits over as a fresh tensor and records where
// the gradient it receives lives.
TEST(LogitsGradientInPlace, OnlyWhenNothingElseHoldsTheLogits) {
  const int64_t n = 6, ld = 37, classes = 33;
  const Tensor targets = tops::from_ints({3, -100, 0, 32, 7, 7}, {n});
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    const void* seen = nullptr;
    auto probe = [&seen](const Variable& x) {
      return make_output("Probe", x.data().clone(), {x}, [&seen](const std::vector<Tensor>& g) {
        seen = g[0].data_ptr();
        return std::vector<Tensor>{g[0].clone()};
      });
    };
    enum class Keep { Nothing, Variable, View };
    auto run = [&](Keep keep) {
      Variable w = input({n, ld}, 11, dt, -4.f, 4.f);
      Variable logits = probe(w);
      const void* at = logits.data().data_ptr();
      const Tensor before = logits.data().clone();
      Tensor view = keep == Keep::View ? logits.data().narrow(0, 1, 2) : Tensor();
      Variable loss = cross_entropy(logits, targets, -100, classes);
      if (keep != Keep::Variable) logits = Variable();
      seen = nullptr;
      loss.backward();
      EXPECT_EQ(seen == at, keep == Keep::Nothing);
      if (keep == Keep::Variable) {
        EXPECT_TRUE(same_bits(logits.data(), before));
      }
      if (keep == Keep::View) {
        EXPECT_TRUE(same_bits(view, before.narrow(0, 1, 2)));
      }
      return w.grad();
    };
    const Tensor in_place = run(Keep::Nothing);
    EXPECT_TRUE(same_bits(in_place, run(Keep::Variable)));
    EXPECT_TRUE(same_bits(in_place, run(Keep::View)));
    // The padding columns get 0 and the ignored row is all 0, as out of place.
    const Tensor f = in_place.to(DType::F32);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < ld; ++c) {
        if (r == 1 || c >= classes) {
          ASSERT_EQ(f.data<float>()[r * ld + c], 0.f) << r << ", " << c;
        }
      }
  }
}

// Note [Fused cross-entropy gradient]: under a LossGradientScope that names the gradient the loss
// receives, cross_entropy_consuming writes the logits' gradient in its forward (the logits' bytes
// change before the backward) and the leaf gradient has the bits of cross_entropy, in every
// dtype, for a plain loss, one scaled as Trainer scales it (1 / accumulation steps, then an fp16
// loss scale) and a power-of-two mismatch. A mismatch by another ratio is rescaled: within one
// rounding of the logits' dtype. Without a scope, under NoGradGuard, or when the caller keeps a
// handle on the logits, nothing is fused and kept logits are untouched.
struct FusedCeRun {
  Tensor grad;         // the leaf's
  Tensor loss;         // the loss's value
  bool fused = false;  // the logits' bytes changed in the forward
};

// What the caller keeps of its logits while the loss consumes them.
enum class Keep { Nothing, Variable, View };

FusedCeRun fused_ce_run(DType dt, std::optional<float> scope, float weight, float loss_scale,
                        Keep keep = Keep::Nothing) {
  const int64_t n = 6, ld = 37, classes = 33;
  const Tensor targets = tops::from_ints({3, -100, 0, 32, 7, 7}, {n});
  Variable w = input({n, ld}, 12, dt, -4.f, 4.f);
  Variable logits = make_output("Probe", w.data().clone(), {w}, [](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{g[0].clone()};
  });
  const Tensor before = logits.data().clone();
  const auto* at = static_cast<const unsigned char*>(logits.data().data_ptr());
  Variable kept = keep == Keep::Variable ? logits : Variable();
  const Tensor view = keep == Keep::View ? logits.data().narrow(0, 1, 2) : Tensor();
  std::optional<LossGradientScope> hint;
  if (scope) hint.emplace(*scope);
  Variable loss = cross_entropy_consuming(std::move(logits), targets, -100, classes);
  hint.reset();
  FusedCeRun r;
  r.fused = std::memcmp(at, before.data_ptr(), before.nbytes()) != 0;
  r.loss = loss.data().clone();
  Variable root = weight == 1.f ? loss : scale(loss, weight);
  (loss_scale == 1.f ? root : scale(root, loss_scale)).backward();
  if (keep == Keep::Variable) {
    EXPECT_TRUE(same_bits(kept.data(), before));
  }
  if (keep == Keep::View) {
    EXPECT_TRUE(same_bits(view, before.narrow(0, 1, 2)));
  }
  r.grad = w.grad();
  return r;
}

TEST(FusedCrossEntropyGradient, TheForwardWritesTheGradientWithTheUnfusedBits) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    // A plain loss; Trainer's 1 / A then a loss scale (the product the backward makes).
    for (auto [weight, loss_scale] : {std::pair{1.f, 1.f}, std::pair{1.f / 3.f, 1024.f}}) {
      const FusedCeRun want = fused_ce_run(dt, std::nullopt, weight, loss_scale);
      const FusedCeRun got = fused_ce_run(dt, loss_scale * weight, weight, loss_scale);
      EXPECT_FALSE(want.fused);
      EXPECT_TRUE(got.fused);
      EXPECT_TRUE(same_bits(got.loss, want.loss));
      EXPECT_TRUE(same_bits(got.grad, want.grad));
    }
    // The scope said 1, the loss got 0.5: rescaled by a power of two, which is exact (but for
    // f16's subnormals, below 2^-14, which halving rounds).
    const FusedCeRun half = fused_ce_run(dt, 1.f, 0.5f, 1.f);
    EXPECT_TRUE(half.fused);
    if (dt != DType::F16) {
      EXPECT_TRUE(same_bits(half.grad, fused_ce_run(dt, std::nullopt, 0.5f, 1.f).grad));
    }
    // 0.3: the fused value is rounded four times (1 / m, times p, the ratio 0.3 / 1, the rescaled
    // product: the last in the dtype), the unfused one twice (0.3 / m, times p), so they differ
    // by at most about 6 units of roundoff of the dtype (u: 2^-24 f32, 2^-9 bf16, 2^-12 f16).
    const FusedCeRun odd = fused_ce_run(dt, 1.f, 0.3f, 1.f);
    const Tensor ref = fused_ce_run(dt, std::nullopt, 0.3f, 1.f).grad.to(DType::F32);
    const double u = dt == DType::F32 ? 0x1p-24 : dt == DType::BF16 ? 0x1p-9 : 0x1p-12;
    const double tiny = dt == DType::F16 ? 0x1p-24 : 0.0;  // f16's subnormal spacing
    const Tensor got = odd.grad.to(DType::F32);
    for (int64_t i = 0; i < ref.numel(); ++i) {
      const double a = got.data<float>()[i], b = ref.data<float>()[i];
      ASSERT_LE(std::abs(a - b), 6.5 * u * std::abs(b) + tiny) << i << ": " << a << " vs " << b;
    }
    // A kept handle on the logits (a second Variable, or a tensor viewing their data): not
    // fused, the logits untouched (checked in the run).
    for (Keep keep : {Keep::Variable, Keep::View}) {
      const FusedCeRun kept = fused_ce_run(dt, 1.f, 1.f, 1.f, keep);
      EXPECT_FALSE(kept.fused);
      EXPECT_TRUE(same_bits(kept.grad, fused_ce_run(dt, std::nullopt, 1.f, 1.f).grad));
    }
  }
  // Logits that need no gradient: a plain forward, even in a scope. (Under NoGradGuard with
  // logits that would need one: CudaProfiler.TheLossIsFusedOnlyWhenAGradientIsWanted, where the
  // kernel that ran shows.)
  const LossGradientScope hint(1.f);
  Variable l = cross_entropy_consuming(Variable(tops::uniform({2, 5}, {13, 1}, -1.f, 1.f)),
                                       tops::from_ints({1, 4}, {2}));
  EXPECT_FALSE(l.requires_grad());
}

TEST(FusedCrossEntropyGradient, ScopesNest) {
  EXPECT_FALSE(LossGradientScope::current().has_value());
  {
    const LossGradientScope outer(2.f);
    {
      const LossGradientScope inner(0.5f);
      EXPECT_EQ(LossGradientScope::current(), std::optional<float>(0.5f));
    }
    EXPECT_EQ(LossGradientScope::current(), std::optional<float>(2.f));
  }
  EXPECT_FALSE(LossGradientScope::current().has_value());
}

// ---- against finite differences ----

TEST(FusedGradcheck, AddLayerNorm) {
  // x a transposed view: the op takes any layout.
  Variable x(tops::randn({7, 4}, {1, 1}).transpose(0, 1), true);
  std::vector<Variable> in{x, input({4, 7}, 2), input({7}, 3), input({7}, 4)};
  auto both = [](const std::vector<Variable>& v) {
    auto [s, y] = add_layernorm(v[0], v[1], v[2], v[3], 1e-5f);
    return concat({s, y}, 0);
  };
  auto y_only = [](const std::vector<Variable>& v) {
    return add_layernorm(v[0], v[1], v[2], v[3], 1e-5f, /*keep_sum=*/false).second;
  };
  EXPECT_EQ(gradcheck(both, in), "");
  EXPECT_EQ(gradcheck(y_only, in), "");
}

TEST(FusedGradcheck, AddRmsNorm) {
  std::vector<Variable> in{input({2, 3, 9}, 5), input({2, 3, 9}, 6), input({9}, 7)};
  auto both = [](const std::vector<Variable>& v) {
    auto [s, y] = add_rmsnorm(v[0], v[1], v[2], 1e-6f);
    return concat({s, y}, 0);
  };
  auto y_only = [](const std::vector<Variable>& v) {
    return add_rmsnorm(v[0], v[1], v[2], 1e-6f, /*keep_sum=*/false).second;
  };
  EXPECT_EQ(gradcheck(both, in), "");
  EXPECT_EQ(gradcheck(y_only, in), "");
}

TEST(FusedGradcheck, MlpGelu) {
  std::vector<Variable> in{input({2, 3, 5}, 8, DType::F32, -2.f, 2.f), input({8, 5}, 9),
                           input({8}, 10), input({4, 8}, 11), input({4}, 12)};
  auto with_bias = [](const std::vector<Variable>& v) {
    return mlp_gelu(v[0], v[1], v[2], v[3], v[4]);
  };
  EXPECT_EQ(gradcheck(with_bias, in), "");
  std::vector<Variable> nb{in[0], in[1], in[3]};
  auto no_bias = [](const std::vector<Variable>& v) {
    return mlp_gelu(v[0], v[1], Variable(), v[2], Variable());
  };
  EXPECT_EQ(gradcheck(no_bias, nb), "");
}

// ---- the same bits as the compositions ----

struct Grads {
  Tensor y, s;
  std::vector<Tensor> g;
};

// A residual block's pattern: s = x + r feeds the norm and a later add (z = s + q), so the
// gradient of s is the sum of two contributions; or (keep_sum = false) the norm only.
Grads run_add_norm(bool fused, bool layer, bool keep_sum, DType dt, bool ckpt = false) {
  std::vector<Variable> p{input({6, 24}, 21, dt, 1.f, 3.f), input({6, 24}, 22, dt),
                          input({24}, 23, dt), input({24}, 24, dt), input({6, 24}, 25, dt)};
  auto f = [&](const std::vector<Variable>& v) {
    Variable s, y;
    if (fused) {
      std::tie(s, y) = layer ? add_layernorm(v[0], v[1], p[2], p[3], 1e-5f, keep_sum)
                             : add_rmsnorm(v[0], v[1], p[2], 1e-5f, keep_sum);
    } else {
      s = add(v[0], v[1]);
      y = layer ? layernorm(s, p[2], p[3], 1e-5f) : rmsnorm(s, p[2], 1e-5f);
    }
    if (!keep_sum) return std::vector<Variable>{y};
    return std::vector<Variable>{y, add(s, p[4])};
  };
  std::vector<Variable> out = ckpt ? checkpoint(f, {p[0], p[1]}) : f({p[0], p[1]});
  std::vector<Tensor> seeds;
  for (size_t i = 0; i < out.size(); ++i)
    seeds.push_back(tops::uniform(out[i].shape(), {31 + i, 5}, -1.f, 1.f).to(dt));
  backward(out, seeds);
  Grads r;
  r.y = out[0].data();
  if (keep_sum) r.s = out[1].data();
  for (const Variable& v : p) r.g.push_back(v.grad());
  return r;
}

TEST(FusedBitwise, AddNormEqualsAddThenNorm) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (bool layer : {true, false})
      for (bool keep_sum : {true, false})
        for (bool ckpt : {false, true}) {
          SCOPED_TRACE(std::string(dtype_name(dt)) + (layer ? " layernorm" : " rmsnorm") +
                       (keep_sum ? " +s" : " y only") + (ckpt ? " checkpointed" : ""));
          const Grads f = run_add_norm(true, layer, keep_sum, dt, ckpt);
          const Grads u = run_add_norm(false, layer, keep_sum, dt);
          EXPECT_TRUE(same_bits(f.y, u.y));
          EXPECT_TRUE(same_bits(f.s, u.s));
          for (size_t i = 0; i < u.g.size(); ++i)
            EXPECT_TRUE(same_bits(f.g[i], u.g[i])) << "gradient of input " << i;
        }
}

// f32: mlp_gelu and linear are the unfused nodes' kernels on the same values.
TEST(FusedBitwise, MlpGeluEqualsLinearGeluLinearInF32) {
  for (bool ckpt : {false, true}) {
    SCOPED_TRACE(ckpt ? "checkpointed" : "plain");
    std::vector<Tensor> outs, grads;
    for (bool fused : {true, false}) {
      std::vector<Variable> p{input({3, 7, 16}, 41, DType::F32, -2.f, 2.f), input({64, 16}, 42),
                              input({64}, 43), input({16, 64}, 44), input({16}, 45)};
      auto f = [&](const std::vector<Variable>& v) {
        Variable y = fused ? mlp_gelu(v[0], p[1], p[2], p[3], p[4])
                           : linear(gelu(linear(v[0], p[1], p[2])), p[3], p[4]);
        return std::vector<Variable>{y};
      };
      Variable y = (ckpt ? checkpoint(f, {p[0]}) : f({p[0]}))[0];
      backward({y}, {tops::uniform(y.shape(), {46, 5}, -1.f, 1.f)});
      outs.push_back(y.data());
      for (const Variable& v : p) grads.push_back(v.grad());
    }
    EXPECT_TRUE(same_bits(outs[0], outs[1]));
    for (size_t i = 0; i < 5; ++i) EXPECT_TRUE(same_bits(grads[i], grads[i + 5])) << "input " << i;
  }
}

// mlp_gelu writes the GELU input (pre, [N, 4C]) only when a graph is built now or later (Note
// [Replayed forwards]): under NoGradGuard the call's peak activation bytes drop by exactly pre's
// bytes (the CPU's f32 scratch in its place is workspace) and its output keeps its bits; inside checkpoint's first run (replayed with grad on in backward)
// pre is written as with grad on, so the replay runs the same GEMM epilogue.
TEST(FusedMemory, MlpGeluWritesTheGeluInputOnlyForAGraph) {
  const int64_t N = 3 * 7, C = 16;
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    std::vector<Variable> p{input({3, 7, C}, 71, dt), input({4 * C, C}, 72, dt),
                            input({4 * C}, 73, dt), input({C, 4 * C}, 74, dt), input({C}, 75, dt)};
    auto& stats = offload::MemoryStats::global();
    struct Call {
      Tensor y;
      int64_t peak = 0;
    };
    auto call = [&](const std::vector<Variable>& v) {
      const auto activations = [&] {
        return stats.usage(offload::Tier::Host, offload::Category::Activation);
      };
      const int64_t before = activations().current;
      stats.reset_peaks();
      Call c;
      c.y = mlp_gelu(v[0], p[1], p[2], p[3], p[4]).data();
      c.peak = activations().peak - before;
      return c;
    };
    const Call with_grad = call({p[0]});
    Call no_grad;
    {
      NoGradGuard guard;
      no_grad = call({p[0]});
    }
    std::optional<Call> first_run;
    Variable y = checkpoint(
        [&](const std::vector<Variable>& v) {
          if (!first_run) first_run = call(v);
          return std::vector<Variable>{mlp_gelu(v[0], p[1], p[2], p[3], p[4])};
        },
        {p[0]})[0];
    EXPECT_FALSE(GradMode::will_be_replayed());  // the first run's mark is gone
    const int64_t pre_bytes = N * 4 * C * static_cast<int64_t>(dtype_size(dt));
    EXPECT_EQ(with_grad.peak - no_grad.peak, pre_bytes)
        << with_grad.peak << " bytes with grad, " << no_grad.peak << " without";
    ASSERT_TRUE(first_run.has_value());
    EXPECT_EQ(first_run->peak, with_grad.peak);
    EXPECT_TRUE(same_bits(no_grad.y, with_grad.y));
    EXPECT_TRUE(same_bits(first_run->y, with_grad.y));
    EXPECT_TRUE(same_bits(y.data(), with_grad.y));
  }
}

TEST(FusedBitwise, LinearEqualsMatmulThenBiasAddInF32) {
  Variable x = input({9, 12}, 51), w = input({20, 12}, 52), b = input({20}, 53);
  Variable y = linear(x, w, b);
  backward({y}, {tops::uniform(y.shape(), {54, 5}, -1.f, 1.f)});
  Variable x2(x.data(), true), w2(w.data(), true), b2(b.data(), true);
  Variable y2 = bias_add(matmul(x2, w2, false, true), b2);
  backward({y2}, {tops::uniform(y2.shape(), {54, 5}, -1.f, 1.f)});
  EXPECT_TRUE(same_bits(y.data(), y2.data()));
  EXPECT_TRUE(same_bits(x.grad(), x2.grad()));
  EXPECT_TRUE(same_bits(w.grad(), w2.grad()));
  EXPECT_TRUE(same_bits(b.grad(), b2.grad()));
}

// bf16: one rounding instead of several, so close to the composition but not its bits.
TEST(FusedNumerics, MlpGeluInBf16IsCloseToTheComposition) {
  std::vector<Variable> p{
      input({4, 5, 32}, 61, DType::BF16, -2.f, 2.f), input({128, 32}, 62, DType::BF16, -0.2f, 0.2f),
      input({128}, 63, DType::BF16), input({32, 128}, 64, DType::BF16, -0.1f, 0.1f),
      input({32}, 65, DType::BF16)};
  std::vector<Variable> q;
  for (const Variable& v : p) q.emplace_back(v.data(), true);
  Variable y = mlp_gelu(p[0], p[1], p[2], p[3], p[4]);
  Variable y2 = linear(gelu(linear(q[0], q[1], q[2])), q[3], q[4]);
  const Tensor seed = tops::uniform(y.shape(), {66, 5}, -1.f, 1.f).to(DType::BF16);
  backward({y}, {seed});
  backward({y2}, {seed});
  auto rel = [](const Tensor& a, const Tensor& b) {
    const Tensor d = tops::sub(a.to(DType::F32), b.to(DType::F32));
    return tops::l2_norm(d) / tops::l2_norm(b.to(DType::F32));
  };
  EXPECT_LT(rel(y.data(), y2.data()), 1e-2);
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_EQ(p[i].grad().dtype(), DType::BF16);
    EXPECT_LT(rel(p[i].grad(), q[i].grad()), 2e-2) << "input " << i;
  }
}

}  // namespace
}  // namespace strata::autograd
