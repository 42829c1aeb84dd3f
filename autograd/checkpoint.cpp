#include "autograd/checkpoint.h"

#include <atomic>
#include <memory>

#include "autograd/engine.h"
#include "autograd/node.h"
#include "autograd/rng_context.h"
#include "offload/memory_stats.h"
#include "offload/pinned_allocator.h"
#include "tensor/host_tensor.h"
#include "tensor/storage.h"

namespace strata::autograd {

namespace {

std::atomic<bool> g_cpu_checkpointing{false};

// Note [CPU checkpointing]: a pinned host copy of a device tensor, contiguous.
Tensor to_pinned_host(const Tensor& t) {
  Tensor host = tensor::empty_host(t.shape(), t.dtype(), offload::Category::Activation, true);
  host.copy_(t);
  return host;
}

}  // namespace

void set_cpu_checkpointing(bool on) {
  g_cpu_checkpointing.store(on, std::memory_order_relaxed);
}

bool cpu_checkpointing() {
  return g_cpu_checkpointing.load(std::memory_order_relaxed);
}

std::vector<Variable> checkpoint(const CheckpointFn& fn, const std::vector<Variable>& inputs) {
  if (!GradMode::is_enabled()) return fn(inputs);
  Generator& gen = current_generator();
  const uint64_t seed = gen.seed(), offset = gen.offset();
  std::vector<Variable> first;
  {
    // Note [Replayed forwards]; restored on the way out, an exception included.
    struct Replayed {
      bool prev = GradMode::will_be_replayed();
      Replayed() { GradMode::set_will_be_replayed(true); }
      ~Replayed() { GradMode::set_will_be_replayed(prev); }
    } replayed;
    NoGradGuard no_grad;
    first = fn(inputs);
  }
  std::vector<Tensor> outs;
  for (const Variable& v : first) outs.push_back(v.data());
  std::vector<Tensor> saved_inputs;
  std::vector<Device> input_devices;
  std::vector<bool> input_needs_grad;
  const bool to_host = cpu_checkpointing();
  for (const Variable& v : inputs) {
    const Tensor& t = v.data();
    // Note [CPU checkpointing]
    saved_inputs.push_back(to_host && t.defined() && t.device().is_cuda() ? to_pinned_host(t) : t);
    input_devices.push_back(t.defined() ? t.device() : Device::cpu());
    input_needs_grad.push_back(v.requires_grad());
  }
  // Note [Activation checkpointing]: the recompute sees the generator as the first run did.
  BackwardFn backward = [fn, saved_inputs, input_devices, input_needs_grad, seed,
                         offset](const std::vector<Tensor>& grad_outputs) {
    std::vector<Variable> detached;
    for (size_t i = 0; i < saved_inputs.size(); ++i) {
      Tensor x = saved_inputs[i];
      if (x.defined() && x.device() != input_devices[i]) {
        // Note [CPU checkpointing]: back to the device for the replay, dropped after it.
        offload::CategoryScope activation(offload::Category::Activation);
        x = x.to(input_devices[i]);
      }
      detached.emplace_back(x, static_cast<bool>(input_needs_grad[i]));
    }
    Generator& g = current_generator();
    const uint64_t cur_seed = g.seed(), cur_offset = g.offset();
    g.set_state(seed, offset);
    std::vector<Variable> again;
    {
      EnableGradGuard grad_on;
      again = fn(detached);
    }
    g.set_state(cur_seed, cur_offset);
    std::vector<Variable> roots;
    std::vector<Tensor> root_grads;
    for (size_t i = 0; i < again.size(); ++i)
      if (again[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(again[i]);
        root_grads.push_back(grad_outputs[i]);
      }
    if (!roots.empty()) autograd::backward(roots, root_grads);
    std::vector<Tensor> input_grads;
    for (const Variable& d : detached)
      input_grads.push_back(d.requires_grad() ? d.grad() : Tensor());
    return input_grads;
  };
  // Always a node: parameters used inside fn need gradients even when no input does.
  return make_outputs("Checkpoint", std::move(outs), inputs, std::move(backward), true);
}

}  // namespace strata::autograd
