#pragma once
// Slice arithmetic of ZeRO partitions and gradient buckets over flat unit buffers.
//
// Note [ZeRO partitions]
// ZeRO (stages 1-3) works on each unit's flat buffers (Note [Flat parameters]) padded to a
// multiple of dp * 16 elements (models::repad_flat_units): `padded` = P = dp * L. Rank r owns
// slice r, [r*L, (r+1)*L), of EVERY unit — its optimizer state (stages 1-3), its reduced
// gradient (stages 1-3) and, in stage 3, its fp32 parameters. Every slice is whole cache lines
// (L is a multiple of 16) and all ranks' slices are equal, which is what reduce-scatter and
// allgather need. The padding (beyond `numel`, the size flatten laid out) is zero and covered by
// no parameter, so it stays zero through every update; checkpoints use flat coordinates
// [0, numel), the same for every dp size, so a run can resume on another dp (Engine::shards).
// Stage 0 (plain DP) does not repad: P = numel, and each rank "owns" everything.
#include <cstdint>
#include <vector>

#include "models/flat_params.h"
#include "parallel/zero_memory.h"  // kPartitionAlign, and the formulas the partition matches

namespace strata::parallel {

// Half-open element range.
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
};

inline Range intersect(Range a, Range b) {
  Range r{a.begin > b.begin ? a.begin : b.begin, a.end < b.end ? a.end : b.end};
  if (r.end < r.begin) r.end = r.begin;
  return r;
}

int64_t align_up(int64_t x, int64_t multiple);

// One unit's partition (Note [ZeRO partitions]).
struct UnitPartition {
  int64_t numel = 0;   // as flatten laid the unit out, before dp padding
  int64_t padded = 0;  // P, a multiple of dp * kPartitionAlign (numel itself when unpartitioned)
  int64_t shard = 0;   // L = P / dp
  int dp = 1;

  // Rank r's slice of the padded buffer.
  Range owned(int r) const { return {r * shard, (r + 1) * shard}; }
  // The part of rank r's slice inside [0, numel): what a checkpoint holds for it (may be empty).
  Range owned_unpadded(int r) const { return intersect(owned(r), {0, numel}); }
};

// P = round_up(numel, dp * kPartitionAlign), L = P / dp.
UnitPartition partition_unit(int64_t numel, int dp);
// Stage 0: the whole unit, P = numel, L = numel (every rank "owns" it all).
UnitPartition whole_unit(int64_t numel);

// Note [Gradient buckets]
// A bucket is a set of element ranges of ONE unit's flat gradient buffer reduced by one
// collective; a bucket never spans units because units are separate buffers (and a unit's
// gradients become final together). Plain DP (stage 0) buckets are contiguous slices of at most
// reduce_bucket_size elements, reduced with an in-place allreduce. ZeRO buckets are a per-rank
// range [a, b) of the slice: the dp ranges [r*L + a, r*L + b) of the buffer, reduce-scattered
// so each rank gets [a, b) of its own slice; dp * (b - a) <= reduce_bucket_size. Bucket
// boundaries are multiples of kPartitionAlign (cache lines) except at the end of the buffer.
// A bucket may be launched once the gradients of every parameter overlapping any of its ranges
// are final for the pass (grad-ready hooks count them down), which overlaps the reduction with
// the rest of backward. Every rank builds the same plan and the same graph, so the launch order
// (Note [Collective order]) is the same everywhere.
struct BucketPlan {
  int unit = 0;
  Range per_rank;             // stage 0: the flat range itself
  std::vector<Range> ranges;  // flat ranges it covers (1 for stage 0, dp for ZeRO)
  std::vector<int> params;    // indices into the unit's parameters overlapping `ranges`
};

// Splits [0, n) into consecutive ranges of at most `max_size` elements; boundaries are multiples
// of `align` unless max_size < align (then max_size).
std::vector<Range> split_range(int64_t n, int64_t max_size, int64_t align = kPartitionAlign);

// Stage 0 buckets of `unit` (index `unit_index`) over [0, unit.size()).
std::vector<BucketPlan> plan_allreduce_buckets(const models::FlatUnit& unit, int unit_index,
                                               int64_t bucket_size);
// ZeRO buckets of `unit` partitioned as `part` (unit.size() == part.padded).
std::vector<BucketPlan> plan_reduce_scatter_buckets(const models::FlatUnit& unit, int unit_index,
                                                    const UnitPartition& part, int64_t bucket_size);
// Elements of the largest of those buckets over all ranks (its staging copy), for a unit of
// `shard` elements per rank over `dp` ranks.
int64_t largest_reduce_scatter_bucket(int64_t shard, int dp, int64_t bucket_size);

}  // namespace strata::parallel
