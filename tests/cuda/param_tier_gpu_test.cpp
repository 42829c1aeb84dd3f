// ZeRO-Infinity's parameter tier with the partitions on the GPU (parallel/param_tier.h, Note
// [Tier copies]): loads copy host-to-device on the tier's own stream without waiting for it, the
// compute stream's later work waits for those copies, a store copies after the compute that wrote
// the partition; through the Engine, the next unit is staged while the current one computes and
// the run keeps the in-memory run's bits. On the emulator's deferred streams (Note [Emulated
// streams]) a missing event leaves old bytes where new ones belong, so the ordering is tested.
// Every test skips itself without a device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "comm/self_communicator.h"
#include "models/flat_params.h"
#include "parallel/engine.h"
#include "parallel/param_tier.h"
#include "tensor/cuda.h"
#include "tensor/ops.h"
#include "tests/parallel/engine_test_util.h"
#ifdef STRATA_CUDA_EMULATION
#include "cuda_emu/control.h"
#endif

namespace strata::parallel {
namespace {

namespace fs = std::filesystem;
using strata::testing::TrainSpec;
using tensor::Tensor;
const Device kGpu = Device::cuda(0);

#define SKIP_WITHOUT_GPU() \
  if (!tensor::cuda_available()) GTEST_SKIP() << "no CUDA device visible"

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("strata_param_tier_gpu_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

Tensor host_values(int64_t n, float base) {
  Tensor t = Tensor::empty({n});
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = base + static_cast<float>(i % 1000);
  return t;
}

bool same(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(Device::cpu()), y = b.to(Device::cpu());
  return x.numel() == y.numel() && std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

uint64_t host_waits() {
#ifdef STRATA_CUDA_EMULATION
  return cuda_emu::stats().host_waits;
#else
  return 0;
#endif
}

const std::vector<std::string> kNames = {"wte", "h.0", "h.1"};
const std::vector<int64_t> kNumel = {5000, 70001, 3000};

// Note [Tier copies], both tiers: the load is enqueued on the tier's stream after the compute
// stream's earlier work on dst, the host does not wait for it, and an op enqueued on the compute
// stream after order_before_compute() reads the loaded bytes.
TEST(ParamTierGpu, LoadsAreCopiedOnTheTiersStreamAndComputeWaitsForThem) {
  SKIP_WITHOUT_GPU();
  for (const auto device : {OffloadParamConfig::Device::Nvme, OffloadParamConfig::Device::Cpu}) {
    SCOPED_TRACE(offload_param_device_name(device));
    TempDir dir;
    OffloadParamConfig c;
    c.device = device;
    c.nvme_path = dir.str();
    c.buffer_count = 3;
    ParamTier tier(c, kNumel, kNames, DType::F32);
    for (int u = 0; u < 3; ++u) tier.store(u, host_values(kNumel[u], 10.f * u).to(kGpu));
    tier.wait_all();
    ASSERT_TRUE(tier.async_copies());
    ASSERT_NE(tier.copy_stream()->stream(), tensor::cuda_current_stream());
    for (int u = 0; u < 3; ++u) {
      Tensor dst = tensor::full({kNumel[u]}, -1.0, DType::F32, kGpu);  // compute stream, pending
      const uint64_t waits = host_waits();
      tier.load(u, dst);
      EXPECT_EQ(host_waits(), waits) << "the load waited for the device";
      // On a GPU an idle copy stream runs the copy at once; here, for h.0 and h.1, the host makes
      // it run: still after the compute stream's fill, which was enqueued before the load.
      if (u != 1)
        ASSERT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(tier.copy_stream()->stream())),
                  cudaSuccess);
      tier.order_before_compute();
      const Tensor doubled = tensor::add(dst, dst);
      EXPECT_TRUE(same(
          doubled, tensor::add(host_values(kNumel[u], 10.f * u), host_values(kNumel[u], 10.f * u))))
          << kNames[u];
    }
#ifdef STRATA_CUDA_EMULATION
    // Deferred streams: a load's copy waits on the tier's stream until something needs it
    // (querying the stream runs it, so this comes after the checks above).
    Tensor dst = Tensor::empty({kNumel[1]}, DType::F32, kGpu);
    tier.load(1, dst);
    EXPECT_EQ(cudaStreamQuery(static_cast<cudaStream_t>(tier.copy_stream()->stream())),
              cudaErrorNotReady);
    EXPECT_EQ(cudaGetLastError(), cudaErrorNotReady);
    tier.order_before_compute();
#endif
  }
}

// A store copies what the compute stream wrote (the copy waits for it), and a buffer is read
// again from NVMe only after the copies to the device that read it.
TEST(ParamTierGpu, StoresCopyWhatTheComputeStreamWrote) {
  SKIP_WITHOUT_GPU();
  TempDir dir;
  OffloadParamConfig c;
  c.device = OffloadParamConfig::Device::Nvme;
  c.nvme_path = dir.str();
  c.buffer_count = 2;
  ParamTier tier(c, kNumel, kNames, DType::F32);
  for (int round = 1; round <= 3; ++round) {
    for (int u = 0; u < 3; ++u) {
      const Tensor base = host_values(kNumel[u], 100.f * round + u).to(kGpu);
      const Tensor updated = tensor::add(base, base);  // enqueued, not run yet
      tier.store(u, updated);
    }
    for (int u = 0; u < 3; ++u) {
      Tensor dst = tensor::zeros({kNumel[u]}, DType::F32, kGpu);
      tier.load(u, dst);
      tier.order_before_compute();
      const Tensor base = host_values(kNumel[u], 100.f * round + u);
      EXPECT_TRUE(same(dst, tensor::add(base, base)))  // its copy to the host: compute stream
          << "round " << round << " " << kNames[u];
    }
  }
}

std::vector<uint8_t> bytes(const Tensor& t) {
  const Tensor h = t.to(Device::cpu());
  const auto* p = static_cast<const uint8_t*>(h.data_ptr());
  return {p, p + h.nbytes()};
}

struct TierRun {
  std::vector<double> losses;
  std::vector<std::vector<uint8_t>> params;
  int64_t stages = 0;
};

TierRun train(const TrainSpec& s, OffloadParamConfig::Device device, const std::string& dir) {
  auto model = std::make_unique<models::gpt2::GPT2>(strata::testing::tiny_config(s), s.seed);
  models::move_flat_units(model->flat_units(), kGpu);
  ZeroConfig z;
  z.stage = 3;
  z.stage3_param_persistence_threshold = 100;
  z.offload_param.device = device;
  z.offload_param.nvme_path = dir;
  z.offload_param.buffer_count = 3;
  Engine engine(*model, std::make_shared<comm::SelfCommunicator>("dp"), z,
                strata::testing::adamw_factory());
  TierRun r;
  engine.set_trace([&r](const std::string& what) {
    if (what.rfind("stage ", 0) == 0) ++r.stages;
  });
  for (int step = 0; step < s.steps; ++step) {
    TrainStepInputs in;
    in.micro_batches = s.accum;
    in.batch = [&](int64_t m) {
      const strata::testing::Batch b =
          strata::testing::make_batch((step * s.accum + m) * s.micro, s.micro);
      return MicroBatch{b.ids.to(kGpu), b.targets.to(kGpu)};
    };
    in.lr = s.lr;
    r.losses.push_back(engine.train_step(in).mean_loss);
  }
  engine.for_each_gathered_unit(
      [&r](const models::FlatUnit& u) { r.params.push_back(bytes(u.params)); });
  return r;
}

// Note [Tier copies]: the Engine stages the next unit's partition on the copy stream while the
// current unit computes; the losses and the parameters are the in-memory ZeRO-3 run's bits.
TEST(ParamTierGpu, StagedLoadsKeepTheInMemoryRunsBits) {
  SKIP_WITHOUT_GPU();
  TempDir dir;
  TrainSpec s;
  s.n_layer = 3;
  s.steps = 3;
  s.accum = 2;
  const TierRun ref = train(s, OffloadParamConfig::Device::None, dir.str());
  for (const auto device : {OffloadParamConfig::Device::Nvme, OffloadParamConfig::Device::Cpu}) {
    SCOPED_TRACE(offload_param_device_name(device));
    const TierRun off = train(s, device, dir.str());
    EXPECT_EQ(off.losses, ref.losses);
    EXPECT_EQ(off.params, ref.params);
    EXPECT_GT(off.stages, 0);
  }
  EXPECT_EQ(ref.stages, 0);
  EXPECT_LT(ref.losses.back(), ref.losses.front());
}

}  // namespace
}  // namespace strata::parallel
