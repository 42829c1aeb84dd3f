#include "optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "offload/memory_stats.h"
#include "tensor/cuda.h"

#ifdef STRATA_OPTIM_HAVE_CUDA
#include "optim/cuda/adamw_cuda.h"
#endif

namespace strata::optim {

namespace {
// Elements of gradient widened at a time (4 MiB of f32 scratch).
constexpr int64_t kWidenBlock = int64_t{1} << 20;
}  // namespace

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWConfig& config)
    : Optimizer(std::move(groups), {"exp_avg", "exp_avg_sq"}),
      config_(config),
      isa_(default_adamw_isa()) {
  const AdamWConfig& c = config_;
  if (!(c.lr >= 0)) user_error("AdamW: lr must be >= 0, got {}", c.lr);
  if (!(c.beta1 >= 0 && c.beta1 < 1)) user_error("AdamW: beta1 must be in [0, 1), got {}", c.beta1);
  if (!(c.beta2 >= 0 && c.beta2 < 1)) user_error("AdamW: beta2 must be in [0, 1), got {}", c.beta2);
  if (!(c.eps >= 0)) user_error("AdamW: eps must be >= 0, got {}", c.eps);
  if (!(c.weight_decay >= 0))
    user_error("AdamW: weight_decay must be >= 0, got {}", c.weight_decay);
}

void AdamW::set_isa(Isa isa) {
  if (!adamw_isa_available(isa))
    user_error("AdamW kernel {} is not available on this CPU or build", isa_name(isa));
  isa_ = isa;
}

void AdamW::step(double lr) {
  if (!(lr >= 0) || !std::isfinite(lr)) user_error("AdamW: learning rate must be >= 0, got {}", lr);
  ++step_;
  const AdamWConfig& c = config_;
  const AdamWScalars decay = adamw_scalars(lr, c.beta1, c.beta2, c.eps, c.weight_decay, step_);
  const float scale = grad_scale_;
  grad_scale_ = 1.f;
  if (device_.is_cuda()) {
    if (!has_fence()) {
      step_cuda(decay, scale, 0, groups_.size());
      return;
    }
    for (size_t gi = 0; gi < groups_.size(); ++gi) {  // Note [Group fence]
      fence(gi, true);
      step_cuda(decay, scale, gi, gi + 1);
      fence(gi, false);
    }
    return;
  }
  const AdamWScalars no_decay = adamw_scalars(lr, c.beta1, c.beta2, c.eps, 0.0, step_);
  // Note [Mixed precision] (parallel/engine.h): a bf16/f16 gradient, or any gradient with a
  // scale, reaches the kernel as f32(grad) * scale through a bounded scratch block.
  tensor::Tensor scratch;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    fence(gi, true);  // Note [Group fence]
    const ParamGroup& g = groups_[gi];
    const bool widen = g.grad.dtype() != DType::F32 || scale != 1.f;
    if (widen && !scratch.defined()) {
      offload::CategoryScope ws(offload::Category::Workspace);
      scratch = tensor::Tensor::empty({kWidenBlock}, DType::F32);
    }
    float* param = g.param.data<float>();
    float* m = exp_avg(gi).data<float>();
    float* v = exp_avg_sq(gi).data<float>();
    auto* lp = g.low_precision_copy.defined()
                   ? static_cast<uint16_t*>(g.low_precision_copy.data_ptr())
                   : nullptr;
    for (const Run& r : runs(gi)) {
      for (int64_t at = 0; at < r.numel; at += widen ? kWidenBlock : r.numel) {
        const int64_t off = r.offset + at;
        const int64_t n = widen ? std::min(kWidenBlock, r.numel - at) : r.numel;
        AdamWBuffers b;
        b.param = param + off;
        if (widen) {
          tensor::Tensor dst = scratch.narrow(0, 0, n);
          dst.copy_(g.grad.narrow(0, off, n));
          float* d = dst.data<float>();
          if (scale != 1.f) {
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 16))
            for (int64_t i = 0; i < n; ++i) d[i] = d[i] * scale;
          }
          b.grad = d;
        } else {
          b.grad = g.grad.data<float>() + off;
        }
        b.exp_avg = m + off;
        b.exp_avg_sq = v + off;
        b.low_precision = lp == nullptr ? nullptr : lp + off;
        if (lp != nullptr) b.low_precision_dtype = g.low_precision_copy.dtype();
        b.numel = n;
        adamw_update(b, r.decay ? decay : no_decay, isa_);
      }
    }
    fence(gi, false);
  }
}

