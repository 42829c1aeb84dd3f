// Zoo models forward + backward with bf16/f16 parameters against f32 on the same values
// (Note [Low-precision ops], Note [Gradient dtypes]).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "core/rng.h"
#include "models/registry.h"
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

// Rounds every parameter to `dt`'s grid in place (the model stays f32), so an f32 run and a
// `dt` run start from the same values.
void round_parameters(CausalLM& m, DType dt) {
  for (auto& [name, p] : m.named_parameters()) {
    Tensor d = p.data();
    d.copy_(d.to(dt));
  }
}

// Rebinds every parameter to a `dt` copy of itself and unbinds its gradient from the flat f32
// buffer, so backward leaves each gradient in the parameter's dtype. (Test-only: it breaks the
// flat-buffer aliasing of Note [Flat parameters] on purpose.)
void cast_parameters(CausalLM& m, DType dt) {
  for (auto& [name, p] : m.named_parameters()) {
    p.set_data(p.data().to(dt));
    p.set_grad(Tensor());
  }
}

double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

struct Step {
  float loss;
  std::vector<std::vector<float>> grads;
  std::vector<DType> grad_dtypes;
  double total_sq = 0;  // sum over parameters of |grad|^2
};

Step forward_backward(CausalLM& m, const Tensor& ids, const Tensor& targets) {
  m.zero_grad();
  autograd::Variable loss = m.loss(ids, targets);
  EXPECT_EQ(loss.dtype(), DType::F32) << "cross-entropy's loss stays f32";
  loss.backward();
  Step s;
  s.loss = loss.item();
  for (auto& [name, p] : m.named_parameters()) {
    s.grads.push_back(tensor::to_float_vector(p.grad()));
    s.grad_dtypes.push_back(p.grad().dtype());
    s.total_sq += tensor::sum_squares(p.grad());
  }
  return s;
}

void check_model(const std::string& preset, DType dt, double grad_bound) {
  SCOPED_TRACE(preset + " " + std::string(dtype_name(dt)));
  ModelOptions o;
  o.seed = 5;
  std::unique_ptr<CausalLM> ref = ModelRegistry::global().create(preset, o);
  std::unique_ptr<CausalLM> low = ModelRegistry::global().create(preset, o);
  round_parameters(*ref, dt);
  round_parameters(*low, dt);
  cast_parameters(*low, dt);
  const Tensor ids = random_ids(2, 32, ref->vocab_size(), 1);
  const Tensor targets = random_ids(2, 32, ref->vocab_size(), 2);
  const Step want = forward_backward(*ref, ids, targets);
  const Step got = forward_backward(*low, ids, targets);

  const double loss_err = std::fabs(got.loss - want.loss) / want.loss;
  // Within 1% is what mixed-precision training needs; the near-uniform logits of a freshly
  // initialised model make it far closer than that, and a tenth of it still catches a broken op.
  EXPECT_LT(loss_err, 1e-3) << got.loss << " vs " << want.loss;
  // Every gradient in the parameter's dtype; the global relative L2 error over all of them, and
  // the worst single parameter's.
  double num = 0, worst = 0;
  std::string worst_name;
  auto named = low->named_parameters();
  for (size_t i = 0; i < got.grads.size(); ++i) {
    EXPECT_EQ(got.grad_dtypes[i], dt) << named[i].first;
    const double e = rel_l2(got.grads[i], want.grads[i]);
    for (size_t j = 0; j < got.grads[i].size(); ++j) {
      const double d = static_cast<double>(got.grads[i][j]) - want.grads[i][j];
      num += d * d;
    }
    if (e > worst) {
      worst = e;
      worst_name = named[i].first;
    }
  }
  const double global = std::sqrt(num / want.total_sq);
  std::printf("[ %s %s ] loss %.6f vs f32 %.6f (rel %.2e); grads rel L2 %.3e, worst %s %.3e\n",
              preset.c_str(), std::string(dtype_name(dt)).c_str(), got.loss, want.loss, loss_err,
              global, worst_name.c_str(), worst);
  EXPECT_LT(global, grad_bound);
}

TEST(LowpModels, Gpt2TinyInBf16AndF16MatchesF32) {
  check_model("gpt2-tiny", DType::BF16, 1e-2);
  check_model("gpt2-tiny", DType::F16, 2e-3);
}

TEST(LowpModels, ActivationCheckpointingInBf16GivesTheSameGradients) {
  ModelOptions o;
  o.seed = 7;
  std::unique_ptr<CausalLM> plain = ModelRegistry::global().create("gpt2-tiny", o);
  o.overrides["activation_checkpointing"] = "true";
  std::unique_ptr<CausalLM> ckpt = ModelRegistry::global().create("gpt2-tiny", o);
  cast_parameters(*plain, DType::BF16);
  cast_parameters(*ckpt, DType::BF16);
  const Tensor ids = random_ids(2, 16, plain->vocab_size(), 3);
  const Tensor targets = random_ids(2, 16, plain->vocab_size(), 4);
  const Step a = forward_backward(*plain, ids, targets), b = forward_backward(*ckpt, ids, targets);
  EXPECT_EQ(a.loss, b.loss);
  // The recompute replays the same bf16 ops on the same inputs: bitwise.
  EXPECT_EQ(a.grads, b.grads);
  for (DType d : b.grad_dtypes) EXPECT_EQ(d, DType::BF16);
}

TEST(LowpModels, LlamaTinyInBf16AndF16MatchesF32) {
  check_model("llama-tiny", DType::BF16, 1e-2);
  check_model("llama-tiny", DType::F16, 2e-3);
}

}  // namespace
}  // namespace strata::models
