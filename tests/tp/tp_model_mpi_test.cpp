// Tensor- and sequence-parallel GPT-2 and LLaMA (GQA) against the single-process model, on CPU
// ranks: the whole world is the tensor-parallel group (tp = world size). Every rank also builds
// and trains the single-process model itself, so no rank depends on another's reference. The
// must-show checks of Note [Tensor-parallel shards]: the same weights put together, each shard's
// gradient its slice of the whole gradient, and the fp32 loss trajectory within 1e-5 relative.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "autograd/rng_context.h"
#include "models/gpt2/gpt2.h"
#include "models/llama/llama.h"
#include "models/nn/fused_ops.h"
#include "models/registry.h"
#include "offload/memory_stats.h"
#include "optim/adamw.h"
#include "optim/grad_clip.h"
#include "parallel/param_groups.h"
#include "parallel/tp_grad_norm.h"
#include "parallel/zero_memory.h"
#include "tensor/ops.h"
#include "tests/support/mpi_test_env.h"

namespace strata::models {
namespace {

using autograd::Variable;
using tensor::Tensor;

constexpr int64_t kBatch = 2, kSeq = 16, kVocab = 64;
constexpr uint64_t kSeed = 4321;
constexpr int kSteps = 20;

nn::TensorParallel tp_group(bool sp) {
  return {strata::testing::test_world(), sp};
}

std::unique_ptr<CausalLM> make_model(const std::string& family, const nn::TensorParallel& tp,
                                     float dropout = 0.f, bool tied = false, int layers = 2,
                                     bool checkpointing = false) {
  if (family == "gpt2") {
    gpt2::GPT2Config c;
    c.dropout = dropout;
    c.vocab_size = c.padded_vocab_size = kVocab;
    c.n_positions = kSeq;
    c.n_embd = 32;
    c.n_layer = layers;
    c.activation_checkpointing = checkpointing;
    c.n_head = 4;
    return std::make_unique<gpt2::GPT2>(c, kSeed, tp);
  }
  llama::LlamaConfig c = llama::preset("llama-tiny");
  c.vocab_size = c.padded_vocab_size = kVocab;
  c.max_position_embeddings = kSeq;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = layers;
  c.activation_checkpointing = checkpointing;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;  // grouped-query attention: two query heads per k/v head
  c.tie_word_embeddings = tied;
  return std::make_unique<llama::Llama>(c, kSeed, tp);
}

struct Batch {
  Tensor ids, targets;
};

// A noisy counter: something to learn, the same on every rank.
Batch make_batch(int step) {
  std::mt19937_64 rng(0x7a11 + static_cast<uint64_t>(step));
  std::vector<int64_t> ids, targets;
  for (int64_t b = 0; b < kBatch; ++b) {
    int64_t x = static_cast<int64_t>(rng() % kVocab);
    std::vector<int64_t> t;
    for (int64_t i = 0; i <= kSeq; ++i) {
      t.push_back(x);
      x = (x + 1 + static_cast<int64_t>(rng() % 4 == 0 ? rng() % 5 : 0)) % kVocab;
    }
    ids.insert(ids.end(), t.begin(), t.end() - 1);
    targets.insert(targets.end(), t.begin() + 1, t.end());
  }
  return {tensor::from_ints(ids, {kBatch, kSeq}), tensor::from_ints(targets, {kBatch, kSeq})};
}

struct Run {
  std::vector<double> losses, norms;
  std::vector<std::pair<std::string, Tensor>> initial, first_grads;  // by parameter name
};

// With max_norm > 0 the gradients are clipped: the single-process model by optim::clip_grad_norm
// over its flat buffers, a tensor-parallel one by the tp-aware norm.
Run train(CausalLM& model, int steps, double max_norm = 0) {
  // Dropout draws its keys from the thread's generator: the same sequence for every run.
  Generator generator(99);
  autograd::GeneratorScope scope(generator);
  optim::AdamWConfig cfg;
  cfg.weight_decay = 0.1;
  optim::AdamW opt(parallel::unit_param_groups(model), cfg);
  Run run;
  for (auto& [name, p] : model.named_parameters()) run.initial.emplace_back(name, p.data().clone());
  for (int step = 0; step < steps; ++step) {
    opt.zero_grad();
    Batch b = make_batch(step);
    Variable loss = model.loss(b.ids, b.targets);
    run.losses.push_back(loss.item());
    loss.backward();
    if (step == 0)
      for (auto& [name, p] : model.named_parameters())
        run.first_grads.emplace_back(name, p.grad().clone());
    if (max_norm > 0)
      run.norms.push_back(model.tensor_parallel().enabled()
                              ? parallel::tp_clip_grad_norm(model, max_norm)
                              : optim::clip_grad_norm(opt.grads(), max_norm));
    opt.step(3e-3);
  }
  return run;
}

nn::ShardSpec spec_of(const CausalLM& model, const std::string& name) {
  auto it = model.shard_specs().find(name);
  return it == model.shard_specs().end() ? nn::ShardSpec{} : it->second;
}

void expect_same_model(const std::string& family, bool sp, bool fused = true, double max_norm = 0,
                       bool tied = false, bool checkpointing = false) {
  nn::FusedOpsGuard guard(fused);
  const nn::TensorParallel tp = tp_group(sp);
  const int n = tp.size(), r = tp.rank();
  std::unique_ptr<CausalLM> whole = make_model(family, {}, 0.f, tied, 2, checkpointing);
  std::unique_ptr<CausalLM> part = make_model(family, tp, 0.f, tied, 2, checkpointing);
  const Run ref = train(*whole, kSteps, max_norm);
  const Run got = train(*part, kSteps, max_norm);

  // Same names, and each shard is its slice of the whole tensor: initial values exactly, step-0
  // gradients within 1e-6.
  ASSERT_EQ(got.initial.size(), ref.initial.size());
  for (size_t i = 0; i < ref.initial.size(); ++i) {
    const std::string& name = ref.initial[i].first;
    ASSERT_EQ(got.initial[i].first, name);
    const nn::ShardSpec spec = spec_of(*part, name);
    EXPECT_EQ(tensor::max_abs_diff(got.initial[i].second,
                                   nn::shard_of(ref.initial[i].second, spec, r, n)),
              0.0)
        << name;
    const Tensor want = nn::shard_of(ref.first_grads[i].second, spec, r, n);
    EXPECT_LE(tensor::max_abs_diff(got.first_grads[i].second, want), 1e-6)
        << name << " (gradient scale " << tensor::l2_norm(want) << ")";
  }
  if (n > 1) {
    EXPECT_FALSE(part->shard_specs().empty());
  }

  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (size_t s = 0; s < ref.losses.size(); ++s)
    EXPECT_LE(std::fabs(got.losses[s] - ref.losses[s]), 1e-5 * std::fabs(ref.losses[s]))
        << "step " << s << ": " << got.losses[s] << " vs single-process " << ref.losses[s];
  EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.1) << "the reference did not train";
  // Note [Tensor-parallel gradient norm]: every element once, so the whole model's norm.
  ASSERT_EQ(got.norms.size(), ref.norms.size());
  for (size_t s = 0; s < ref.norms.size(); ++s)
    EXPECT_NEAR(got.norms[s], ref.norms[s], 1e-5 * ref.norms[s]) << "norm at step " << s;
  if (max_norm > 0) {
    EXPECT_GT(ref.norms.front(), max_norm) << "the test should clip";
  }
  if (r == 0) {
    double worst = 0;
    for (size_t s = 0; s < ref.losses.size(); ++s)
      worst = std::max(worst, std::fabs(got.losses[s] - ref.losses[s]) / std::fabs(ref.losses[s]));
    std::printf("[tp %d %s%s%s%s] %d steps, loss %.6f -> %.6f, worst relative loss delta %.3g\n", n,
                family.c_str(), sp ? " sp" : "", fused ? "" : " unfused",
                checkpointing ? " checkpointed" : "", kSteps, ref.losses.front(), ref.losses.back(),
                worst);
  }
}

TEST(TpModel, Gpt2) {
  expect_same_model("gpt2", false);
}
TEST(TpModel, Gpt2SequenceParallel) {
  expect_same_model("gpt2", true);
}
TEST(TpModel, Gpt2SequenceParallelUnfused) {
  expect_same_model("gpt2", true, /*fused=*/false);
}
// Clipped (a norm above max_norm at the first step): the tp-aware norm counts replicated norms
// and biases once.
TEST(TpModel, Gpt2SequenceParallelClipped) {
  expect_same_model("gpt2", true, true, /*max_norm=*/0.5);
}
TEST(TpModel, LlamaGqaClipped) {
  expect_same_model("llama", false, true, /*max_norm=*/0.5);
}
TEST(TpModel, LlamaGqa) {
  expect_same_model("llama", false);
}
// The tied head reads embed_tokens' vocabulary slice.
TEST(TpModel, LlamaGqaTiedSequenceParallel) {
  expect_same_model("llama", true, true, 0, /*tied=*/true);
}
TEST(TpModel, LlamaGqaSequenceParallel) {
  expect_same_model("llama", true);
}
// Note [Sequence-parallel saved input] inside a checkpointed block: the replay releases and
// gathers again, the gradients stay the single process's.
TEST(TpModel, Gpt2SequenceParallelCheckpointed) {
  expect_same_model("gpt2", true, true, 0, false, /*checkpointing=*/true);
}
TEST(TpModel, LlamaGqaSequenceParallelCheckpointed) {
  expect_same_model("llama", true, true, 0, false, /*checkpointing=*/true);
}

// Dropout without sequence parallelism: it acts on replicated activations ([B, T, C] after each
// reduction and after the embeddings), so every rank draws the mask the single process draws
// from the same key, and the trajectory is still the single-process one. (Under sequence
// parallelism each rank masks its own tokens with a mask drawn for its [B, T / tp, C] slice: a
// valid dropout, but not the single process's masks.)
TEST(TpModel, Gpt2DropoutMatchesWithoutSequenceParallelism) {
  const nn::TensorParallel tp = tp_group(false);
  std::unique_ptr<CausalLM> whole = make_model("gpt2", {}, 0.1f);
  std::unique_ptr<CausalLM> part = make_model("gpt2", tp, 0.1f);
  const models::Run ref = train(*whole, 10);
  const models::Run got = train(*part, 10);
  for (size_t s = 0; s < ref.losses.size(); ++s)
    EXPECT_LE(std::fabs(got.losses[s] - ref.losses[s]), 1e-5 * std::fabs(ref.losses[s]))
        << "step " << s << ": " << got.losses[s] << " vs single-process " << ref.losses[s];
}

// Per-rank parameter elements of a tensor-parallel model, as allocated in its flat buffers: the
// sharded parameters' whole size / tp plus the replicated ones'.
TEST(TpModel, ParametersAreShardsPlusReplicated) {
  for (const std::string family : {"gpt2", "llama"}) {
    const nn::TensorParallel tp = tp_group(false);
    std::unique_ptr<CausalLM> whole = make_model(family, {});
    // Measured: the host Param bytes the model holds once built (its flat buffers).
    const offload::MemoryStats& stats = offload::MemoryStats::global();
    const int64_t before = stats.usage(offload::Tier::Host, offload::Category::Param).current;
    std::unique_ptr<CausalLM> part = make_model(family, tp);
    const int64_t bytes =
        stats.usage(offload::Tier::Host, offload::Category::Param).current - before;
    int64_t sharded = 0, replicated = 0, allocated = 0, padded = 0;
    for (auto& [name, p] : whole->named_parameters())
      (spec_of(*part, name).dim >= 0 ? sharded : replicated) += p.numel();
    for (const FlatUnit& u : part->flat_units()) {
      allocated += u.num_parameters();
      padded += u.size();
    }
    EXPECT_EQ(sharded % tp.size(), 0);
    EXPECT_EQ(allocated, sharded / tp.size() + replicated) << family;
    // Every byte is a flat buffer's: the parameters above plus each one's 16-element alignment.
    EXPECT_EQ(bytes, 4 * padded) << family;
    EXPECT_LT(padded - allocated, 16 * static_cast<int64_t>(part->named_parameters().size()));
    if (tp.rank() == 0)
      std::printf(
          "[tp %d %s] parameter bytes per rank %lld measured = 4 x (%lld sharded / %d + "
          "%lld replicated + %lld alignment)\n",
          tp.size(), family.c_str(), static_cast<long long>(bytes), static_cast<long long>(sharded),
          tp.size(), static_cast<long long>(replicated),
          static_cast<long long>(padded - allocated));
    if (tp.size() > 1) {
      EXPECT_GT(sharded, 0);
    }
  }
}

}  // namespace
}  // namespace strata::models

