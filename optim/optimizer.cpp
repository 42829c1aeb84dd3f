#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>

#include "core/error.h"
#include "offload/memory_stats.h"

namespace strata::optim {

namespace {

constexpr int64_t kFillChunk = int64_t{1} << 16;

void fill_zero(float* p, int64_t n) {
  const int64_t chunks = (n + kFillChunk - 1) / kFillChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kFillChunk;
    std::fill(p + begin, p + std::min(begin + kFillChunk, n), 0.f);
  }
}

// Note [Optimizer devices]: every tensor of every group on one device, the CPU or one GPU.
void validate_group(const ParamGroup& g, size_t index, Device device) {
  if (!is_flat(g.param) || g.param.dtype() != DType::F32)
    user_error("parameter group {}: param must be a 1-d contiguous f32 tensor, got {}", index,
               g.param.defined() ? g.param.str() : "an undefined tensor");
  if (!is_flat(g.grad) || !is_floating(g.grad.dtype()) || g.grad.numel() != g.param.numel())
    user_error(
        "parameter group {}: grad must be a 1-d contiguous f32, bf16 or f16 tensor of {} "
        "elements like param, got {}",
        index, g.param.numel(), g.grad.defined() ? g.grad.str() : "an undefined tensor");
  if (g.low_precision_copy.defined()) {
    const tensor::Tensor& lp = g.low_precision_copy;
    if (!is_flat(lp) || (lp.dtype() != DType::BF16 && lp.dtype() != DType::F16) ||
        lp.numel() != g.param.numel())
      user_error(
          "parameter group {}: low_precision_copy must be a 1-d contiguous bf16 or f16 "
          "tensor of {} elements, got {}",
          index, g.param.numel(), lp.str());
  }
  auto check_device = [&](const tensor::Tensor& t, const char* what) {
    if (t.defined() && t.device() != device)
      user_error(
          "parameter group {}: {} is on {} but the optimizer's tensors are on {}: every "
          "param, grad and model copy of every group must live on one device (move the "
          "model's flat units there first: models::move_flat_units)",
          index, what, t.device().str(), device.str());
  };
  check_device(g.param, "param");
  check_device(g.grad, "grad");
  check_device(g.low_precision_copy, "low_precision_copy");
}

}  // namespace

bool is_flat(const tensor::Tensor& t) {
  return t.defined() && t.ndim() == 1 && t.is_contiguous();
}

std::vector<DecayRun> decay_runs(std::vector<Segment> segments, int64_t numel,
                                 std::string_view owner) {
  for (const Segment& s : segments) {
    if (s.offset < 0 || s.numel < 0 || s.offset + s.numel > numel)
      user_error("{}: segment '{}' [{}, {}) lies outside the {}-element buffer", owner, s.name,
                 s.offset, s.offset + s.numel, numel);
  }
  std::stable_sort(segments.begin(), segments.end(),
                   [](const Segment& a, const Segment& b) { return a.offset < b.offset; });
  std::vector<DecayRun> runs;
  auto push = [&runs](int64_t offset, int64_t n, bool decay) {
    if (n == 0) return;
    if (!runs.empty() && runs.back().decay == decay) {
      runs.back().numel += n;
    } else {
      runs.push_back({offset, n, decay});
    }
  };
  int64_t cursor = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    if (s.offset < cursor)
      user_error("{}: segments '{}' and '{}' overlap", owner, segments[i - 1].name, s.name);
    push(cursor, s.offset - cursor, false);
    push(s.offset, s.numel, s.decay);
    cursor = s.offset + s.numel;
  }
  push(cursor, numel - cursor, false);
  return runs;
}

