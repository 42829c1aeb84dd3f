#pragma once
// ParamGathering: the Engine part that keeps parameters whole where and when they are used. Two
// jobs, both about the model's parameter buffers:
//   - ZeRO-3 (partition_params): units of at least `persistence_threshold` elements keep only the
//     owned slice (ParamGatherer, Note [ZeRO-3 gathering] in parallel/zero3.h); module hooks
//     installed here gather a unit before its forward or backward and release it after.
//   - After the optimizer updated each rank's owned slice (partitioned layouts: stages 1-3), the
//     allgather that makes every unit kept whole (all of them at stages 1/2, stage 3's small
//     ones) whole again on every rank, in buckets of allgather_bucket_size elements.
// With whole units (stage 0) it does nothing: every rank updated the same whole units. ZeRO-
// Infinity's parameter offload (offload_param) is ParamGatherer's partition storage on a slower
// tier, read ahead in the recorded order (Note [Offloaded partitions] in parallel/zero3.h).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "models/causal_lm.h"
#include "parallel/module_hooks.h"
#include "parallel/partitioning.h"
#include "parallel/zero3.h"

namespace strata::parallel {

struct ParamGatheringOptions {
  bool partition_params = false;                // ZeRO-3
  int64_t persistence_threshold = 100'000;      // ZeRO-3: smaller units stay whole
  int64_t prefetch_size = 50'000'000;           // ZeRO-3: elements gathered ahead
  int64_t allgather_bucket_size = 500'000'000;  // updated slices, per allgather
  OffloadParamConfig offload_param;             // ZeRO-3: the partitions' tier
};

class ParamGathering {
 public:
  // Under partition_params the managed units' full parameter buffers are released (their owned
  // slices copied out first) and the hooks installed on `model`'s modules. `parts` must be
  // partitioned then.
  ParamGathering(models::CausalLM& model, const Partitioning& parts, comm::Communicator& dp,
                 const ParamGatheringOptions& options);
  ~ParamGathering();
  ParamGathering(const ParamGathering&) = delete;
  ParamGathering& operator=(const ParamGathering&) = delete;

  // ZeRO-3: every rank's parameters are its slices (checkpoints write them).
  bool params_partitioned() const { return gatherer_ != nullptr; }
  // Unit u keeps only its owned slice between uses.
  bool managed(int u) const { return gatherer_ && gatherer_->managed(u); }
  // Note [Unit-by-unit construction] (parallel/engine.h): see ParamGatherer.
  void set_partition(int u, const tensor::Tensor& owned) { gatherer_->set_partition(u, owned); }
  void partitions_set() { gatherer_->partitions_set(); }
  // This rank's slice of unit u's parameters, in the model's dtype: the persistent partition of a
  // managed unit, else a view of the owned slice of the unit's buffer.
  tensor::Tensor owned_params(int u) const;
  // fn(owned_params(u)), the partition of an offloaded unit resident only during the call
  // (Note [Streamed shards] in parallel/engine.h); `store`: fn changed it, it goes back to its
  // tier.
  void with_owned_params(int u, bool store, const std::function<void(const tensor::Tensor&)>& fn);

  // Around each micro-batch (forward and backward) and its backward: a recomputing forward
  // inside backward (activation checkpointing) must not release its unit.
  void begin_pass(bool last);
  void end_pass();
  void set_in_backward(bool on) { in_backward_ = on; }
  // Before the optimizer step: nothing stays gathered.
  void release_all();
  // After the owned slices were updated (a step, a checkpoint load): every unit kept whole is
  // made whole on every rank. No-op with whole units or one rank.
  void allgather_updated();
  // fn(unit) with the unit's parameters whole, one unit at a time. Collective under ZeRO-3.
  void for_each_gathered_unit(const std::function<void(const models::FlatUnit&)>& fn);

  int64_t gathered_peak_bytes() const;
  void reset_gathered_peak();
  const std::vector<int>& gather_order() const;
  int64_t prefetches() const;

  // offload_param (Note [Offloaded partitions]); null without it.
  ParamTier* tier() const { return gatherer_ ? gatherer_->tier() : nullptr; }
  // The optimizer's group fence, and a checkpoint's: every partition resident / stored back.
  void step_fence(size_t group, bool before) { gatherer_->step_fence(group, before); }
  void load_partitions() {
    if (gatherer_) gatherer_->load_partitions();
  }
  void store_partitions() {
    if (gatherer_) gatherer_->store_partitions();
  }
  void drop_partitions() {
    if (gatherer_) gatherer_->drop_partitions();
  }
  void set_trace(std::function<void(const std::string&)> fn);

 private:
  void install_hooks(models::CausalLM& model);

  std::vector<models::FlatUnit>& units_;
  const Partitioning& parts_;
  comm::Communicator& dp_;
  ParamGatheringOptions options_;
  std::unique_ptr<ParamGatherer> gatherer_;  // ZeRO-3
  bool in_backward_ = false;
  std::function<void(const std::string&)> trace_;
  ModuleHooks hooks_;  // after gatherer_: removed before it goes
};

}  // namespace strata::parallel
