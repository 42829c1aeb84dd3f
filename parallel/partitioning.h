#pragma once
// Partitioning: the Engine part that says which rank owns which slice of each flat unit (Note
// [ZeRO partitions] in parallel/partition.h). Every other part asks it: the gradient reduction
// reduces into the owned slices, the parameter gathering allgathers them, the optimizer placement
// steps them, checkpoints write them.
//
// Two layouts, chosen once from the config: whole units (ZeRO stage 0, plain DP: no repad, every
// rank owns all of every unit and holds the same values) and dp-partitioned units (stages 1-3:
// the units repadded so rank r owns slice r, of equal size on every rank).
#include <vector>

#include "models/flat_params.h"
#include "parallel/partition.h"

namespace strata::parallel {

class Partitioning {
 public:
  // Records each unit's partition in its unpadded size (the coordinates checkpoints use) and,
  // when `partitioned`, repads the units' buffers to a multiple of dp * kPartitionAlign.
  Partitioning(std::vector<models::FlatUnit>& units, bool partitioned, int dp_size, int dp_rank);

  // Whether each rank owns a different slice (stages 1-3). Then a sum over what each rank owns
  // (the gradient norm) needs an allreduce, and updated slices must be allgathered.
  bool partitioned() const { return partitioned_; }
  int num_units() const { return static_cast<int>(parts_.size()); }
  const UnitPartition& unit(int u) const { return parts_[u]; }
  const std::vector<UnitPartition>& units() const { return parts_; }

  // This rank's slice of unit u in its (padded) flat buffer: the whole unit when not partitioned.
  Range owned(int u) const { return parts_[u].owned(owner_index()); }
  // The part of it inside [0, numel): what a checkpoint holds for this rank (may be empty).
  Range owned_unpadded(int u) const { return parts_[u].owned_unpadded(owner_index()); }
  // Whether this rank writes its owned slices to a checkpoint: every rank when partitioned; with
  // whole units rank 0 alone (all ranks hold the same values).
  bool writes_shards() const { return partitioned_ || rank_ == 0; }

 private:
  int owner_index() const { return partitioned_ ? rank_ : 0; }

  std::vector<UnitPartition> parts_;
  bool partitioned_ = false;
  int rank_ = 0;
};

}  // namespace strata::parallel
