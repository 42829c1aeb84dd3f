// The KV cache and the sampler on the GPU against the full forward and the CPU's draws. Every
// test skips itself when no device is visible; there is no GPU in CI.
#include "tests/cuda/train_gpu_test_util.h"

namespace strata {
namespace {

using namespace train_gpu_test;

// Note [KV cache] on the GPU, as `generate --device cuda` and `train`'s samples use it: tokens fed
// in chunks (a 20-token prompt, single tokens, longer runs, up to the whole 64-position context)
// through forward_cached give the rows of the full GPU forward at those positions, in f32 (to
// 1e-5) and bf16 (to 2e-2 of the largest logit), for GPT-2 with head dims 16 and 64 (the SIMT
// and the tensor-core attention, queries fewer than keys) and LLaMA with grouped k/v heads, and
// so does each chunk's last position alone (last_only, in a second cache); the f32 GPU cache
// agrees with the CPU's cached forward to 1e-4 of the largest logit. The cache lives on the GPU,
// charged to its activations, and is freed with the cache.
TEST(GpuKvCache, CachedLogitsMatchTheFullForward) {
  SKIP_WITHOUT_GPU();
  struct Case {
    const char* preset;
    std::map<std::string, std::string> overrides;
    int64_t kv_width;  // k/v heads x head dim
  };
  const std::vector<Case> cases{
      {"gpt2-tiny", {}, 64}, {"gpt2-tiny", {{"n_head", "1"}}, 64}, {"llama-tiny", {}, 32}};
  const std::vector<int64_t> chunks{20, 1, 1, 17, 1, 24};
  const int64_t B = 2, T = 64;
  std::vector<int64_t> v;
  for (int64_t i = 0; i < B * T; ++i) v.push_back((i * 37 + i / 5) % 256);
  const Tensor ids = tensor::from_ints(v, {B, T}, DType::I32);
  autograd::NoGradGuard no_grad;
  auto& stats = offload::MemoryStats::global();
  const auto gpu_activations = [&] {
    return stats.usage(offload::Tier::Gpu, offload::Category::Activation).current;
  };
  for (const Case& c : cases)
    for (DType dtype : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(fmt::format("{} {} {}", c.preset, c.overrides.empty() ? "" : "n_head 1",
                               dtype_name(dtype)));
      models::ModelOptions o;
      o.seed = 3;
      o.overrides = c.overrides;
      auto cpu = models::ModelRegistry::global().create(c.preset, o);
      auto gpu = models::ModelRegistry::global().create(c.preset, o);
      if (dtype != DType::F32) models::cast_flat_units(gpu->flat_units(), dtype);
      models::move_flat_units(gpu->flat_units(), kGpu);
      cpu->eval();
      gpu->eval();
      const std::vector<float> full =
          tensor::to_float_vector(gpu->forward(ids.to(kGpu)).data().to(Device::cpu()));
      double largest = 0;
      for (float x : full) largest = std::max(largest, std::fabs(static_cast<double>(x)));
      ASSERT_GT(largest, 0.0);
      const int64_t before = gpu_activations();
      {
        models::KvCache gpu_cache, cpu_cache, last_cache;
        const int64_t Vp = gpu->padded_vocab_size();
        int64_t at = 0;
        double worst = 0, worst_cpu = 0;
        for (int64_t n : chunks) {
          const Tensor chunk = ids.narrow(1, at, n).contiguous();
          const std::vector<float> got = tensor::to_float_vector(
              gpu->forward_cached(chunk.to(kGpu), gpu_cache).data().to(Device::cpu()));
          // The last position alone (Note [Last-position logits]): the norm and head on a
          // strided [B, 1, C] view of the hidden states.
          const Tensor last =
              gpu->forward_cached(chunk.to(kGpu), last_cache, /*last_only=*/true).data();
          ASSERT_EQ(last.shape(), tensor::Shape({B, 1, Vp}));
          const std::vector<float> last_v = tensor::to_float_vector(last.to(Device::cpu()));
          for (int64_t b = 0; b < B; ++b)
            for (int64_t j = 0; j < Vp; ++j)
              worst = std::max(
                  worst, std::fabs(static_cast<double>(last_v[static_cast<size_t>(b * Vp + j)]) -
                                   full[static_cast<size_t>((b * T + at + n - 1) * Vp + j)]));
          const std::vector<float> on_cpu =
              tensor::to_float_vector(cpu->forward_cached(chunk, cpu_cache).data());
          for (int64_t b = 0; b < B; ++b)
            for (int64_t t = 0; t < n; ++t)
              for (int64_t j = 0; j < Vp; ++j) {
                const double g = got[static_cast<size_t>((b * n + t) * Vp + j)];
                const double f = full[static_cast<size_t>((b * T + at + t) * Vp + j)];
                worst = std::max(worst, std::fabs(g - f));
                worst_cpu = std::max(
                    worst_cpu, std::fabs(g - on_cpu[static_cast<size_t>((b * n + t) * Vp + j)]));
              }
          at += n;
        }
        EXPECT_EQ(gpu_cache.length(), T);
        if (dtype == DType::F32) {
          EXPECT_LE(worst, 1e-5 * std::max(1.0, largest));
          EXPECT_LE(worst_cpu, 1e-4 * largest);
        } else {
          EXPECT_LE(worst, 2e-2 * largest);
        }
        fmt::print(
            "{} {}: largest logit {:.3g}, |cached - full| <= {:.3g}, |gpu - cpu| <= {:.3g}\n",
            c.preset, dtype_name(dtype), largest, worst, worst_cpu);
        // Two [B, T, heads, D] buffers per layer, k and v, on the GPU.
        const int64_t layers = gpu_cache.layers();
        EXPECT_EQ(layers, 2);
        EXPECT_GE(gpu_activations() - before,
                  layers * 2 * B * T * c.kv_width * static_cast<int64_t>(dtype_size(dtype)));
      }
      EXPECT_EQ(gpu_activations(), before) << "the cache's buffers outlived it";
    }
}

// Batched sampling on the GPU (Note [Batched sampling]): each row's logits are read from a
// strided [B, vocab] view of the device's logits, the KV cache holds B rows. In f32 the GPU's
// samples are the CPU's, cached and not, for both families, past the context too; the rows differ.
TEST(GpuSampler, ABatchDrawsTheCpusSamples) {
  SKIP_WITHOUT_GPU();
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    SCOPED_TRACE(preset);
    models::ModelOptions o;
    o.seed = 6;
    // A short context so 4 + 12 tokens pass it; LLaMA's init raised so its draws spread.
    o.overrides = std::string(preset) == "gpt2-tiny"
                      ? std::map<std::string, std::string>{{"n_positions", "10"}}
                      : std::map<std::string, std::string>{{"max_position_embeddings", "10"},
                                                           {"initializer_range", "0.2"}};
    auto cpu = models::ModelRegistry::global().create(preset, o);
    auto gpu = models::ModelRegistry::global().create(preset, o);
    models::move_flat_units(gpu->flat_units(), kGpu);
    sampling::SampleOptions so;
    so.max_new_tokens = 12;
    so.temperature = 1.0;
    so.top_k = 0;
    so.seed = 9;
    const std::vector<int32_t> prompt{3, 1, 4, 1};
    const auto want = sampling::sample_batch(*cpu, prompt, so, 3);
    EXPECT_EQ(sampling::sample_batch(*gpu, prompt, so, 3), want);
    so.kv_cache = false;
    EXPECT_EQ(sampling::sample_batch(*gpu, prompt, so, 3), want);
    EXPECT_NE(want[0], want[1]);
    EXPECT_NE(want[1], want[2]);
    // A row that stops leaves the batch, its cache rows dropped on the device (Note [Dropping
    // cache rows]); the others go on drawing the CPU's tokens.
    so.stop_token = want[1][2];
    so.kv_cache = true;
    const auto want_stopped = sampling::sample_batch(*cpu, prompt, so, 3);
    EXPECT_LE(want_stopped[1].size(), 3u);
    EXPECT_EQ(sampling::sample_batch(*gpu, prompt, so, 3), want_stopped);
    so.kv_cache = false;
    EXPECT_EQ(sampling::sample_batch(*gpu, prompt, so, 3), want_stopped);
  }
}

// Note [Device candidates]: greedy and top-k draws on the GPU bring each row's top candidates to
// the host (the top-k kernel, Note [CUDA top-k]) instead of its whole logits, and draw the CPU's
// tokens, in f32, for both families, with the nucleus too, cached and not.
TEST(GpuSampler, DrawsFromTheDevicesCandidatesTheCpusTokens) {
  SKIP_WITHOUT_GPU();
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    SCOPED_TRACE(preset);
    models::ModelOptions o;
    o.seed = 7;
    if (std::string(preset) == "llama-tiny") o.overrides = {{"initializer_range", "0.2"}};
    auto cpu = models::ModelRegistry::global().create(preset, o);
    auto gpu = models::ModelRegistry::global().create(preset, o);
    models::move_flat_units(gpu->flat_units(), kGpu);
    const std::vector<int32_t> prompt{2, 7, 1, 8};
    struct Draw {
      double temperature;
      int64_t top_k;
      double top_p;
    };
    for (const Draw& d : {Draw{0.0, 0, 1.0}, Draw{1.0, 5, 1.0}, Draw{1.5, 9, 0.8}}) {
      SCOPED_TRACE(::testing::Message()
                   << "T " << d.temperature << " top_k " << d.top_k << " top_p " << d.top_p);
      sampling::SampleOptions so;
      so.max_new_tokens = 10;
      so.temperature = d.temperature;
      so.top_k = d.top_k;
      so.top_p = d.top_p;
      so.seed = 3;
      ASSERT_GT(sampling::detail::device_candidates(so, gpu->vocab_size(), kGpu), 0);
      const auto want = sampling::sample_batch(*cpu, prompt, so, 3);
#if defined(STRATA_CUDA_EMULATION)
      // Greedy draws take the one-pass kernel (Note [CUDA top-k]).
      const std::string kernel = d.top_k == 0 ? "top_1_kernel" : "top_k_kernel";
      const uint64_t before = cuda_emu::launches_of(kernel);
#endif
      EXPECT_EQ(sampling::sample_batch(*gpu, prompt, so, 3), want);
#if defined(STRATA_CUDA_EMULATION)
      EXPECT_EQ(cuda_emu::launches_of(kernel) - before,
                10u);  // one per step, every row in one launch
#endif
      so.kv_cache = false;
      EXPECT_EQ(sampling::sample_batch(*gpu, prompt, so, 3), want);
      if (d.temperature > 0) {
        EXPECT_NE(want[0], want[1]);
      }
    }
    // Note [Non-finite logits]: NaN weights make NaN logits, which rank first among the device's
    // candidates: a UserError, as on the CPU.
    gpu->flat_units().back().params.fill_(std::nan(""));
    for (double temperature : {0.0, 1.0}) {
      sampling::SampleOptions so;
      so.max_new_tokens = 2;
      so.temperature = temperature;
      so.top_k = 5;
      EXPECT_THROW(sampling::sample_batch(*gpu, prompt, so, 2), UserError);
    }
  }
}

}  // namespace
}  // namespace strata
