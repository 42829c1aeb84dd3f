// `train` on GPUs under mpirun, end to end through the real binary (label cuda): every ZeRO stage
// over nccl reproduces one GPU's losses (and SGD at stage 2), so do tp 2 and pp 2 through their
// checkpoints, a bf16 ZeRO-3 checkpoint written by
// two GPU ranks resumes bitwise on two and continues on one GPU and on the CPU, ranks share one GPU
// over mpi, `generate --device cuda` samples the CPU's text from a GPU checkpoint, and nccl with
// more ranks than GPUs stops with a clear error. Each test skips without
// the GPUs it needs; the emulation build runs them on emulated GPUs, one per process (Note
// [Emulated NCCL]; its ctest sets STRATA_CUDA_EMU_DEVICES=2). On one real GPU only the mpi,
// generate and error cases run.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

#include "../train_mpi_fixture.h"
#include "tensor/cuda.h"
#include "tensor/safetensors.h"

namespace strata::tools {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using testing::describe;
using testing::expect_close;
using testing::ScratchDir;

const std::string kBin = STRATA_BINARY_DIR;

// A layout of `train` on GPUs over nccl: its name, its --set lines, what its first log line says.
struct GpuLayout {
  std::string name;
  std::vector<std::string> sets;
  std::string log;
};

class TrainGpuMpi : public testing::TrainMpiFixture {
 protected:
  TrainGpuMpi() : TrainMpiFixture(kBin, "cuda") {}
  void SetUp() override {
    TrainMpiFixture::SetUp();
    gpus_ = tensor::cuda_device_count();
  }
  // `common`: --set lines of the one-GPU run and of every layout.
  void expect_layouts_follow_one_gpu(int np, const std::vector<GpuLayout>& layouts,
                                     const std::vector<std::string>& common = {});
  int gpus_ = 0;
};

#define NEED_GPUS(n) \
  if (gpus_ < (n)) GTEST_SKIP() << "needs " << (n) << " visible GPU(s), this machine has " << gpus_

TEST_F(TrainGpuMpi, EveryZeroStageOverNcclReproducesOneGpu) {
  NEED_GPUS(2);
  const int kSteps = 6;
  CommandResult one = train(0, config("one", kSteps), {"run.dtype=fp32"});
  ASSERT_EQ(one.exit_code, 0) << describe(one);
  const std::vector<double> want = losses("one");
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
  EXPECT_LT(want.back(), want.front()) << "the one-GPU run did not train";
  for (int stage = 0; stage <= 3; ++stage) {
    const std::string name = fmt::format("stage{}", stage);
    CommandResult r = train(2, config(name, kSteps),
                            {"run.dtype=fp32", fmt::format("zero_optimization.stage={}", stage)});
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    EXPECT_NE(r.out.find("| cuda | 2 ranks (nccl)"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("rank 1: model states"), std::string::npos) << r.out;
    expect_close(losses(name), want, 1e-5, name);
  }
}

// SGD with momentum on the GPU (Note [CUDA SGD]): each ZeRO-2 rank steps its partition of the
// momentum buffers on its own GPU and the two ranks track one GPU's losses.
TEST_F(TrainGpuMpi, SgdWithMomentumAtZeroTwoOverNcclReproducesOneGpu) {
  NEED_GPUS(2);
  const int kSteps = 6;
  const std::vector<std::string> sgd = {"run.dtype=fp32", "optimizer.name=sgd", "optimizer.lr=0.05",
                                        "optimizer.momentum=0.9"};
  CommandResult one = train(0, config("sgd_one", kSteps), sgd);
  ASSERT_EQ(one.exit_code, 0) << describe(one);
  const std::vector<double> want = losses("sgd_one");
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
  EXPECT_LT(want.back(), want.front()) << "the one-GPU SGD run did not train";
  std::vector<std::string> two = sgd;
  two.push_back("zero_optimization.stage=2");
  CommandResult r = train(2, config("sgd_two", kSteps), two);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("| cuda | 2 ranks (nccl)"), std::string::npos) << r.out;
  expect_close(losses("sgd_two"), want, 1e-5, "sgd stage 2");
}

// Each layout on `np` GPUs trains 3 steps in fp32, writes a checkpoint (put together over nccl,
// which moves GPU memory only: runtime/tp_checkpoint.cpp) and resumes for 3 more, on one GPU's
// losses throughout (within 1e-5 relative); both checkpoints hold the one-GPU run's tensor names.
void TrainGpuMpi::expect_layouts_follow_one_gpu(int np, const std::vector<GpuLayout>& layouts,
                                                const std::vector<std::string>& common) {
  const int kSteps = 6;
  const std::string one_name = fmt::format("one_for_np{}", np);
  std::vector<std::string> one_sets = common;
  one_sets.push_back("run.dtype=fp32");
  CommandResult one = train(0, config(one_name, kSteps), one_sets);
  ASSERT_EQ(one.exit_code, 0) << describe(one);
  const std::vector<double> want = losses(one_name);
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
  EXPECT_LT(want.back(), want.front()) << "the one-GPU run did not train";
  std::vector<std::string> want_names;
  for (const auto& [name, t] :
       tensor::load_safetensors(tmp_ / (one_name + "/checkpoints/step_00000006/model.safetensors")))
    want_names.push_back(name);
  ASSERT_FALSE(want_names.empty());

  for (const GpuLayout& l : layouts) {
    const std::string cfg = config(l.name, kSteps);
    std::vector<std::string> sets = common;
    sets.insert(sets.end(), l.sets.begin(), l.sets.end());
    sets.push_back("run.dtype=fp32");
    std::vector<std::string> first = sets;
    first.push_back("training.steps=3");
    CommandResult a = train(np, cfg, first);
    ASSERT_EQ(a.exit_code, 0) << describe(a);
    EXPECT_NE(a.out.find(fmt::format("{} ranks (nccl)", np)), std::string::npos) << a.out;
    EXPECT_NE(a.out.find(l.log), std::string::npos) << a.out;
    for (const std::string step : {"step_00000003", "step_00000006"}) {
      if (step == "step_00000006") {
        CommandResult b = train(np, cfg, sets);
        ASSERT_EQ(b.exit_code, 0) << describe(b);
        EXPECT_NE(b.out.find("resumed from"), std::string::npos) << b.out;
      }
      const std::string file = tmp_ / (l.name + "/checkpoints/" + step + "/model.safetensors");
      ASSERT_TRUE(fs::exists(file)) << file;
      std::vector<std::string> names;
      for (const auto& [name, t] : tensor::load_safetensors(file)) names.push_back(name);
      EXPECT_EQ(names, want_names) << file;
    }
    const std::vector<double> got = losses(l.name);
    ASSERT_EQ(got.size(), static_cast<size_t>(kSteps)) << l.name;
    expect_close(got, want, 1e-5, l.name);
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i)
      worst = std::max(worst, std::abs(got[i] - want[i]) / std::abs(want[i]));
    fmt::print("[train {} on {} GPUs over nccl] resumed at step 3: worst relative delta {:.3g}\n",
               l.name, np, worst);
  }
}

