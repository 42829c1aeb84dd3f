#include "parallel/partitioning.h"

namespace strata::parallel {

Partitioning::Partitioning(std::vector<models::FlatUnit>& units, bool partitioned, int dp_size,
                           int dp_rank)
    : partitioned_(partitioned), rank_(dp_rank) {
  // Note [ZeRO partitions]: checkpoints use the unpadded coordinates, recorded before the repad.
  for (const models::FlatUnit& u : units)
    parts_.push_back(partitioned ? partition_unit(u.size(), dp_size) : whole_unit(u.size()));
  if (partitioned) models::repad_flat_units(units, static_cast<int64_t>(dp_size) * kPartitionAlign);
}

}  // namespace strata::parallel