// Note [CUDA AdamW] (optim/cuda/adamw_cuda.h): every run of every group in one launcher call on
// the backend's compute stream, in order with the backward that wrote the gradients. The
// decay-free runs take the same scalars with the weight-decay flag off, which is what the CPU
// path's no_decay scalars amount to (every other field is independent of weight_decay).
void AdamW::step_cuda(const AdamWScalars& s, float scale, size_t g0, size_t g1) {
#ifdef STRATA_OPTIM_HAVE_CUDA
  std::vector<cuda::AdamWCudaTensor> list;
  for (size_t gi = g0; gi < g1; ++gi) {
    const ParamGroup& g = groups_[gi];
    const size_t grad_bytes = dtype_size(g.grad.dtype());
    const bool copy = g.low_precision_copy.defined();
    for (const Run& r : runs(gi)) {
      cuda::AdamWCudaTensor t;
      t.param = g.param.data<float>() + r.offset;
      t.grad = static_cast<const char*>(g.grad.data_ptr()) + r.offset * grad_bytes;
      t.grad_dtype = static_cast<int>(g.grad.dtype());
      t.exp_avg = exp_avg(gi).data<float>() + r.offset;
      t.exp_avg_sq = exp_avg_sq(gi).data<float>() + r.offset;
      if (copy) {
        t.model_copy = static_cast<char*>(g.low_precision_copy.data_ptr()) +
                       r.offset * dtype_size(g.low_precision_copy.dtype());
        t.copy_dtype = static_cast<int>(g.low_precision_copy.dtype());
      }
      t.numel = r.numel;
      t.weight_decay = r.decay;
      list.push_back(t);
    }
  }
  if (list.empty()) return;
  const cuda::AdamWCudaScalars cs{.decay_factor = s.decay_factor,
                                  .beta1 = s.beta1,
                                  .one_minus_beta1 = s.one_minus_beta1,
                                  .beta2 = s.beta2,
                                  .one_minus_beta2 = s.one_minus_beta2,
                                  .step_size = s.step_size,
                                  .bias_correction2_sqrt = s.bias_correction2_sqrt,
                                  .eps = s.eps,
                                  .grad_scale = scale};
  // Bytes moved: master, exp_avg and exp_avg_sq read and written, the gradient read, the copy
  // written (Note [CUDA op profiler]).
  double bytes = 0;
  for (const cuda::AdamWCudaTensor& t : list)
    bytes += static_cast<double>(t.numel) *
             (24.0 + dtype_size(static_cast<DType>(t.grad_dtype)) +
              (t.model_copy ? dtype_size(static_cast<DType>(t.copy_dtype)) : 0));
  tensor::CudaProfileScope prof("adamw", 0.0, bytes);
  const int rc = cuda::launch_adamw_multi_tensor(list.data(), static_cast<int>(list.size()), cs,
                                                 tensor::cuda_current_stream());
  STRATA_CHECK(rc == 0, "AdamW: the fused CUDA step over {} buffers failed to launch (code {})",
               list.size(), rc);
#else
  (void)s;
  (void)scale;
  (void)g0;
  (void)g1;
  user_error(
      "AdamW: the parameters are on {} but this build has no CUDA AdamW; rebuild with "
      "the CUDA toolkit (docs/gpu.md)",
      device_.str());
#endif
}

}  // namespace strata::optim
