#include "optim/sgd.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "offload/memory_stats.h"
#include "tensor/cuda.h"

#ifdef STRATA_OPTIM_HAVE_CUDA
#include "optim/cuda/sgd_cuda.h"
#endif

namespace strata::optim {

namespace {

constexpr int64_t kSgdChunk = int64_t{1} << 15;

struct SgdScalars {
  float weight_decay, momentum, one_minus_dampening, lr;
  bool first, nesterov;
};

// Plain loops the compiler vectorises for the baseline ISA; the update is memory-bound.
void sgd_range(float* __restrict p, const float* __restrict g, float* __restrict buf,
               const SgdScalars& s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    // Like PyTorch, no decay term at all when it is zero (0 * inf would be NaN).
    float d = s.weight_decay != 0.f ? g[i] + s.weight_decay * p[i] : g[i];
    if (buf != nullptr) {
      const float b = s.first ? d : s.momentum * buf[i] + s.one_minus_dampening * d;
      buf[i] = b;
      d = s.nesterov ? d + s.momentum * b : b;
    }
    p[i] = p[i] - s.lr * d;
  }
}

void sgd_update(float* p, const float* g, float* buf, const SgdScalars& s, int64_t n) {
  const int64_t chunks = (n + kSgdChunk - 1) / kSgdChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kSgdChunk;
    sgd_range(p + begin, g + begin, buf == nullptr ? nullptr : buf + begin, s,
              std::min(kSgdChunk, n - begin));
  }
}

std::vector<std::string> state_names(const SgdConfig& c) {
  if (c.momentum == 0.0) return {};
  return {"momentum_buffer"};
}

}  // namespace

Sgd::Sgd(std::vector<ParamGroup> groups, const SgdConfig& config)
    : Optimizer(std::move(groups), state_names(config)), config_(config) {
  const SgdConfig& c = config_;
  if (!(c.lr >= 0)) user_error("SGD: lr must be >= 0, got {}", c.lr);
  if (!(c.momentum >= 0)) user_error("SGD: momentum must be >= 0, got {}", c.momentum);
  if (!(c.weight_decay >= 0)) user_error("SGD: weight_decay must be >= 0, got {}", c.weight_decay);
  if (c.nesterov && (c.momentum <= 0 || c.dampening != 0))
    user_error(
        "SGD: nesterov momentum needs momentum > 0 and dampening 0 (got momentum {}, "
        "dampening {})",
        c.momentum, c.dampening);
}

tensor::Tensor Sgd::momentum_buffer(size_t group) const {
  if (config_.momentum == 0.0) return {};
  return state(group, 0);
}

void Sgd::step(double lr) {
  if (!(lr >= 0) || !std::isfinite(lr)) user_error("SGD: learning rate must be >= 0, got {}", lr);
  const SgdConfig& c = config_;
  SgdScalars s{static_cast<float>(c.weight_decay),
               static_cast<float>(c.momentum),
               static_cast<float>(1.0 - c.dampening),
               static_cast<float>(lr),
               /*first=*/step_ == 0,
               c.nesterov};
  const float scale = grad_scale_;
  grad_scale_ = 1.f;
  if (device_.is_cuda()) {
    if (!has_fence()) {
      step_cuda(s.weight_decay, s.momentum, s.one_minus_dampening, s.lr, s.first, scale, 0,
                groups_.size());
    } else {
      for (size_t gi = 0; gi < groups_.size(); ++gi) {  // Note [Group fence]
        fence(gi, true);
        step_cuda(s.weight_decay, s.momentum, s.one_minus_dampening, s.lr, s.first, scale, gi,
                  gi + 1);
        fence(gi, false);
      }
    }
    ++step_;
    return;
  }
  SgdScalars no_decay = s;
  no_decay.weight_decay = 0.f;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    fence(gi, true);  // Note [Group fence]
    const ParamGroup& g = groups_[gi];
    float* p = g.param.data<float>();
    // Note [Mixed precision] (parallel/engine.h): f32(grad) * scale, whole group at once (SGD is
    // not the mixed-precision workhorse; AdamW widens in bounded blocks).
    tensor::Tensor widened;
    if (g.grad.dtype() != DType::F32 || scale != 1.f) {
      offload::CategoryScope ws(offload::Category::Workspace);
      widened = g.grad.to(DType::F32).contiguous();
      if (g.grad.dtype() == DType::F32) widened = widened.clone();
      float* w = widened.data<float>();
      for (int64_t i = 0; i < widened.numel(); ++i) w[i] = w[i] * scale;
    }
    const float* grad = widened.defined() ? widened.data<float>() : g.grad.data<float>();
    float* buf = c.momentum == 0.0 ? nullptr : state(gi, 0).data<float>();
    for (const Run& r : runs(gi)) {
      sgd_update(p + r.offset, grad + r.offset, buf == nullptr ? nullptr : buf + r.offset,
                 r.decay ? s : no_decay, r.numel);
    }
    if (g.low_precision_copy.defined()) tensor::Tensor(g.low_precision_copy).copy_(g.param);
    fence(gi, false);
  }
  ++step_;
}