Optimizer::Optimizer(std::vector<ParamGroup> groups, std::vector<std::string> state_names)
    : groups_(std::move(groups)), state_names_(std::move(state_names)) {
  if (!groups_.empty() && groups_[0].param.defined()) device_ = groups_[0].param.device();
  for (size_t g = 0; g < groups_.size(); ++g) {
    validate_group(groups_[g], g, device_);
    runs_.push_back(decay_runs(groups_[g].segments, groups_[g].param.numel(),
                               fmt::format("parameter group {}", g)));
  }

  offload::CategoryScope scope(offload::Category::Optimizer);
  for (const ParamGroup& g : groups_) {
    const int64_t n = g.param.numel();
    std::vector<tensor::Tensor> bufs;
    for (size_t k = 0; k < state_names_.size(); ++k) {
      tensor::Tensor t = tensor::Tensor::empty({n}, DType::F32, device_);
      if (device_.is_cpu()) {
        fill_zero(t.data<float>(), n);
      } else {
        t.zero_();
      }
      bufs.push_back(std::move(t));
    }
    state_.push_back(std::move(bufs));
  }
}

void Optimizer::zero_grad() {
  for (ParamGroup& g : groups_) {
    if (g.grad.dtype() == DType::F32 && g.grad.device().is_cpu()) {
      fill_zero(g.grad.data<float>(), g.grad.numel());
    } else {
      g.grad.zero_();
    }
  }
}

void Optimizer::set_grad_scale(float s) {
  if (!std::isfinite(s)) user_error("{}: gradient scale must be finite, got {}", name(), s);
  grad_scale_ = s;
}

std::vector<tensor::Tensor> Optimizer::grads() const {
  std::vector<tensor::Tensor> out;
  for (const ParamGroup& g : groups_) out.push_back(g.grad);
  return out;
}

OptimizerState Optimizer::state_dict() const {
  OptimizerState s;
  s.step = step_;
  for (size_t g = 0; g < state_.size(); ++g)
    for (size_t k = 0; k < state_names_.size(); ++k)
      s.tensors.push_back({fmt::format("group{}.{}", g, state_names_[k]), state_[g][k]});
  return s;
}

void Optimizer::load_state_dict(const OptimizerState& state) {
  // Validate everything before copying anything, so a bad checkpoint leaves the state intact.
  if (state.step < 0) user_error("{} state has a negative step count ({})", name(), state.step);
  std::unordered_map<std::string, const tensor::Tensor*> given;
  for (const NamedTensor& t : state.tensors) {
    if (!given.emplace(t.name, &t.tensor).second)
      user_error("{} state lists '{}' twice", name(), t.name);
  }
  std::vector<std::pair<const tensor::Tensor*, const tensor::Tensor*>> copies;  // (src, dst)
  for (size_t g = 0; g < state_.size(); ++g) {
    for (size_t k = 0; k < state_names_.size(); ++k) {
      const std::string key = fmt::format("group{}.{}", g, state_names_[k]);
      auto it = given.find(key);
      if (it == given.end())
        user_error(
            "{} state has no '{}': the checkpoint was written by a different optimizer or "
            "for a different model/partitioning",
            name(), key);
      const tensor::Tensor& src = *it->second;
      const tensor::Tensor& dst = state_[g][k];
      if (!src.defined() || src.dtype() != DType::F32 || !src.is_contiguous() ||
          src.shape() != dst.shape())
        user_error(
            "{} state '{}' is {}, expected {}: the checkpoint does not match this "
            "model/partitioning",
            name(), key, src.defined() ? src.str() : "undefined", dst.str());
      copies.emplace_back(&src, &dst);
      given.erase(it);
    }
  }
  if (!given.empty())
    user_error("{} state has unexpected entry '{}' ({} groups here)", name(), given.begin()->first,
               state_.size());
  // Host to host by memcpy; across devices (a host checkpoint into GPU state) through copy_.
  for (auto [src, dst] : copies) {
    if (src->device() == dst->device() && src->data_ptr() == dst->data_ptr()) continue;
    if (src->device().is_cpu() && dst->device().is_cpu()) {
      std::memcpy(dst->data_ptr(), src->data_ptr(), dst->nbytes());
    } else {
      tensor::Tensor(*dst).copy_(*src);  // a handle to the live buffer
    }
  }
  step_ = state.step;
}

}  // namespace strata::optim
