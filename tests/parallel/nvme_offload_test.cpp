// ZeRO-Infinity's optimizer side through the Engine on the CPU tier (offload_optimizer.device
// nvme; optim/nvme_adamw.h): masters and moments in an NVMe swap file, stepped sub-group by
// sub-group. The run is bitwise the in-memory run at ZeRO-1/2/3, fp32 and bf16, whatever the
// sub-group size, buffer count and pipelining (Note [Optimizer states on NVMe]); resident
// optimizer memory stays within the sub-group buffers; I/O errors, damaged blocks, a held swap
// directory and a bad nvme_path are clear errors; swap files are gone when the engine is. At
// ZeRO-3 the gradients live on NVMe too: resident gradient bytes stay within the optimizer's
// gradient buffers, and their I/O errors name the swap file.
// dp 2 and 4 are in offload_mpi_test.cpp, `train` end to end in tests/dist.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "comm/self_communicator.h"
#include "core/error.h"
#include "offload/memory_stats.h"
#include "optim/nvme_adamw.h"
#include "tests/parallel/engine_test_util.h"
#include "tests/support/temp_dir.h"

namespace strata::parallel {
namespace {

namespace fs = std::filesystem;
using strata::testing::TrainSpec;

std::vector<uint8_t> bytes(const tensor::Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.data_ptr());
  return {p, p + t.nbytes()};
}

struct NvmeSetup {
  std::string path;  // empty: in memory
  int64_t sub_group_size = 1'000'000'000;
  int buffer_count = 4;
  bool pipeline = true;
  bool pin_memory = true;
};

ZeroConfig zero(int stage, const NvmeSetup& n) {
  ZeroConfig z;
  z.stage = stage;
  z.reduce_bucket_size = 1000;
  z.allgather_bucket_size = 1000;
  z.stage3_param_persistence_threshold = 500;
  if (!n.path.empty()) {
    z.offload_optimizer.enabled = true;
    z.offload_optimizer.nvme = true;
    optim::NvmeAdamWOptions& o = z.offload_optimizer.nvme_options;
    o.nvme_path = n.path;
    o.sub_group_size = n.sub_group_size;
    o.buffer_count = n.buffer_count;
    o.pipeline_read = o.pipeline_write = n.pipeline;
    z.offload_optimizer.pin_memory = n.pin_memory;
    o.aio.block_size = 64 * 1024;
  }
  return z;
}

struct NvmeRun {
  std::vector<double> losses;
  std::vector<std::vector<uint8_t>> params, states;
};

NvmeRun run(const TrainSpec& s, int stage, DType dtype, const NvmeSetup& n) {
  models::gpt2::GPT2 model(strata::testing::tiny_config(s), s.seed);
  Engine engine(model, std::make_shared<comm::SelfCommunicator>("dp"), zero(stage, n),
                strata::testing::adamw_factory(), dtype);
  NvmeRun r;
  for (int step = 0; step < s.steps; ++step)
    r.losses.push_back(strata::testing::engine_step(engine, s, step));
  // ZeRO-3 keeps partitions: the owned ones (the units' storage is released between steps).
  if (stage == 3) {
    for (const Engine::Shard& sh : engine.shards())
      if (sh.key == "param") r.params.push_back(bytes(sh.data));
  } else {
    for (const models::FlatUnit& u : model.flat_units()) r.params.push_back(bytes(u.params));
  }
  EXPECT_FALSE(r.params.empty());
  for (const optim::NamedTensor& t : engine.optimizer().state_dict().tensors)
    r.states.push_back(bytes(t.tensor));
  return r;
}

std::vector<std::string> swap_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  return out;
}