namespace strata::models {
namespace {

// Host activation bytes alive once the loss of one forward exists (the graph's saved tensors).
int64_t activation_bytes_after_forward(CausalLM& model) {
  const offload::MemoryStats& stats = offload::MemoryStats::global();
  const int64_t before = stats.usage(offload::Tier::Host, offload::Category::Activation).current;
  Batch b = make_batch(0);
  Variable loss = model.loss(b.ids, b.targets);
  const int64_t after = stats.usage(offload::Tier::Host, offload::Category::Activation).current;
  loss.backward();
  return after - before;
}

// One layer's saved activations, measured: a model of two layers minus the same model of one.
int64_t activation_bytes_per_layer(const std::string& family, const nn::TensorParallel& tp) {
  std::unique_ptr<CausalLM> one = make_model(family, tp, 0.f, false, 1);
  std::unique_ptr<CausalLM> two = make_model(family, tp, 0.f, false, 2);
  return activation_bytes_after_forward(*two) - activation_bytes_after_forward(*one);
}

// Korthikanti et al. (2022), eq. 1-3: one layer keeps sbh(34 + 5as/h) bytes of 16-bit
// activations; tensor parallelism alone sbh(10 + 24/t + 5as/(ht)), the 10sbh being the norms'
// inputs (4), the column-parallel linears' inputs (4) and two dropout masks (2), which stay whole;
// sequence parallelism divides those too: sbh(10/t + 24/t + 5as/(ht)). Here, per layer, for
// N = s b tokens of width C = h, a = H heads, fp32 (4 bytes, the paper's 2 sbh at 2 bytes is
// 4 N C), measured on the fused ops:
//   - GPT-2: norm inputs 2 x 4NC plus their mean and rstd 2 x 8N; c_attn's and the MLP's inputs
//     2 x 4NC; q, k, v 12NC; the attention output (c_proj's input) 4NC; GELU input and output
//     2 x 16NC: 64NC + 16N, the paper's 34 - 2 (sbh at 2 bytes, x 2): dropout keeps no mask
//     (masks are redrawn from their keys); the attention is a fused one keeping its logsumexp,
//     4NH, in place of the paper's 5as^2b score terms.
//   - LLaMA (F the intermediate size): RMSNorm inputs and rstd 2 x (4NC + 4N); the q/k/v and MLP
//     inputs 2 x 4NC; q, repeated k and v, the output 4 x 4NC; gate, up and their product 12NF;
//     logsumexp 4NH.
// The sequence-parallelisable part S (norm inputs and statistics, column-parallel inputs) is
// 16NC + 16N (GPT-2) or 16NC + 8N (LLaMA). Checked: tp alone keeps S + (A1 - S)/t, sequence
// parallelism A1/t (Note [Sequence-parallel saved input]), fused and unfused.
TEST(TpModel, SequenceParallelActivationsPerLayer) {
  const nn::TensorParallel off = tp_group(false), on = tp_group(true);
  const int64_t t = off.size(), N = kBatch * kSeq, C = 32, F = 64;
  for (const bool fused : {true, false}) {
    nn::FusedOpsGuard guard(fused);
    for (const std::string family : {"gpt2", "llama"}) {
      const bool gpt2 = family == "gpt2";
      const int64_t H = gpt2 ? 4 : 8;
      const int64_t a1 = activation_bytes_per_layer(family, {});
      const int64_t a_tp = activation_bytes_per_layer(family, off);
      const int64_t a_sp = activation_bytes_per_layer(family, on);
      const int64_t S = gpt2 ? 16 * N * C + 16 * N : 16 * N * C + 8 * N;
      if (fused) {
        EXPECT_EQ(a1, gpt2 ? 64 * N * C + 16 * N + 4 * N * H
                           : 32 * N * C + 12 * N * F + 8 * N + 4 * N * H)
            << family;
      }
      EXPECT_EQ((a1 - S) % t, 0) << family;
      EXPECT_EQ(a_tp, S + (a1 - S) / t) << family << (fused ? "" : " unfused");
      EXPECT_EQ(a_sp * t, a1) << family << (fused ? "" : " unfused");
      if (off.rank() == 0)
        std::printf(
            "[tp %d %s%s] activation bytes per layer: %lld at tp 1, %lld at tp %d (S %lld + %lld "
            "/ t), %lld with sequence parallelism (%lld / t)\n",
            static_cast<int>(t), family.c_str(), fused ? "" : " unfused",
            static_cast<long long>(a1), static_cast<long long>(a_tp), static_cast<int>(t),
            static_cast<long long>(S), static_cast<long long>(a1 - S), static_cast<long long>(a_sp),
            static_cast<long long>(a1));
    }
  }
}

// The whole model (embeddings, 2 layers, the final norm, the head and loss): sequence
// parallelism saves each norm's input and statistics and each column-parallel input (the 2 layers'
// and the head's) but 1/t: (2L + 1)(4NC + 2 x 4N + 4NC)(1 - 1/t); and GPT-2's position ids
// (I64), [T] shared by the batch without it, this rank's [B, T / t] with it.
TEST(TpModel, SequenceParallelActivationSaving) {
  const nn::TensorParallel off = tp_group(false), on = tp_group(true);
  const int t = off.size();
  std::unique_ptr<CausalLM> plain = make_model("gpt2", off);
  std::unique_ptr<CausalLM> sp = make_model("gpt2", on);
  const int64_t a_tp = activation_bytes_after_forward(*plain);
  const int64_t a_sp = activation_bytes_after_forward(*sp);
  const int64_t L = 2, N = kBatch * kSeq, C = 32;
  const int64_t region = (2 * L + 1) * (4 * N * C + 2 * 4 * N + 4 * N * C);
  const int64_t positions = on.sp() ? 8 * kSeq - 8 * N / t : 0;
  EXPECT_EQ(a_tp - a_sp, region - region / t + positions)
      << "tp " << t << ": " << a_tp << " bytes without, " << a_sp << " with sequence parallelism";
  if (off.rank() == 0)
    std::printf(
        "[tp %d gpt2] activations after forward: %lld bytes (tp), %lld (tp + sp), saved %lld\n", t,
        static_cast<long long>(a_tp), static_cast<long long>(a_sp),
        static_cast<long long>(a_tp - a_sp));
}

}  // namespace
}  // namespace strata::models

