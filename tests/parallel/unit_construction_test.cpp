// Note [Unit-by-unit construction] (parallel/engine.h): a model built inside a DeferredInitScope
// and handed to a ZeRO-3 engine with offload_param is initialised one unit at a time straight
// into its offloaded partitions. What must hold: the run is bitwise the in-memory ZeRO-3 run of
// a model built whole (losses, parameters) for every optimizer placement (device, cpu, nvme),
// and construction's peak parameter bytes — measured by the allocators — are one unit plus the
// tier's buffers, not the model. dp 2 and the `train` path are in tests/dist.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/self_communicator.h"
#include "offload/memory_stats.h"
#include "tests/parallel/engine_test_util.h"

namespace strata::parallel {
namespace {

namespace fs = std::filesystem;
using offload::Category;
using offload::MemoryStats;
using offload::Tier;
using strata::testing::TrainSpec;

enum class Opt { Device, Cpu, Nvme };

class UnitConstruction : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("strata_unit_construction_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // ZeRO-3; offload_param on NVMe unless `in_memory`; the optimizer where `opt` says.
  ZeroConfig zero(bool in_memory, Opt opt) const {
    ZeroConfig z;
    z.stage = 3;
    z.reduce_bucket_size = 1000;
    z.allgather_bucket_size = 1000;
    z.stage3_param_persistence_threshold = 500;  // every block and the embeddings partitioned
    if (!in_memory) {
      z.offload_param.device = OffloadParamConfig::Device::Nvme;
      z.offload_param.nvme_path = dir_.string();
      z.offload_param.buffer_count = 3;
      z.offload_param.aio.block_size = 64 * 1024;
    }
    if (opt != Opt::Device) z.offload_optimizer.enabled = true;
    if (opt == Opt::Nvme) {
      z.offload_optimizer.nvme = true;
      optim::NvmeAdamWOptions& o = z.offload_optimizer.nvme_options;
      o.nvme_path = dir_.string();
      o.sub_group_size = 3000;
      o.aio.block_size = 64 * 1024;
    }
    return z;
  }

  fs::path dir_;
};

struct BuiltRun {
  std::vector<double> losses;
  std::vector<std::vector<uint8_t>> params;
};

BuiltRun run(const TrainSpec& s, const ZeroConfig& z, bool deferred) {
  std::unique_ptr<models::gpt2::GPT2> model;
  {
    std::optional<models::nn::DeferredInitScope> scope;
    if (deferred) scope.emplace();
    model = std::make_unique<models::gpt2::GPT2>(strata::testing::tiny_config(s), s.seed);
  }
  EXPECT_EQ(model->built_deferred(), deferred);
  Engine engine(*model, std::make_shared<comm::SelfCommunicator>("dp"), z,
                strata::testing::adamw_factory());
  BuiltRun r;
  for (int step = 0; step < s.steps; ++step)
    r.losses.push_back(strata::testing::engine_step(engine, s, step));
  engine.finish_pending_update();
  engine.for_each_gathered_unit([&](const models::FlatUnit& u) {
    const auto* p = static_cast<const uint8_t*>(u.params.data_ptr());
    r.params.emplace_back(p, p + u.params.nbytes());
  });
  return r;
}

TEST_F(UnitConstruction, EveryOptimizerPlacementIsBitwiseTheWholeInMemoryBuild) {
  TrainSpec s;
  s.n_layer = 3;
  s.steps = 3;
  s.max_norm = 1.0;  // the clip's scaling too
  for (Opt opt : {Opt::Device, Opt::Cpu, Opt::Nvme}) {
    SCOPED_TRACE(static_cast<int>(opt));
    const BuiltRun whole = run(s, zero(/*in_memory=*/true, opt), /*deferred=*/false);
    const BuiltRun unit_by_unit = run(s, zero(/*in_memory=*/false, opt), /*deferred=*/true);
    ASSERT_EQ(whole.losses.size(), unit_by_unit.losses.size());
    for (size_t i = 0; i < whole.losses.size(); ++i)
      EXPECT_EQ(whole.losses[i], unit_by_unit.losses[i]) << "step " << i + 1;
    ASSERT_EQ(whole.params.size(), unit_by_unit.params.size());
    for (size_t u = 0; u < whole.params.size(); ++u)
      EXPECT_TRUE(whole.params[u] == unit_by_unit.params[u]) << "unit " << u;
  }
}

// The peak of Category::Param over host and pinned memory while the model and the engine are
// built: the whole build holds the model (several times over), the deferred one a unit, its
// partition and the tier's buffers.
TEST_F(UnitConstruction, PeakParameterBytesAreOneUnitAndTheBuffersNotTheModel) {
  TrainSpec s;
  s.n_layer = 12;
  auto peak_params = [&](bool deferred, int64_t* model_bytes, int64_t* bound) {
    MemoryStats& stats = MemoryStats::global();
    stats.reset_peaks();
    const int64_t base = stats.usage(Tier::Host, Category::Param).current +
                         stats.usage(Tier::Pinned, Category::Param).current;
    std::unique_ptr<models::gpt2::GPT2> model;
    {
      std::optional<models::nn::DeferredInitScope> scope;
      if (deferred) scope.emplace();
      model = std::make_unique<models::gpt2::GPT2>(strata::testing::tiny_config(s), s.seed);
    }
    Engine engine(*model, std::make_shared<comm::SelfCommunicator>("dp"),
                  zero(/*in_memory=*/false, Opt::Nvme), strata::testing::adamw_factory());
    const int64_t peak = stats.usage(Tier::Host, Category::Param).peak +
                         stats.usage(Tier::Pinned, Category::Param).peak - base;
    int64_t largest = 0;
    *model_bytes = 0;
    for (const models::FlatUnit& u : model->flat_units()) {
      *model_bytes += static_cast<int64_t>(u.params.nbytes());
      largest = std::max(largest, static_cast<int64_t>(u.params.nbytes()));
    }
    const ParamTier* tier = engine.param_tier();
    EXPECT_NE(tier, nullptr);
    // One unit whole, its partition (at dp 1 the unit again), the tier's buffers.
    *bound = 2 * largest + (tier ? tier->buffer_count() * tier->buffer_bytes() : 0);
    return peak;
  };
  int64_t model_bytes = 0, bound = 0;
  const int64_t whole = peak_params(false, &model_bytes, &bound);
  const int64_t deferred = peak_params(true, &model_bytes, &bound);
  EXPECT_GE(whole, model_bytes);  // the whole build holds the model at least once
  EXPECT_LE(deferred, bound) << "model " << model_bytes;
  EXPECT_LT(deferred, model_bytes / 2) << "bound " << bound;
}

}  // namespace
}  // namespace strata::parallel
