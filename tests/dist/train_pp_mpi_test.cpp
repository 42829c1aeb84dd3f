// `train` under mpirun with pipeline parallelism: parallelism.pipeline_parallel_size = 2 on 4
// ranks (pp 2 x dp 2, and pp 2 x tp 2) reproduces the one-process loss and validation trajectory
// in metrics.jsonl with the 1f1b and gpipe schedules (activation checkpointing inside the stages
// too), logs the stages and the bubble, writes one-process checkpoints that resume at another
// pp, and refuses layouts it cannot run with errors that name the key and the numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tensor/safetensors.h"
#include "tests/dist/train_mpi_fixture.h"

namespace strata::tools {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using testing::describe;
using testing::expect_close;

class TrainPpMpi : public testing::TrainMpiFixture {
 protected:
  TrainPpMpi() : TrainMpiFixture(STRATA_BINARY_DIR, "") {}

  std::vector<double> val_losses(const std::string& name) {
    std::vector<double> out;
    for (const nlohmann::json& j : records(name))
      if (j.contains("val_loss")) out.push_back(j["val_loss"].get<double>());
    return out;
  }
};

double worst_relative(const std::vector<double>& got, const std::vector<double>& want) {
  double worst = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i)
    worst = std::max(worst, std::abs(got[i] - want[i]) / std::abs(want[i]));
  return worst;
}

