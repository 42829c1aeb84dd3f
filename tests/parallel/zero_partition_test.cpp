// Single-process pieces of the engine: partition arithmetic, bucket plans, repadding, storage
// release/materialise, parameter groups over slices.
#include <gtest/gtest.h>

#include "core/error.h"
#include "models/flat_params.h"
#include "models/nn/module.h"
#include "offload/memory_stats.h"
#include "parallel/param_groups.h"
#include "parallel/partition.h"
#include "parallel/partitioning.h"
#include "tensor/tensor.h"

namespace strata::parallel {
namespace {

using tensor::Tensor;

TEST(ZeroPartition, PadsToDpTimesSixteenAndSlicesEqually) {
  UnitPartition p = partition_unit(100, 4);
  EXPECT_EQ(p.padded, 128);  // round_up(100, 64)
  EXPECT_EQ(p.shard, 32);
  EXPECT_EQ(p.owned(0).begin, 0);
  EXPECT_EQ(p.owned(3).begin, 96);
  EXPECT_EQ(p.owned(3).end, 128);
  // Checkpoint coordinates stop at the unpadded size.
  EXPECT_EQ(p.owned_unpadded(3).begin, 96);
  EXPECT_EQ(p.owned_unpadded(3).end, 100);
  EXPECT_TRUE(partition_unit(10, 4).owned_unpadded(1).empty());  // slice 1 is all padding
  EXPECT_EQ(partition_unit(64, 4).padded, 64);                   // already a multiple
  EXPECT_EQ(partition_unit(0, 8).padded, 0);
  // Agrees with the estimate tool's arithmetic (Note [ZeRO padding]).
  for (int dp : {1, 2, 3, 8})
    for (int64_t n : {1, 15, 16, 17, 1000, 12704})
      EXPECT_EQ(partition_unit(n, dp).padded, padded_unit_size(n, 1, dp)) << n << " " << dp;
  UnitPartition w = whole_unit(37);
  EXPECT_EQ(w.padded, 37);
  EXPECT_EQ(w.owned(0).end, 37);
}

TEST(ZeroPartition, SplitRangeKeepsCacheLineBoundaries) {
  auto r = split_range(100, 40);  // 40 rounds down to 32: 32 + 32 + 32 + 4
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].end, 32);
  EXPECT_EQ(r[1].end, 64);
  EXPECT_EQ(r[2].end, 96);
  EXPECT_EQ(r[3].begin, 96);
  EXPECT_EQ(r[3].end, 100);
  auto all = split_range(100, 1000);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].end, 100);
  auto tiny = split_range(5, 2);  // smaller than a cache line: plain chunks
  ASSERT_EQ(tiny.size(), 3u);
  EXPECT_EQ(tiny[2].begin, 4);
  EXPECT_EQ(tiny[2].end, 5);
}

// A fake unit: parameters of `numels` at 16-aligned offsets.
models::FlatUnit fake_unit(const std::vector<int64_t>& numels) {
  models::FlatUnit u;
  u.name = "u";
  int64_t off = 0;
  for (size_t k = 0; k < numels.size(); ++k) {
    u.names.push_back("p" + std::to_string(k));
    u.offsets.push_back(off);
    u.numels.push_back(numels[k]);
    u.shapes.push_back(k == 0 ? tensor::Shape{numels[k] / 4, 4} : tensor::Shape{numels[k]});
    off = (off + numels[k] + 15) / 16 * 16;
  }
  u.params = tensor::zeros({off});
  u.grads = tensor::zeros({off});
  return u;
}

TEST(GradBuckets, AllreducePlanCoversTheUnitAndNamesOverlappingParameters) {
  models::FlatUnit u = fake_unit({64, 20, 40});  // offsets 0, 64, 96; size 144
  ASSERT_EQ(u.params.numel(), 144);
  auto plans = plan_allreduce_buckets(u, 7, 48);  // 48 -> ranges [0,48) [48,96) [96,144)
  ASSERT_EQ(plans.size(), 3u);
  EXPECT_EQ(plans[0].unit, 7);
  EXPECT_EQ(plans[0].params, (std::vector<int>{0}));
  EXPECT_EQ(plans[1].params, (std::vector<int>{0, 1}));  // end of p0, p1 [64, 84)
  EXPECT_EQ(plans[2].params, (std::vector<int>{2}));
  int64_t covered = 0;
  for (auto& b : plans) covered += b.per_rank.size();
  EXPECT_EQ(covered, 144);
}