// tp 2 and pp 2 (1f1b and gpipe, 4 micro-batches; the links are nccl send/recv) on two GPUs.
TEST_F(TrainGpuMpi, TensorAndPipelineParallelOverNcclReproduceOneGpuAndResume) {
  NEED_GPUS(2);
  expect_layouts_follow_one_gpu(
      2, {
             {"tp2", {"parallelism.tensor_parallel_size=2"}, "tp 2 x dp 1"},
             {"pp2", {"parallelism.pipeline_parallel_size=2"}, "pp 2 (1f1b) x tp 1 x dp 1"},
             {"pp2_gpipe",
              {"parallelism.pipeline_parallel_size=2", "parallelism.pipeline_schedule=gpipe"},
              "pp 2 (gpipe) x tp 1 x dp 1"},
         });
}

// The interleaved schedule (Note [Interleaved schedule]) on two GPUs: a 4-layer model at pp 2 x
// v 2 (4 micro-batches), the wrap-around link an nccl pair of its own; fp32 on one GPU's losses
// through a checkpoint, and bf16 resumed bitwise.
TEST_F(TrainGpuMpi, InterleavedPipelineOverNcclReproducesOneGpuAndResumes) {
  NEED_GPUS(2);
  const std::vector<std::string> interleaved = {"parallelism.pipeline_parallel_size=2",
                                                "parallelism.pipeline_schedule=interleaved",
                                                "parallelism.virtual_pipeline_stages=2"};
  const std::vector<std::string> layers = {"model.config.n_layer=4"};
  expect_layouts_follow_one_gpu(2, {{"pp2_v2", interleaved, "pp 2 (interleaved) x tp 1 x dp 1"}},
                                layers);
  // In bf16 (the GPU default) the resumed run is the uninterrupted one, bit for bit.
  std::vector<std::string> sets = layers;
  sets.insert(sets.end(), interleaved.begin(), interleaved.end());
  ASSERT_NO_FATAL_FAILURE(train_full_and_resumed(2, sets, 6, 3, "il_full", "il_parts"));
  const std::vector<double> x = losses("il_full"), y = losses("il_parts");
  ASSERT_EQ(x.size(), 6u);
  ASSERT_EQ(y.size(), 6u);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i], y[i]) << "step " << i + 1;
}

