// Tensor-parallel checkpoints of an engine whose optimizer states live on NVMe (Note
// [Tensor-parallel checkpoints] in runtime/tp_checkpoint.h, Note [Streamed shards] in
// parallel/engine.h): at tp 2 the save and the load go a unit at a time, so a rank's host memory
// grows by the whole model's parameters that rank 0 lays out (and every rank reads through) plus
// a few units' states, not by the model's optimizer states; what is read back is what was written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "comm/process_groups.h"
#include "offload/memory_stats.h"
#include "runtime/checkpoint.h"
#include "runtime/tp_checkpoint.h"
#include "tensor/ops.h"
#include "tests/parallel/engine_test_util.h"
#include "tests/support/mpi_test_env.h"
#include "tests/support/temp_dir.h"

namespace strata::runtime {
namespace {

namespace fs = std::filesystem;
using offload::MemoryStats;
using offload::Tier;
using strata::testing::TrainSpec;

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

// Rank 0's string on every rank (a directory every rank must see).
std::string from_rank_0(comm::Communicator& world, const std::string& s) {
  std::vector<int64_t> chars(512, 0);
  if (world.rank() == 0) {
    EXPECT_LT(s.size(), chars.size());
    for (size_t i = 0; i < s.size() && i < chars.size(); ++i) chars[i] = s[i];
  }
  tensor::Tensor t = tensor::from_ints(chars, {static_cast<int64_t>(chars.size())}, DType::I32);
  world.allreduce(t, comm::ReduceOp::Sum)->wait();
  std::string out;
  for (int64_t c : tensor::to_int_vector(t))
    if (c != 0) out.push_back(static_cast<char>(c));
  return out;
}

parallel::ZeroConfig nvme_zero(const fs::path& swap) {
  parallel::ZeroConfig z;
  z.stage = 1;
  z.offload_optimizer.enabled = true;
  z.offload_optimizer.nvme = true;
  optim::NvmeAdamWOptions& o = z.offload_optimizer.nvme_options;
  o.nvme_path = swap.string();
  o.sub_group_size = 4000;  // several sub-groups per unit
  o.aio.block_size = 64 * 1024;
  fs::create_directories(swap);
  return z;
}

struct TpRun {
  TpRun(const TrainSpec& s, uint64_t seed, const comm::ProcessGroups& g, const fs::path& swap)
      : spec(s),
        groups(g),
        model(strata::testing::tiny_config(s), seed, {g.tp, false}),
        engine(model, g.dp, nvme_zero(swap), strata::testing::adamw_factory()) {}

  std::unique_ptr<models::CausalLM> make_whole() const {
    return std::make_unique<models::gpt2::GPT2>(strata::testing::tiny_config(spec), spec.seed);
  }
  TpCheckpointContext context() {
    return {model, engine, *groups.world, [this] { return make_whole(); }, nullptr};
  }
  std::string save(const std::string& run_dir, int64_t step) {
    TrainerState st;
    st.step = step;
    st.model_name = "gpt2-tiny";
    return save_tp_checkpoint(context(), run_dir, st, "", 0);
  }
  // What Trainer::resume does at tp > 1 (Note [Tensor-parallel checkpoints]), fp32: no masters
  // in the file, the parameters stand for them.
  void load(const std::string& dir) {
    const std::unique_ptr<models::CausalLM> whole = make_whole();
    OpenedCheckpoint ck = open_checkpoint(dir, *whole);
    TpCheckpointReader reader(model, *whole, *ck.index);
    for (const models::FlatUnit& u : model.flat_units())
      reader.fill(u.name, "param", "param", 0, u.params);
    engine.sync_params();
    engine.load_shards(
        [&](const std::string& unit, const std::string& key, int64_t begin, tensor::Tensor dst) {
          reader.fill(unit, key, key == "master" ? "param" : key, begin, dst);
        });
    engine.optimizer().set_step_count(ck.optimizer_step);
  }

