// ZeRO-Offload across data-parallel ranks on the CPU tier (parallel/host_placement.h; the same
// code a GPU run takes, the copies memcpy): each rank steps its own partition on the host, and the
// run is bitwise the run without offload over the same world at ZeRO-1, 2 and 3, fp32 and bf16
// (Note [Offloaded step]), with the states in host memory or on NVMe. The GPU version is
// tests/dist/gpu/offload_gpu_mpi_test.cpp.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstring>
#include <optional>
#include <vector>

#include "tests/parallel/engine_test_util.h"
#include "tests/support/mpi_test_env.h"
#include "tests/support/temp_dir.h"

namespace strata::parallel {
namespace {

using strata::testing::TrainSpec;

struct Result {
  std::vector<double> losses;
  std::vector<std::vector<uint8_t>> params;
};

// nvme_path non-empty: offload_optimizer.device nvme there (ZeRO-Infinity's optimizer side).
// `deferred`: the model built unit by unit into partitions on the host tier (offload_param cpu,
// Note [Unit-by-unit construction]).
Result run(const TrainSpec& s, int stage, bool offload, DType dtype,
           const std::string& nvme_path = "", bool deferred = false) {
  ZeroConfig z;
  z.stage = stage;
  z.reduce_bucket_size = 1000;
  z.allgather_bucket_size = 1000;
  z.stage3_param_persistence_threshold = 500;
  z.offload_optimizer.enabled = offload;
  if (!nvme_path.empty()) {
    z.offload_optimizer.nvme = true;
    z.offload_optimizer.nvme_options.nvme_path = nvme_path;
    z.offload_optimizer.nvme_options.sub_group_size = 600;
    z.offload_optimizer.nvme_options.buffer_count = 3;
  }
  if (deferred) z.offload_param.device = OffloadParamConfig::Device::Cpu;
  std::optional<models::nn::DeferredInitScope> scope;
  if (deferred) scope.emplace();
  models::gpt2::GPT2 model(strata::testing::tiny_config(s), s.seed);
  scope.reset();
  EXPECT_EQ(model.built_deferred(), deferred);
  Engine engine(model, strata::testing::test_world(), z, strata::testing::adamw_factory(), dtype);
  Result r;
  for (int step = 0; step < s.steps; ++step)
    r.losses.push_back(engine.average(strata::testing::engine_step(engine, s, step)));
  auto add = [&r](const tensor::Tensor& t) {
    const auto* p = static_cast<const uint8_t*>(t.data_ptr());
    r.params.emplace_back(p, p + t.nbytes());
  };
  if (stage == 3) {  // the owned partitions: units are released between steps
    for (const Engine::Shard& sh : engine.shards())
      if (sh.key == "param") add(sh.data);
  } else {
    for (const models::FlatUnit& u : model.flat_units()) add(u.params);
  }
  return r;
}

TEST(OffloadMpi, EveryRankStepsItsPartitionAndTheRunKeepsItsBits) {
  TrainSpec s;
  s.steps = 3;
  s.accum = 2;
  s.max_norm = 0.5;
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (int stage : {1, 2, 3}) {
      SCOPED_TRACE(fmt::format("{} stage {}", dtype_name(dtype), stage));
      const Result ref = run(s, stage, false, dtype);
      const Result off = run(s, stage, true, dtype);
      EXPECT_EQ(off.losses, ref.losses);
      EXPECT_TRUE(off.params == ref.params);
      EXPECT_LT(ref.losses.back(), ref.losses.front());
    }
  }
}

// ZeRO-Infinity's optimizer states on NVMe (optim/nvme_adamw.h): every rank streams its own
// partition's states through its swap file, at ZeRO-1, 2 and 3, bitwise the in-memory run.
TEST(OffloadMpi, NvmeStatesEveryRankStreamsItsPartitionBitwise) {
  TrainSpec s;
  s.steps = 3;
  s.accum = 2;
  s.max_norm = 0.5;
  testing::TempDir dir;  // each rank its own directory
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (int stage : {1, 2, 3}) {
      SCOPED_TRACE(fmt::format("{} stage {}", dtype_name(dtype), stage));
      const Result ref = run(s, stage, false, dtype);
      const Result nvme = run(s, stage, true, dtype, dir.path());
      EXPECT_EQ(nvme.losses, ref.losses);
      EXPECT_TRUE(nvme.params == ref.params);
    }
  }
}

// Note [Unit-by-unit construction] across ranks in mixed precision: each rank initialises every
// unit in fp32, keeps its owned slice as the master (the optimizer in memory, offloaded to the
// host, or on NVMe) and its cast partition on the host tier; bitwise the in-memory run built
// whole, with the same optimizer placement.
TEST(OffloadMpi, MixedPrecisionBuiltUnitByUnitIsBitwiseTheWholeBuild) {
  TrainSpec s;
  s.steps = 3;
  s.max_norm = 0.5;
  testing::TempDir dir;
  struct Case {
    bool offload;
    std::string nvme;
  };
  for (const Case& c : {Case{false, ""}, Case{true, ""}, Case{true, dir.path().string()}}) {
    SCOPED_TRACE(fmt::format("offload {} nvme '{}'", c.offload, c.nvme));
    const Result whole = run(s, 3, c.offload, DType::BF16, c.nvme);
    const Result unit_by_unit = run(s, 3, c.offload, DType::BF16, c.nvme, /*deferred=*/true);
    EXPECT_EQ(unit_by_unit.losses, whole.losses);
    EXPECT_TRUE(unit_by_unit.params == whole.params);
    EXPECT_FALSE(whole.params.empty());
  }
}

}  // namespace
}  // namespace strata::parallel
