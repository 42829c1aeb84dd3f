// ZeRO-Offload across data-parallel ranks on the CPU tier (parallel/host_placement.h; the same
// code a GPU run takes, the copies memcpy): each rank steps its own partition on the host, and the
// run is bitwise the run without offload over the same world at ZeRO-1 and ZeRO-2, fp32 and bf16
// (Note [Offloaded step]). The GPU version is tests/dist/gpu/offload_gpu_mpi_test.cpp.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstring>
#include <vector>

#include "tests/parallel/engine_test_util.h"
#include "tests/support/mpi_test_env.h"

namespace strata::parallel {
namespace {

using strata::testing::TrainSpec;

struct Result {
  std::vector<double> losses;
  std::vector<std::vector<uint8_t>> params;
};

Result run(const TrainSpec& s, int stage, bool offload, DType dtype) {
  ZeroConfig z;
  z.stage = stage;
  z.reduce_bucket_size = 1000;
  z.allgather_bucket_size = 1000;
  z.offload_optimizer.enabled = offload;
  models::gpt2::GPT2 model(strata::testing::tiny_config(s), s.seed);
  Engine engine(model, strata::testing::test_world(), z, strata::testing::adamw_factory(), dtype);
  Result r;
  for (int step = 0; step < s.steps; ++step)
    r.losses.push_back(engine.average(strata::testing::engine_step(engine, s, step)));
  for (const models::FlatUnit& u : model.flat_units()) {
    const auto* p = static_cast<const uint8_t*>(u.params.data_ptr());
    r.params.emplace_back(p, p + u.params.nbytes());
  }
  return r;
}

TEST(OffloadMpi, EveryRankStepsItsPartitionAndTheRunKeepsItsBits) {
  TrainSpec s;
  s.steps = 3;
  s.accum = 2;
  s.max_norm = 0.5;
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (int stage : {1, 2}) {
      SCOPED_TRACE(fmt::format("{} stage {}", dtype_name(dtype), stage));
      const Result ref = run(s, stage, false, dtype);
      const Result off = run(s, stage, true, dtype);
      EXPECT_EQ(off.losses, ref.losses);
      EXPECT_TRUE(off.params == ref.params);
      EXPECT_LT(ref.losses.back(), ref.losses.front());
    }
  }
}

}  // namespace
}  // namespace strata::parallel
