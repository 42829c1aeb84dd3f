// Note [Unit-by-unit construction] (parallel/engine.h) on the GPU: a model built inside a
// DeferredInitScope for a ZeRO-3 engine with offload_param on a CUDA device is initialised one
// unit at a time in an fp32 host buffer (the whole build initialises on the host too), its owned
// slice handed to the optimizer placement as the fp32 master and, cast to param_dtype, copied to
// the device partition and stored on the tier. What must hold: the run is bitwise the in-memory
// ZeRO-3 run of the model built whole and moved to the device (losses, parameters, optimizer
// states), fp32 and bf16, optimizer on the device, the host or NVMe; and the device's parameter
// bytes during construction are one partition at a time, never the model. dp 2 through `train`
// is tests/dist/gpu/offload_param_gpu_mpi_test.cpp. Every test skips itself without a device.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "comm/self_communicator.h"
#include "models/flat_params.h"
#include "offload/memory_stats.h"
#include "parallel/engine.h"
#include "tensor/cuda.h"
#include "tests/parallel/engine_test_util.h"

namespace strata::parallel {
namespace {

namespace fs = std::filesystem;
using offload::Category;
using offload::MemoryStats;
using offload::Tier;
using strata::testing::TrainSpec;
using tensor::Tensor;
const Device kGpu = Device::cuda(0);

enum class Opt { Device, Cpu, Nvme };

class UnitConstructionGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!tensor::cuda_available()) GTEST_SKIP() << "no CUDA device visible";
    dir_ = fs::temp_directory_path() /
           ("strata_unit_construction_gpu_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // ZeRO-3, every unit partitioned; the parameters on `param` (None: in memory), the optimizer
  // where `opt` says.
  ZeroConfig zero(OffloadParamConfig::Device param, Opt opt) const {
    ZeroConfig z;
    z.stage = 3;
    z.reduce_bucket_size = 1000;
    z.allgather_bucket_size = 1000;
    z.stage3_param_persistence_threshold = 0;
    z.offload_param.device = param;
    z.offload_param.nvme_path = dir_.string();
    z.offload_param.buffer_count = 3;
    z.offload_param.aio.block_size = 64 * 1024;
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

std::vector<uint8_t> bytes(const Tensor& t) {
  const Tensor h = t.to(Device::cpu());
  const auto* p = static_cast<const uint8_t*>(h.data_ptr());
  return {p, p + h.nbytes()};
}

struct GpuRun {
  std::vector<double> losses;
  std::vector<std::vector<uint8_t>> params;  // per unit, gathered
  std::vector<uint8_t> states;               // every optimizer state, in the checkpoint's order
  int64_t construction_peak = 0;             // device Category::Param bytes, above the start
  int64_t model_bytes = 0;                   // the model's parameters in param_dtype
  int64_t largest_unit = 0;                  // bytes in param_dtype
};

// As `train` does it: the zoo builds on the host; the units move to the device before the engine,
// or with offload_optimizer inside it (Note [Offload construction]).
GpuRun run(const TrainSpec& s, const ZeroConfig& z, bool deferred, DType dtype) {
  MemoryStats& stats = MemoryStats::global();
  stats.reset_peaks();
  const int64_t base = stats.usage(Tier::Gpu, Category::Param).current;
  std::unique_ptr<models::gpt2::GPT2> model;
  {
    std::optional<models::nn::DeferredInitScope> scope;
    if (deferred) scope.emplace();
    model = std::make_unique<models::gpt2::GPT2>(strata::testing::tiny_config(s), s.seed);
  }
  EXPECT_EQ(model->built_deferred(), deferred);
  if (!z.offload_optimizer.enabled) models::move_flat_units(model->flat_units(), kGpu);
  Engine engine(*model, std::make_shared<comm::SelfCommunicator>("dp"), z,
                strata::testing::adamw_factory(), dtype, kGpu);
  GpuRun r;
  r.construction_peak = stats.usage(Tier::Gpu, Category::Param).peak - base;
  for (const models::FlatUnit& u : model->flat_units()) {
    EXPECT_EQ(u.params.dtype(), dtype) << u.name;
    EXPECT_TRUE(u.params.device().is_cuda()) << u.name;
    r.model_bytes += u.params.numel() * static_cast<int64_t>(dtype_size(dtype));
    r.largest_unit =
        std::max(r.largest_unit, u.params.numel() * static_cast<int64_t>(dtype_size(dtype)));
  }
  for (int step = 0; step < s.steps; ++step) {
    TrainStepInputs in;
    in.micro_batches = s.accum;
    in.batch = [&](int64_t m) {
      const strata::testing::Batch b =
          strata::testing::make_batch((step * s.accum + m) * s.micro, s.micro);
      return MicroBatch{b.ids.to(kGpu), b.targets.to(kGpu)};
    };
    in.lr = s.lr;
    in.max_norm = s.max_norm;
    r.losses.push_back(engine.train_step(in).mean_loss);
  }
  engine.for_each_gathered_unit(
      [&r](const models::FlatUnit& u) { r.params.push_back(bytes(u.params)); });
  engine.stream_shards(false, [&r](size_t, const Tensor& piece) {
    const std::vector<uint8_t> b = bytes(piece);
    r.states.insert(r.states.end(), b.begin(), b.end());
  });
  return r;
}

TEST_F(UnitConstructionGpu, IsBitwiseTheWholeBuildAndNeverHoldsTheModelOnTheDevice) {
  TrainSpec s;
  s.n_layer = 3;
  s.steps = 3;
  s.max_norm = 1.0;
  const auto nvme = OffloadParamConfig::Device::Nvme, cpu = OffloadParamConfig::Device::Cpu;
  struct Case {
    DType dtype;
    Opt opt;
    OffloadParamConfig::Device param;
  };
  for (const Case c : {Case{DType::F32, Opt::Device, nvme}, Case{DType::BF16, Opt::Device, nvme},
                       Case{DType::BF16, Opt::Cpu, cpu}, Case{DType::BF16, Opt::Nvme, nvme},
                       Case{DType::F32, Opt::Cpu, cpu}}) {
    SCOPED_TRACE(fmt::format("{} optimizer {} offload_param {}", dtype_name(c.dtype),
                             static_cast<int>(c.opt), offload_param_device_name(c.param)));
    const GpuRun whole =
        run(s, zero(OffloadParamConfig::Device::None, c.opt), /*deferred=*/false, c.dtype);
    const GpuRun unit_by_unit = run(s, zero(c.param, c.opt), /*deferred=*/true, c.dtype);
    ASSERT_EQ(whole.losses.size(), static_cast<size_t>(s.steps));
    EXPECT_EQ(unit_by_unit.losses, whole.losses);
    EXPECT_LT(whole.losses.back(), whole.losses.front()) << "the run did not train";
    ASSERT_EQ(unit_by_unit.params.size(), whole.params.size());
    for (size_t u = 0; u < whole.params.size(); ++u)
      EXPECT_TRUE(unit_by_unit.params[u] == whole.params[u]) << "unit " << u;
    EXPECT_FALSE(whole.states.empty());
    EXPECT_TRUE(unit_by_unit.states == whole.states) << "the optimizer states differ";
    // The whole build holds the model on the device; unit by unit, one partition at a time (at
    // dp 1 a whole unit), stored on the tier and released before the next.
    EXPECT_GE(whole.construction_peak, whole.model_bytes);
    EXPECT_LE(unit_by_unit.construction_peak, unit_by_unit.largest_unit)
        << "model " << unit_by_unit.model_bytes;
    EXPECT_GT(unit_by_unit.construction_peak, 0);
  }
  EXPECT_TRUE(fs::is_empty(dir_)) << "swap files left behind";
}

}  // namespace
}  // namespace strata::parallel
