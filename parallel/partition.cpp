#include "parallel/partition.h"

#include <algorithm>

#include "core/error.h"

namespace strata::parallel {

int64_t align_up(int64_t x, int64_t multiple) {
  return (x + multiple - 1) / multiple * multiple;
}

UnitPartition partition_unit(int64_t numel, int dp) {
  STRATA_CHECK(dp >= 1 && numel >= 0, "partition of {} elements over {} ranks", numel, dp);
  UnitPartition p;
  p.numel = numel;
  p.dp = dp;
  p.padded = align_up(numel, dp * kPartitionAlign);
  p.shard = p.padded / dp;
  return p;
}

UnitPartition whole_unit(int64_t numel) {
  UnitPartition p;
  p.numel = numel;
  p.padded = numel;
  p.shard = numel;
  p.dp = 1;
  return p;
}

namespace {

// split_range's range length.
int64_t split_step(int64_t max_size, int64_t align) {
  STRATA_CHECK(max_size >= 1, "bucket size {} must be positive", max_size);
  return max_size >= align ? max_size / align * align : max_size;
}

// Elements per rank of a ZeRO bucket of `bucket_size` elements in all.
int64_t per_rank_bucket(int64_t bucket_size, int dp) {
  return std::max<int64_t>(1, bucket_size / dp);
}

}  // namespace

std::vector<Range> split_range(int64_t n, int64_t max_size, int64_t align) {
  const int64_t step = split_step(max_size, align);
  std::vector<Range> out;
  for (int64_t b = 0; b < n; b += step) out.push_back({b, std::min(n, b + step)});
  return out;
}

namespace {

// Indices of the parameters of `unit` overlapping any of `ranges`.
std::vector<int> overlapping(const models::FlatUnit& unit, const std::vector<Range>& ranges) {
  std::vector<int> out;
  for (size_t k = 0; k < unit.offsets.size(); ++k) {
    Range p{unit.offsets[k], unit.offsets[k] + unit.numels[k]};
    for (const Range& r : ranges)
      if (!intersect(p, r).empty()) {
        out.push_back(static_cast<int>(k));
        break;
      }
  }
  return out;
}

}  // namespace

std::vector<BucketPlan> plan_allreduce_buckets(const models::FlatUnit& unit, int unit_index,
                                               int64_t bucket_size) {
  std::vector<BucketPlan> plans;
  for (Range r : split_range(unit.size(), bucket_size)) {
    BucketPlan b;
    b.unit = unit_index;
    b.per_rank = r;
    b.ranges = {r};
    b.params = overlapping(unit, b.ranges);
    plans.push_back(std::move(b));
  }
  return plans;
}

std::vector<BucketPlan> plan_reduce_scatter_buckets(const models::FlatUnit& unit, int unit_index,
                                                    const UnitPartition& part,
                                                    int64_t bucket_size) {
  STRATA_CHECK(unit.size() == part.padded, "unit '{}' has {} elements, its partition {}", unit.name,
               unit.size(), part.padded);
  const int64_t per_rank = per_rank_bucket(bucket_size, part.dp);
  std::vector<BucketPlan> plans;
  for (Range r : split_range(part.shard, per_rank)) {
    BucketPlan b;
    b.unit = unit_index;
    b.per_rank = r;
    for (int q = 0; q < part.dp; ++q)
      b.ranges.push_back({q * part.shard + r.begin, q * part.shard + r.end});
    b.params = overlapping(unit, b.ranges);
    plans.push_back(std::move(b));
  }
  return plans;
}

int64_t largest_reduce_scatter_bucket(int64_t shard, int dp, int64_t bucket_size) {
  // split_range's first range is its longest.
  return std::min(shard, split_step(per_rank_bucket(bucket_size, dp), kPartitionAlign)) * dp;
}

}  // namespace strata::parallel