// The fixture's model has 2 layers, micro-batches of 2 and a global batch of 8: one process
// accumulates 4 micro-batches, pp 2 x dp 2 runs 2 per pipeline, pp 2 x tp 2 runs 4.
TEST_F(TrainPpMpi, PipelineReproducesOneProcess) {
  const int kSteps = 20;
  CommandResult single = train(0, config("single", kSteps), {});
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  const std::vector<double> want = losses("single");
  const std::vector<double> want_val = val_losses("single");
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
  ASSERT_FALSE(want_val.empty());

  struct Run {
    std::string name;
    std::vector<std::string> sets;
    int64_t micro_batches;  // per pipeline
    std::string layout;     // in the first log line
    std::string rank3;      // global rank 3's coordinates (Note [Process group order])
  };
  const std::vector<Run> runs = {
      {"pp2_1f1b",
       {"parallelism.pipeline_parallel_size=2"},
       2,
       "pp 2 (1f1b) x tp 1 x dp 2",
       "rank 3 (stage 1, tp 0, dp 1)"},
      {"pp2_gpipe_z1",
       {"parallelism.pipeline_parallel_size=2", "parallelism.pipeline_schedule=gpipe",
        "zero_optimization.stage=1", "model.config.activation_checkpointing=true"},
       2,
       "pp 2 (gpipe) x tp 1 x dp 2, ZeRO stage 1",
       "rank 3 (stage 1, tp 0, dp 1)"},
      {"pp2_tp2",
       {"parallelism.pipeline_parallel_size=2", "parallelism.tensor_parallel_size=2",
        "parallelism.pipeline_partition=[1, 1]"},
       4,
       "pp 2 (1f1b) x tp 2 x dp 1",
       "rank 3 (stage 1, tp 1, dp 0)"},
  };
  for (const Run& run : runs) {
    CommandResult r = train(4, config(run.name, kSteps), run.sets);
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    const std::vector<double> got = losses(run.name);
    expect_close(got, want, 1e-5, run.name);
    expect_close(val_losses(run.name), want_val, 1e-5, run.name + " (validation)");
    std::printf(
        "[train %s, 4 ranks] %zu steps, loss %.6f -> %.6f, worst relative delta %.3g "
        "(validation %.3g)\n",
        run.name.c_str(), got.size(), got.empty() ? 0.0 : got.front(),
        got.empty() ? 0.0 : got.back(), worst_relative(got, want),
        worst_relative(val_losses(run.name), want_val));
    EXPECT_NE(r.out.find(run.layout), std::string::npos) << r.out;
    // The stages, with their layers and parameters; the bubble beside its formula.
    EXPECT_NE(r.out.find("pipeline: 2 stages"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("stage 0: layers 0-0 ("), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("stage 1: layers 1-1 ("), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(" | bubble "), std::string::npos) << r.out;
    const double formula = 1.0 / static_cast<double>(run.micro_batches + 1);
    for (const nlohmann::json& j : records(run.name)) {
      ASSERT_TRUE(j.contains("pipeline_bubble")) << j.dump();
      ASSERT_EQ(j["pipeline_bubble"].size(), 2u) << j.dump();
      for (const auto& b : j["pipeline_bubble"]) {
        EXPECT_GE(b.get<double>(), 0.0) << j.dump();
        EXPECT_LT(b.get<double>(), 1.0) << j.dump();
      }
      EXPECT_NEAR(j["pipeline_bubble_formula"].get<double>(), formula, 1e-12) << j.dump();
    }
    // The memory report has every rank with its stage, and each stage's claim.
    EXPECT_NE(r.out.find(run.rank3 + ": model states"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(", claimed "), std::string::npos) << r.out;
  }
}

// Note [Tensor-parallel checkpoints] under pipeline parallelism: a checkpoint written at pp 2 is a
// one-process checkpoint (the same HF names, the tied embedding once) and resumes at pp 1; one
// written by one process resumes at pp 2, one written at pp 2 x tp 2 at pp 2 x tp 1; each
// continues the one-process trajectory.
TEST_F(TrainPpMpi, CheckpointsResumeAtAnotherPp) {
  const int kSteps = 6;
  CommandResult single = train(0, config("single", kSteps), {});
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  const std::vector<double> want = losses("single");
  const auto one_process_names = [&] {
    std::vector<std::string> names;
    for (const auto& [name, t] :
         tensor::load_safetensors(tmp_ / "single/checkpoints/step_00000006/model.safetensors"))
      names.push_back(name);
    return names;
  }();

  struct Move {
    std::string name;
    int np_first;
    std::vector<std::string> first;
    int np_second;
    std::vector<std::string> second;
  };
  const std::vector<Move> moves = {
      {"pp2_to_pp1",
       4,
       {"parallelism.pipeline_parallel_size=2", "zero_optimization.stage=1"},
       2,
       {}},
      {"pp1_to_pp2",
       0,
       {},
       4,
       {"parallelism.pipeline_parallel_size=2", "parallelism.pipeline_schedule=gpipe"}},
      // pp 2 x tp 2 (ZeRO-2 over dp 1) -> pp 2 x dp 1
      {"pp2tp2_to_pp2",
       4,
       {"parallelism.pipeline_parallel_size=2", "parallelism.tensor_parallel_size=2",
        "zero_optimization.stage=2"},
       2,
       {"parallelism.pipeline_parallel_size=2"}},
  };
  for (const Move& m : moves) {
    const std::string cfg = config(m.name, kSteps);
    std::vector<std::string> first = m.first;
    first.push_back("training.steps=3");
    CommandResult a = train(m.np_first, cfg, first);
    ASSERT_EQ(a.exit_code, 0) << describe(a);
    const std::string ckpt = tmp_ / (m.name + "/checkpoints/step_00000003");
    ASSERT_TRUE(fs::exists(ckpt + "/model.safetensors")) << m.name;
    std::vector<std::string> names;
    for (const auto& [name, t] : tensor::load_safetensors(ckpt + "/model.safetensors"))
      names.push_back(name);
    EXPECT_EQ(names, one_process_names) << m.name;
    if (m.np_first == 4) {
      CommandResult verify = testing::run_command(
          {std::string(STRATA_BINARY_DIR) + "/convert", "--checkpoint", ckpt, "--verify"});
      EXPECT_EQ(verify.exit_code, 0) << describe(verify);
    }
    CommandResult b = train(m.np_second, cfg, m.second);
    ASSERT_EQ(b.exit_code, 0) << describe(b);
    EXPECT_NE(b.out.find("resumed from"), std::string::npos) << b.out;
    // Each half ran in its layout.
    EXPECT_EQ(a.out.find("pipeline: 2 stages") != std::string::npos, !m.first.empty()) << a.out;
    EXPECT_EQ(b.out.find("pipeline: 2 stages") != std::string::npos, !m.second.empty()) << b.out;
    const std::vector<double> got = losses(m.name);
    expect_close(got, want, 1e-5, m.name);
    std::printf("[train %s] resumed at step 3, %zu steps logged, worst relative delta %.3g\n",
                m.name.c_str(), got.size(), worst_relative(got, want));
  }
}

// Four stages of a 4-layer model (two middle stages without embeddings or head, the tied copy
// four ranks away): 5 steps at pp 4, checkpointed, then 5 more resumed at pp 2 (explicit
// partition [3, 1]), against one process.
TEST_F(TrainPpMpi, FourStagesThenTwo) {
  const int kSteps = 10;
  const std::string layers = "model.config.n_layer=4";
  CommandResult single = train(0, config("single", kSteps), {layers});
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  const std::vector<double> want = losses("single");
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));

  const std::string cfg = config("pp4", kSteps);
  CommandResult a =
      train(4, cfg, {layers, "parallelism.pipeline_parallel_size=4", "training.steps=5"});
  ASSERT_EQ(a.exit_code, 0) << describe(a);
  EXPECT_NE(a.out.find("pp 4 (1f1b) x tp 1 x dp 1"), std::string::npos) << a.out;
  EXPECT_NE(a.out.find("stage 2: layers 2-2 ("), std::string::npos) << a.out;
  const std::string ckpt = tmp_ / "pp4/checkpoints/step_00000005";
  CommandResult verify = testing::run_command(
      {std::string(STRATA_BINARY_DIR) + "/convert", "--checkpoint", ckpt, "--verify"});
  EXPECT_EQ(verify.exit_code, 0) << describe(verify);
  CommandResult b = train(
      2, cfg,
      {layers, "parallelism.pipeline_parallel_size=2", "parallelism.pipeline_partition=[3, 1]"});
  ASSERT_EQ(b.exit_code, 0) << describe(b);
  EXPECT_NE(b.out.find("resumed from"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("stage 0: layers 0-2 ("), std::string::npos) << b.out;
  const std::vector<double> got = losses("pp4");
  expect_close(got, want, 1e-5, "pp 4 -> pp 2");
  std::printf("[train pp4 -> pp2] resumed at step 5, %zu steps logged, worst relative delta %.3g\n",
              got.size(), worst_relative(got, want));
}

// LLaMA, untied (the head only on the last stage) and tied: 2 steps at pp 2 (dp 1), checkpointed
// with the one-process HF names, 2 more in one process, against one process.
TEST_F(TrainPpMpi, LlamaUntiedAndTied) {
  const int kSteps = 4;
  for (const std::string tied : {"false", "true"}) {
    const auto llama_config = [&](const std::string& name) {
      const std::string path = config(name, kSteps);
      std::string text = testing::read_text(path);
      for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
               {"name: gpt2-tiny", "name: llama-tiny"},
               {"n_positions: 32", "block_size: 32\n    tie_word_embeddings: " + tied}}) {
        const size_t at = text.find(from);
        EXPECT_NE(at, std::string::npos) << from;
        if (at != std::string::npos) text.replace(at, from.size(), to);
      }
      testing::write_text(path, text);
      return path;
    };
    const std::string single_name = "llama_single_" + tied, name = "llama_pp2_" + tied;
    CommandResult single = train(0, llama_config(single_name), {});
    ASSERT_EQ(single.exit_code, 0) << describe(single);
    const std::vector<double> want = losses(single_name);
    std::vector<std::string> want_names;
    for (const auto& [n, t] : tensor::load_safetensors(
             tmp_ / (single_name + "/checkpoints/step_00000004/model.safetensors")))
      want_names.push_back(n);

    const std::string cfg = llama_config(name);
    CommandResult a = train(2, cfg, {"parallelism.pipeline_parallel_size=2", "training.steps=2"});
    ASSERT_EQ(a.exit_code, 0) << describe(a);
    EXPECT_NE(a.out.find("pp 2 (1f1b) x tp 1 x dp 1"), std::string::npos) << a.out;
    std::vector<std::string> names;
    for (const auto& [n, t] :
         tensor::load_safetensors(tmp_ / (name + "/checkpoints/step_00000002/model.safetensors")))
      names.push_back(n);
    EXPECT_EQ(names, want_names) << "tie_word_embeddings " << tied;
    CommandResult b = train(0, cfg, {});
    ASSERT_EQ(b.exit_code, 0) << describe(b);
    EXPECT_NE(b.out.find("resumed from"), std::string::npos) << b.out;
    const std::vector<double> got = losses(name);
    expect_close(got, want, 1e-5, name);
    std::printf(
        "[train llama-tiny, tie_word_embeddings %s] pp 2 -> 1 process: %zu steps, worst "
        "relative delta %.3g\n",
        tied.c_str(), got.size(), worst_relative(got, want));
  }
}

