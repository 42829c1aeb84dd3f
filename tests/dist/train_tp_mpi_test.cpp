// `train` under mpirun with tensor parallelism: parallelism.tensor_parallel_size = 2 on 4 ranks
// (tp 2 x dp 2, Megatron's order) reproduces the one-process loss trajectory in metrics.jsonl,
// with and without sequence parallelism and ZeRO; layouts the world or the model cannot take
// are clear errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "tests/dist/train_mpi_fixture.h"

namespace strata::tools {
namespace {

using testing::CommandResult;
using testing::describe;
using testing::expect_close;

class TrainTpMpi : public testing::TrainMpiFixture {
 protected:
  TrainTpMpi() : TrainMpiFixture(STRATA_BINARY_DIR, "") {}
};

TEST_F(TrainTpMpi, TpTimesDpReproducesOneProcess) {
  const int kSteps = 6;
  CommandResult single = train(0, config("single", kSteps), {});
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  const std::vector<double> want = losses("single");
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));

  const std::vector<std::pair<std::string, std::vector<std::string>>> runs = {
      {"tp2", {"parallelism.tensor_parallel_size=2"}},
      {"tp2_sp_z1",
       {"parallelism.tensor_parallel_size=2", "parallelism.sequence_parallel=true",
        "zero_optimization.stage=1"}},
      {"tp2_z3", {"parallelism.tensor_parallel_size=2", "zero_optimization.stage=3"}},
  };
  for (const auto& [name, sets] : runs) {
    CommandResult r = train(4, config(name, kSteps), sets);
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    const std::vector<double> got = losses(name);
    expect_close(got, want, 1e-5, name);
    double worst = 0;
    for (size_t i = 0; i < got.size() && i < want.size(); ++i)
      worst = std::max(worst, std::abs(got[i] - want[i]) / std::abs(want[i]));
    std::printf("[train %s, 4 ranks] %zu steps, loss %.6f -> %.6f, worst relative delta %.3g\n",
                name.c_str(), got.size(), got.empty() ? 0.0 : got.front(),
                got.empty() ? 0.0 : got.back(), worst);
    EXPECT_NE(r.out.find("tp 2"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("x dp 2"), std::string::npos) << r.out;
    // The memory report has every rank, with its coordinates.
    EXPECT_NE(r.out.find("rank 3 (tp 1, dp 1): model states"), std::string::npos) << r.out;
    // Every rank logs its coordinates.
    for (int g = 0; g < 4; ++g)
      EXPECT_NE(
          (r.out + r.err)
              .find(fmt::format("rank {} of 4: tp rank {} of 2, dp rank {} of 2", g, g % 2, g / 2)),
          std::string::npos)
          << describe(r);
  }
}

// Note [Tensor-parallel checkpoints]: a checkpoint written at one (tp, dp) holds whole tensors in
// the one-process layout and resumes at another, continuing the one-process trajectory.
TEST_F(TrainTpMpi, CheckpointsResumeAtAnotherLayout) {
  const int kSteps = 6;
  CommandResult single = train(0, config("single", kSteps), {});
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  const std::vector<double> want = losses("single");

  struct Move {
    std::string name;
    int np_first;
    std::vector<std::string> first;
    int np_second;
    std::vector<std::string> second;
  };
  const std::vector<Move> moves = {
      // tp 2 x dp 2 (ZeRO-1) -> tp 2 x dp 1
      {"to_tp2dp1",
       4,
       {"parallelism.tensor_parallel_size=2", "zero_optimization.stage=1"},
       2,
       {"parallelism.tensor_parallel_size=2"}},
      // tp 2 x dp 2 (ZeRO-3, sequence parallel) -> tp 1 x dp 2
      {"to_tp1dp2",
       4,
       {"parallelism.tensor_parallel_size=2", "zero_optimization.stage=3",
        "parallelism.sequence_parallel=true"},
       2,
       {"zero_optimization.stage=2"}},
      // one process -> tp 2 x dp 2 (ZeRO-2)
      {"from_single",
       0,
       {},
       4,
       {"parallelism.tensor_parallel_size=2", "zero_optimization.stage=2"}},
  };
  for (const Move& m : moves) {
    const std::string cfg = config(m.name, kSteps);
    std::vector<std::string> first = m.first;
    first.push_back("training.steps=3");
    CommandResult a = train(m.np_first, cfg, first);
    ASSERT_EQ(a.exit_code, 0) << describe(a);
    // Whole tensors in the one-process layout, written once.
    EXPECT_TRUE(
        std::filesystem::exists(tmp_ / (m.name + "/checkpoints/step_00000003/model.safetensors")))
        << m.name;
    if (m.name == "to_tp2dp1") {
      // A tensor-parallel run's checkpoint is a one-process checkpoint: convert writes the whole
      // model as HF GPT-2.
      const std::string ckpt = tmp_ / (m.name + "/checkpoints/step_00000003");
      CommandResult conv = testing::run_command({std::string(STRATA_BINARY_DIR) + "/convert",
                                                 "--checkpoint", ckpt, "--to-hf", tmp_ / "hf"});
      EXPECT_EQ(conv.exit_code, 0) << describe(conv);
      CommandResult verify = testing::run_command(
          {std::string(STRATA_BINARY_DIR) + "/convert", "--checkpoint", ckpt, "--verify"});
      EXPECT_EQ(verify.exit_code, 0) << describe(verify);
    }
    CommandResult b = train(m.np_second, cfg, m.second);
    ASSERT_EQ(b.exit_code, 0) << describe(b);
    EXPECT_NE(b.out.find("resumed from"), std::string::npos) << b.out;
    // Each half ran in its layout.
    auto tp2 = [](const std::vector<std::string>& sets) {
      return std::find(sets.begin(), sets.end(), "parallelism.tensor_parallel_size=2") !=
             sets.end();
    };
    EXPECT_EQ(a.out.find("): tp 2") != std::string::npos, tp2(m.first)) << a.out;
    EXPECT_EQ(b.out.find("): tp 2") != std::string::npos, tp2(m.second)) << b.out;
    const std::vector<double> got = losses(m.name);
    expect_close(got, want, 1e-5, m.name);
    double worst = 0;
    for (size_t i = 0; i < got.size() && i < want.size(); ++i)
      worst = std::max(worst, std::abs(got[i] - want[i]) / std::abs(want[i]));
    std::printf("[train %s] resumed at step 3, %zu steps logged, worst relative delta %.3g\n",
                m.name.c_str(), got.size(), worst);
  }
}

// model.init_from at tp 2: the HF tensors are whole, each rank keeps its slices (Note
// [Tensor-parallel shards]), and the run follows the one-process run started from the same file.
// `generate` reads a tensor-parallel run's checkpoint (whole tensors, Note [Tensor-parallel
// checkpoints]) as a one-process one and samples what it samples from the one-process run's.
TEST_F(TrainTpMpi, InitFromHfAndGenerateFromTheCheckpoint) {
  const int kSteps = 6;
  CommandResult base = train(0, config("base", 3), {});
  ASSERT_EQ(base.exit_code, 0) << describe(base);
  const std::vector<double> base_losses = losses("base");
  const std::string hf = tmp_ / "hf";
  CommandResult conv =
      testing::run_command({std::string(STRATA_BINARY_DIR) + "/convert", "--checkpoint",
                            tmp_ / "base/checkpoints/step_00000003", "--to-hf", hf});
  ASSERT_EQ(conv.exit_code, 0) << describe(conv);
  const std::string init = "model.init_from=" + hf;

  CommandResult one = train(0, config("ft_one", kSteps), {init});
  ASSERT_EQ(one.exit_code, 0) << describe(one);
  const std::vector<double> want = losses("ft_one");
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
  // The file's weights, not a fresh init: the first loss is below the base run's first.
  EXPECT_LT(want.front(), base_losses.front() - 0.05);
  const std::vector<std::pair<std::string, std::vector<std::string>>> runs = {
      {"ft_tp2", {init, "parallelism.tensor_parallel_size=2"}},
      {"ft_tp2_sp",
       {init, "parallelism.tensor_parallel_size=2", "parallelism.sequence_parallel=true"}},
  };
  for (const auto& [name, sets] : runs) {
    CommandResult r = train(4, config(name, kSteps), sets);
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    EXPECT_NE(r.out.find("): tp 2"), std::string::npos) << r.out;
    const std::vector<double> got = losses(name);
    expect_close(got, want, 1e-5, name);
    double worst = 0;
    for (size_t i = 0; i < got.size() && i < want.size(); ++i)
      worst = std::max(worst, std::abs(got[i] - want[i]) / std::abs(want[i]));
    std::printf(
        "[train %s, 4 ranks, init_from] %zu steps, loss %.6f -> %.6f, worst relative "
        "delta %.3g\n",
        name.c_str(), got.size(), got.empty() ? 0.0 : got.front(), got.empty() ? 0.0 : got.back(),
        worst);
  }

  std::string text[2];
  const std::string names[2] = {"ft_one", "ft_tp2"};
  for (int i = 0; i < 2; ++i) {
    CommandResult g =
        testing::run_command({std::string(STRATA_BINARY_DIR) + "/generate", "--checkpoint",
                              tmp_ / names[i], "--prompt", "The run", "--max-new-tokens", "32",
                              "--temperature", "1.0", "--top-k", "0", "--seed", "3"},
                             std::chrono::seconds(120));
    ASSERT_EQ(g.exit_code, 0) << describe(g);
    text[i] = g.out;
  }
  EXPECT_EQ(text[0].rfind("The run", 0), 0u) << text[0];
  EXPECT_EQ(text[0].size(), std::string("The run").size() + 32 + 1) << text[0];  // + newline
  EXPECT_EQ(text[1], text[0]);
}

// bf16 on CPU ranks (Note [Mixed precision] in parallel/engine.h): tp 2 x dp 2, with and without
// sequence parallelism, tracks the one-process bf16 run. A tensor-parallel layer rounds each
// rank's partial sums (the row-parallel outputs) to bf16 before the ranks add them, where one
// process rounds the whole sum once: one rounding more per value, as when data-parallel ranks add
// gradients in another order, which the GPU suite bounds by 1e-3 relative (TrainGpuMpi).
TEST_F(TrainTpMpi, Bf16TracksTheOneProcessBf16Run) {
  const int kSteps = 6;
  CommandResult single = train(0, config("bf16_single", kSteps), {"run.dtype=bf16"});
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  const std::vector<double> want = losses("bf16_single");
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
  for (const bool sp : {false, true}) {
    const std::string name = sp ? "bf16_tp2_sp" : "bf16_tp2";
    CommandResult r =
        train(4, config(name, kSteps),
              {"run.dtype=bf16", "parallelism.tensor_parallel_size=2",
               std::string("parallelism.sequence_parallel=") + (sp ? "true" : "false")});
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    EXPECT_NE(r.out.find("): tp 2"), std::string::npos) << r.out;
    const std::vector<double> got = losses(name);
    expect_close(got, want, 1e-3, name);
    double worst = 0;
    for (size_t i = 0; i < got.size() && i < want.size(); ++i)
      worst = std::max(worst, std::abs(got[i] - want[i]) / std::abs(want[i]));
    std::printf("[train %s, 4 ranks] worst relative loss delta against one process's bf16: %.3g\n",
                name.c_str(), worst);
  }
}

TEST_F(TrainTpMpi, ImpossibleLayoutsAreClearErrors) {
  // The test model has 2 heads.
  CommandResult r = train(4, config("bad_heads", 2), {"parallelism.tensor_parallel_size=4"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("parallelism.tensor_parallel_size"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("4 does not divide the 2 attention heads"), std::string::npos)
      << describe(r);
  // tp above the world: one process asked for tp 2.
  r = train(0, config("bad_world", 2), {"parallelism.tensor_parallel_size=2"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("the world has 1 ranks"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("parallelism"), std::string::npos) << describe(r);
}

}  // namespace
}  // namespace strata::tools
