// Per-op CPU micro-benchmarks (Google Benchmark) at GPT-2 124M shapes (B*T = 1024, C = 768).
//
// Most non-GEMM ops are memory-bound, so each reports the bytes it must move (inputs read once,
// outputs written once) as bytes_per_second; BM_MemcpyReference moves the same kind of traffic
// with memcpy in the same run, and the ratio of an op's GB/s to it says how close the op runs
// to the machine's copy bandwidth. Attention is compute-bound and reports GFLOP/s instead.
//
// usage: bench_ops [--benchmark_filter=...]  (any Google Benchmark flag)
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "tensor/ops.h"

namespace {

using namespace strata;
using tensor::Tensor;

constexpr int64_t kRows = 1024, kC = 768, kVocab = 50304;

Tensor rand(const tensor::Shape& s, uint64_t salt) {
  return tensor::randn(s, {7, salt});
}

void BM_MemcpyReference(benchmark::State& state) {
  const size_t n = static_cast<size_t>(kRows * 4 * kC);
  std::vector<float> a(n, 1.f), b(n);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), n * sizeof(float));
    benchmark::DoNotOptimize(b.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(2 * n * sizeof(float)));
}
BENCHMARK(BM_MemcpyReference)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_Gelu(benchmark::State& state) {
  Tensor x = rand({kRows, 4 * kC}, 1);
  for (auto _ : state) benchmark::DoNotOptimize(tensor::gelu(x).data_ptr());
  state.SetBytesProcessed(state.iterations() * 2 * static_cast<int64_t>(x.nbytes()));
}
BENCHMARK(BM_Gelu)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_GeluBackward(benchmark::State& state) {
  Tensor x = rand({kRows, 4 * kC}, 1), dy = rand({kRows, 4 * kC}, 2);
  for (auto _ : state)
    benchmark::DoNotOptimize(tensor::unary_backward(tensor::UnaryOp::Gelu, x, dy).data_ptr());
  state.SetBytesProcessed(state.iterations() * 3 * static_cast<int64_t>(x.nbytes()));
}
BENCHMARK(BM_GeluBackward)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_Add(benchmark::State& state) {
  Tensor a = rand({kRows, kC}, 1), b = rand({kRows, kC}, 2);
  for (auto _ : state) benchmark::DoNotOptimize(tensor::add(a, b).data_ptr());
  state.SetBytesProcessed(state.iterations() * 3 * static_cast<int64_t>(a.nbytes()));
}
BENCHMARK(BM_Add)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_LayerNorm(benchmark::State& state) {
  Tensor x = rand({kRows, kC}, 1), w = rand({kC}, 2), b = rand({kC}, 3);
  for (auto _ : state) benchmark::DoNotOptimize(tensor::layernorm(x, w, b, 1e-5f).y.data_ptr());
  state.SetBytesProcessed(state.iterations() * 2 * static_cast<int64_t>(x.nbytes()));
}
BENCHMARK(BM_LayerNorm)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_LayerNormBackward(benchmark::State& state) {
  Tensor x = rand({kRows, kC}, 1), w = rand({kC}, 2), b = rand({kC}, 3), dy = rand({kRows, kC}, 4);
  tensor::NormResult r = tensor::layernorm(x, w, b, 1e-5f);
  for (auto _ : state)
    benchmark::DoNotOptimize(tensor::layernorm_backward(dy, x, w, r.mean, r.rstd).dx.data_ptr());
  state.SetBytesProcessed(state.iterations() * 3 * static_cast<int64_t>(x.nbytes()));
}
BENCHMARK(BM_LayerNormBackward)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_Softmax(benchmark::State& state) {
  Tensor x = rand({64, kVocab}, 1);
  for (auto _ : state) benchmark::DoNotOptimize(tensor::softmax(x).data_ptr());
  state.SetBytesProcessed(state.iterations() * 2 * static_cast<int64_t>(x.nbytes()));
}
BENCHMARK(BM_Softmax)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_CrossEntropy(benchmark::State& state) {
  Tensor logits = rand({256, kVocab}, 1);
  std::vector<int64_t> t(256);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int64_t>(i * 131 % 50257);
  Tensor targets = tensor::from_ints(t, {256});
  for (auto _ : state)
    benchmark::DoNotOptimize(tensor::cross_entropy(logits, targets).lse.data_ptr());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(logits.nbytes()));
}
BENCHMARK(BM_CrossEntropy)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_CrossEntropyBackward(benchmark::State& state) {
  Tensor logits = rand({256, kVocab}, 1);
  std::vector<int64_t> t(256);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int64_t>(i * 131 % 50257);
  Tensor targets = tensor::from_ints(t, {256});
  tensor::CrossEntropyResult r = tensor::cross_entropy(logits, targets);
  Tensor dloss = tensor::full({256}, 1.0 / 256);
  for (auto _ : state)
    benchmark::DoNotOptimize(
        tensor::cross_entropy_backward(logits, targets, r.lse, dloss).data_ptr());
  state.SetBytesProcessed(state.iterations() * 2 * static_cast<int64_t>(logits.nbytes()));
}
BENCHMARK(BM_CrossEntropyBackward)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_EmbeddingBackward(benchmark::State& state) {
  std::vector<int64_t> ids(kRows);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i * 7919 % 50257);
  Tensor id = tensor::from_ints(ids, {kRows}), dout = rand({kRows, kC}, 2);
  Tensor dw = tensor::zeros({kVocab, kC});
  for (auto _ : state) tensor::embedding_backward(id, dout, dw);
  state.SetBytesProcessed(state.iterations() * 3 * static_cast<int64_t>(dout.nbytes()));
}
BENCHMARK(BM_EmbeddingBackward)->Unit(benchmark::kMicrosecond)->UseRealTime();

// Causal attention, GPT-2 124M head shape; flops counted for the causal half (2 GEMMs forward,
// 4 backward after recomputation's extra one is excluded).
void BM_Attention(benchmark::State& state) {
  const int64_t B = 1, H = 12, T = state.range(0), D = 64;
  Tensor q = rand({B, H, T, D}, 1), k = rand({B, H, T, D}, 2), v = rand({B, H, T, D}, 3);
  for (auto _ : state) benchmark::DoNotOptimize(tensor::attention(q, k, v, true).out.data_ptr());
  const double flops = 2.0 * 2.0 * B * H * T * T * D / 2.0;
  state.counters["GFLOP/s"] = benchmark::Counter(
      flops * static_cast<double>(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Attention)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_AttentionBackward(benchmark::State& state) {
  const int64_t B = 1, H = 12, T = state.range(0), D = 64;
  Tensor q = rand({B, H, T, D}, 1), k = rand({B, H, T, D}, 2), v = rand({B, H, T, D}, 3);
  Tensor dout = rand({B, H, T, D}, 4);
  tensor::AttentionResult r = tensor::attention(q, k, v, true);
  for (auto _ : state)
    benchmark::DoNotOptimize(
        tensor::attention_backward(q, k, v, r.out, r.lse, dout, true).dq.data_ptr());
  const double flops = 2.0 * 5.0 * B * H * T * T * D / 2.0;  // S, dP, dV, dQ, dK
  state.counters["GFLOP/s"] = benchmark::Counter(
      flops * static_cast<double>(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_AttentionBackward)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