// model.init_from at pp 2: each stage takes its tensors from the HF export of a trained run, and
// the run follows the one-process run from the same file.
TEST_F(TrainPpMpi, InitFromHfAtPp2) {
  CommandResult base = train(0, config("base", 2), {});
  ASSERT_EQ(base.exit_code, 0) << describe(base);
  const std::string hf = tmp_ / "hf";
  CommandResult conv =
      testing::run_command({std::string(STRATA_BINARY_DIR) + "/convert", "--checkpoint",
                            tmp_ / "base/checkpoints/step_00000002", "--to-hf", hf});
  ASSERT_EQ(conv.exit_code, 0) << describe(conv);
  const std::string init = "model.init_from=" + hf;
  CommandResult single = train(0, config("init_single", 4), {init});
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  const std::vector<double> want = losses("init_single");
  CommandResult pp =
      train(4, config("init_pp2", 4), {init, "parallelism.pipeline_parallel_size=2"});
  ASSERT_EQ(pp.exit_code, 0) << describe(pp);
  const std::vector<double> got = losses("init_pp2");
  expect_close(got, want, 1e-5, "init_from at pp 2");
  // Not the fresh initialisation's trajectory: the weights came from the file.
  EXPECT_LT(want.front(), losses("base").front() - 1e-3);
  std::printf("[train init_from, pp 2] %zu steps, loss %.6f -> %.6f, worst relative delta %.3g\n",
              got.size(), got.empty() ? 0.0 : got.front(), got.empty() ? 0.0 : got.back(),
              worst_relative(got, want));
}

