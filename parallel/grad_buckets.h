#pragma once
// GradReducer: reduces each unit's gradients across dp in buckets, launched from grad-ready hooks
// while backward still runs (Note [Gradient buckets] in parallel/partition.h).
//
// Three reductions, one per kind of unit:
//   Allreduce       plain DP: in-place allreduce of the full gradient buffer (sum; the engine
//                   divides by dp once the sum is in).
//   IntoOwnedSlice  ZeRO-1: the full buffer persists and accumulates over micro-batches; on the
//                   last one it is reduce-scattered into the rank's own slice of that buffer.
//   IntoPartition   ZeRO-2/3: every micro-batch is reduce-scattered into a persistent partition
//                   buffer of L elements (Category::Grad), which accumulates. The full buffer is
//                   transient (Note [Transient gradients]).
//
// Note [Transient gradients]
// Under IntoPartition a unit's full gradient buffer holds memory only while the unit is in
// backward: GradientReduction calls ensure_full_grads from the unit's backward pre-hooks
// (materialised, charged to Category::Comm, zeroed), backward accumulates into it, and once every
// parameter of the unit has a final gradient its buckets have been copied into their staging
// buffers, so the buffer is released at once (Note [Released storage]). The persistent Grad bytes
// are then the partitions alone: 4 Psi / Nd.
//
// A reduce-scatter bucket copies its dp ranges into one contiguous staging buffer
// (Category::Comm, freed when the reduction is waited for) laid out as the collective needs;
// for IntoPartition the rank's own chunk first adds what the partition already holds, so the
// collective's output is the accumulated gradient and can be written into the partition itself.
//
// Note [Gradients streamed to the host]
// ZeRO-Offload at stage 2 keeps an IntoPartition unit's partition in pinned host memory
// (UnitReduction::host_partition) instead of on the device, so the device holds no persistent
// gradient bytes. While the unit's buckets reduce, its partition exists on the device as a
// transient buffer (Category::Comm) that the reduce-scatters write, exactly as into a persistent
// partition: a later micro-batch of the step first brings the bucket's range back from the host
// (a zero-filled range on the step's first micro-batch, as the persistent partition would be), so
// the arithmetic and its order are those of the device partition. As each bucket's reduction is
// waited for, its range goes to the host on the copy stream (after the compute stream's work,
// Note [Copy stream]); on the step's last micro-batch the bucket is first multiplied on the device
// by the last-pass scales (fp32's 1/dp and 1/loss-scale, in the order DevicePlacement applies
// them), and once every bucket of the unit is in, the unit's sum of squares is taken on the
// device over the whole transient partition, the tensor and kernel the norm would read there
// (unit_sum_of_squares). Then the transient buffer goes; the compute stream is ordered after the
// copies first, so its memory is not reused while they read it. wait_all() also waits for the
// copies, so the host partitions are whole when it returns.
//
// Note [Gradients on the NVMe tier]
// ZeRO-Infinity with the optimizer on NVMe (UnitReduction::on_nvme) keeps no partition at all:
// its home is the optimizer's store (Note [Gradients on NVMe] in optim/nvme_adamw.h), which
// reads it sub-group by sub-group at the step. The reductions run as for a host partition, into
// the unit's transient device partition, with the same last-pass scales and the same sum of
// squares; only where the partition comes from and goes to differs. It is read back whole from
// NVMe when the unit's first bucket of a later micro-batch of the step launches (zeros on the
// step's first: nothing is read), and once the unit's last bucket is reduced the whole partition
// is written to NVMe (from itself on a CPU device, else through a host staging buffer) and
// released once the write completes. Reading back rather than accumulating the step's
// micro-batches in memory keeps the resident gradient bytes at a few units' partitions
// (Category::Comm: the one reducing, and at most kTierWritesInFlight being written) instead of
// the whole model's; the read costs one partition of I/O per unit and micro-batch after the
// first. begin_pass() and wait_all() wait for the writes, so the next read-back and the step's
// reads see them.
//
// Note [Partial passes]
// A backward pass may go through some units only: under the interleaved pipeline schedule each
// pass runs one of the rank's model chunks (Note [Interleaved schedule] in
// parallel/pipeline_schedule.h). begin_pass(reduce, units) names them; the others take no part
// in the pass: they neither reduce nor are launched by end_pass, and their host or NVMe
// partitions are read back only once a pass of theirs has left something there (accumulation is
// tracked per unit). `reduce` then means the last pass of *these* units in the step, so each
// unit is reduced once, in its own last backward (Megatron's no_sync per chunk). A gradient for a
// unit outside the pass is an internal error.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "models/flat_params.h"
#include "optim/nvme_adamw.h"
#include "parallel/partition.h"

