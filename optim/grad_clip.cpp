#include "optim/grad_clip.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "offload/memory_stats.h"
#include "tensor/ops.h"

namespace strata::optim {

namespace {

constexpr int64_t kNormChunk = int64_t{1} << 15;

void check_grad(const tensor::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu() || t.dtype() != DType::F32 || !t.is_contiguous())
    user_error("gradient clipping needs contiguous f32 CPU tensors, got {}",
               t.defined() ? t.str() : "an undefined tensor");
}

double sum_squares_chunk(const float* x, int64_t n) {
  // Independent accumulators for instruction-level parallelism; their order is fixed.
  double acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += static_cast<double>(x[i + k]) * x[i + k];
  for (; i < n; ++i) acc[0] += static_cast<double>(x[i]) * x[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

double sum_squares(const float* x, int64_t n) {
  const int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
  std::vector<double> partial(static_cast<size_t>(chunks));
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kNormChunk;
    partial[c] = sum_squares_chunk(x + begin, std::min(kNormChunk, n - begin));
  }
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

void scale(float* x, int64_t n, float coef) {
  const int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kNormChunk;
    const int64_t end = std::min(begin + kNormChunk, n);
    for (int64_t i = begin; i < end; ++i) x[i] *= coef;
  }
}

}  // namespace

double grad_sum_of_squares(const std::vector<tensor::Tensor>& grads) {
  // Note [GPU gradients]: GPU gradients in one batch (one device wait for all of them), added in
  // the same order as the loop below would.
  std::vector<tensor::Tensor> on_gpu;
  for (const tensor::Tensor& g : grads)
    if (g.defined() && g.device().is_cuda()) on_gpu.push_back(g);
  if (!on_gpu.empty() && on_gpu.size() == grads.size()) {
    double total = 0;
    for (double s : tensor::sum_squares_many(on_gpu)) total += s;
    return total;
  }
  double total = 0;
  for (const tensor::Tensor& g : grads) {
    if (g.defined() && g.device().is_cuda()) {
      // Note [GPU gradients]: the backend's deterministic reduction, any float dtype.
      total += tensor::sum_squares(g);
      continue;
    }
    if (g.defined() && (g.dtype() == DType::BF16 || g.dtype() == DType::F16)) {
      // Widened exactly, in bounded blocks, so the sum is that of the f32 values.
      STRATA_USER_CHECK(g.device().is_cpu() && g.is_contiguous(),
                        "gradient norm needs contiguous CPU tensors, got {}", g.str());
      constexpr int64_t kBlock = int64_t{1} << 20;
      tensor::Tensor w;
      {
        offload::CategoryScope ws(offload::Category::Workspace);
        w = tensor::Tensor::empty({std::min(kBlock, std::max<int64_t>(g.numel(), 1))}, DType::F32);
      }
      const tensor::Tensor flat = g.flatten();
      for (int64_t at = 0; at < flat.numel(); at += kBlock) {
        const int64_t n = std::min(kBlock, flat.numel() - at);
        tensor::Tensor dst = w.narrow(0, 0, n);
        dst.copy_(flat.narrow(0, at, n));
        total += sum_squares(dst.data<float>(), n);
      }
      continue;
    }
    check_grad(g);
    total += sum_squares(g.data<float>(), g.numel());
  }
  return total;
}

double global_grad_norm(const std::vector<tensor::Tensor>& grads) {
  return std::sqrt(grad_sum_of_squares(grads));
}

void scale_grads(const std::vector<tensor::Tensor>& grads, float coef) {
  for (const tensor::Tensor& g : grads) {
    if (g.defined() && g.device().is_cuda()) {
      // Note [GPU gradients]: one rounded multiply per element, like the loop below.
      tensor::Tensor(g).copy_(tensor::scale(g, coef));  // a handle to the same buffer
      continue;
    }
    check_grad(g);
    scale(g.data<float>(), g.numel(), coef);
  }
}

float clip_coefficient(double norm, double max_norm) {
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.f;
}

double clip_grad_norm(const std::vector<tensor::Tensor>& grads, double max_norm) {
  if (!(max_norm > 0)) user_error("gradient clipping: max_norm must be > 0, got {}", max_norm);
  const double norm = global_grad_norm(grads);
  if (!std::isfinite(norm)) return norm;
  const float coef = clip_coefficient(norm, max_norm);
  if (coef < 1.f) scale_grads(grads, coef);
  return norm;
}

}  // namespace strata::optim