// The interleaved schedule (Note [Interleaved schedule]) on a 4-layer model at pp 2 x v 2: rank
// 0 holds layers 0 and 2, rank 1 layers 1 and 3. 6 steps against one process: at dp 1 (4
// micro-batches per pipeline) with ZeRO 0, at dp 2 (2 micro-batches, m == p: every forward,
// then every backward) with ZeRO 1 and 2, and at tp 2, with and without sequence parallelism.
const std::vector<std::string> kInterleaved = {
    "model.config.n_layer=4", "parallelism.pipeline_parallel_size=2",
    "parallelism.pipeline_schedule=interleaved", "parallelism.virtual_pipeline_stages=2"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST_F(TrainPpMpi, InterleavedReproducesOneProcess) {
  const int kSteps = 6;
  CommandResult single = train(0, config("single", kSteps), {"model.config.n_layer=4"});
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  const std::vector<double> want = losses("single");
  const std::vector<double> want_val = val_losses("single");
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
  struct Run {
    std::string name;
    int np;
    std::vector<std::string> sets;
    int64_t micro_batches;  // per pipeline
    std::string layout;
  };
  const std::vector<Run> runs = {
      {"il_dp1", 2, {}, 4, "pp 2 (interleaved) x tp 1 x dp 1, ZeRO stage 0"},
      {"il_dp2_z1",
       4,
       {"zero_optimization.stage=1"},
       2,
       "pp 2 (interleaved) x tp 1 x dp 2, ZeRO stage 1"},
      {"il_dp2_z2",
       4,
       {"zero_optimization.stage=2"},
       2,
       "pp 2 (interleaved) x tp 1 x dp 2, ZeRO stage 2"},
      {"il_tp2", 4, {"parallelism.tensor_parallel_size=2"}, 4, "pp 2 (interleaved) x tp 2 x dp 1"},
      {"il_tp2_sp",
       4,
       {"parallelism.tensor_parallel_size=2", "parallelism.sequence_parallel=true"},
       4,
       "pp 2 (interleaved) x tp 2 (sequence parallel) x dp 1"},
  };
  for (const Run& run : runs) {
    CommandResult r = train(run.np, config(run.name, kSteps), with(kInterleaved, run.sets));
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    const std::vector<double> got = losses(run.name);
    expect_close(got, want, 1e-5, run.name);
    expect_close(val_losses(run.name), want_val, 1e-5, run.name + " (validation)");
    std::printf(
        "[train %s, %d ranks] %zu steps, loss %.6f -> %.6f, worst relative delta %.3g "
        "(validation %.3g)\n",
        run.name.c_str(), run.np, got.size(), got.empty() ? 0.0 : got.front(),
        got.empty() ? 0.0 : got.back(), worst_relative(got, want),
        worst_relative(val_losses(run.name), want_val));
    EXPECT_NE(r.out.find(run.layout), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("pipeline: 2 stages x 2 chunks, interleaved schedule"), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("rank 0: layers 0-0, 2-2 ("), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("rank 1: layers 1-1, 3-3 ("), std::string::npos) << r.out;
    // The bubble formula with v: (p - 1) / (v m + p - 1).
    const double formula = 1.0 / static_cast<double>(2 * run.micro_batches + 1);
    for (const nlohmann::json& j : records(run.name)) {
      ASSERT_TRUE(j.contains("pipeline_bubble")) << j.dump();
      EXPECT_NEAR(j["pipeline_bubble_formula"].get<double>(), formula, 1e-12) << j.dump();
    }
  }
}

// Resume at the same v is bitwise the uninterrupted interleaved run; the checkpoint has the
// one-process names, and resumed in one process it continues the one-process trajectory.
TEST_F(TrainPpMpi, InterleavedResumes) {
  const int kSteps = 6;
  CommandResult single = train(0, config("single", kSteps), {"model.config.n_layer=4"});
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  const std::vector<double> want = losses("single");
  std::vector<std::string> want_names;
  for (const auto& [n, t] :
       tensor::load_safetensors(tmp_ / "single/checkpoints/step_00000006/model.safetensors"))
    want_names.push_back(n);
  CommandResult whole = train(2, config("il", kSteps), kInterleaved);
  ASSERT_EQ(whole.exit_code, 0) << describe(whole);
  const std::vector<double> uninterrupted = losses("il");

  for (const std::string to : {"interleaved", "one process"}) {
    const std::string name = to == "interleaved" ? "il_resume" : "il_to_one";
    const std::string cfg = config(name, kSteps);
    CommandResult a = train(2, cfg, with(kInterleaved, {"training.steps=3"}));
    ASSERT_EQ(a.exit_code, 0) << describe(a);
    std::vector<std::string> names;
    for (const auto& [n, t] :
         tensor::load_safetensors(tmp_ / (name + "/checkpoints/step_00000003/model.safetensors")))
      names.push_back(n);
    EXPECT_EQ(names, want_names) << name;
    CommandResult b = to == "interleaved" ? train(2, cfg, kInterleaved)
                                          : train(0, cfg, {"model.config.n_layer=4"});
    ASSERT_EQ(b.exit_code, 0) << describe(b);
    EXPECT_NE(b.out.find("resumed from"), std::string::npos) << b.out;
    const std::vector<double> got = losses(name);
    if (to == "interleaved") {
      EXPECT_EQ(got, uninterrupted) << "resumed at pp 2 x v 2: not bitwise";
    } else {
      expect_close(got, want, 1e-5, name);
    }
    std::printf("[train %s] resumed at step 3 (%s), %zu steps, worst relative delta %.3g\n",
                name.c_str(), to.c_str(), got.size(), worst_relative(got, want));
  }
}

// Note [Tensor-parallel checkpoints]: model.safetensors written a unit at a time and read back
// as each rank's slices, in the layout that wrote it: a run stopped at step 2 and resumed is
// bitwise the uninterrupted run, and its step-4 checkpoint has the same bytes (pp 2 x v 2: the
// test above).
TEST_F(TrainPpMpi, ResumesInTheSameLayoutAreBitwise) {
  const int kSteps = 4;
  struct Layout {
    std::string name;
    int np;
    std::vector<std::string> sets;
  };
  const std::vector<Layout> layouts = {
      {"tp2", 2, {"parallelism.tensor_parallel_size=2"}},
      {"pp2", 2, {"parallelism.pipeline_parallel_size=2"}},
      {"tp2dp2", 4, {"parallelism.tensor_parallel_size=2", "zero_optimization.stage=1"}},
  };
  for (const Layout& l : layouts) {
    CommandResult whole = train(l.np, config(l.name, kSteps), l.sets);
    ASSERT_EQ(whole.exit_code, 0) << describe(whole);
    const std::vector<double> uninterrupted = losses(l.name);
    const std::string name = l.name + "_resumed";
    const std::string cfg = config(name, kSteps);
    CommandResult a = train(l.np, cfg, with(l.sets, {"training.steps=2"}));
    ASSERT_EQ(a.exit_code, 0) << describe(a);
    CommandResult b = train(l.np, cfg, l.sets);
    ASSERT_EQ(b.exit_code, 0) << describe(b);
    EXPECT_NE(b.out.find("resumed from"), std::string::npos) << b.out;
    EXPECT_EQ(losses(name), uninterrupted) << l.name << ": the resumed run is not bitwise";
    for (const char* f : {"model.safetensors", "optimizer.safetensors"}) {
      const std::string want =
          testing::read_text(tmp_ / (l.name + "/checkpoints/step_00000004/" + f));
      EXPECT_FALSE(want.empty()) << l.name << " " << f;
      EXPECT_TRUE(testing::read_text(tmp_ / (name + "/checkpoints/step_00000004/" + f)) == want)
          << l.name << ": " << f << " differs after the resume";
    }
    std::printf("[train %s] stopped at step 2 and resumed: %zu steps, bitwise\n", l.name.c_str(),
                uninterrupted.size());
  }
}

// Four stages x 2 chunks of an 8-layer model (rank r holds layers r and r + 4; middle stages
// outside the wrap-around link): 4 steps, 4 micro-batches, against one process.
TEST_F(TrainPpMpi, InterleavedFourStages) {
  const int kSteps = 4;
  const std::string layers = "model.config.n_layer=8";
  CommandResult single = train(0, config("single", kSteps), {layers});
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  const std::vector<double> want = losses("single");
  CommandResult r =
      train(4, config("il_pp4", kSteps),
            {layers, "parallelism.pipeline_parallel_size=4",
             "parallelism.pipeline_schedule=interleaved", "parallelism.virtual_pipeline_stages=2"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("pp 4 (interleaved) x tp 1 x dp 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 2: layers 2-2, 6-6 ("), std::string::npos) << r.out;
  const std::vector<double> got = losses("il_pp4");
  expect_close(got, want, 1e-5, "pp 4 x v 2");
  std::printf("[train pp 4 x v 2] %zu steps, loss %.6f -> %.6f, worst relative delta %.3g\n",
              got.size(), got.empty() ? 0.0 : got.front(), got.empty() ? 0.0 : got.back(),
              worst_relative(got, want));
}

// model.init_from at pp 2 x v 2: each rank takes its chunks' tensors from the HF export by name
// and follows the one-process run from the same file.
TEST_F(TrainPpMpi, InterleavedInitFromHf) {
  const std::string layers = "model.config.n_layer=4";
  CommandResult base = train(0, config("base", 2), {layers});
  ASSERT_EQ(base.exit_code, 0) << describe(base);
  const std::string hf = tmp_ / "hf";
  CommandResult conv =
      testing::run_command({std::string(STRATA_BINARY_DIR) + "/convert", "--checkpoint",
                            tmp_ / "base/checkpoints/step_00000002", "--to-hf", hf});
  ASSERT_EQ(conv.exit_code, 0) << describe(conv);
  const std::string init = "model.init_from=" + hf;
  CommandResult single = train(0, config("init_single", 4), {layers, init});
  ASSERT_EQ(single.exit_code, 0) << describe(single);
  const std::vector<double> want = losses("init_single");
  CommandResult il = train(2, config("init_il", 4), with(kInterleaved, {init}));
  ASSERT_EQ(il.exit_code, 0) << describe(il);
  const std::vector<double> got = losses("init_il");
  expect_close(got, want, 1e-5, "init_from at pp 2 x v 2");
  // Not the fresh initialisation's trajectory: the weights came from the file.
  EXPECT_LT(want.front(), losses("base").front() - 1e-3);
  std::printf(
      "[train init_from, pp 2 x v 2] %zu steps, loss %.6f -> %.6f, worst relative delta "
      "%.3g\n",
      got.size(), got.empty() ? 0.0 : got.front(), got.empty() ? 0.0 : got.back(),
      worst_relative(got, want));
}

TEST_F(TrainPpMpi, BadLayoutsAreClearErrors) {
  const auto expect_error = [&](int np, const std::vector<std::string>& sets,
                                const std::vector<std::string>& parts) {
    CommandResult r = train(np, config("bad", 2), sets);
    EXPECT_NE(r.exit_code, 0) << describe(r);
    for (const std::string& part : parts)
      EXPECT_NE(r.err.find(part), std::string::npos) << part << "\n" << describe(r);
  };
  // The test model has 2 layers.
  expect_error(0, {"parallelism.pipeline_parallel_size=3"},
               {"parallelism.pipeline_parallel_size", "is 3 but model 'gpt2-tiny' has 2 layers"});
  expect_error(
      0, {"parallelism.pipeline_parallel_size=2", "parallelism.pipeline_partition=[2, 1]"},
      {"parallelism.pipeline_partition", "[2, 1] adds up to 3 layers but model 'gpt2-tiny' has 2"});
  expect_error(0, {"parallelism.pipeline_parallel_size=2", "parallelism.pipeline_partition=[2]"},
               {"parallelism.pipeline_partition", "lists 1 stages", "pipeline_parallel_size is 2"});
  expect_error(0, {"parallelism.pipeline_parallel_size=2", "zero_optimization.stage=3"},
               {"parallelism.pipeline_parallel_size", "zero_optimization.stage is 3"});
  expect_error(0, {"parallelism.pipeline_schedule=interleaved"},
               {"parallelism.virtual_pipeline_stages", "pipeline_schedule is interleaved"});
  // Note [Interleaved schedule]: the micro-batches (8 / 2 / dp 1 = 4, here 3) in groups of pp.
  expect_error(2,
               {"model.config.n_layer=4", "parallelism.pipeline_parallel_size=2",
                "parallelism.pipeline_schedule=interleaved",
                "parallelism.virtual_pipeline_stages=2", "batch.global_batch_size=6"},
               {"batch.grad_accum_steps is 3", "virtual_pipeline_stages 2", "multiple of 2"});
  // pp x tp above the world, and not dividing it.
  expect_error(0, {"parallelism.pipeline_parallel_size=2"},
               {"parallelism", "pipeline_parallel_size 2 = 2 ranks is more than the world's 1"});
  expect_error(3, {"parallelism.pipeline_parallel_size=2"},
               {"parallelism", "the world's 3 ranks do not divide", "pipeline_parallel_size 2"});
}

}  // namespace
}  // namespace strata::tools