template <typename Fn>
std::string user_error_of(Fn&& fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(NvmeOffload, BitwiseTheInMemoryRunAtEveryStage) {
  TrainSpec s;
  s.steps = 4;
  s.accum = 2;
  s.max_norm = 0.5;
  testing::TempDir dir;
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (int stage : {1, 2, 3}) {
      SCOPED_TRACE(fmt::format("{} stage {}", dtype_name(dtype), stage));
      const NvmeRun ref = run(s, stage, dtype, {});
      // Sub-groups of 700 elements cut units and decay runs and 4 buffers overlap reads and
      // writes with the update; 2 pageable buffers without pipelining wait for each read and
      // write.
      for (NvmeSetup n : {NvmeSetup{dir.path(), 700, 4, true, true},
                          NvmeSetup{dir.path(), 1000, 2, false, false}}) {
        SCOPED_TRACE(fmt::format("sub_group_size {} buffers {} pipeline {}", n.sub_group_size,
                                 n.buffer_count, n.pipeline));
        const NvmeRun got = run(s, stage, dtype, n);
        EXPECT_EQ(got.losses, ref.losses);
        EXPECT_TRUE(got.params == ref.params);
        EXPECT_TRUE(got.states == ref.states);
      }
      EXPECT_LT(ref.losses.back(), ref.losses.front());
    }
  }
  EXPECT_TRUE(swap_files(dir.path()).empty()) << "swap files or locks left behind";
}

// Note [Optimizer states on NVMe]: resident optimizer bytes (pinned and host) stay within the
// sub-group buffers while the NVMe tier holds 12 bytes per owned element.
TEST(NvmeOffload, ResidentOptimizerStatesStayWithinTheSubGroupBuffers) {
  TrainSpec s;
  s.steps = 3;
  s.n_layer = 3;
  testing::TempDir dir;
  using offload::Category;
  using offload::Tier;
  auto& stats = offload::MemoryStats::global();
  models::gpt2::GPT2 model(strata::testing::tiny_config(s), s.seed);
  int64_t elements = 0;
  for (const models::FlatUnit& u : model.flat_units()) elements += u.params.numel();
  const int64_t nvme_before = stats.usage(Tier::Nvme, Category::Optimizer).current;
  Engine engine(model, std::make_shared<comm::SelfCommunicator>("dp"),
                zero(2, {dir.path(), 2048, 3, true}), strata::testing::adamw_factory());
  auto* nvme = dynamic_cast<optim::NvmeAdamW*>(&engine.optimizer());
  ASSERT_NE(nvme, nullptr);
  EXPECT_GT(nvme->sub_groups(), 10u);
  EXPECT_EQ(nvme->buffer_count(), 3);
  const int64_t bound = 3 * static_cast<int64_t>(nvme->buffer_bytes());
  EXPECT_EQ(nvme->buffer_bytes(), 2048u * 12);
  stats.reset_peaks();
  for (int step = 0; step < s.steps; ++step) strata::testing::engine_step(engine, s, step);
  const int64_t resident = stats.usage(Tier::Pinned, Category::Optimizer).peak +
                           stats.usage(Tier::Host, Category::Optimizer).peak;
  EXPECT_LE(resident, bound);
  EXPECT_GT(stats.usage(Tier::Pinned, Category::Optimizer).peak, 0);
  // The states the model would hold in memory: far more than the buffers.
  EXPECT_GT(12 * elements, 5 * bound);
  EXPECT_GE(stats.usage(Tier::Nvme, Category::Optimizer).current - nvme_before, 12 * elements);
}