TEST(GradBuckets, ReduceScatterPlanTakesTheSameRangeOfEverySlice) {
  models::FlatUnit u = fake_unit({64, 20, 40});  // 144 elements
  UnitPartition p = partition_unit(144, 2);      // padded 160, L = 80
  u.params = tensor::zeros({160});
  u.grads = tensor::zeros({160});
  auto plans = plan_reduce_scatter_buckets(u, 0, p, 64);  // 32 per rank -> [0,32) [32,64) [64,80)
  ASSERT_EQ(plans.size(), 3u);
  ASSERT_EQ(plans[0].ranges.size(), 2u);
  EXPECT_EQ(plans[0].ranges[1].begin, 80);
  EXPECT_EQ(plans[0].ranges[1].end, 112);
  EXPECT_EQ(plans[0].params, (std::vector<int>{0, 1, 2}));  // [0,32) of p0 and [80,112)
  EXPECT_EQ(plans[2].per_rank.begin, 64);
  EXPECT_EQ(plans[2].ranges[1].begin, 144);           // [144, 160): padding only
  EXPECT_EQ(plans[2].params, (std::vector<int>{1}));  // [64, 80) is p1's start
  // One bucket for a whole unit when it fits.
  EXPECT_EQ(plan_reduce_scatter_buckets(u, 0, p, 1000).size(), 1u);
}

TEST(ParamGroups, SegmentsAreClippedToTheSlice) {
  models::FlatUnit u = fake_unit({64, 20, 40});
  auto all = unit_segments(u);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_TRUE(all[0].decay);   // a matrix
  EXPECT_FALSE(all[1].decay);  // 1-D
  auto mid = unit_segments(u, {48, 100});
  ASSERT_EQ(mid.size(), 3u);
  EXPECT_EQ(mid[0].offset, 0);
  EXPECT_EQ(mid[0].numel, 16);  // [48, 64) of p0
  EXPECT_EQ(mid[1].offset, 16);
  EXPECT_EQ(mid[1].numel, 20);
  EXPECT_EQ(mid[2].offset, 48);  // [96, 100) of p2
  EXPECT_EQ(mid[2].numel, 4);
  optim::ParamGroup g = unit_param_group(u, {48, 100});
  EXPECT_EQ(g.param.numel(), 52);
  EXPECT_EQ(g.param.storage(), u.params.storage());
}

TEST(FlatParams, RepadGrowsBuffersRebindsViewsAndKeepsPaddingZero) {
  models::nn::Module root;
  auto& a = root.add_module<models::nn::Module>("a");
  autograd::Variable w = a.register_parameter("w", tensor::Shape{3, 5});
  autograd::Variable b = a.register_parameter("b", tensor::Shape{7});
  tensor::Tensor(w.data()).fill_(2.0);
  tensor::Tensor(b.data()).fill_(3.0);
  auto units = models::flatten_parameters(root, {{"a", {"a"}}});
  ASSERT_EQ(units[0].size(), 32);  // name order: a.b [0, 7) -> 16, a.w [16, 31) -> 32
  tensor::Tensor(w.grad()).fill_(1.0);
  models::repad_flat_units(units, 3 * 16);
  const models::FlatUnit& u = units[0];
  EXPECT_EQ(u.size(), 48);
  // Views rebound into the new buffers, values kept.
  EXPECT_EQ(w.data().storage(), u.params.storage());
  EXPECT_EQ(b.grad().storage(), u.grads.storage());
  EXPECT_EQ(w.data().offset(), u.params.offset() + 16);
  std::vector<float> p = tensor::to_float_vector(u.params), g = tensor::to_float_vector(u.grads);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(p[i], 3.f);
  for (int i = 16; i < 31; ++i) EXPECT_EQ(p[i], 2.f);
  for (int i = 16; i < 31; ++i) EXPECT_EQ(g[i], 1.f);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(g[i], 0.f);
  for (int i = 32; i < 48; ++i) {
    EXPECT_EQ(p[i], 0.f);
    EXPECT_EQ(g[i], 0.f);
  }
  // Already a multiple: untouched.
  auto storage = u.params.storage();
  models::repad_flat_units(units, 16);
  EXPECT_EQ(units[0].params.storage(), storage);
}

