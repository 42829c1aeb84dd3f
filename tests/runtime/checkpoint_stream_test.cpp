// Checkpoints of an engine whose parameters and optimizer states live on NVMe (Note [Streamed
// shards] in parallel/engine.h): written and read back a sub-group or a unit at a time, so host
// memory grows by at most one unit's partition and one state buffer, not by the model; and what
// is read back is what was written, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "comm/self_communicator.h"
#include "core/error.h"
#include "offload/memory_stats.h"
#include "optim/nvme_adamw.h"
#include "runtime/checkpoint.h"
#include "tensor/safetensors.h"
#include "tests/parallel/engine_test_util.h"
#include "tests/support/temp_dir.h"

namespace strata::runtime {
namespace {

namespace fs = std::filesystem;
using offload::MemoryStats;
using offload::Tier;
using strata::testing::TrainSpec;

parallel::ZeroConfig nvme_zero(const fs::path& swap) {
  parallel::ZeroConfig z;
  z.stage = 3;
  z.reduce_bucket_size = 1000;
  z.allgather_bucket_size = 1000;
  z.stage3_param_persistence_threshold = 0;  // every unit partitioned and offloaded
  z.offload_optimizer.enabled = true;
  z.offload_optimizer.nvme = true;
  optim::NvmeAdamWOptions& o = z.offload_optimizer.nvme_options;
  o.nvme_path = (swap / "optimizer").string();
  o.sub_group_size = 4000;  // several sub-groups per block
  o.aio.block_size = 64 * 1024;
  z.offload_param.device = parallel::OffloadParamConfig::Device::Nvme;
  z.offload_param.nvme_path = (swap / "param").string();
  z.offload_param.buffer_count = 3;
  fs::create_directories(o.nvme_path);
  fs::create_directories(z.offload_param.nvme_path);
  return z;
}

// Host and pinned bytes of the tensors allocated now, or their peaks.
int64_t host_bytes(bool peak) {
  const MemoryStats& m = MemoryStats::global();
  const offload::Usage h = m.tier_usage(Tier::Host), p = m.tier_usage(Tier::Pinned);
  return peak ? h.peak + p.peak : h.current + p.current;
}

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Offloaded {
  Offloaded(const TrainSpec& s, uint64_t seed, const fs::path& swap)
      : model(strata::testing::tiny_config(s), seed),
        engine(model, std::make_shared<comm::SelfCommunicator>("dp"), nvme_zero(swap),
               strata::testing::adamw_factory()) {}

  std::string save(const fs::path& run_dir, int64_t step) {
    CheckpointParts parts;
    parts.model = &model;
    parts.param_stream = engine_shard_stream(engine, /*params=*/true);
    parts.optimizer_stream = engine_shard_stream(engine, /*params=*/false);
    parts.optimizer_name = std::string(engine.optimizer().name());
    parts.optimizer_step = engine.optimizer().step_count();
    TrainerState st;
    st.step = step;
    st.model_name = "gpt2-tiny";
    comm::SelfCommunicator self;
    return save_checkpoint(run_dir.string(), parts, st, "", 0, self);
  }
  void load(const std::string& dir) {
    OpenedCheckpoint ck = open_checkpoint(dir, model);
    engine.load_shards([&](const std::string& unit, const std::string& key, int64_t begin,
                           tensor::Tensor dst) { ck.index->fill(unit, key, begin, dst); });
    engine.optimizer().set_step_count(ck.optimizer_step);
  }
  // One unit's partition and one NVMe state buffer, the most a streamed checkpoint may add.
  int64_t bound() {
    int64_t largest = 0;
    for (int u = 0; u < static_cast<int>(model.flat_units().size()); ++u)
      largest = std::max<int64_t>(largest, engine.partition(u).shard * 4);
    auto& nvme = dynamic_cast<optim::NvmeAdamW&>(engine.optimizer());
    return largest + static_cast<int64_t>(nvme.buffer_bytes()) + 4096;  // + agreement scalars
  }
  int64_t model_state_bytes() const {
    int64_t n = 0;
    for (const models::FlatUnit& u : model.flat_units()) n += u.size();
    return 16 * n;
  }

  models::gpt2::GPT2 model;
  parallel::Engine engine;
};

TEST(CheckpointStream, AnNvmeOffloadedEngineSavesAndLoadsWithinOneUnitAndTheBuffers) {
  strata::testing::TempDir tmp;
  TrainSpec s;
  s.n_layer = 4;
  s.steps = 3;
  Offloaded a(s, s.seed, tmp.path() / "swap_a");
  for (int step = 0; step < 2; ++step) strata::testing::engine_step(a.engine, s, step);
  ASSERT_GT(dynamic_cast<optim::NvmeAdamW&>(a.engine.optimizer()).sub_groups(), 8u);
  const int64_t bound = a.bound();
  ASSERT_LT(bound * 4, a.model_state_bytes()) << "the model must dwarf the bound";

  MemoryStats::global().reset_peaks();
  int64_t base = host_bytes(false);
  const std::string dir = a.save(tmp.path() / "run_a", 2);
  const int64_t save_growth = host_bytes(true) - base;
  EXPECT_LE(save_growth, bound) << "model states " << a.model_state_bytes();
  EXPECT_EQ(host_bytes(false), base);  // nothing stays

  Offloaded b(s, s.seed + 1, tmp.path() / "swap_b");  // other weights: the load must set them
  MemoryStats::global().reset_peaks();
  base = host_bytes(false);
  b.load(dir);
  const int64_t load_growth = host_bytes(true) - base;
  EXPECT_LE(load_growth, bound) << "model states " << b.model_state_bytes();
  EXPECT_EQ(host_bytes(false), base);
  EXPECT_EQ(b.engine.optimizer().step_count(), 2);

  // What was read back is what was written: b's checkpoint has a's bytes, and both continue
  // alike.
  const std::string dir_b = b.save(tmp.path() / "run_b", 2);
  for (const char* f : {"model.rank00000-of-00001.safetensors", "optimizer.safetensors"}) {
    const std::string x = file_bytes(fs::path(dir) / f), y = file_bytes(fs::path(dir_b) / f);
    EXPECT_FALSE(x.empty()) << f;
    EXPECT_TRUE(x == y) << f;
  }
  const double la = strata::testing::engine_step(a.engine, s, 2);
  const double lb = strata::testing::engine_step(b.engine, s, 2);
  EXPECT_EQ(std::memcmp(&la, &lb, sizeof(double)), 0) << la << " vs " << lb;

  // The bound discriminates: views of every state at once (Engine::shards(), Note [Staged
  // states]) take the model's optimizer states and partitions into host memory.
  MemoryStats::global().reset_peaks();
  base = host_bytes(false);
  {
    const std::vector<parallel::Engine::Shard> all = a.engine.shards();
    EXPECT_GT(host_bytes(true) - base, bound);
  }
  a.engine.checkpoint_written();
}

// Note [Checkpoint digests] holds for streamed loads: a tensor read whole (a partition) is checked
// as it is read, one read in parts (a state, sub-groups of 4000 elements) before its first part.
TEST(CheckpointStream, ADamagedTensorIsRefusedNamingTheFile) {
  strata::testing::TempDir tmp;
  TrainSpec s;
  s.n_layer = 2;
  Offloaded a(s, s.seed, tmp.path() / "swap_a");
  strata::testing::engine_step(a.engine, s, 0);
  const std::string dir = a.save(tmp.path() / "run_a", 1);
  Offloaded b(s, s.seed + 1, tmp.path() / "swap_b");
  // A partition, read whole; a moment of a block, 12,704 elements, read in sub-groups.
  const std::pair<const char*, const char*> damaged[] = {
      {"model.rank00000-of-00001.safetensors", "h.1/param@0"},
      {"optimizer.safetensors", "h.0/exp_avg_sq@0"}};
  for (const auto& [name, tensor_name] : damaged) {
    SCOPED_TRACE(name);
    const fs::path f = fs::path(dir) / name;
    const std::string good = file_bytes(f);
    uint64_t header = 0;
    std::memcpy(&header, good.data(), 8);
    const tensor::SafetensorsEntry e = tensor::SafetensorsReader(f.string()).entry(tensor_name);
    ASSERT_GT(e.end - e.begin, 4u * 4000) << tensor_name;
    std::string bad = good;
    bad[8 + header + (e.begin + e.end) / 2] ^= 0x01;
    testing::write_bytes(f.string(), bad);
    try {
      b.load(dir);
      ADD_FAILURE() << "a damaged " << tensor_name << " loaded";
    } catch (const UserError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(f.string()), std::string::npos) << what;
      EXPECT_NE(what.find(tensor_name), std::string::npos) << what;
      EXPECT_NE(what.find("damaged or changed"), std::string::npos) << what;
    }
    testing::write_bytes(f.string(), good);
  }
  b.load(dir);  // whole again
  EXPECT_EQ(b.engine.optimizer().step_count(), 1);
}

}  // namespace
}  // namespace strata::runtime