// Note [Gradients on the NVMe tier]: at ZeRO-3 the reduced gradient partitions live in the
// optimizer's store (4 bytes per owned element on NVMe); resident Category::Grad bytes are the
// optimizer's gradient buffers alone, where the in-memory run keeps 4 bytes per element. What the
// transient partitions add to the communication buffers (Category::Comm, over the in-memory
// run's) is a few units' partitions: the same at three and six layers (same unit sizes).
TEST(NvmeOffload, ResidentGradientsAtZeroThreeStayWithinTheGradientBuffers) {
  using offload::Category;
  using offload::Tier;
  auto& stats = offload::MemoryStats::global();
  testing::TempDir dir;
  std::vector<int64_t> grad_peaks, comm_extra;
  for (int64_t layers : {3, 6}) {
    SCOPED_TRACE(fmt::format("{} layers", layers));
    TrainSpec s;
    s.steps = 2;
    s.accum = 2;  // the second micro-batch reads the first's partitions back
    s.n_layer = layers;
    int64_t elements = 0, largest = 0, comm_in_memory = 0;
    {
      models::gpt2::GPT2 model(strata::testing::tiny_config(s), s.seed);
      for (const models::FlatUnit& u : model.flat_units()) {
        elements += u.params.numel();
        largest = std::max(largest, u.params.numel());
      }
      Engine engine(model, std::make_shared<comm::SelfCommunicator>("dp"), zero(3, {}),
                    strata::testing::adamw_factory());
      stats.reset_peaks();
      for (int step = 0; step < s.steps; ++step) strata::testing::engine_step(engine, s, step);
      EXPECT_GE(stats.usage(Tier::Host, Category::Grad).peak, 4 * elements);
      comm_in_memory = stats.usage(Tier::Host, Category::Comm).peak;
    }
    models::gpt2::GPT2 model(strata::testing::tiny_config(s), s.seed);
    const int64_t nvme_before = stats.usage(Tier::Nvme, Category::Grad).current;
    Engine engine(model, std::make_shared<comm::SelfCommunicator>("dp"),
                  zero(3, {dir.path(), 2048, 3, true}), strata::testing::adamw_factory());
    auto* nvme = dynamic_cast<optim::NvmeAdamW*>(&engine.optimizer());
    ASSERT_NE(nvme, nullptr);
    ASSERT_TRUE(nvme->grads_on_nvme());
    ASSERT_TRUE(engine.grads_on_nvme());
    EXPECT_EQ(nvme->grad_buffer_bytes(), 2048u * 4);
    const int64_t bound = nvme->buffer_count() * static_cast<int64_t>(nvme->grad_buffer_bytes());
    EXPECT_GE(stats.usage(Tier::Nvme, Category::Grad).current - nvme_before, 4 * elements);
    stats.reset_peaks();
    for (int step = 0; step < s.steps; ++step) strata::testing::engine_step(engine, s, step);
    const int64_t grad_peak = stats.usage(Tier::Pinned, Category::Grad).peak +
                              stats.usage(Tier::Host, Category::Grad).peak;
    EXPECT_LE(grad_peak, bound);
    EXPECT_GT(stats.usage(Tier::Pinned, Category::Grad).peak, 0);
    EXPECT_GT(4 * elements, 4 * bound) << "the model is too small to show the bound";
    const int64_t extra = stats.usage(Tier::Host, Category::Comm).peak - comm_in_memory;
    // The partition reducing and the kTierWritesInFlight (2) being written, at most.
    EXPECT_LE(extra, 3 * 4 * largest);
    grad_peaks.push_back(grad_peak);
    comm_extra.push_back(extra);
  }
  EXPECT_EQ(grad_peaks[0], grad_peaks[1]);
  EXPECT_EQ(comm_extra[0], comm_extra[1]);
  EXPECT_TRUE(swap_files(dir.path()).empty());
}

// At ZeRO-3 a failed gradient write (the partitions going out) or read (read back for the second
// micro-batch, and by the step) stops the step with an error naming the swap file.
TEST(NvmeOffload, GradientWriteAndReadErrorsAtZeroThreeNameTheSwapFile) {
  TrainSpec s;
  s.accum = 2;
  testing::TempDir dir;
  for (bool write : {true, false}) {
    SCOPED_TRACE(write ? "write error" : "read error");
    {
      models::gpt2::GPT2 model(strata::testing::tiny_config(s), s.seed);
      Engine engine(model, std::make_shared<comm::SelfCommunicator>("dp"),
                    zero(3, {dir.path(), 4096, 2, true}), strata::testing::adamw_factory());
      auto* nvme = dynamic_cast<optim::NvmeAdamW*>(&engine.optimizer());
      ASSERT_NE(nvme, nullptr);
      ASSERT_TRUE(nvme->grads_on_nvme());
      strata::testing::engine_step(engine, s, 0);
      nvme->finish_writes();
      const std::string file = nvme->store().files().at(0);
      nvme->store().engine().set_fault_injector(
          [write](const offload::IoOp& op, long res) { return op.write == write ? -EIO : res; });
      const std::string what = user_error_of([&] { strata::testing::engine_step(engine, s, 1); });
      EXPECT_NE(what.find(file), std::string::npos) << what;
      EXPECT_NE(what.find("Input/output error"), std::string::npos) << what;
      nvme->store().engine().set_fault_injector(nullptr);
    }
    EXPECT_TRUE(swap_files(dir.path()).empty());
  }
}

