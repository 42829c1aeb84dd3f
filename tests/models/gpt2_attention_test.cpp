// GPT-2's attention without layout copies (Note [GPT-2 attention layout]) against the unfused
// split / reshape / transpose composition it replaced: the same loss and gradients, bit for bit,
// in f32 and bf16, with and without activation checkpointing and residual dropout.
#include <gtest/gtest.h>

#include <cstring>

#include "autograd/rng_context.h"
#include "models/gpt2/gpt2.h"
#include "tensor/ops.h"

namespace strata::models {
namespace {

using gpt2::GPT2;
using gpt2::GPT2Config;

tensor::Tensor random_ids(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  std::vector<float> u(static_cast<size_t>(B * T));
  rng_uniform(u.data(), u.size(), {seed, 1}, 0.f, static_cast<float>(vocab));
  std::vector<int64_t> ids;
  for (float x : u) ids.push_back(std::min<int64_t>(static_cast<int64_t>(x), vocab - 1));
  return tensor::from_ints(ids, {B, T});
}

int set_fused_qkv(CausalLM& m, bool on) {
  int n = 0;
  for (auto& [name, mod] : m.named_modules())
    if (auto* a = dynamic_cast<gpt2::CausalSelfAttention*>(mod)) {
      EXPECT_TRUE(a->fused_qkv()) << name << ": fused is the default";
      a->set_fused_qkv(on);
      ++n;
    }
  return n;
}

// Parameters in `dt`, each gradient unbound from the flat f32 buffer so it stays in `dt`.
void cast_parameters(CausalLM& m, DType dt) {
  if (dt == DType::F32) return;
  for (auto& [name, p] : m.named_parameters()) {
    p.set_data(p.data().to(dt));
    p.set_grad(Tensor());
  }
}

std::vector<uint32_t> bits(const Tensor& t) {
  std::vector<float> v = tensor::to_float_vector(t);
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

struct Step {
  std::vector<uint32_t> loss;
  std::vector<std::vector<uint32_t>> grads;
};

Step step(CausalLM& m, const Tensor& ids, const Tensor& targets) {
  Generator gen(123);
  autograd::GeneratorScope scope(gen);
  m.zero_grad();
  autograd::Variable loss = m.loss(ids, targets);
  loss.backward();
  Step s{bits(loss.data()), {}};
  for (auto& [name, p] : m.named_parameters()) s.grads.push_back(bits(p.grad()));
  return s;
}

TEST(Gpt2Attention, FusedQkvGivesTheUnfusedLossAndGradientsBitwise) {
  for (DType dt : {DType::F32, DType::BF16})
    for (bool ckpt : {false, true})
      for (float dropout : {0.f, 0.1f}) {
        SCOPED_TRACE(fmt::format("{} checkpointing={} dropout={}", dtype_name(dt), ckpt, dropout));
        GPT2Config c = gpt2::preset("gpt2-tiny");
        c.dropout = dropout;
        c.activation_checkpointing = ckpt;
        GPT2 fused(c, 21), unfused(c, 21);
        EXPECT_EQ(set_fused_qkv(unfused, false), c.n_layer);
        cast_parameters(fused, dt);
        cast_parameters(unfused, dt);
        const Tensor ids = random_ids(2, 40, c.vocab_size, 5);
        const Tensor targets = random_ids(2, 40, c.vocab_size, 6);
        const Step want = step(unfused, ids, targets), got = step(fused, ids, targets);
        EXPECT_EQ(got.loss, want.loss);
        ASSERT_EQ(got.grads.size(), want.grads.size());
        auto names = fused.named_parameters();
        for (size_t i = 0; i < got.grads.size(); ++i)
          EXPECT_EQ(got.grads[i], want.grads[i]) << names[i].first;
      }
}

}  // namespace
}  // namespace strata::models
