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
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "models/flat_params.h"
#include "parallel/partition.h"

namespace strata::parallel {

enum class Reduction { Allreduce, IntoOwnedSlice, IntoPartition };

struct UnitReduction {
  Reduction kind = Reduction::Allreduce;
  UnitPartition part;
  tensor::Tensor partition_grad;  // IntoPartition: [L]
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
  // last micro-batch, or every one for IntoPartition units).
  void begin_pass(bool reduce);
  // After the backward pass: launches, in plan order, the buckets whose hooks did not all fire
  // (parameters that got no gradient) and releases transient buffers still held.
  void end_pass();
  // Note [Transient gradients]: materialises and zeroes the unit's full gradient buffer if it is
  // released. No-op for other kinds.
  void ensure_full_grads(int unit);
  // Waits for every launched reduction and frees the staging buffers.
  void wait_all();
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
