#pragma once
// ParamGatherer: ZeRO-3's parameter partitioning — gather a unit's parameters just before it is
// used, release them right after, prefetch the next ones.
//
// Note [ZeRO-3 gathering]
// Each partitioned unit keeps only its rank's slice of the fp32 parameters, a persistent buffer
// of L elements (Category::Param) that is also the optimizer's master copy. The unit's full
// buffer (`FlatUnit::params`, which every parameter Variable views) is released (Note [Released
// storage]) except while the unit is gathered: materialised (charged to Category::Comm, like
// every transient communication buffer) and filled by an allgather of the slices. ParamGathering
// drives it from module hooks on the unit's modules — its prefixes and its users (UnitSpec::
// users: GPT-2's tied `lm_head` reads wte) — so model code does not change
// (docs/design.md decision 6):
//   forward pre-hook    gather                 forward post-hook   release (not in backward)
//   backward pre-hook   gather (+ gradients)   backward post-hook  release
// Autograd's saved tensors are views of the parameters; they become valid again when the
// backward pre-hook re-gathers, at whatever address the new memory has. Activation checkpointing
// recomputes forward inside backward: the forward post-hooks seen then must not release
// (ParamGathering tracks the phase), the unit stays gathered until its backward post-hook.
// Prefetch: the order of gathers in the first micro-batch (forward and backward) is recorded;
// later, each gather at position i of that order starts asynchronous allgathers of the next
// units in the order, up to stage3_prefetch_bucket_size elements in all, so their
// communication overlaps the current unit's compute. Every rank records the same order and
// issues the same gathers (Note [Collective order]). The engine releases whatever is still
// gathered before each optimizer step, so between steps only the partitions exist. Units
// smaller than stage3_param_persistence_threshold are not managed here: they stay whole like
// ZeRO-2 units.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "models/flat_params.h"
#include "parallel/partition.h"

namespace strata::parallel {

class ParamGatherer {
 public:
  // `managed[u]`: unit u is partitioned (its full buffer is released by the constructor after its
  // rank's slice is copied into the partition). `parts[u]` as repad laid it out.
  ParamGatherer(std::vector<models::FlatUnit>& units, std::vector<bool> managed,
                std::vector<UnitPartition> parts, comm::Communicator& dp, int64_t prefetch_size);
  ~ParamGatherer();
  ParamGatherer(const ParamGatherer&) = delete;
  ParamGatherer& operator=(const ParamGatherer&) = delete;

  bool managed(int u) const { return managed_[u]; }
  // The rank's slice of a managed unit's parameters ([L]).
  const tensor::Tensor& partition(int u) const { return partition_[u]; }

  // From a hook: the unit is about to be used. Records it (first micro-batch), gathers it
  // (waiting for a prefetch in flight) and prefetches what the recorded order says comes next.
  void request(int u);
  // Gathers synchronously, without recording or prefetching.
  void gather(int u);
  void release(int u);
  void release_all();
  bool gathered(int u) const { return state_[u] != State::Released; }

  // A new micro-batch: rewinds the prefetch cursor; `record` records its gathers.
  void begin_pass(bool record);
  // Its backward is over: the recording (if any) is complete and prefetch may use it.
  void end_pass();
  const std::vector<int>& order() const { return order_; }

  int64_t gathered_bytes() const { return gathered_bytes_; }
  int64_t gathered_peak_bytes() const { return gathered_peak_; }
  void reset_gathered_peak() { gathered_peak_ = gathered_bytes_; }
  int64_t prefetches() const { return prefetches_; }

  // Called with "gather <unit>", "prefetch <unit>", "release <unit>".
  void set_trace(std::function<void(const std::string&)> fn) { trace_ = std::move(fn); }

 private:
  enum class State { Released, InFlight, Gathered };
  void start(int u);   // materialise + async allgather
  void finish(int u);  // wait for it
  void prefetch_after(size_t pos, int current);

  std::vector<models::FlatUnit>* units_;
  std::vector<bool> managed_;
  std::vector<UnitPartition> parts_;
  comm::Communicator* dp_;
  int64_t prefetch_size_;
  std::vector<tensor::Tensor> partition_;
  std::vector<State> state_;
  std::vector<comm::WorkHandle> work_;
  std::vector<int> order_;
  bool recording_ = false;
  bool recorded_ = false;
  bool in_pass_ = false;
  size_t cursor_ = 0;
  int64_t gathered_bytes_ = 0;
  int64_t gathered_peak_ = 0;
  int64_t prefetches_ = 0;
  std::function<void(const std::string&)> trace_;
};

}  // namespace strata::parallel
