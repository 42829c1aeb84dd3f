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
#include <map>
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
    std::unique_ptr<models::CausalLM> whole;
    {
      models::nn::DeferredInitScope layout_only;  // the layout alone
      whole = make_whole();
    }
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

// The whole-copy save, kept as the reference for the streamed one's bytes: every parameter put
// together over tp into an allocated whole model, which rank 0 writes as one process does.
// Returns the checkpoint directory on every rank.
std::string save_whole_copy(TpRun& r, comm::Communicator& world, const std::string& run_dir,
                            int64_t step) {
  const std::unique_ptr<models::CausalLM> whole = r.make_whole();
  const models::nn::TensorParallel& tp = r.model.tensor_parallel();
  for (const models::FlatUnit& u : r.model.flat_units())
    for (size_t i = 0; i < u.names.size(); ++i) {
      const tensor::Tensor mine = u.params.narrow(0, u.offsets[i], u.numels[i]).contiguous();
      tensor::Tensor dst = whole->parameter(u.names[i]).data();
      auto it = r.model.shard_specs().find(u.names[i]);
      if (it == r.model.shard_specs().end()) {
        dst.copy_(mine.view(dst.shape()));
        continue;
      }
      tensor::Tensor all = tensor::Tensor::empty({mine.numel() * tp.size()});
      tp.group->allgather(mine, all)->wait();
      const models::nn::ShardSpec& spec = it->second;
      const tensor::Shape local = models::nn::shard_shape(dst.shape(), spec, tp.size());
      const int64_t block = dst.size(spec.dim) / spec.blocks, piece = block / tp.size();
      for (int q = 0; q < tp.size(); ++q) {
        const tensor::Tensor part = all.narrow(0, q * mine.numel(), mine.numel()).view(local);
        for (int64_t b = 0; b < spec.blocks; ++b) {
          tensor::Tensor to = dst.narrow(spec.dim, b * block + q * piece, piece);
          to.copy_(part.narrow(spec.dim, b * piece, piece));
        }
      }
    }
  TrainerState st;
  st.step = step;
  st.model_name = "gpt2-tiny";
  std::string dir;
  if (world.rank() == 0) dir = save_checkpoint(run_dir, *whole, nullptr, st, "", 0);
  return from_rank_0(world, dir);
}

// At tp 2 (and tp 2 x dp 2 on four ranks) the parameters go into model.safetensors a whole unit
// at a time and come back as each rank's slices read from the file: no rank's host memory grows
// by the whole model (the bound leaves it out: it fails when rank 0 lays the parameters out in a
// whole model, or a load reads through one), and model.safetensors has the whole-copy save's
// bytes.
TEST(TpCheckpointStream, NvmeStatesSaveAndLoadAUnitAtATime) {
  const std::shared_ptr<comm::Communicator> world = strata::testing::test_world();
  if (world->size() != 2 && world->size() != 4) GTEST_SKIP() << "tp 2 (x dp 2) on 2 (4) ranks";
  const comm::ProcessGroups g = comm::make_process_groups(world, 2, 1);
  strata::testing::TempDir local;  // this rank's swap directories
  strata::testing::TempDir shared_holder;
  const fs::path shared = from_rank_0(*world, shared_holder.path().string());
  TrainSpec s;
  s.n_layer = 8;
  TpRun a(s, s.seed, g, local.path() / "swap_a");
  for (int step = 0; step < 2; ++step) strata::testing::engine_step(a.engine, s, step);

  // The whole model's bytes (what a whole copy of the parameters would take).
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
  // What a unit at a time may add, for the 2 states (exp_avg, exp_avg_sq; fp32 keeps no
  // masters; the parameters are one key): each state's whole unit and this rank's unit made
  // whole over dp, a parameter gathered over tp, put together, and copied to the host (at a
  // load: read, or a bounded chunk of its rows), and the agreement scalars.
  const int64_t bound = 2 * 2 * largest_unit * 4 + 3 * largest_param * 4 + 4096;
  // A whole copy of the parameters would not fit, nor the states held whole (rank 0's optimizer
  // file as one tensor per unit and state): the bound discriminates.
  ASSERT_LT(bound, whole_bytes);
  ASSERT_LT(bound, 2 * whole_numel * 4);

  MemoryStats::global().reset_peaks();
  int64_t base = host_bytes(false);
  const std::string dir = a.save((shared / "run_a").string(), 2);
  const int64_t save_growth = host_bytes(true) - base;
  EXPECT_LE(save_growth, bound) << "rank " << world->rank() << ", whole model " << whole_bytes;
  EXPECT_EQ(host_bytes(false), base);  // nothing stays
  std::printf("[rank %d] tp 2 save: host growth %lld B, bound %lld B (whole model %lld B)\n",
              world->rank(), static_cast<long long>(save_growth), static_cast<long long>(bound),
              static_cast<long long>(whole_bytes));
  // The bytes the whole-copy save writes for the same parameters.
  const std::string ref = save_whole_copy(a, *world, (shared / "ref").string(), 2);
  const std::string want = file_bytes(fs::path(ref) / "model.safetensors");
  EXPECT_FALSE(want.empty());
  EXPECT_TRUE(file_bytes(fs::path(dir) / "model.safetensors") == want)
      << "model.safetensors differs from the whole-copy save's";

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
  // A strided slice read a row, or a few rows, at a time is the same slice.
  {
    std::unique_ptr<models::CausalLM> whole;
    {
      models::nn::DeferredInitScope layout_only;
      whole = b.make_whole();
    }
    OpenedCheckpoint ck = open_checkpoint(dir, *whole);
    std::map<std::string, std::pair<std::string, int64_t>> at;  // name -> (whole unit, offset)
    for (const models::FlatUnit& wu : whole->flat_units())
      for (size_t i = 0; i < wu.names.size(); ++i) at[wu.names[i]] = {wu.name, wu.offsets[i]};
    const models::nn::TensorParallel& tp = b.model.tensor_parallel();
    int strided = 0;
    for (const models::FlatUnit& u : b.model.flat_units())
      for (size_t i = 0; i < u.names.size(); ++i) {
        auto spec = b.model.shard_specs().find(u.names[i]);
        if (spec == b.model.shard_specs().end()) continue;
        strided += spec->second.dim > 0;
        const tensor::Shape full = whole->parameter(u.names[i]).data().shape();
        const tensor::Tensor loaded = u.params.narrow(0, u.offsets[i], u.numels[i]).contiguous();
        for (int64_t chunk : {int64_t{7}, int64_t{300}}) {
          tensor::Tensor got = tensor::Tensor::empty({u.numels[i]});
          read_slice(*ck.index, at.at(u.names[i]).first, "param", at.at(u.names[i]).second, full,
                     spec->second, tp.rank(), tp.size(), got, chunk);
          EXPECT_EQ(std::memcmp(got.data_ptr(), loaded.data_ptr(), got.nbytes()), 0)
              << u.names[i] << ", chunk " << chunk;
        }
      }
    EXPECT_GT(strided, 0);  // column shards were among them
  }

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
