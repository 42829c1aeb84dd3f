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
//
// Note [Offloaded partitions]
// With a ParamTier (zero_optimization.offload_param: ZeRO-Infinity) the partitions too are
// released between uses and live on the tier (Note [Parameter tier] in parallel/param_tier.h).
// A gather first materializes the partition (Category::Param) and loads it from the tier, then
// allgathers it; once the allgather is complete the partition is released again (the gathered
// unit holds its bytes). The optimizer step loads, updates and stores one unit's partition at a
// time through the optimizer's group fence (Note [Group fence] in optim/optimizer.h), reading the
// next units ahead. So between uses only the tier holds the parameters; resident are the
// gathered units and the partitions being loaded, updated or allgathered. The tier reads ahead
// (Note [Parameter read-ahead]) by the recorded gather order, from each request's position in
// it and from the order's start when a pass begins, continued by the step's order after the
// step's last micro-batch, and by the next pass's after the step.
//
// Note [Prefetch and the tier]
// A prefetched allgather first loads its partition from the tier, which blocks the host until
// an NVMe read has landed, and on a GPU orders the compute stream after the partition's copy.
// So the prefetch starts at most one unit whose partition comes from the tier (the next one),
// whatever stage3_prefetch_bucket_size allows: the read-ahead brings the units after it from
// NVMe, and on a GPU the unit after it is staged (Note [Tier copies] in parallel/param_tier.h),
// while compute runs. Whether a read has landed must not decide it, since every rank issues the
// same allgathers in the same order (Note [Collective order]) and reads land when they land.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "models/flat_params.h"
#include "parallel/param_tier.h"
#include "parallel/partition.h"

namespace strata::parallel {

class ParamGatherer {
 public:
  // `managed[u]`: unit u is partitioned (its full buffer is released by the constructor after its
  // rank's slice is copied into the partition). `parts[u]` as repad laid it out.
  // `tier` (may be null: partitions stay in memory) takes the managed units' partitions (Note
  // [Offloaded partitions]); it must hold exactly the managed units. A unit whose buffer is
  // released already (Note [Deferred initialisation] in models/nn/module.h) gets its partition
  // later from set_partition().
  ParamGatherer(std::vector<models::FlatUnit>& units, std::vector<bool> managed,
                std::vector<UnitPartition> parts, comm::Communicator& dp, int64_t prefetch_size,
                std::unique_ptr<ParamTier> tier = nullptr);
  ~ParamGatherer();
  ParamGatherer(const ParamGatherer&) = delete;
  ParamGatherer& operator=(const ParamGatherer&) = delete;

  bool managed(int u) const { return managed_[u]; }
  // The rank's slice of a managed unit's parameters ([L]); with a tier, released between uses.
  const tensor::Tensor& partition(int u) const { return partition_[u]; }

  // Note [Unit-by-unit construction] (parallel/engine.h): managed unit u's partition from its
  // owned slice `owned` (handed to the tier, when there is one); partitions_set() once every
  // deferred unit's is, before the first gather.
  void set_partition(int u, const tensor::Tensor& owned);
  void partitions_set();

  // Note [Offloaded partitions]. Without a tier these do nothing.
  ParamTier* tier() const { return tier_.get(); }
  // Every managed partition resident (a checkpoint reads or fills them); they go again when
  // their unit's next allgather completes, or through store_partitions().
  void load_partitions();
  // Writes every resident partition to the tier and releases it.
  void store_partitions();
  // Releases the partitions load_partitions() made resident and nothing changed since (the tier
  // holds the same bytes), except those of units being gathered.
  void drop_partitions();
  // fn(partition(u)) with the partition resident; one the tier held goes again after the call,
  // written back first when `store` (a checkpoint reads or fills one unit at a time).
  void with_partition(int u, bool store, const std::function<void(const tensor::Tensor&)>& fn);
  // The optimizer's group fence (group g = unit g).
  void step_fence(size_t g, bool before);

  // From a hook: the unit is about to be used. Records it (first micro-batch), gathers it
  // (waiting for a prefetch in flight) and prefetches what the recorded order says comes next.
  void request(int u);
  // Gathers synchronously, without recording or prefetching.
  void gather(int u);
  void release(int u);
  void release_all();
  bool gathered(int u) const { return state_[u] != State::Released; }

  // A new micro-batch: rewinds the prefetch cursor; `record` records its gathers; `last`: the
  // step follows it (the tier reads the step's units ahead after this pass's).
  void begin_pass(bool record, bool last = true);
  // Its backward is over: the recording (if any) is complete and prefetch may use it.
  void end_pass();
  const std::vector<int>& order() const { return order_; }

  int64_t gathered_bytes() const { return gathered_bytes_; }
  int64_t gathered_peak_bytes() const { return gathered_peak_; }
  void reset_gathered_peak() { gathered_peak_ = gathered_bytes_; }
  int64_t prefetches() const { return prefetches_; }

  // Called with "gather <unit>", "prefetch <unit>", "stage <unit>" (Note [Tier copies]),
  // "release <unit>".
  void set_trace(std::function<void(const std::string&)> fn) { trace_ = std::move(fn); }

 private:
  enum class State { Released, InFlight, Gathered };
  void start(int u);   // materialise + async allgather
  void finish(int u);  // wait for it
  void prefetch_after(size_t pos, int current);
  void load_partition(int u, bool order = true);             // materialize + load, when released
  void stage_after(size_t pos, int current);                 // Note [Tier copies]
  void read_ahead(const std::vector<int>& seq, size_t pos);  // Note [Parameter read-ahead]

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
  bool last_pass_ = true;
  size_t cursor_ = 0;
  int64_t gathered_bytes_ = 0;
  int64_t gathered_peak_ = 0;
  int64_t prefetches_ = 0;
  std::function<void(const std::string&)> trace_;
  std::unique_ptr<ParamTier> tier_;
  std::vector<int> step_order_;  // the managed units, ascending: the optimizer's order
  int deferred_ = 0;             // partitions set_partition() has yet to fill
};

}  // namespace strata::parallel
