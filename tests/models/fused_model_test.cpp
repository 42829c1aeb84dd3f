// The zoo's fused ops (Note [Fused ops in models]) against the unfused composition on the CPU:
// gpt2-tiny and llama-tiny logits, losses and every gradient are the same bits in f32 (with
// dropout and with activation checkpointing too); llama-tiny also in bf16 (its fused residual
// adds and SwiGLU MLP run the unfused ops); gpt2-tiny in bf16 is close but not bitwise (its MLP
// rounds once).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "autograd/rng_context.h"
#include "core/rng.h"
#include "models/nn/fused_ops.h"
#include "models/registry.h"
#include "offload/memory_stats.h"
#include "tensor/ops.h"

namespace strata::models {
namespace {

tensor::Tensor random_ids(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  std::vector<float> u(static_cast<size_t>(B * T));
  rng_uniform(u.data(), u.size(), {seed, 1}, 0.f, static_cast<float>(vocab));
  std::vector<int64_t> ids;
  for (float x : u) ids.push_back(std::min<int64_t>(static_cast<int64_t>(x), vocab - 1));
  return tensor::from_ints(ids, {B, T});
}

bool same_bits(const tensor::Tensor& a, const tensor::Tensor& b) {
  if (!(a.shape() == b.shape()) || a.dtype() != b.dtype()) return false;
  tensor::Tensor ac = a.contiguous(), bc = b.contiguous();
  return std::memcmp(ac.data_ptr(), bc.data_ptr(), ac.nbytes()) == 0;
}

struct ModelRun {
  tensor::Tensor logits, eval_logits;
  float loss = 0;
  std::vector<tensor::Tensor> grads;
  int64_t activation_peak = 0;  // host activation bytes at the peak of loss + backward
  int64_t activation_kept = 0;  // host activation bytes held for backward when loss returns
};

// Rebinds every parameter to a `dt` copy and unbinds its gradient from the flat f32 buffer, so
// gradients come back in `dt` (test-only, as lowp_model_test.cpp does).
void cast_parameters(CausalLM& m, DType dt) {
  for (auto& [name, p] : m.named_parameters()) {
    p.set_data(p.data().to(dt));
    p.set_grad(tensor::Tensor());
  }
}

ModelRun run(const std::string& preset, bool fused,
             const std::map<std::string, std::string>& overrides, DType dt) {
  nn::FusedOpsGuard mode(fused);
  ModelOptions o;
  o.seed = 9;
  o.overrides = overrides;
  std::unique_ptr<CausalLM> m = ModelRegistry::global().create(preset, o);
  if (dt != DType::F32) cast_parameters(*m, dt);
  const tensor::Tensor ids = random_ids(2, 20, m->vocab_size(), 3),
                       targets = random_ids(2, 20, m->vocab_size(), 4);
  ModelRun r;
  Generator gen(17);
  autograd::GeneratorScope scope(gen);
  r.logits = m->forward(ids).data();
  m->zero_grad();
  auto& stats = offload::MemoryStats::global();
  const auto activations = [&] {
    return stats.usage(offload::Tier::Host, offload::Category::Activation);
  };
  const int64_t before = activations().current;
  stats.reset_peaks();
  autograd::Variable loss = m->loss(ids, targets);
  r.activation_kept = activations().current - before;
  loss.backward();
  r.activation_peak = activations().peak - before;
  r.loss = loss.item();
  for (auto& p : m->parameters()) r.grads.push_back(p.grad());
  m->eval();
  autograd::NoGradGuard no_grad;
  r.eval_logits = m->forward(ids).data();
  return r;
}

void expect_same(const ModelRun& f, const ModelRun& u) {
  EXPECT_TRUE(same_bits(f.logits, u.logits))
      << "max diff " << tensor::max_abs_diff(f.logits, u.logits);
  EXPECT_TRUE(same_bits(f.eval_logits, u.eval_logits));
  uint32_t fb, ub;
  std::memcpy(&fb, &f.loss, 4);
  std::memcpy(&ub, &u.loss, 4);
  EXPECT_EQ(fb, ub) << f.loss << " vs " << u.loss;
  ASSERT_EQ(f.grads.size(), u.grads.size());
  for (size_t i = 0; i < f.grads.size(); ++i)
    EXPECT_TRUE(same_bits(f.grads[i], u.grads[i])) << "gradient " << i;
}

using Overrides = std::map<std::string, std::string>;

TEST(FusedModels, Gpt2TinyF32IsBitwiseTheUnfusedModel) {
  for (const Overrides& o : {Overrides{}, Overrides{{"dropout", "0.1"}},
                             Overrides{{"dropout", "0.1"}, {"activation_checkpointing", "true"}}}) {
    SCOPED_TRACE(o.size());
    expect_same(run("gpt2-tiny", true, o, DType::F32), run("gpt2-tiny", false, o, DType::F32));
  }
}

TEST(FusedModels, LlamaTinyIsBitwiseTheUnfusedModelInF32AndBf16) {
  for (DType dt : {DType::F32, DType::BF16})
    for (const Overrides& o : {Overrides{}, Overrides{{"activation_checkpointing", "true"}}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (o.empty() ? "" : " checkpointed"));
      expect_same(run("llama-tiny", true, o, dt), run("llama-tiny", false, o, dt));
    }
}

TEST(FusedModels, Gpt2TinyBf16IsCloseToTheUnfusedModel) {
  const ModelRun f = run("gpt2-tiny", true, {}, DType::BF16),
                 u = run("gpt2-tiny", false, {}, DType::BF16);
  EXPECT_NEAR(f.loss, u.loss, 1e-2 * std::fabs(u.loss));
  for (size_t i = 0; i < f.grads.size(); ++i) {
    const tensor::Tensor a = f.grads[i].to(DType::F32), b = u.grads[i].to(DType::F32);
    const double scale = std::max(tensor::l2_norm(b), 1e-6);
    EXPECT_LT(tensor::l2_norm(tensor::sub(a, b)) / scale, 5e-2) << "gradient " << i;
  }
}

// Note [GELU recompute]: keeping only the GELU input changes no forward value; in f32 the
// recomputed output is the forward's bits, so every gradient is too; in bf16 proj's weight
// gradient may move by an ulp of h in places. The activation peak (at the end of the forward)
// drops by every layer's GELU output: B T 4C values each, 2 layers of n_embd 64 here.
TEST(FusedModels, Gpt2RecomputedGeluKeepsTheBitsAndLessMemory) {
  const Overrides recompute{{"recompute_gelu", "true"}};
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const ModelRun r = run("gpt2-tiny", true, recompute, dt), k = run("gpt2-tiny", true, {}, dt);
    EXPECT_TRUE(same_bits(r.logits, k.logits));
    EXPECT_EQ(std::memcmp(&r.loss, &k.loss, sizeof(float)), 0) << r.loss << " vs " << k.loss;
    ASSERT_EQ(r.grads.size(), k.grads.size());
    for (size_t i = 0; i < r.grads.size(); ++i) {
      if (dt == DType::F32) {
        EXPECT_TRUE(same_bits(r.grads[i], k.grads[i])) << "gradient " << i;
      } else {
        const tensor::Tensor a = r.grads[i].to(DType::F32), b = k.grads[i].to(DType::F32);
        const double scale = std::max(tensor::l2_norm(b), 1e-6);
        EXPECT_LT(tensor::l2_norm(tensor::sub(a, b)) / scale, 1e-2) << "gradient " << i;
      }
    }
    const int64_t h_bytes = 2 * 20 * 4 * 64 * static_cast<int64_t>(dtype_size(dt));
    EXPECT_EQ(k.activation_peak - r.activation_peak, 2 * h_bytes)
        << k.activation_peak << " bytes kept, " << r.activation_peak << " recomputed";
  }
  // Inside checkpointed blocks (whose backward runs the forward again) too.
  expect_same(run("gpt2-tiny", true,
                  {{"recompute_gelu", "true"}, {"activation_checkpointing", "true"}}, DType::F32),
              run("gpt2-tiny", true, {{"activation_checkpointing", "true"}}, DType::F32));
  // The unfused model has no such node: the key is accepted there and changes nothing.
  expect_same(run("gpt2-tiny", false, recompute, DType::F32),
              run("gpt2-tiny", false, {}, DType::F32));
}

// Note [SwiGLU recompute]: the fused MLP keeps neither silu(g) nor, with recompute_swiglu, the
// product h; recomputing them gives the forward's bits in every dtype, so the logits, loss and
// every gradient are the kept-h model's (which LlamaTinyIsBitwiseTheUnfusedModel... holds to the
// unfused model). What the forward leaves for backward drops by every layer's h with the key, and
// by every layer's s from unfused to fused: B T F values each, 2 layers of intermediate_size 176
// here. The step's peak (here in backward, where this tiny model's temporaries rival a layer's
// activations) must not grow either.
TEST(FusedModels, LlamaRecomputedSwigluKeepsTheBitsAndLessMemory) {
  const Overrides recompute{{"recompute_swiglu", "true"}};
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const ModelRun r = run("llama-tiny", true, recompute, dt), k = run("llama-tiny", true, {}, dt),
                   u = run("llama-tiny", false, {}, dt);
    expect_same(r, k);
    const int64_t f_bytes = 2 * 20 * 176 * static_cast<int64_t>(dtype_size(dt));
    EXPECT_EQ(k.activation_kept - r.activation_kept, 2 * f_bytes)
        << k.activation_kept << " bytes kept, " << r.activation_kept << " with recompute";
    EXPECT_EQ(u.activation_kept - k.activation_kept, 2 * f_bytes)
        << u.activation_kept << " bytes unfused, " << k.activation_kept << " fused";
    EXPECT_LE(r.activation_peak, k.activation_peak);
    EXPECT_LE(k.activation_peak, u.activation_peak);
  }
  // Inside checkpointed layers too, and the unfused model accepts the key and ignores it.
  expect_same(run("llama-tiny", true,
                  {{"recompute_swiglu", "true"}, {"activation_checkpointing", "true"}}, DType::F32),
              run("llama-tiny", true, {{"activation_checkpointing", "true"}}, DType::F32));
  expect_same(run("llama-tiny", false, recompute, DType::F32),
              run("llama-tiny", false, {}, DType::F32));
}

TEST(FusedModels, TheFinalNormRunsItsHooks) {
  ModelOptions o;
  std::unique_ptr<CausalLM> m = ModelRegistry::global().create("gpt2-tiny", o);
  int pre = 0, post = 0;
  m->module("ln_f").register_forward_pre_hook([&](nn::Module&, const auto&) { ++pre; });
  m->module("ln_f").register_backward_hook([&](nn::Module&) { ++post; });
  const tensor::Tensor ids = random_ids(1, 8, m->vocab_size(), 5);
  m->loss(ids, ids).backward();
  EXPECT_EQ(pre, 1);
  EXPECT_EQ(post, 1);
}

}  // namespace
}  // namespace strata::models
