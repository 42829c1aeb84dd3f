// ParamTier (parallel/param_tier.h, Note [Parameter tier], Note [Parameter read-ahead]): the
// partitions' home on the host or NVMe, loads and stores bit for bit, loads served from the copies
// the buffers keep and from reads ahead, one buffer, a store making a copy stale, max_in_cpu, the
// layout the start's plans count (param_tier_layout) and the buffer_size error.
#include "parallel/param_tier.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "offload/memory_stats.h"

namespace strata::parallel {
namespace {

namespace fs = std::filesystem;
using tensor::Tensor;

class ParamTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("strata_param_tier_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  OffloadParamConfig nvme(int64_t buffers) const {
    OffloadParamConfig c;
    c.device = OffloadParamConfig::Device::Nvme;
    c.nvme_path = dir_.string();
    c.buffer_count = buffers;
    return c;
  }
  static Tensor values(int64_t n, float base) {
    Tensor t = Tensor::empty({n});
    for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = base + static_cast<float>(i);
    return t;
  }
  static bool same(const Tensor& a, const Tensor& b) {
    return a.numel() == b.numel() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
  }

  fs::path dir_;
};

const std::vector<std::string> kNames = {"wte", "h.0", "ln_f", "h.1"};
const std::vector<int64_t> kNumel = {3000, 5000, 0, 4000};  // ln_f is not managed

TEST_F(ParamTierTest, NvmeLoadsWhatWasStoredAndReadsAhead) {
  ParamTier tier(nvme(2), kNumel, kNames, DType::F32);
  EXPECT_FALSE(tier.holds(2));
  EXPECT_EQ(tier.nvme_bytes(), (3000 + 5000 + 4000) * 4);
  EXPECT_EQ(tier.buffer_bytes(), 5000 * 4);  // the largest partition
  for (int u : {0, 1, 3}) {
    tier.store(u, values(kNumel[u], 100.f * u));
    tier.wait_all();
  }
  // Note [Parameter read-ahead]: the two buffers keep the last two written, h.0 and h.1 (in
  // wte's buffer). The window (buffer_count - 1 = 1 unit) is wte: it takes the first buffer
  // holding a copy outside it, h.1's.
  tier.read_ahead({0, 1, 3}, 0);
  EXPECT_EQ(tier.reads(), 1);
  for (int u : {0, 1, 3}) {
    Tensor dst = Tensor::empty({kNumel[u]});
    tier.load(u, dst);
    EXPECT_TRUE(same(dst, values(kNumel[u], 100.f * u))) << kNames[u];
  }
  EXPECT_EQ(tier.ahead_hits(), 2);  // wte read ahead, h.0's copy kept from its write
  EXPECT_EQ(tier.reads(), 2);       // h.1 was read on demand (into wte's buffer)
  EXPECT_EQ(tier.waits().misses, 1);
  // A copy kept from a load serves the next load of the unit.
  Tensor again = Tensor::empty({4000});
  tier.load(3, again);
  EXPECT_TRUE(same(again, values(4000, 300.f)));
  EXPECT_EQ(tier.reads(), 2);
  EXPECT_EQ(tier.files().size(), 1u);
  EXPECT_EQ(tier.files().front().rfind(dir_.string(), 0), 0u);
}

TEST_F(ParamTierTest, OneBufferServesLoadsAndStoresInTurn) {
  ParamTier tier(nvme(1), kNumel, kNames, DType::F32);
  for (int round = 0; round < 3; ++round)
    for (int u : {0, 1, 3}) {
      tier.read_ahead({0, 1, 3}, 0);  // no buffer to spare: nothing read ahead
      if (round > 0) {
        Tensor dst = Tensor::empty({kNumel[u]});
        tier.load(u, dst);
        EXPECT_TRUE(same(dst, values(kNumel[u], 10.f * round + u))) << round << kNames[u];
      }
      tier.store(u, values(kNumel[u], 10.f * (round + 1) + u));
    }
  EXPECT_EQ(tier.waits().late + tier.waits().misses, 6);
}

TEST_F(ParamTierTest, AStoreMakesAReadAheadCopyStale) {
  ParamTier tier(nvme(2), kNumel, kNames, DType::F32);
  for (int u : {0, 1, 3}) {
    tier.store(u, values(kNumel[u], 1.f));
    tier.wait_all();
  }
  tier.read_ahead({0}, 0);  // wte's copy was given up for h.1's: read again
  EXPECT_EQ(tier.reads(), 1);
  tier.store(0, values(3000, 7.f));  // the update
  Tensor dst = Tensor::empty({3000});
  tier.load(0, dst);
  EXPECT_TRUE(same(dst, values(3000, 7.f)));
  // A copy kept from a load goes stale the same way.
  tier.store(0, values(3000, 8.f));
  tier.load(0, dst);
  EXPECT_TRUE(same(dst, values(3000, 8.f)));
}

TEST_F(ParamTierTest, MaxInCpuKeepsTheFirstUnitsThatFitOnTheHost) {
  OffloadParamConfig c = nvme(2);
  c.max_in_cpu = 3500;
  ParamTier tier(c, kNumel, kNames, DType::F32);
  EXPECT_FALSE(tier.on_nvme(0));  // 3000 fit
  EXPECT_TRUE(tier.on_nvme(1));   // 5000 do not
  EXPECT_TRUE(tier.on_nvme(3));   // 500 left: 4000 do not
  tier.store(0, values(3000, 2.f));
  Tensor dst = Tensor::empty({3000});
  tier.load(0, dst);
  EXPECT_TRUE(same(dst, values(3000, 2.f)));
  EXPECT_EQ(tier.reads(), 0);
}

// param_tier_layout (what the start's plans count) is what a built tier allocates.
TEST_F(ParamTierTest, LayoutIsWhatTheTierAllocates) {
  OffloadParamConfig c = nvme(3);
  c.max_in_cpu = 3500;
  const ParamTierLayout l = param_tier_layout(c, kNumel, DType::F32);
  EXPECT_EQ(l.nvme, (std::vector<bool>{false, true, false, true}));
  EXPECT_EQ(l.host_bytes, 3000 * 4);
  EXPECT_EQ(l.nvme_extents, (std::vector<int64_t>{5000 * 4, 4000 * 4}));
  EXPECT_EQ(l.largest_unit, 1);
  auto& stats = offload::MemoryStats::global();
  const int64_t pinned = stats.usage(offload::Tier::Pinned, offload::Category::Param).current;
  const int64_t on_nvme = stats.usage(offload::Tier::Nvme, offload::Category::Param).current;
  ParamTier tier(c, kNumel, kNames, DType::F32);
  EXPECT_EQ(tier.buffer_bytes(), l.buffer_bytes);
  EXPECT_EQ(tier.buffer_count(), l.buffer_count);
  EXPECT_EQ(tier.nvme_bytes(), l.nvme_extents[0] + l.nvme_extents[1]);
  EXPECT_EQ(stats.usage(offload::Tier::Pinned, offload::Category::Param).current - pinned,
            l.host_bytes + l.buffer_count * l.buffer_bytes);
  EXPECT_EQ(stats.usage(offload::Tier::Nvme, offload::Category::Param).current - on_nvme,
            tier.nvme_bytes());
  // Nothing on NVMe (device cpu): no buffers.
  OffloadParamConfig cpu = c;
  cpu.device = OffloadParamConfig::Device::Cpu;
  const ParamTierLayout h = param_tier_layout(cpu, kNumel, DType::BF16);
  EXPECT_EQ(h.host_bytes, (3000 + 5000 + 4000) * 2);
  EXPECT_EQ(h.buffer_count, 0);
  EXPECT_TRUE(h.nvme_extents.empty());
}

// Note [Parameter tier]: pinned buffers of 2 MiB or more are whole 2 MiB pages; smaller ones and
// pageable ones are the largest partition's bytes.
TEST_F(ParamTierTest, PinnedBuffersOfAHugePageOrMoreAreWholeHugePages) {
  OffloadParamConfig c = nvme(2);
  const std::vector<int64_t> big = {800'000, 0, 300'000};  // 3.2 MB, 1.2 MB of fp32
  EXPECT_EQ(param_tier_layout(c, big, DType::F32).buffer_bytes, int64_t{4} << 20);
  EXPECT_EQ(param_tier_layout(c, {300'000}, DType::F32).buffer_bytes, 1'200'000);
  c.pin_memory = false;
  EXPECT_EQ(param_tier_layout(c, big, DType::F32).buffer_bytes, 3'200'000);
}

TEST_F(ParamTierTest, CpuTierHoldsThePartitionsInPinnedMemory) {
  OffloadParamConfig c;
  c.device = OffloadParamConfig::Device::Cpu;
  const auto& stats = offload::MemoryStats::global();
  const int64_t before = stats.usage(offload::Tier::Pinned, offload::Category::Param).current;
  ParamTier tier(c, kNumel, kNames, DType::F32);
  EXPECT_EQ(stats.usage(offload::Tier::Pinned, offload::Category::Param).current - before,
            (3000 + 5000 + 4000) * 4);
  EXPECT_EQ(tier.buffer_count(), 0);
  tier.store(3, values(4000, 3.f));
  Tensor dst = Tensor::empty({4000});
  tier.load(3, dst);
  EXPECT_TRUE(same(dst, values(4000, 3.f)));
}

TEST_F(ParamTierTest, ABufferSmallerThanAPartitionIsAnErrorNamingTheUnit) {
  OffloadParamConfig c = nvme(2);
  c.buffer_size = 4500;
  try {
    ParamTier tier(c, kNumel, kNames, DType::F32);
    FAIL() << "no error";
  } catch (const UserError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("zero_optimization.offload_param.buffer_size is 4500"), std::string::npos)
        << what;
    EXPECT_NE(what.find("'h.0' has 5000"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace strata::parallel