// Note [CUDA SGD] (optim/cuda/sgd_cuda.h): every run of every group in one launcher call on the
// backend's compute stream, in order with the backward that wrote the gradients. The decay-free
// runs take the same scalars with the weight-decay flag off, which is the CPU's no_decay.
void Sgd::step_cuda(float weight_decay, float momentum, float one_minus_dampening, float lr,
                    bool first, float scale, size_t g0, size_t g1) {
#ifdef STRATA_OPTIM_HAVE_CUDA
  std::vector<cuda::SgdCudaTensor> list;
  double bytes = 0;  // param read and written, grad read, buffer read and written, copy written
  for (size_t gi = g0; gi < g1; ++gi) {
    const ParamGroup& g = groups_[gi];
    const size_t grad_bytes = dtype_size(g.grad.dtype());
    const bool copy = g.low_precision_copy.defined();
    float* buf = config_.momentum == 0.0 ? nullptr : state(gi, 0).data<float>();
    for (const Run& r : runs(gi)) {
      cuda::SgdCudaTensor t;
      t.param = g.param.data<float>() + r.offset;
      t.grad = static_cast<const char*>(g.grad.data_ptr()) + r.offset * grad_bytes;
      t.grad_dtype = static_cast<int>(g.grad.dtype());
      t.momentum_buffer = buf == nullptr ? nullptr : buf + r.offset;
      if (copy) {
        t.model_copy = static_cast<char*>(g.low_precision_copy.data_ptr()) +
                       r.offset * dtype_size(g.low_precision_copy.dtype());
        t.copy_dtype = static_cast<int>(g.low_precision_copy.dtype());
      }
      t.numel = r.numel;
      t.weight_decay = r.decay;
      list.push_back(t);
      bytes +=
          static_cast<double>(r.numel) * (8.0 + grad_bytes + (buf ? 8.0 : 0.0) +
                                          (copy ? dtype_size(g.low_precision_copy.dtype()) : 0));
    }
  }
  if (list.empty()) return;
  const cuda::SgdCudaScalars cs{.weight_decay = weight_decay,
                                .momentum = momentum,
                                .one_minus_dampening = one_minus_dampening,
                                .lr = lr,
                                .grad_scale = scale,
                                .first = first,
                                .nesterov = config_.nesterov};
  tensor::CudaProfileScope prof("sgd", 0.0, bytes);
  const int rc = cuda::launch_sgd_multi_tensor(list.data(), static_cast<int>(list.size()), cs,
                                               tensor::cuda_current_stream());
  STRATA_CHECK(rc == 0, "SGD: the CUDA step over {} buffers failed to launch (code {})",
               list.size(), rc);
#else
  (void)weight_decay, (void)momentum, (void)one_minus_dampening, (void)lr, (void)first, (void)scale;
  (void)g0, (void)g1;
  user_error("SGD: the parameters are on {} but this build has no CUDA SGD", device_.str());
#endif
}

}  // namespace strata::optim