// optim::nvme_adamw_sizes, what the start's plans count (runtime/offload_plan.h): sub-groups
// of at most sub_group_size inside each slice, their homes as runs of equal extents, and the
// buffers by the model's and the gradients' dtypes.
TEST(NvmeOffload, SizesCutTheSlicesAsTheOptimizerDoes) {
  optim::NvmeAdamWOptions o;
  o.sub_group_size = 3000;
  o.buffer_count = 8;
  const optim::NvmeAdamWSizes f = optim::nvme_adamw_sizes({7000, 2500}, o, DType::F32, DType::F32);
  EXPECT_EQ(f.sub_groups, 4);  // 3000, 3000, 1000 | 2500
  EXPECT_EQ(f.max_sub_group, 3000);
  ASSERT_EQ(f.extents.size(), 3u);
  EXPECT_EQ(f.extents[0].count, 2);
  EXPECT_EQ(f.extents[0].bytes, 3000 * 12);
  EXPECT_EQ(f.extents[1].count, 1);
  EXPECT_EQ(f.extents[1].bytes, 1000 * 12);
  EXPECT_EQ(f.extents[2].bytes, 2500 * 12);
  EXPECT_EQ(f.buffer_count, 4);            // no more buffers than sub-groups
  EXPECT_EQ(f.state_buffer_bytes, 36864);  // 36000 rounded up to 4 KiB
  EXPECT_EQ(f.host_bytes(), 4 * 36864 + 3000 * 4);
  const optim::NvmeAdamWSizes b =
      optim::nvme_adamw_sizes({7000, 2500}, o, DType::BF16, DType::BF16);
  EXPECT_EQ(b.grad_stage_bytes, 3000 * 2);
  EXPECT_EQ(b.model_copy_bytes, 3000 * 2);
  EXPECT_EQ(b.widened_bytes, 3000 * 4);
  EXPECT_TRUE(b.grad_extents.empty());
  EXPECT_EQ(b.grad_buffer_count, 1);  // the one staging buffer
  // Note [Gradients on NVMe]: a gradient home per sub-group, a gradient buffer per state buffer.
  o.grads_on_nvme = true;
  o.grad_dtype = DType::BF16;
  const optim::NvmeAdamWSizes n =
      optim::nvme_adamw_sizes({7000, 2500}, o, DType::BF16, DType::BF16);
  ASSERT_EQ(n.grad_extents.size(), 3u);
  EXPECT_EQ(n.grad_extents[0].count, 2);
  EXPECT_EQ(n.grad_extents[0].bytes, 3000 * 2);
  EXPECT_EQ(n.grad_extents[1].bytes, 1000 * 2);
  EXPECT_EQ(n.grad_extents[2].bytes, 2500 * 2);
  EXPECT_EQ(n.grad_buffer_count, 4);
}