// Note [Engine parts]: the Partitioning part. Whole units (stage 0) are not repadded, every rank
// owns all of each and rank 0 alone writes them to a checkpoint; partitioned units (stages 1-3)
// are repadded to dp * 16 and rank r owns slice r, whose checkpoint coordinates stop at the
// unpadded size.
TEST(Partitioning, WholeOrSlicedUnitsAndWhoWritesThem) {
  auto make_units = [] {
    auto root = std::make_unique<models::nn::Module>();
    auto& a = root->add_module<models::nn::Module>("a");
    a.register_parameter("w", tensor::Shape{10, 10});  // 100 elements, padded to 112 by flatten
    auto units = models::flatten_parameters(*root, {{"a", {"a"}}});
    return std::make_pair(std::move(root), std::move(units));
  };
  {
    auto [root, units] = make_units();
    const int64_t n = units[0].size();
    const Partitioning whole(units, /*partitioned=*/false, /*dp_size=*/4, /*dp_rank=*/2);
    EXPECT_FALSE(whole.partitioned());
    EXPECT_EQ(units[0].size(), n);  // not repadded
    EXPECT_EQ(whole.owned(0).begin, 0);
    EXPECT_EQ(whole.owned(0).end, n);
    EXPECT_FALSE(whole.writes_shards());
    EXPECT_TRUE(Partitioning(units, false, 4, 0).writes_shards());
  }
  auto [root, units] = make_units();
  const int64_t numel = units[0].size();
  const Partitioning sliced(units, /*partitioned=*/true, /*dp_size=*/4, /*dp_rank=*/3);
  EXPECT_TRUE(sliced.partitioned());
  EXPECT_TRUE(sliced.writes_shards());
  EXPECT_EQ(sliced.unit(0).numel, numel);  // checkpoint coordinates: before the repad
  EXPECT_EQ(units[0].size(), align_up(numel, 4 * kPartitionAlign));
  EXPECT_EQ(sliced.unit(0).padded, units[0].size());
  const int64_t L = units[0].size() / 4;
  EXPECT_EQ(sliced.owned(0).begin, 3 * L);
  EXPECT_EQ(sliced.owned(0).end, 4 * L);
  EXPECT_EQ(sliced.owned_unpadded(0).end, numel);
}

TEST(Storage, ReleaseFreesTheBytesAndAUseFailsUntilMaterialized) {
  auto& stats = offload::MemoryStats::global();
  const int64_t before = stats.usage(offload::Tier::Host, offload::Category::Param).current;
  Tensor t;
  {
    offload::CategoryScope scope(offload::Category::Param);
    t = Tensor::empty({256});
  }
  t.fill_(1.0);
  Tensor view = t.narrow(0, 16, 32).view({4, 8});
  EXPECT_EQ(stats.usage(offload::Tier::Host, offload::Category::Param).current - before, 1024);
  t.storage()->release();
  EXPECT_TRUE(t.storage()->is_released());
  EXPECT_EQ(stats.usage(offload::Tier::Host, offload::Category::Param).current, before);
  // A use while released is an internal error naming the cause, not a read of freed memory.
  try {
    view.fill_(2.0);
    ADD_FAILURE() << "a released storage was written";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("released storage"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tensor::to_float_vector(view), InternalError);
  t.storage()->release();  // idempotent
  // Materialised under another category (ZeRO's transient buffers are Comm); views work again.
  const int64_t comm = stats.usage(offload::Tier::Host, offload::Category::Comm).current;
  t.storage()->materialize(offload::Category::Comm);
  EXPECT_EQ(stats.usage(offload::Tier::Host, offload::Category::Comm).current - comm, 1024);
  view.fill_(5.0);
  EXPECT_EQ(tensor::to_float_vector(t)[16], 5.f);
  EXPECT_EQ(t.storage()->category(), offload::Category::Comm);
  t.storage()->release();  // and the destructor of a released storage frees nothing twice
  EXPECT_EQ(stats.usage(offload::Tier::Host, offload::Category::Comm).current, comm);
  // Memory someone else owns cannot be released.
  float buf[4];
  Tensor blob = Tensor::from_blob(buf, {4}, DType::F32);
  EXPECT_THROW(blob.storage()->release(), InternalError);
}

}  // namespace
}  // namespace strata::parallel
