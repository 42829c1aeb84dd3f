// Note [Unit-by-unit construction] (parallel/engine.h): a model built inside a DeferredInitScope
// and handed to a ZeRO-3 engine with offload_param is initialised one unit at a time straight
// into its offloaded partitions. What must hold: the run is bitwise the in-memory ZeRO-3 run of
// a model built whole (losses, parameters, optimizer states) for every optimizer placement
// (device, cpu, nvme), in fp32 and in bf16/fp16 (each unit initialised in fp32, its master taken
// before the cast), and construction's peak parameter bytes — measured by the allocators — are
// a unit or two plus the tier's buffers, not the model. dp 2 and the `train` path are in
// tests/dist and offload_mpi_test.cpp, the GPU in tests/cuda/unit_construction_gpu_test.cpp.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

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
  std::vector<std::vector<uint8_t>> params;  // per unit, gathered
  std::vector<uint8_t> states;               // every optimizer state, in the checkpoint's order
};

BuiltRun run(const TrainSpec& s, const ZeroConfig& z, bool deferred,
             DType param_dtype = DType::F32) {
  std::unique_ptr<models::gpt2::GPT2> model;
  {
    std::optional<models::nn::DeferredInitScope> scope;
    if (deferred) scope.emplace();
    model = std::make_unique<models::gpt2::GPT2>(strata::testing::tiny_config(s), s.seed);
  }
  EXPECT_EQ(model->built_deferred(), deferred);
  Engine engine(*model, std::make_shared<comm::SelfCommunicator>("dp"), z,
                strata::testing::adamw_factory(), param_dtype);
  BuiltRun r;
  for (int step = 0; step < s.steps; ++step)
    r.losses.push_back(strata::testing::engine_step(engine, s, step));
  engine.finish_pending_update();
  engine.for_each_gathered_unit([&](const models::FlatUnit& u) {
    EXPECT_EQ(u.params.dtype(), param_dtype) << u.name;
    const auto* p = static_cast<const uint8_t*>(u.params.data_ptr());
    r.params.emplace_back(p, p + u.params.nbytes());
  });
  // Every optimizer state (the moments; the fp32 masters where the placement keeps them apart),
  // as a checkpoint streams them.
  engine.stream_shards(false, [&](size_t, const tensor::Tensor& piece) {
    const auto* p = static_cast<const uint8_t*>(piece.data_ptr());
    r.states.insert(r.states.end(), p, p + piece.nbytes());
  });
  return r;
}

void expect_same(const BuiltRun& whole, const BuiltRun& unit_by_unit) {
  ASSERT_EQ(whole.losses.size(), unit_by_unit.losses.size());
  for (size_t i = 0; i < whole.losses.size(); ++i)
    EXPECT_EQ(whole.losses[i], unit_by_unit.losses[i]) << "step " << i + 1;
  ASSERT_EQ(whole.params.size(), unit_by_unit.params.size());
  for (size_t u = 0; u < whole.params.size(); ++u)
    EXPECT_TRUE(whole.params[u] == unit_by_unit.params[u]) << "unit " << u;
  EXPECT_FALSE(whole.states.empty());
  EXPECT_TRUE(whole.states == unit_by_unit.states) << "the optimizer states differ";
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
    expect_same(whole, unit_by_unit);
  }
}

// Mixed precision: each unit is initialised in fp32 on the host, its owned slice becomes the
// placement's fp32 master (device, cpu, nvme), the cast slice the partition on the tier (cpu,
// nvme). Losses, the bf16/fp16 parameters and every optimizer state are the whole build's bits.
TEST_F(UnitConstruction, MixedPrecisionIsBitwiseTheWholeInMemoryBuild) {
  TrainSpec s;
  s.n_layer = 2;
  s.steps = 3;
  s.max_norm = 1.0;
  struct Case {
    DType dtype;
    Opt opt;
    OffloadParamConfig::Device param;
  };
  const auto nvme = OffloadParamConfig::Device::Nvme, cpu = OffloadParamConfig::Device::Cpu;
  for (const Case c : {Case{DType::BF16, Opt::Device, nvme}, Case{DType::BF16, Opt::Cpu, nvme},
                       Case{DType::BF16, Opt::Nvme, nvme}, Case{DType::BF16, Opt::Device, cpu},
                       Case{DType::BF16, Opt::Cpu, cpu}, Case{DType::F16, Opt::Nvme, cpu}}) {
    SCOPED_TRACE(fmt::format("{} optimizer {} offload_param {}", dtype_name(c.dtype),
                             static_cast<int>(c.opt), offload_param_device_name(c.param)));
    ZeroConfig offloaded = zero(/*in_memory=*/false, c.opt);
    offloaded.offload_param.device = c.param;
    const BuiltRun whole = run(s, zero(/*in_memory=*/true, c.opt), /*deferred=*/false, c.dtype);
    const BuiltRun unit_by_unit = run(s, offloaded, /*deferred=*/true, c.dtype);
    expect_same(whole, unit_by_unit);
  }
}

// The peak of Category::Param over host and pinned memory while the model and the engine are
// built: the whole build holds the model (several times over), the deferred one a unit in fp32,
// its partition (and under mixed precision the partition's cast copy: together at most another
// fp32 unit) and the tier's buffers.
TEST_F(UnitConstruction, PeakParameterBytesAreOneUnitAndTheBuffersNotTheModel) {
  TrainSpec s;
  s.n_layer = 12;
  auto peak_params = [&](bool deferred, DType dtype, int64_t* model_bytes, int64_t* bound) {
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
                  zero(/*in_memory=*/false, Opt::Nvme), strata::testing::adamw_factory(), dtype);
    const int64_t peak = stats.usage(Tier::Host, Category::Param).peak +
                         stats.usage(Tier::Pinned, Category::Param).peak - base;
    int64_t largest = 0;  // fp32 bytes, as every unit is initialised
    *model_bytes = 0;
    for (const models::FlatUnit& u : model->flat_units()) {
      EXPECT_EQ(u.params.dtype(), dtype);
      *model_bytes += u.params.numel() * 4;
      largest = std::max(largest, u.params.numel() * 4);
    }
    const ParamTier* tier = engine.param_tier();
    EXPECT_NE(tier, nullptr);
    // One unit whole, its partition (at dp 1 the unit again), the tier's buffers; under mixed
    // precision NvmeAdamW's buffer of one sub-group's updated low-precision parameters.
    const int64_t nvme_buffer =
        dtype == DType::F32
            ? 0
            : 2 * zero(false, Opt::Nvme).offload_optimizer.nvme_options.sub_group_size;
    *bound = 2 * largest + (tier ? tier->buffer_count() * tier->buffer_bytes() : 0) + nvme_buffer;
    return peak;
  };
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    int64_t model_bytes = 0, bound = 0;
    const int64_t whole = peak_params(false, dtype, &model_bytes, &bound);
    const int64_t deferred = peak_params(true, dtype, &model_bytes, &bound);
    EXPECT_GE(whole, model_bytes);  // the whole build holds the fp32 model at least once
    EXPECT_LE(deferred, bound) << "model " << model_bytes;
    EXPECT_LT(deferred, model_bytes / 2) << "bound " << bound;
  }
}

}  // namespace
}  // namespace strata::parallel