// An I/O error or a damaged block stops the step with an error naming the swap file; the swap
// files and the lock go with the engine, error or not.
TEST(NvmeOffload, IoErrorsAndDamagedBlocksNameTheSwapFile) {
  TrainSpec s;
  testing::TempDir dir;
  for (bool corrupt : {false, true}) {
    SCOPED_TRACE(corrupt ? "damaged block" : "read error");
    {
      models::gpt2::GPT2 model(strata::testing::tiny_config(s), s.seed);
      Engine engine(model, std::make_shared<comm::SelfCommunicator>("dp"),
                    zero(1, {dir.path(), 4096, 2, true}), strata::testing::adamw_factory());
      auto* nvme = dynamic_cast<optim::NvmeAdamW*>(&engine.optimizer());
      ASSERT_NE(nvme, nullptr);
      strata::testing::engine_step(engine, s, 0);
      const std::string file = nvme->store().files().at(0);
      if (corrupt) {
        nvme->finish_writes();
        const int fd = ::open(file.c_str(), O_RDWR);
        ASSERT_GE(fd, 0);
        unsigned char c = 0;
        ASSERT_EQ(::pread(fd, &c, 1, 100), 1);
        c ^= 0x40;
        ASSERT_EQ(::pwrite(fd, &c, 1, 100), 1);
        ::close(fd);
      } else {
        nvme->store().engine().set_fault_injector(
            [](const offload::IoOp& op, long res) { return op.write ? res : -EIO; });
      }
      const std::string what = user_error_of([&] { strata::testing::engine_step(engine, s, 1); });
      EXPECT_NE(what.find(file), std::string::npos) << what;
      EXPECT_NE(what.find(corrupt ? "checksum mismatch" : "Input/output error"), std::string::npos)
          << what;
      nvme->store().engine().set_fault_injector(nullptr);
    }
    EXPECT_TRUE(swap_files(dir.path()).empty());
  }
}

// Note [Swap directory lock]: a directory whose lock a live process holds is refused, naming the
// lock and the process; once that process is gone its lock and swap files are taken over.
TEST(NvmeOffload, ASwapDirectoryHeldByALiveRunIsRefusedAndADeadOnesIsTakenOver) {
  TrainSpec s;
  testing::TempDir dir;
  const std::string lock = dir.file("strata-optimizer-dp0.lock");
  // The holder: a child that only waits (it uses nothing of this process's state).
  const pid_t holder = ::fork();
  if (holder == 0) {
    ::pause();
    ::_exit(0);
  }
  std::ofstream(lock) << holder << "\n";
  std::ofstream(dir.file(fmt::format("strata-swap-{}-0-0.bin", holder))) << "its swap file";
  {
    models::gpt2::GPT2 model(strata::testing::tiny_config(s), s.seed);
    const std::string what = user_error_of([&] {
      Engine e(model, std::make_shared<comm::SelfCommunicator>("dp"), zero(1, {dir.path()}),
               strata::testing::adamw_factory());
    });
    EXPECT_NE(what.find("in use by another run"), std::string::npos) << what;
    EXPECT_NE(what.find(std::to_string(holder)), std::string::npos) << what;
    EXPECT_NE(what.find(lock), std::string::npos) << what;
  }
  EXPECT_EQ(swap_files(dir.path()).size(), 2u) << "the holder's files were touched";
  ::kill(holder, SIGKILL);
  ::waitpid(holder, nullptr, 0);
  {
    models::gpt2::GPT2 model(strata::testing::tiny_config(s), s.seed);
    Engine e(model, std::make_shared<comm::SelfCommunicator>("dp"), zero(1, {dir.path()}),
             strata::testing::adamw_factory());
    strata::testing::engine_step(e, s, 0);
    std::ifstream in(lock);
    pid_t now = 0;
    in >> now;
    EXPECT_EQ(now, ::getpid());
    for (const std::string& f : swap_files(dir.path()))
      EXPECT_EQ(f.find(std::to_string(holder)), std::string::npos) << f << " was not removed";
  }
  EXPECT_TRUE(swap_files(dir.path()).empty());
}

TEST(NvmeOffload, AMissingNvmePathIsAClearErrorAtStart) {
  TrainSpec s;
  testing::TempDir dir;
  const std::string missing = dir.file("no/such/dir");
  models::gpt2::GPT2 model(strata::testing::tiny_config(s), s.seed);
  const std::string what = user_error_of([&] {
    Engine e(model, std::make_shared<comm::SelfCommunicator>("dp"), zero(1, {missing}),
             strata::testing::adamw_factory());
  });
  EXPECT_NE(what.find(missing), std::string::npos) << what;
  EXPECT_NE(what.find("does not exist"), std::string::npos) << what;
}

}  // namespace
}  // namespace strata::parallel