// On four GPUs the checkpoint's dp sums (ZeRO-1 shards) and the tp gathers inside a pipeline go
// over nccl too: pp 2 x dp 2 with ZeRO-1, and pp 2 x tp 2. The emulation build runs it on 4
// emulated GPUs (its own ctest entry, TrainGpuMpi.FourGpus.emulated).
TEST_F(TrainGpuMpi, PipelineWithDataAndTensorParallelOnFourGpusReproducesOneGpuAndResumes) {
  NEED_GPUS(4);
  expect_layouts_follow_one_gpu(
      4, {
             {"pp2dp2_z1",
              {"parallelism.pipeline_parallel_size=2", "zero_optimization.stage=1"},
              "pp 2 (1f1b) x tp 1 x dp 2, ZeRO stage 1"},
             {"pp2tp2",
              {"parallelism.pipeline_parallel_size=2", "parallelism.tensor_parallel_size=2"},
              "pp 2 (1f1b) x tp 2 x dp 1"},
         });
}

// bf16 (the GPU default) at pp 2: the checkpoint carries the fp32 masters, so 3 steps, a
// checkpoint and 3 resumed steps give the uninterrupted run's losses bit for bit.
TEST_F(TrainGpuMpi, Bf16PipelineResumesBitwiseOnTwoGpus) {
  NEED_GPUS(2);
  ResumedRuns runs;
  ASSERT_NO_FATAL_FAILURE(train_full_and_resumed(2, {"parallelism.pipeline_parallel_size=2"}, 6, 3,
                                                 "pp_full", "pp_parts", &runs));
  EXPECT_NE(runs.whole.out.find("pp 2 (1f1b) x tp 1 x dp 1"), std::string::npos) << runs.whole.out;
  const std::vector<double> x = losses("pp_full"), y = losses("pp_parts");
  ASSERT_EQ(x.size(), 6u);
  ASSERT_EQ(y.size(), 6u);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i], y[i]) << "step " << i + 1;
}