namespace strata::parallel {

enum class Reduction { Allreduce, IntoOwnedSlice, IntoPartition };

struct UnitReduction {
  Reduction kind = Reduction::Allreduce;
  UnitPartition part;
  tensor::Tensor partition_grad;  // IntoPartition: [L] on the device
  // IntoPartition, instead of partition_grad: [L] in host memory (pinned for asynchronous copies),
  // Note [Gradients streamed to the host].
  tensor::Tensor host_partition;
  // IntoPartition, instead of either: the partition's home is NVMe (Note [Gradients on the NVMe
  // tier]); set_nvme() names the store before the first pass.
  bool on_nvme = false;
};

class GradReducer {
 public:
  // `units` must outlive the reducer and keep their buffers; one UnitReduction per unit.
  // Installs a grad-ready hook on every parameter (they become no-ops once the reducer is gone).
  GradReducer(std::vector<models::FlatUnit>& units, std::vector<UnitReduction> setup,
              comm::Communicator& dp, int64_t bucket_size);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Before a backward pass: re-arms the counters; `reduce` says whether this pass reduces (the
  // last micro-batch, or every one for IntoPartition units). `units` (one flag per unit; null:
  // all) are the units the pass's backward goes through (Note [Partial passes]).
  void begin_pass(bool reduce, const std::vector<bool>* units = nullptr);
  // After the backward pass: launches, in plan order, the buckets whose hooks did not all fire
  // (parameters that got no gradient) and releases transient buffers still held.
  void end_pass();
  // Note [Transient gradients]: materialises and zeroes the unit's full gradient buffer if it is
  // released. No-op for other kinds.
  void ensure_full_grads(int unit);
  // Waits for every launched reduction and frees the staging buffers; with host partitions, also
  // for their copies.
  void wait_all();
  // Note [Gradients streamed to the host]: the factors applied in order to each bucket of a host
  // partition on the step's last micro-batch before it leaves the device (fp32's mean over dp and
  // loss-scale division); empty: none.
  void set_last_pass_scales(std::vector<float> scales);
  // After the step: the host partitions hold nothing of the next step yet (its first micro-batch
  // adds zeros instead of reading them back).
  void restart_accumulation();
  // The device sum of squares of unit u's whole partition after the last micro-batch (host or
  // NVMe partitions only), valid once wait_all() returned.
  double unit_sum_of_squares(int unit) const;
  // Before the first pass, for a norm that adds its terms per parameter (Note [Tensor-parallel
  // gradient norm] in parallel/tp_grad_norm.h): unit u's sum of squares is taken per piece of
  // its partition instead, each piece alone, in the given order (piece_sums_of_squares).
  void set_norm_pieces(int unit, std::vector<Range> pieces);
  // With set_norm_pieces: the device sums of squares of unit u's pieces after the last
  // micro-batch, in their order, valid once wait_all() returned.
  const std::vector<double>& piece_sums_of_squares(int unit) const;
  // Note [Gradients on the NVMe tier]: the store of the on_nvme units' partitions (slice u of
  // `nvme` is unit u); it must outlive the reducer's passes.
  void set_nvme(optim::NvmeAdamW* nvme);
  // overlap_comm = false: each launch waits for its reduction before backward goes on.
  void set_synchronous(bool on);

  // Called with the unit index when a reducing pass has every gradient of the unit final and
  // its buckets launched.
  void set_on_unit_done(std::function<void(int)> fn);
  // Called with "reduce <unit> [a, b)" at each launch (tests check the overlap with backward).
  void set_trace(std::function<void(const std::string&)> fn);

  const std::vector<BucketPlan>& plans() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace strata::parallel
