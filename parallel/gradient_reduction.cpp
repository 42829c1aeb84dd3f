#include "parallel/gradient_reduction.h"

#include "offload/memory_stats.h"
#include "offload/pinned_allocator.h"
#include "tensor/host_tensor.h"
#include "tensor/storage.h"

namespace strata::parallel {

namespace {

// A zeroed [n] host tensor charged to Category::Grad, from the pinned pool or host memory.
tensor::Tensor host_partition(int64_t n, DType dtype, bool pinned) {
  tensor::Tensor t = tensor::empty_host({n}, dtype, offload::Category::Grad, pinned);
  t.zero_();
  return t;
}

}  // namespace

Reduction GradientReduction::for_stage(int stage) {
  if (stage == 0) return Reduction::Allreduce;
  if (stage == 1) return Reduction::IntoOwnedSlice;
  return Reduction::IntoPartition;
}

GradientReduction::GradientReduction(models::CausalLM& model, const Partitioning& parts,
                                     Reduction kind, comm::Communicator& dp, int64_t bucket_size,
                                     bool overlap_comm, const HostGradients& host)
    : units_(model.flat_units()),
      parts_(parts),
      kind_(kind),
      grads_on_host_(host.enabled && !host.nvme && kind == Reduction::IntoPartition),
      grads_on_nvme_(host.nvme && kind == Reduction::IntoPartition) {
  STRATA_CHECK(kind_ == Reduction::Allreduce || parts_.partitioned(),
               "a reduce-scatter into slices needs partitioned units");
  const int n_units = static_cast<int>(units_.size());
  std::vector<UnitReduction> setup(units_.size());
  partition_grads_.resize(units_.size());
  for (int u = 0; u < n_units; ++u) {
    UnitReduction& s = setup[u];
    s.kind = kind_;
    s.part = parts_.unit(u);
    if (kind_ != Reduction::IntoPartition) continue;
    if (grads_on_nvme_) {  // Note [Gradients on the NVMe tier]: no partition resident
      s.on_nvme = true;
      units_[u].grads.storage()->release();  // Note [Transient gradients]
      continue;
    }
    if (grads_on_host_) {
      partition_grads_[u] =
          host_partition(parts_.unit(u).shard, units_[u].grads.dtype(), host.pinned);
      s.host_partition = partition_grads_[u];
      units_[u].grads.storage()->release();  // Note [Transient gradients]
      continue;
    }
    {
      offload::CategoryScope scope(offload::Category::Grad);
      partition_grads_[u] = tensor::Tensor::empty({parts_.unit(u).shard}, units_[u].grads.dtype(),
                                                  units_[u].grads.device());
    }
    partition_grads_[u].zero_();
    s.partition_grad = partition_grads_[u];
    units_[u].grads.storage()->release();  // Note [Transient gradients]
  }
  reducer_ = std::make_unique<GradReducer>(units_, std::move(setup), dp, bucket_size);
  reducer_->set_synchronous(!overlap_comm);

  // Note [Transient gradients]: a unit's full buffer exists from its backward pre-hook on.
  if (kind_ != Reduction::IntoPartition) return;
  for (int u = 0; u < n_units; ++u)
    for (models::nn::Module* m : unit_modules(model, units_[u]))
      hooks_.add(*m, m->register_backward_pre_hook(
                         [this, u](models::nn::Module&) { reducer_->ensure_full_grads(u); }));
}

tensor::Tensor GradientReduction::owned_grad(int u) const {
  if (kind_ == Reduction::IntoPartition) return partition_grads_[u];
  const Range own = parts_.owned(u);
  return units_[u].grads.narrow(0, own.begin, own.size());
}

void GradientReduction::zero_grads() {
  // The host (or NVMe) partitions are overwritten by the next step's first micro-batch, not read.
  if (grads_on_host_ || grads_on_nvme_) {
    reducer_->restart_accumulation();
    return;
  }
  for (size_t u = 0; u < units_.size(); ++u) {
    if (kind_ == Reduction::IntoPartition) {
      partition_grads_[u].zero_();
    } else {
      units_[u].grads.zero_();
    }
  }
}

}  // namespace strata::parallel