  TrainSpec spec;
  comm::ProcessGroups groups;
  models::gpt2::GPT2 model;
  parallel::Engine engine;
};

TEST(TpCheckpointStream, NvmeStatesSaveAndLoadAUnitAtATime) {
  const std::shared_ptr<comm::Communicator> world = strata::testing::test_world();
  if (world->size() != 2) GTEST_SKIP() << "tp 2 on two ranks";
  const comm::ProcessGroups g = comm::make_process_groups(world, 2, 1);
  strata::testing::TempDir local;  // this rank's swap directories
  strata::testing::TempDir shared_holder;
  const fs::path shared = from_rank_0(*world, shared_holder.path().string());
  TrainSpec s;
  s.n_layer = 8;
  TpRun a(s, s.seed, g, local.path() / "swap_a");
  for (int step = 0; step < 2; ++step) strata::testing::engine_step(a.engine, s, step);

  // The whole model's bytes (rank 0 lays the parameters out in it; a load reads through it).
  int64_t whole_bytes = 0, largest_unit = 0, largest_param = 0, whole_numel = 0;
  {
    const int64_t before = host_bytes(false);
    const std::unique_ptr<models::CausalLM> w = a.make_whole();
    whole_bytes = host_bytes(false) - before;
    for (const models::FlatUnit& u : w->flat_units()) {
      largest_unit = std::max(largest_unit, u.size());
      whole_numel += u.size();
      for (int64_t n : u.numels) largest_param = std::max(largest_param, n);
    }
  }
  // What a unit at a time may add beside the whole model, for the 2 states (exp_avg,
  // exp_avg_sq; fp32 keeps no masters): each state's whole unit and this rank's unit made whole
  // over dp, a parameter gathered over tp, put together, and copied to the host, and the
  // agreement scalars.
  const int64_t per_unit = 2 * 2 * largest_unit * 4 + 3 * largest_param * 4 + 4096;
  const int64_t bound = whole_bytes + per_unit;
  // The states held whole (rank 0's optimizer file as one tensor per unit and state) would not
  // fit: the bound discriminates.
  ASSERT_LT(bound, whole_bytes + 2 * whole_numel * 4);

  MemoryStats::global().reset_peaks();
  int64_t base = host_bytes(false);
  const std::string dir = a.save((shared / "run_a").string(), 2);
  const int64_t save_growth = host_bytes(true) - base;
  EXPECT_LE(save_growth, bound) << "rank " << world->rank() << ", whole model " << whole_bytes;
  EXPECT_EQ(host_bytes(false), base);  // nothing stays
  std::printf("[rank %d] tp 2 save: host growth %lld B, bound %lld B (whole model %lld B)\n",
              world->rank(), static_cast<long long>(save_growth), static_cast<long long>(bound),
              static_cast<long long>(whole_bytes));

  TpRun b(s, s.seed + 1, g, local.path() / "swap_b");  // other weights: the load sets them
  MemoryStats::global().reset_peaks();
  base = host_bytes(false);
  b.load(dir);
  const int64_t load_growth = host_bytes(true) - base;
  EXPECT_LE(load_growth, bound) << "rank " << world->rank();
  EXPECT_EQ(host_bytes(false), base);
  EXPECT_EQ(b.engine.optimizer().step_count(), 2);
  std::printf("[rank %d] tp 2 load: host growth %lld B, bound %lld B\n", world->rank(),
              static_cast<long long>(load_growth), static_cast<long long>(bound));

  // What was read back is what was written: b's checkpoint has a's bytes, and both continue
  // alike.
  const std::string dir_b = b.save((shared / "run_b").string(), 2);
  for (const char* f : {"model.safetensors", "optimizer.safetensors"}) {
    const std::string x = file_bytes(fs::path(dir) / f), y = file_bytes(fs::path(dir_b) / f);
    EXPECT_FALSE(x.empty()) << f;
    EXPECT_TRUE(x == y) << f;
  }
  const double la = strata::testing::engine_step(a.engine, s, 2);
  const double lb = strata::testing::engine_step(b.engine, s, 2);
  EXPECT_EQ(std::memcmp(&la, &lb, sizeof(double)), 0) << la << " vs " << lb;
}

}  // namespace
}  // namespace strata::runtime
