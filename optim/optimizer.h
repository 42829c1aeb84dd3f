#pragma once
// Optimizer: the common base of AdamW and SGD. Both work on parameter groups of flat buffers
// (docs/design.md decision 4): one fp32 parameter buffer and its gradient per unit, with named
// segments saying where each parameter lives and whether it takes weight decay.
//
// Note [Segments and weight decay]
// A group's segments must lie inside the buffer and must not overlap; they need not cover it.
// Elements outside every segment (e.g. ZeRO's alignment padding) are updated like decay=false
// elements: with zero gradient and zero state they stay exactly where they are. Which
// parameters decay is the caller's decision (typically: matrices decay; biases, norm weights
// and other 1-D parameters do not). At construction the segments are merged into maximal runs
// of equal decay flag, so a step is one kernel call per run.
//
// Note [Optimizer state]
// Per-group state buffers (AdamW's exp_avg and exp_avg_sq, SGD's momentum_buffer) are fp32,
// the size of the group, zero-initialised and allocated under Category::Optimizer (Note [Every
// byte is accounted]). state_dict() names them "group<i>.<name>" and returns views of the live
// buffers, not copies: write them out before the next step. load_state_dict() copies into the
// live buffers after checking that names, dtypes and sizes match exactly; a resumed run then
// continues bitwise as the uninterrupted one would (docs/design.md decision 9).
//
// Note [Optimizer devices]
// Every tensor of every group (param, grad, model copy) lives on ONE device: the CPU, or one
// CUDA device (`train` on the GPU moves the model's flat units there before the Engine builds
// the groups). The state buffers are allocated on that device. A group on another device is a
// user_error naming it. load_state_dict takes state on any device (a checkpoint read on the
// host) and copies it in; state_dict() returns the live buffers where they live, so a writer
// copies them to the host (save_safetensors does).
// ZeRO-Offload keeps this rule: its groups (masters, gradient and model-copy staging) all live on
// the host, and HostOffload moves gradients in and parameters out (Note [Host offload] in
// optim/host_offload.h).
//
// Note [Group fence]
// A group's parameters need not be resident between steps: ZeRO-Infinity keeps each rank's
// parameter partitions on a slower tier (parallel/param_tier.h). With a fence set, step() calls
// fence(g, true) right before it touches group g's param / low_precision_copy and
// fence(g, false) right after group g's update is complete (on the GPU: enqueued on the compute
// stream, so a copy the fence makes from the group is ordered after it), one group at a time, so
// at most one group's parameters must be resident. The update is elementwise, so stepping the
// groups one by one gives the bits of one multi-group step.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "tensor/tensor.h"

namespace strata::optim {

struct Segment {
  std::string name;
  int64_t offset = 0;  // elements from the start of the group's buffer
  int64_t numel = 0;
  bool decay = true;
};

struct ParamGroup {
  // F32, 1-d, contiguous, on the optimizer's device (Note [Optimizer devices]); under mixed
  // precision the fp32 master.
  tensor::Tensor param;
  // Same shape as param; F32, or BF16/F16 under mixed precision (then every step widens it to
  // f32, times grad_scale, before the update: Note [Mixed precision] in parallel/engine.h).
  tensor::Tensor grad;
  std::vector<Segment> segments;
  // Optional bf16/f16 "model copy" of param (same shape), rewritten by every step.
  tensor::Tensor low_precision_copy;
};

// A maximal stretch of a flat buffer with one decay flag (Note [Segments and weight decay]).
struct DecayRun {
  int64_t offset = 0;  // elements from the start of the buffer
  int64_t numel = 0;
  bool decay = false;
};

// The decay runs covering a buffer of `numel` elements cut into `segments` (Note [Segments and
// weight decay]): ordered by offset, gaps decay-free, equal neighbours merged. A segment outside
// the buffer or overlapping another is a strata::user_error whose message starts with `owner`
// ("parameter group 3").
std::vector<DecayRun> decay_runs(std::vector<Segment> segments, int64_t numel,
                                 std::string_view owner);

// A defined, 1-d, contiguous tensor: the form of every flat buffer the optimizers take.
bool is_flat(const tensor::Tensor& t);

struct NamedTensor {
  std::string name;
  tensor::Tensor tensor;
};

struct OptimizerState {
  int64_t step = 0;  // updates taken so far
  std::vector<NamedTensor> tensors;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every group with learning rate `lr` (from an LrSchedule, say).
  virtual void step(double lr) = 0;
  virtual std::string_view name() const = 0;

  // Sets every gradient buffer to zero.
  void zero_grad();

  // The next step() uses grad * s (in f32, after widening a bf16/f16 gradient) in place of each
  // gradient, without changing the gradient buffers; then the scale is 1 again. This is how
  // low-precision gradients are unscaled (fp16 loss scale, 1/dp) and clipped exactly, in f32.
  void set_grad_scale(float s);
  float grad_scale() const { return grad_scale_; }

  // Note [Optimizer state]. Virtual for optimizers whose states are not resident (Note [Staged
  // states] in optim/nvme_adamw.h).
  virtual OptimizerState state_dict() const;
  virtual void load_state_dict(const OptimizerState& state);

  const std::vector<ParamGroup>& groups() const { return groups_; }
  // Note [Group fence]; an empty function removes it.
  using GroupFence = std::function<void(size_t group, bool before)>;
  void set_group_fence(GroupFence fence) { fence_ = std::move(fence); }
  // Where every group and state buffer lives (Note [Optimizer devices]); CPU with no groups.
  Device device() const { return device_; }
  int64_t step_count() const { return step_; }
  // A checkpoint load that filled the states in place (Note [Streamed states] in
  // optim/nvme_adamw.h) sets the step count alone.
  void set_step_count(int64_t step) {
    STRATA_USER_CHECK(step >= 0, "{} state has a negative step count ({})", name(), step);
    step_ = step;
  }
  // The gradient buffer of every group, e.g. for clip_grad_norm.
  std::vector<tensor::Tensor> grads() const;

 protected:
  using Run = DecayRun;

  // Validates the groups (strata::user_error on a malformed one) and allocates one zeroed state
  // buffer per group for each of `state_names`.
  Optimizer(std::vector<ParamGroup> groups, std::vector<std::string> state_names);

  // state(g, k): group g's buffer for state_names[k].
  const tensor::Tensor& state(size_t group, size_t k) const { return state_[group][k]; }
  // Maximal runs of equal decay flag covering group g's buffer (Note [Segments and weight decay]).
  const std::vector<Run>& runs(size_t group) const { return runs_[group]; }
  bool has_fence() const { return static_cast<bool>(fence_); }
  void fence(size_t group, bool before) const {
    if (fence_) fence_(group, before);
  }

  std::vector<ParamGroup> groups_;
  int64_t step_ = 0;
  float grad_scale_ = 1.f;
  Device device_ = Device::cpu();

 private:
  std::vector<std::string> state_names_;
  std::vector<std::vector<tensor::Tensor>> state_;
  std::vector<std::vector<Run>> runs_;
  GroupFence fence_;
};

}  // namespace strata::optim
