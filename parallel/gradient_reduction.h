#pragma once
// GradientReduction: the Engine part that reduces gradients across dp and holds the reduced
// gradients of what this rank owns (the optimizer's `grad`s). It wraps GradReducer's buckets
// (Note [Gradient buckets] in parallel/partition.h), one reduction for every unit, chosen once
// from the ZeRO stage:
//   stage 0    Allreduce       of the full buffers, on the last micro-batch (plain DP);
//   stage 1    IntoOwnedSlice  the full buffers accumulate; the last micro-batch reduce-scatters
//                              them into the owned slice of themselves;
//   stages 2/3 IntoPartition   every micro-batch reduce-scatters into a persistent partition
//                              buffer (owned here); the full buffers are transient (Note
//                              [Transient gradients] in parallel/grad_buckets.h), materialised
//                              from module backward pre-hooks installed here.
// What accumulates across the micro-batches of a step (partitions, or the full buffers) is
// zeroed after the step by zero_grads().
// With `HostGradients::enabled` (ZeRO-Offload at stage 2) the IntoPartition partitions live in
// host memory and each bucket goes there as soon as it is reduced (Note [Gradients streamed to
// the host] in parallel/grad_buckets.h): the device keeps no persistent gradient bytes.
// With `HostGradients::nvme` (ZeRO-Infinity: the optimizer on NVMe) they have no resident
// partition at all: each unit's goes to the NVMe optimizer's store once reduced (Note [Gradients
// on the NVMe tier] in parallel/grad_buckets.h), named by use_nvme() before the first pass.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "models/causal_lm.h"
#include "parallel/grad_buckets.h"
#include "parallel/module_hooks.h"
#include "parallel/partitioning.h"

namespace strata::parallel {

struct HostGradients {
  bool enabled = false;  // IntoPartition partitions on the host (other kinds ignore it)
  bool pinned = true;    // in pinned memory, so their copies are asynchronous
  // IntoPartition partitions on NVMe instead (Note [Gradients on the NVMe tier]); wins over
  // `enabled`.
  bool nvme = false;
};

class GradientReduction {
 public:
  // The reduction ZeRO stage `stage` uses (table above).
  static Reduction for_stage(int stage);

  // `parts` as the units are laid out (repadded when partitioned); IntoOwnedSlice and
  // IntoPartition need a partitioned layout. IntoPartition allocates the partitions
  // (Category::Grad) and releases the full gradient buffers. Installs GradReducer's grad-ready
  // hooks, and under IntoPartition the backward pre-hooks on `model`'s modules.
  GradientReduction(models::CausalLM& model, const Partitioning& parts, Reduction kind,
                    comm::Communicator& dp, int64_t bucket_size, bool overlap_comm,
                    const HostGradients& host = {});
  GradientReduction(const GradientReduction&) = delete;
  GradientReduction& operator=(const GradientReduction&) = delete;

  Reduction kind() const { return kind_; }
  // The reduced gradient of this rank's slice of unit u, once wait_all() returned: the
  // partition buffer (IntoPartition; on the host with grads_on_host()) or a view of the owned
  // slice of the unit's full buffer.
  tensor::Tensor owned_grad(int u) const;
  // Whether the owned gradients are host partitions (HostGradients, IntoPartition).
  bool grads_on_host() const { return grads_on_host_; }
  // Whether they live on NVMe (HostGradients::nvme, IntoPartition): then owned_grad() is
  // undefined and the store must be named by use_nvme() (slice u: unit u) before the first pass.
  bool grads_on_nvme() const { return grads_on_nvme_; }
  void use_nvme(optim::NvmeAdamW& nvme) { reducer_->set_nvme(&nvme); }
  // grads_on_host() or grads_on_nvme(): the device's sum of squares of owned_grad(u) as the step's
  // last micro-batch left it, after the last-pass scales; the norm's term for unit u.
  double owned_sum_of_squares(int u) const { return reducer_->unit_sum_of_squares(u); }
  // grads_on_host() or grads_on_nvme(), before the first pass: unit u's sums of squares are
  // taken per piece of owned_grad(u) instead (GradReducer::set_norm_pieces), for a norm that
  // splits its terms by parameter (Note [Tensor-parallel gradient norm]).
  void set_norm_pieces(int u, std::vector<Range> pieces) {
    reducer_->set_norm_pieces(u, std::move(pieces));
  }
  const std::vector<double>& owned_piece_sums(int u) const {
    return reducer_->piece_sums_of_squares(u);
  }
  // grads_on_host() or grads_on_nvme(): factors applied in order to the owned gradients on the
  // device on the step's last micro-batch (fp32's 1/dp and 1/loss-scale; Note [Gradients streamed
  // to the host]).
  void set_last_pass_scales(std::vector<float> scales) {
    reducer_->set_last_pass_scales(std::move(scales));
  }

  // Around each micro-batch's backward; `last`: the step's last micro-batch (of `units`, when
  // the pass goes through those units only: Note [Partial passes] in parallel/grad_buckets.h).
  void begin_pass(bool last, const std::vector<bool>* units = nullptr) {
    reducer_->begin_pass(last, units);
  }
  void end_pass() { reducer_->end_pass(); }
  // Before the step reads the owned gradients.
  void wait_all() { reducer_->wait_all(); }
  // After the step: zero what accumulates over a step's micro-batches.
  void zero_grads();

  void set_trace(std::function<void(const std::string&)> fn) { reducer_->set_trace(std::move(fn)); }

 private:
  std::vector<models::FlatUnit>& units_;
  const Partitioning& parts_;
  Reduction kind_;
  bool grads_on_host_ = false;
  bool grads_on_nvme_ = false;
  std::vector<tensor::Tensor> partition_grads_;  // IntoPartition
  std::unique_ptr<GradReducer> reducer_;
  ModuleHooks hooks_;  // after reducer_: removed before it goes
};

}  // namespace strata::parallel