// bf16 (the GPU default): ZeRO-3's shards hold the bf16 parameters beside the fp32 masters.
TEST_F(TrainGpuMpi, Bf16ZeroThreeResumesBitwiseOnTwoGpusAndMovesToOneGpuAndTheCpu) {
  NEED_GPUS(2);
  ResumedRuns runs;
  ASSERT_NO_FATAL_FAILURE(
      train_full_and_resumed(2, {"zero_optimization.stage=3"}, 6, 3, "full", "parts", &runs));
  const std::string ckpt3 = tmp_ / "parts/checkpoints/step_00000003";
  ASSERT_TRUE(fs::exists(ckpt3 + "/model.rank00001-of-00002.safetensors")) << describe(runs.first);

  const std::vector<double> x = losses("full"), y = losses("parts");
  ASSERT_EQ(x.size(), 6u);
  ASSERT_EQ(y.size(), 6u);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i], y[i]) << "step " << i + 1;
  for (int r = 0; r < 2; ++r) {
    const std::string file = fmt::format("model.rank{:05d}-of-00002.safetensors", r);
    auto pa = tensor::load_safetensors(tmp_ / ("full/checkpoints/step_00000006/" + file));
    auto pb = tensor::load_safetensors(tmp_ / ("parts/checkpoints/step_00000006/" + file));
    ASSERT_EQ(pa.size(), pb.size()) << file;
    for (auto& [name, t] : pa) {
      EXPECT_EQ(t.dtype(), DType::BF16) << file << " " << name;
      EXPECT_EQ(std::memcmp(t.data_ptr(), pb.at(name).data_ptr(), t.nbytes()), 0)
          << file << " " << name;
    }
  }

  // The step-3 checkpoint of two GPU ranks, continued by one GPU (ZeRO-0) and by the CPU.
  const std::vector<double> tail(x.begin() + 3, x.end());
  for (const std::string& where : {std::string("gpu"), std::string("cpu")}) {
    const std::string name = "moved_" + where;
    CommandResult r = train(0, config(name, 6),
                            {"run.device=" + std::string(where == "gpu" ? "cuda" : "cpu"),
                             "run.dtype=bf16", "training.resume=" + ckpt3});
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    EXPECT_NE(r.out.find("resumed from"), std::string::npos) << r.out;
    // One GPU adds the ranks' gradients in another order; the CPU's kernels differ more.
    expect_close(losses(name), tail, where == "gpu" ? 1e-3 : 2e-2, name);
  }
}

