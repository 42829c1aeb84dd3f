// ZeRO-Offload under tensor parallelism through the Engine on CPU ranks (the CPU tier plays the
// host, the same code a GPU run takes): tp 2 (x dp 2 under mpirun -np 4) with the optimizer on the
// host (parallel/host_placement.h) or in an NVMe swap file is bitwise the in-memory tp run at
// ZeRO-1, 2 and 3, fp32 and bf16, clipped at every step: the norm counts each replicated
// parameter once (Note [Tensor-parallel gradient norm]), so it and the clipping are the in-memory
// run's. At ZeRO-2 the gradients stream to host partitions and the reduction takes the norm's
// sums per segment; at ZeRO-3 with device nvme they go to NVMe the same way.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <vector>

#include "comm/process_groups.h"
#include "tests/parallel/engine_test_util.h"
#include "tests/support/mpi_test_env.h"
#include "tests/support/temp_dir.h"

namespace strata::testing {
namespace {

struct Result {
  std::vector<double> losses, norms;
  std::vector<std::vector<uint8_t>> params;
};

comm::ProcessGroups groups() {
  const std::shared_ptr<comm::Communicator> world = test_world();
  return comm::make_process_groups(world, 2, 1);
}

// offload false: in memory; else on the host, or with `nvme_path` in a swap file there.
Result run(const TrainSpec& s, const comm::ProcessGroups& g, int stage, DType dtype, bool offload,
           const std::string& nvme_path = "") {
  parallel::ZeroConfig z;
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
  models::gpt2::GPT2 model(tiny_config(s), s.seed, {g.tp, false});
  parallel::Engine engine(model, g.dp, z, adamw_factory(), dtype);
  Result r;
  for (int step = 0; step < s.steps; ++step) {
    parallel::StepResult result;
    r.losses.push_back(engine.average(engine_step(engine, s, step, &result)));
    r.norms.push_back(result.grad_norm);
  }
  auto add = [&r](const tensor::Tensor& t) {
    const auto* p = static_cast<const uint8_t*>(t.data_ptr());
    r.params.emplace_back(p, p + t.nbytes());
  };
  if (stage == 3) {  // the owned partitions: units are released between steps
    for (const parallel::Engine::Shard& sh : engine.shards())
      if (sh.key == "param") add(sh.data);
  } else {
    for (const models::FlatUnit& u : model.flat_units()) add(u.params);
  }
  return r;
}

TEST(TpOffload, HostAndNvmeStatesAreBitwiseTheInMemoryTpRun) {
  if (test_world()->size() % 2 != 0) GTEST_SKIP() << "tp 2 needs an even world";
  const comm::ProcessGroups g = groups();
  TrainSpec s;
  s.steps = 3;
  s.accum = 2;
  s.max_norm = 0.05;
  TempDir dir;  // each rank its own directory
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (int stage : {1, 2, 3}) {
      SCOPED_TRACE(fmt::format("tp 2 x dp {}, {} stage {}", g.dp_size, dtype_name(dtype), stage));
      const Result ref = run(s, g, stage, dtype, false);
      EXPECT_LT(ref.losses.back(), ref.losses.front());
      for (double n : ref.norms) EXPECT_GT(n, s.max_norm) << "a step did not clip";
      const Result host = run(s, g, stage, dtype, true);
      EXPECT_EQ(host.losses, ref.losses);
      EXPECT_EQ(host.norms, ref.norms);
      EXPECT_TRUE(host.params == ref.params) << "host: the parameters differ";
      const Result nvme = run(s, g, stage, dtype, true, dir.path());
      EXPECT_EQ(nvme.losses, ref.losses);
      EXPECT_EQ(nvme.norms, ref.norms);
      EXPECT_TRUE(nvme.params == ref.params) << "nvme: the parameters differ";
    }
  }
}

}  // namespace
}  // namespace strata::testing