namespace strata::models {
namespace {

// estimate --tp's units (parallel::unit_sizes by formula) are those a tensor-parallel model
// allocates, unit by unit.
TEST(TpModel, UnitFormulasMatchTheBuiltModel) {
  const nn::TensorParallel tp = tp_group(false);
  const std::vector<std::pair<std::string, std::map<std::string, std::string>>> cases = {
      {"gpt2-tiny", {}},
      {"llama-tiny", {{"num_attention_heads", "8"}, {"num_key_value_heads", "4"}}},
      {"llama-tiny",
       {{"num_attention_heads", "8"},
        {"num_key_value_heads", "4"},
        {"tie_word_embeddings", "true"}}},
  };
  for (const auto& [name, overrides] : cases) {
    ModelOptions o;
    o.overrides = overrides;
    o.tp = tp;
    std::unique_ptr<CausalLM> model = ModelRegistry::global().create(name, o);
    const std::vector<parallel::UnitSize> built = parallel::unit_sizes(*model);
    const std::vector<parallel::UnitSize> formula = parallel::unit_sizes(name, o, tp.size());
    ASSERT_EQ(built.size(), formula.size()) << name;
    for (size_t u = 0; u < built.size(); ++u) {
      EXPECT_EQ(built[u].name, formula[u].name);
      EXPECT_EQ(built[u].size, formula[u].size) << name << " " << built[u].name;
      EXPECT_EQ(built[u].num_parameters, formula[u].num_parameters) << name << " " << built[u].name;
    }
  }
}

}  // namespace
}  // namespace strata::models
