#pragma once
// HostOffload: ZeRO-Offload's optimizer side (Ren et al., 2021). The fp32 master weights and the
// optimizer's states live in host memory and its step runs on the CPU (the SIMD AdamW, all
// cores), while the parameters and gradients the forward and backward use stay on the device.
//
// Note [Host offload]
// For each slice (a unit's owned part, in the model's dtype on the device) the host holds:
//   - the fp32 master (pinned with pin_memory; Category::Optimizer),
//   - a gradient buffer in the device gradient's dtype (pinned; Category::Grad), or, with
//     grads_on_host, the producer's host buffer itself (a copy of it for the delayed update),
//   - under mixed precision, a bf16/f16 model copy the AdamW kernel writes (pinned;
//     Category::Param),
// and the optimizer built over host groups of those allocates its moments on the host
// (Category::Optimizer, Tier::Host: they never cross the bus, so they need not be pinned).
// A step: fetch_grads() copies each device gradient to its host buffer on the copy stream (Note
// [Copy stream]) after the compute stream's backward, and waits for them (with grads_on_host
// they are there already); step(lr, scale) runs
// the optimizer over the host groups with Optimizer::set_grad_scale(scale), then write_back()
// enqueues each updated slice to the device (the model copy, or the fp32 master when the device
// parameters are fp32) and orders the compute stream after it, so the next forward reads the new
// parameters without the host waiting. Gradients cross the bus in their own dtype and are
// widened to f32 on the host, times the scale, exactly as the fused CUDA AdamW widens them on
// the device: the same operations in the same order, so the parameters are bitwise those of the
// on-device step (Note [CUDA AdamW] gives the CPU kernel's bits).
//
// Note [Delayed parameter update]
// The paper's DPU (section 5): step_async(lr, scale) starts the CPU step on a host thread and
// returns; the caller goes on with the next forward and backward on the parameters it has, and
// finish() (called before the next fetch_grads, or by the next step) joins the thread and writes
// the update back. So from the first delayed step on, the gradients of step k are computed with
// the parameters of step k-2 and applied to the masters of step k-1: each update reaches the
// device one step late. While a step is pending the host buffers belong to its thread: nothing
// but finish() may touch them (every other method finishes first).
//
// Note [Write-back through the group fence]
// Under ZeRO-Infinity's parameter offload the device slices are partitions that are resident
// only while in use (Note [Offloaded partitions] in parallel/zero3.h). With set_param_fence(f),
// write_back() calls f(i, true) before it copies slice i to the device and f(i, false) once that
// copy is complete, one slice at a time, as Optimizer::step calls its group fence (Note [Group
// fence]): the fence loads the partition and then stores it back to its tier. The host step
// itself touches only host buffers and needs no fence.
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "offload/copy_stream.h"
#include "optim/optimizer.h"

namespace strata::optim {

struct OffloadSlice {
  // On the device (or the CPU, for CPU-only runs of the same code): 1-d, contiguous, same numel.
  tensor::Tensor params;  // F32, BF16 or F16: what forward reads; write_back() rewrites it
  tensor::Tensor grads;   // F32, BF16 or F16: the reduced gradient fetch_grads() copies
  // The fp32 values the masters start from (any device); when undefined, params (then F32).
  tensor::Tensor master;
  std::vector<Segment> segments;  // offsets relative to the slice
};

struct HostOffloadOptions {
  bool pin_memory = true;  // zero_optimization.offload_optimizer.pin_memory
  // The slices' grads are host buffers a producer fills (ZeRO-2's gradients streamed to the host
  // during backward): nothing to copy from the device. The optimizer reads them in place unless
  // `copy_host_grads`, for the delayed update, whose step still reads its gradients while the
  // next backward refills the producer's buffers: then fetch_grads() copies them into buffers of
  // the optimizer's own.
  bool grads_on_host = false;
  bool copy_host_grads = false;
};

class HostOffload {
 public:
  using Factory = std::function<std::unique_ptr<Optimizer>(std::vector<ParamGroup>)>;

  // Allocates the host buffers (Note [Host offload]), copies the masters in and builds the
  // optimizer through `make` over host groups, one per slice in order.
  HostOffload(std::vector<OffloadSlice> slices, const Factory& make,
              const HostOffloadOptions& options = {});
  ~HostOffload();
  HostOffload(const HostOffload&) = delete;
  HostOffload& operator=(const HostOffload&) = delete;

  Optimizer& optimizer() { return *optimizer_; }
  const Optimizer& optimizer() const { return *optimizer_; }
  Device device() const { return device_; }
  size_t size() const { return slices_.size(); }
  // The host masters, one per slice (the optimizer's group params).
  const tensor::Tensor& master(size_t i) const { return optimizer_->groups()[i].param; }

  // Copies every device gradient to the host and waits for them (finishes a pending step first);
  // with grads_on_host, copies the producer's buffers into the optimizer's if they differ.
  void fetch_grads();
  // One optimizer step over the host groups with lr and gradient scale, then write_back().
  void step(double lr, float grad_scale = 1.f);
  // Note [Delayed parameter update]: the same step on a host thread; finish() completes it.
  void step_async(double lr, float grad_scale = 1.f);
  bool pending() const { return worker_.joinable(); }
  // Joins a pending step and writes it back; nothing when none is pending.
  void finish();
  // Enqueues every updated slice to the device parameters (after a step, or after a checkpoint
  // filled the masters: then the model copies are rounded from the masters first).
  void write_back();
  // Rounds the host model copies from the masters (after a checkpoint load), then write_back().
  void params_from_masters();
  // Slice i's initial master, for a slice built with released params and no master (Note
  // [Unit-by-unit construction] in parallel/engine.h).
  void set_initial_master(size_t i, const tensor::Tensor& master);
  // Note [Write-back through the group fence]; an empty function removes it.
  void set_param_fence(Optimizer::GroupFence fence) { param_fence_ = std::move(fence); }

 private:
  void compute_wait_for_copies();

  std::vector<OffloadSlice> slices_;
  Device device_;
  bool mixed_ = false;  // device parameters are bf16/f16
  bool grads_on_host_ = false;
  std::vector<tensor::Tensor> host_grads_;
  std::unique_ptr<offload::CopyStream> copies_;
  std::unique_ptr<Optimizer> optimizer_;
  std::thread worker_;
  std::exception_ptr worker_error_;
  Optimizer::GroupFence param_fence_;
};

}  // namespace strata::optim
