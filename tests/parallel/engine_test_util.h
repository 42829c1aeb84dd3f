#pragma once
// Shared by the engine tests: a tiny GPT-2, synthetic data, the single-process reference step
// (Note [Training step] in runtime/trainer.h) and the same training through the engine.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "autograd/functions.h"
#include "models/gpt2/gpt2.h"
#include "optim/adamw.h"
#include "optim/grad_clip.h"
#include "parallel/engine.h"
#include "parallel/param_groups.h"

namespace strata::testing {

struct TrainSpec {
  int64_t n_layer = 2;
  int64_t micro = 2;  // M: samples per micro-batch
  int64_t accum = 1;  // A: micro-batches per step and rank
  int steps = 20;
  double lr = 3e-3;
  double max_norm = 0;  // > 0: clip
  bool checkpointing = false;
  uint64_t seed = 1234;
  static constexpr int64_t kSeq = 16;
  static constexpr int64_t kVocab = 64;
};

inline models::gpt2::GPT2Config tiny_config(const TrainSpec& s) {
  models::gpt2::GPT2Config c;
  c.vocab_size = TrainSpec::kVocab;
  c.padded_vocab_size = TrainSpec::kVocab;
  c.n_positions = TrainSpec::kSeq;
  c.n_embd = 32;
  c.n_head = 2;
  c.n_layer = s.n_layer;
  c.dropout = 0.f;
  c.activation_checkpointing = s.checkpointing;
  return c;
}

inline optim::AdamWConfig adamw_config() {
  optim::AdamWConfig c;
  c.weight_decay = 0.1;
  return c;
}

// Sample i of a fixed synthetic corpus: kSeq + 1 token ids with some structure to learn (a
// noisy counter), the same on every rank and every run.
inline std::vector<int64_t> sample_tokens(int64_t i) {
  std::mt19937_64 rng(0x5eed + static_cast<uint64_t>(i));
  std::vector<int64_t> t(TrainSpec::kSeq + 1);
  int64_t x = static_cast<int64_t>(rng() % TrainSpec::kVocab);
  for (auto& v : t) {
    v = x;
    x = (x + 1 + static_cast<int64_t>(rng() % 3 == 0 ? rng() % 5 : 0)) % TrainSpec::kVocab;
  }
  return t;
}

struct Batch {
  tensor::Tensor ids, targets;
};

// Samples [first, first + n) as ids / targets [n, kSeq].
inline Batch make_batch(int64_t first, int64_t n) {
  std::vector<int64_t> ids, targets;
  for (int64_t i = first; i < first + n; ++i) {
    std::vector<int64_t> t = sample_tokens(i);
    ids.insert(ids.end(), t.begin(), t.end() - 1);
    targets.insert(targets.end(), t.begin() + 1, t.end());
  }
  return {tensor::from_ints(ids, {n, TrainSpec::kSeq}),
          tensor::from_ints(targets, {n, TrainSpec::kSeq})};
}

// The single-process trajectory for a global batch of `dp` ranks' worth: A * dp micro-batches of
// M, each loss scaled by 1 / (A * dp), then norm/clip and AdamW, as the Trainer does
// (runtime/trainer_loop.cpp).
inline std::vector<double> reference_losses(const TrainSpec& s, int dp) {
  models::gpt2::GPT2 model(tiny_config(s), s.seed);
  optim::AdamW opt(parallel::unit_param_groups(model), adamw_config());
  const int64_t micro_batches = s.accum * dp;
  const int64_t G = s.micro * micro_batches;
  std::vector<double> losses;
  for (int step = 0; step < s.steps; ++step) {
    opt.zero_grad();
    double sum = 0;
    for (int64_t m = 0; m < micro_batches; ++m) {
      Batch b = make_batch(step * G + m * s.micro, s.micro);
      autograd::Variable loss = model.loss(b.ids, b.targets);
      sum += loss.item();
      autograd::scale(loss, 1.f / static_cast<float>(micro_batches)).backward();
    }
    if (s.max_norm > 0) {
      optim::clip_grad_norm(opt.grads(), s.max_norm);
    }
    opt.step(s.lr);
    losses.push_back(sum / static_cast<double>(micro_batches));
  }
  return losses;
}

inline parallel::Engine::OptimizerFactory adamw_factory() {
  return [](std::vector<optim::ParamGroup> groups) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::AdamW>(std::move(groups), adamw_config());
  };
}

// One training step through the engine on this rank (Note [Training step]'s data split, Note
// [Train step]); returns the rank's mean micro-batch loss. `loss_factor` multiplies the loss that
// backward starts from (an infinite one forces an overflow).
inline double engine_step(parallel::Engine& engine, const TrainSpec& s, int step,
                          parallel::StepResult* result = nullptr, float loss_factor = 1.f) {
  const int dp = engine.dp().size(), r = engine.dp().rank();
  const int64_t G = s.micro * s.accum * dp;
  parallel::TrainStepInputs in;
  in.micro_batches = s.accum;
  in.batch = [&](int64_t m) {
    Batch b = make_batch(step * G + r * s.micro * s.accum + m * s.micro, s.micro);
    return parallel::MicroBatch{b.ids, b.targets};
  };
  in.lr = s.lr;
  in.max_norm = s.max_norm;
  in.loss_factor = loss_factor;
  const parallel::TrainStepOutput out = engine.train_step(in);
  if (result) *result = out.result;
  return out.mean_loss;
}

// The global mean loss per step through an engine over `dp`.
inline std::vector<double> engine_losses(const TrainSpec& s, std::shared_ptr<comm::Communicator> dp,
                                         const parallel::ZeroConfig& zero,
                                         DType param_dtype = DType::F32,
                                         optim::LossScaler* scaler = nullptr) {
  models::gpt2::GPT2 model(tiny_config(s), s.seed);
  parallel::Engine engine(model, dp, zero, adamw_factory(), param_dtype);
  engine.set_loss_scaler(scaler);
  std::vector<double> losses;
  for (int step = 0; step < s.steps; ++step)
    losses.push_back(engine.average(engine_step(engine, s, step)));
  return losses;
}

// Per step |a - e| <= rel * |e|.
inline void expect_trajectory(const std::vector<double>& actual,
                              const std::vector<double>& expected, double rel) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i)
    EXPECT_LE(std::fabs(actual[i] - expected[i]), rel * std::fabs(expected[i]))
        << "step " << i << ": " << actual[i] << " vs reference " << expected[i];
  // The run must actually train, or agreement would prove little.
  EXPECT_LT(expected.back(), expected.front() - 0.1) << "the reference loss did not go down";
}

}  // namespace strata::testing