// Tensor parallelism over nccl (docs/tensor_parallel.md): tp 2 on two GPUs reproduces one GPU's
// fp32 losses, with and without sequence parallelism, and writes the checkpoint one GPU would
// (whole tensors); in bf16 it tracks one GPU's bf16 run.
TEST_F(TrainGpuMpi, TensorParallelOverNcclReproducesOneGpu) {
  NEED_GPUS(2);
  const int kSteps = 6;
  const std::string tp2 = "parallelism.tensor_parallel_size=2";
  CommandResult one = train(0, config("tp_one", kSteps), {"run.dtype=fp32"});
  ASSERT_EQ(one.exit_code, 0) << describe(one);
  const std::vector<double> want = losses("tp_one");
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
  for (const bool sp : {false, true}) {
    const std::string name = sp ? "tp2_sp" : "tp2";
    CommandResult r =
        train(2, config(name, kSteps),
              {"run.dtype=fp32", tp2,
               std::string("parallelism.sequence_parallel=") + (sp ? "true" : "false")});
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    EXPECT_NE(r.out.find("| cuda | 2 ranks (nccl)"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("): tp 2"), std::string::npos) << r.out;
    const std::vector<double> got = losses(name);
    expect_close(got, want, 1e-5, name);
    double worst = 0;
    for (size_t i = 0; i < got.size() && i < want.size(); ++i)
      worst = std::max(worst, std::abs(got[i] - want[i]) / std::abs(want[i]));
    std::printf("[%s fp32 over nccl] worst relative loss delta against one GPU: %.3g\n",
                name.c_str(), worst);
  }
  // The checkpoint holds whole tensors, put together from the two GPUs' shards: the one-GPU
  // run's names and shapes (TrainTpMpi resumes such checkpoints at other layouts on the CPU).
  auto a = tensor::load_safetensors(tmp_ / "tp_one/checkpoints/step_00000006/model.safetensors");
  auto b = tensor::load_safetensors(tmp_ / "tp2/checkpoints/step_00000006/model.safetensors");
  ASSERT_EQ(a.size(), b.size());
  for (auto& [name, t] : a) {
    ASSERT_TRUE(b.contains(name)) << name;
    EXPECT_EQ(t.shape(), b.at(name).shape()) << name;
  }
  // Written at tp 2 on GPUs after 3 steps, read back at tp 2 on GPUs: the one-GPU trajectory.
  const std::string resumed = config("tp2_resumed", kSteps);
  CommandResult first = train(2, resumed, {"run.dtype=fp32", tp2, "training.steps=3"});
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  CommandResult second = train(2, resumed, {"run.dtype=fp32", tp2});
  ASSERT_EQ(second.exit_code, 0) << describe(second);
  EXPECT_NE(second.out.find("resumed from"), std::string::npos) << second.out;
  expect_close(losses("tp2_resumed"), want, 1e-5, "tp2_resumed");

  // bf16: a tensor-parallel layer rounds each rank's partial sums (row-parallel outputs, the
  // vocab-parallel loss's per-row sums) to bf16 before adding them, where one GPU rounds the
  // whole sum once: a rounding more per value, of the size one GPU's bf16 run sees against two
  // data-parallel ranks adding gradients in another order (Bf16ZeroThree... above: 1e-3).
  CommandResult one16 = train(0, config("tp_one_bf16", kSteps), {"run.dtype=bf16"});
  ASSERT_EQ(one16.exit_code, 0) << describe(one16);
  const std::vector<double> want16 = losses("tp_one_bf16");
  CommandResult r16 = train(2, config("tp2_bf16", kSteps), {"run.dtype=bf16", tp2});
  ASSERT_EQ(r16.exit_code, 0) << describe(r16);
  const std::vector<double> got16 = losses("tp2_bf16");
  double worst = 0;
  for (size_t i = 0; i < got16.size() && i < want16.size(); ++i)
    worst = std::max(worst, std::abs(got16[i] - want16[i]) / std::abs(want16[i]));
  std::printf("[tp 2 bf16 over nccl] worst relative loss delta against one GPU's bf16: %.3g\n",
              worst);
  expect_close(got16, want16, 1e-3, "tp2_bf16");
}

// Backend mpi stages GPU tensors through the host, so ranks may share a GPU (NCCL's may not).
TEST_F(TrainGpuMpi, RanksShareOneGpuOverMpi) {
  NEED_GPUS(1);
  ::setenv("STRATA_CUDA_EMU_DEVICES", "1", 1);  // the emulator's GPUs; a real GPU ignores it
  CommandResult one = train(0, config("one", 4), {"run.dtype=fp32"});
  ASSERT_EQ(one.exit_code, 0) << describe(one);
  CommandResult two =
      train(2, config("two", 4),
            {"run.dtype=fp32", "distributed.backend=mpi", "zero_optimization.stage=2"});
  ::setenv("STRATA_CUDA_EMU_DEVICES", std::to_string(gpus_).c_str(), 1);
  ASSERT_EQ(two.exit_code, 0) << describe(two);
  EXPECT_NE(two.out.find("| cuda | 2 ranks (mpi)"), std::string::npos) << two.out;
  expect_close(losses("two"), losses("one"), 1e-5, "2 ranks on one GPU over mpi");
}

// `generate --device cuda` on a checkpoint that `train` wrote on the GPU (bf16): the model is
// built and loaded on the host, moved to the GPU, and samples there, in the run's bf16 by default
// (--dtype auto) and in f32 with --dtype fp32. Temperature 1 over the whole
// vocabulary, so each token is an inverse-CDF draw from the f32 probabilities: the GPU's text is
// the CPU's as long as no draw lands within the two devices' f32 difference (~1e-6) of a bucket's
// edge (f32 on both). The tiny model's text is bytes of every kind; it must be the prompt and 48
// new ones.
TEST_F(TrainGpuMpi, GenerateOnTheGpuDrawsTheCpusTokens) {
  NEED_GPUS(1);
  CommandResult t = train(0, config("gen", 12), {});
  ASSERT_EQ(t.exit_code, 0) << describe(t);
  std::string text[2];
  for (int d = 0; d < 2; ++d) {
    CommandResult g = testing::run_command(
        {kBin + "/generate", "--checkpoint", tmp_ / "gen", "--prompt", "The GPU",
         "--max-new-tokens", "48", "--temperature", "1.0", "--top-k", "0", "--seed", "3",
         "--device", d ? "cuda" : "cpu", "--dtype", d ? "fp32" : "auto"},
        std::chrono::seconds(120));
    ASSERT_EQ(g.exit_code, 0) << describe(g);
    EXPECT_NE(g.err.find(d ? "f32) on cuda:0" : "f32) on cpu"), std::string::npos) << g.err;
    text[d] = g.out;
  }
  EXPECT_EQ(text[0].rfind("The GPU", 0), 0u) << text[0];
  EXPECT_EQ(text[0].size(), std::string("The GPU").size() + 48 + 1) << text[0];  // + newline
  EXPECT_EQ(text[1], text[0]);
  // The default on the GPU: the run's bf16.
  CommandResult g = testing::run_command(
      {kBin + "/generate", "--checkpoint", tmp_ / "gen", "--prompt", "The GPU", "--max-new-tokens",
       "48", "--temperature", "1.0", "--top-k", "0", "--seed", "3", "--device", "cuda"},
      std::chrono::seconds(120));
  ASSERT_EQ(g.exit_code, 0) << describe(g);
  EXPECT_NE(g.err.find("bf16) on cuda:0"), std::string::npos) << g.err;
  EXPECT_EQ(g.out.rfind("The GPU", 0), 0u) << g.out;
  EXPECT_EQ(g.out.size(), text[0].size()) << g.out;
}

// `generate --device cuda` on an fp32 checkpoint trained with run.tf32: on samples with TF32
// GEMMs too (--tf32 auto, as `train`'s own samples do; Note [TF32] in tensor/cuda.h), --tf32 off
// turns them off, and --tf32 on where no f32 GEMM runs on the GPU is an error naming the fix.
TEST_F(TrainGpuMpi, GenerateFollowsTheRunsTf32) {
  NEED_GPUS(1);
  CommandResult t = train(0, config("tf32", 3), {"run.dtype=fp32", "run.tf32=on"});
  ASSERT_EQ(t.exit_code, 0) << describe(t);
  const auto generate = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = {kBin + "/generate",
                                     "--checkpoint",
                                     tmp_ / "tf32",
                                     "--prompt",
                                     "The GPU",
                                     "--max-new-tokens",
                                     "8",
                                     "--device",
                                     "cuda"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return testing::run_command(argv, std::chrono::seconds(120));
  };
  CommandResult g = generate({});
  ASSERT_EQ(g.exit_code, 0) << describe(g);
  EXPECT_NE(g.err.find("f32, TF32 GEMMs) on cuda:0"), std::string::npos) << g.err;
  EXPECT_EQ(g.out.rfind("The GPU", 0), 0u) << g.out;
  g = generate({"--tf32", "off"});
  ASSERT_EQ(g.exit_code, 0) << describe(g);
  EXPECT_NE(g.err.find("f32) on cuda:0"), std::string::npos) << g.err;
  EXPECT_EQ(g.err.find("TF32"), std::string::npos) << g.err;
  // bf16 sampling of the same run: TF32 touches no bf16 GEMM, so auto leaves it off and on is an
  // error.
  g = generate({"--dtype", "bf16"});
  ASSERT_EQ(g.exit_code, 0) << describe(g);
  EXPECT_NE(g.err.find("bf16) on cuda:0"), std::string::npos) << g.err;
  g = generate({"--dtype", "bf16", "--tf32", "on"});
  EXPECT_EQ(g.exit_code, 1) << describe(g);
  EXPECT_NE(g.err.find("--tf32 on: TF32 is the GPU tensor cores' format for fp32 GEMMs, but "
                       "sampling runs bf16 on cuda"),
            std::string::npos)
      << g.err;
  EXPECT_EQ(g.out, "");
}

TEST_F(TrainGpuMpi, NcclWithMoreRanksThanGpusIsAClearError) {
  NEED_GPUS(1);
  const int np = gpus_ + 1;
  CommandResult r = train(np, config("crowded", 2), {});
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.err.find("backend 'nccl' needs a GPU per rank"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find(fmt::format("started {} ranks on this node", np)), std::string::npos)
      << describe(r);
  EXPECT_NE(r.err.find("use backend mpi"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("crowded.yaml"), std::string::npos) << describe(r);
  EXPECT_FALSE(fs::exists(tmp_ / "crowded/checkpoints"));
}

}  // namespace
}  // namespace strata::tools
