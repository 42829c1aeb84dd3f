#include "optim/host_offload.h"

#include <exception>
#include <utility>

#include "core/error.h"
#include "offload/memory_stats.h"
#include "offload/pinned_allocator.h"
#include "tensor/cuda.h"
#include "tensor/host_tensor.h"
#include "tensor/storage.h"

namespace strata::optim {

HostOffload::HostOffload(std::vector<OffloadSlice> slices, const Factory& make,
                         const HostOffloadOptions& options)
    : slices_(std::move(slices)), grads_on_host_(options.grads_on_host) {
  STRATA_USER_CHECK(!slices_.empty(), "offload_optimizer: nothing to offload (no slices)");
  device_ = slices_.front().params.device();
  mixed_ = slices_.front().params.dtype() != DType::F32;
  std::vector<ParamGroup> groups;
  for (size_t i = 0; i < slices_.size(); ++i) {
    OffloadSlice& s = slices_[i];
    STRATA_CHECK(is_flat(s.params) && is_flat(s.grads) && s.grads.numel() == s.params.numel(),
                 "offload slice {}: params {} and grads {} must be 1-d contiguous and alike", i,
                 s.params.str(), s.grads.str());
    const Device grads_on = grads_on_host_ ? Device::cpu() : device_;
    STRATA_CHECK(s.params.device() == device_ && s.grads.device() == grads_on,
                 "offload slice {}: params on {} and grads on {}, expected {} and {}", i,
                 s.params.device().str(), s.grads.device().str(), device_.str(), grads_on.str());
    STRATA_CHECK((s.params.dtype() != DType::F32) == mixed_,
                 "offload slice {} is {} but slice 0 is {}", i, dtype_name(s.params.dtype()),
                 dtype_name(slices_.front().params.dtype()));
    // Released params without a master (Note [Unit-by-unit construction] in parallel/engine.h):
    // set_initial_master() fills it, in any precision of the params.
    const bool later = !s.master.defined() && s.params.storage()->is_released();
    const tensor::Tensor& from = s.master.defined() ? s.master : s.params;
    STRATA_CHECK(later || (from.dtype() == DType::F32 && from.numel() == s.params.numel()),
                 "offload slice {}: masters start from an f32 tensor of {} elements, got {}", i,
                 s.params.numel(), from.str());
    const int64_t n = s.params.numel();
    ParamGroup g;
    g.param = tensor::empty_host({n}, DType::F32, offload::Category::Optimizer, options.pin_memory);
    if (!later) g.param.copy_(from);
    if (grads_on_host_ && !options.copy_host_grads) {
      g.grad = s.grads;
    } else {
      g.grad =
          tensor::empty_host({n}, s.grads.dtype(), offload::Category::Grad, options.pin_memory);
      g.grad.zero_();
    }
    if (mixed_) {
      g.low_precision_copy =
          tensor::empty_host({n}, s.params.dtype(), offload::Category::Param, options.pin_memory);
      if (!later) g.low_precision_copy.copy_(g.param);
    }
    g.segments = s.segments;
    host_grads_.push_back(g.grad);
    groups.push_back(std::move(g));
    s.master = tensor::Tensor();  // not kept: the host master is the optimizer's group param
  }
  copies_ = std::make_unique<offload::CopyStream>(device_.is_cuda());
  optimizer_ = make(std::move(groups));
  STRATA_CHECK(optimizer_ != nullptr, "the optimizer factory returned nothing");
  STRATA_CHECK(optimizer_->device().is_cpu(), "the offloaded optimizer is on {}",
               optimizer_->device().str());
}

HostOffload::~HostOffload() {
  if (worker_.joinable()) worker_.join();
}

void HostOffload::compute_wait_for_copies() {
  if (copies_->cuda()) copies_->order_before(tensor::cuda_current_stream());
}

void HostOffload::fetch_grads() {
  finish();
  if (grads_on_host_) {
    for (size_t i = 0; i < slices_.size(); ++i)
      if (host_grads_[i].data_ptr() != slices_[i].grads.data_ptr())
        host_grads_[i].copy_(slices_[i].grads);
    return;
  }
  if (copies_->cuda()) copies_->wait_for(tensor::cuda_current_stream());
  for (size_t i = 0; i < slices_.size(); ++i)
    copies_->to_host(host_grads_[i].data_ptr(), slices_[i].grads.data_ptr(),
                     host_grads_[i].nbytes());
  // The next backward may write the device gradients only after they have left.
  compute_wait_for_copies();
  copies_->synchronize();
}

void HostOffload::step(double lr, float grad_scale) {
  finish();
  copies_->synchronize();  // the last write-back has read the buffers the step rewrites
  optimizer_->set_grad_scale(grad_scale);
  optimizer_->step(lr);
  write_back();
}

void HostOffload::step_async(double lr, float grad_scale) {
  finish();
  copies_->synchronize();
  optimizer_->set_grad_scale(grad_scale);
  worker_error_ = nullptr;
  worker_ = std::thread([this, lr] {
    try {
      optimizer_->step(lr);
    } catch (...) {
      worker_error_ = std::current_exception();
    }
  });
}

void HostOffload::finish() {
  if (!worker_.joinable()) return;
  worker_.join();
  if (worker_error_) std::rethrow_exception(std::exchange(worker_error_, nullptr));
  write_back();
}

void HostOffload::write_back() {
  STRATA_CHECK(!worker_.joinable(), "write_back while a delayed step is pending");
  // The device parameters may still be read by a forward enqueued earlier: copy after it.
  if (copies_->cuda()) copies_->wait_for(tensor::cuda_current_stream());
  for (size_t i = 0; i < slices_.size(); ++i) {
    const ParamGroup& g = optimizer_->groups()[i];
    const tensor::Tensor& src = mixed_ ? g.low_precision_copy : g.param;
    if (!param_fence_) {
      copies_->to_device(slices_[i].params.data_ptr(), src.data_ptr(), src.nbytes());
      continue;
    }
    // Note [Write-back through the group fence]: the slice is resident from here to the fence's
    // second call, which may copy it out, so the copy completes before that call.
    param_fence_(i, true);
    if (copies_->cuda()) copies_->wait_for(tensor::cuda_current_stream());  // after its load
    copies_->to_device(slices_[i].params.data_ptr(), src.data_ptr(), src.nbytes());
    copies_->synchronize();
    param_fence_(i, false);
  }
  compute_wait_for_copies();
}

void HostOffload::set_initial_master(size_t i, const tensor::Tensor& master) {
  finish();
  const ParamGroup& g = optimizer_->groups()[i];
  STRATA_CHECK(master.dtype() == DType::F32 && master.numel() == g.param.numel(),
               "offload slice {}: masters start from an f32 tensor of {} elements, got {}", i,
               g.param.numel(), master.str());
  tensor::Tensor(g.param).copy_(master);
  if (mixed_) tensor::Tensor(g.low_precision_copy).copy_(g.param);
}

void HostOffload::params_from_masters() {
  finish();
  // Nothing may still be copying out of the model copies while they are rewritten.
  copies_->synchronize();
  if (mixed_)
    for (const ParamGroup& g : optimizer_->groups())
      tensor::Tensor(g.low_precision_copy).copy_(g.param);  // a handle to the live buffer
  write_back();
}

}  // namespace strata::optim
