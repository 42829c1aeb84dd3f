// The nccl backend on the emulated device (Note [Emulated NCCL] in nccl.cpp), run as
// `mpirun -np 2 nccl_emu_mpi_test`: each process is one rank with its own emulated GPU. The
// communicator's collectives give the values MPI's would, in chunks larger than the emulator's
// slot, and the engine on GPU memory over nccl reproduces, at every ZeRO stage, the losses of a
// one-process GPU run over the same global batch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "models/flat_params.h"
#include "comm/nccl_communicator.h"
#include "comm/self_communicator.h"
#include "comm/world.h"
#include "tensor/cuda.h"
#include "tensor/ops.h"
#include "tests/parallel/engine_test_util.h"
#include "tests/support/mpi_test_env.h"

namespace strata::parallel {
namespace {

using tensor::Tensor;
// Each rank takes the GPU of its local rank (run with STRATA_CUDA_EMU_DEVICES >= ranks): NCCL
// refuses two ranks on one GPU, and so does the emulator.
const Device kGpu = comm::launch_device(Device::cuda(0), comm::detect_launch());

std::shared_ptr<comm::Communicator> nccl_world() {
  static std::shared_ptr<comm::Communicator> w = comm::make_nccl_communicator(
      strata::testing::test_world(), kGpu, "nccl", std::chrono::seconds(120));
  return w;
}

std::vector<float> host_floats(const Tensor& t) {
  const Tensor h = t.to(Device::cpu()).to(DType::F32).contiguous();
  return {h.data<float>(), h.data<float>() + h.numel()};
}

// Element i of rank r's input: small integers, exact in bf16 and in any order of addition.
Tensor ramp(int64_t n, int rank, DType dt) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>((i + rank) % 50);
  return tensor::from_vector(v, {n}).to(dt).to(kGpu);
}

TEST(EmulatedNccl, CollectivesGiveTheExpectedValues) {
  auto w = nccl_world();
  const int n = w->size(), r = w->rank();
  ASSERT_EQ(w->backend(), "nccl");
  const int64_t big = 300'000;  // 1.2 MB of f32: more than one 1 MiB slot per rank
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor t = ramp(big, r, dt);
    w->allreduce(t)->wait();
    const std::vector<float> got = host_floats(t);
    for (int64_t i = 0; i < big; i += 997) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += static_cast<float>((i + q) % 50);
      ASSERT_EQ(got[static_cast<size_t>(i)], want) << "element " << i;
    }
  }
  {
    Tensor t = tensor::from_ints({r * 10, -r, 7}, {3}).to(kGpu);
    w->allreduce(t, comm::ReduceOp::Max)->wait();
    const Tensor h = t.to(Device::cpu());
    EXPECT_EQ(h.data<int64_t>()[0], (n - 1) * 10);
    EXPECT_EQ(h.data<int64_t>()[1], 0);
    EXPECT_EQ(h.data<int64_t>()[2], 7);
  }
  {
    Tensor in = ramp(big, r, DType::F32), out = tensor::zeros({big * n}, DType::F32, kGpu);
    w->allgather(in, out)->wait();
    const std::vector<float> got = host_floats(out);
    for (int q = 0; q < n; ++q)
      for (int64_t i = 0; i < big; i += 991)
        ASSERT_EQ(got[static_cast<size_t>(q * big + i)], static_cast<float>((i + q) % 50));
  }
  {
    Tensor in = ramp(big * n, r, DType::F32), out = tensor::zeros({big}, DType::F32, kGpu);
    w->reduce_scatter(in, out)->wait();
    const std::vector<float> got = host_floats(out);
    for (int64_t i = 0; i < big; i += 983) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += static_cast<float>((r * big + i + q) % 50);
      ASSERT_EQ(got[static_cast<size_t>(i)], want) << "element " << i;
    }
  }
  {
    Tensor t = ramp(big, r, DType::F32);
    w->broadcast(t, n - 1)->wait();
    const std::vector<float> got = host_floats(t);
    for (int64_t i = 0; i < big; i += 977)
      ASSERT_EQ(got[static_cast<size_t>(i)], static_cast<float>((i + n - 1) % 50));
  }
}

// The engine step on the GPU (as TrainGpu's): the batch copied in, the loss, backward, step.
double gpu_step(Engine& engine, models::CausalLM& model, const strata::testing::TrainSpec& s,
                int step) {
  const int dp = engine.dp().size(), r = engine.dp().rank();
  const int64_t G = s.micro * s.accum * dp;
  double sum = 0;
  for (int64_t m = 0; m < s.accum; ++m) {
    engine.begin_micro_batch(m == s.accum - 1);
    strata::testing::Batch b =
        strata::testing::make_batch(step * G + r * s.micro * s.accum + m * s.micro, s.micro);
    autograd::Variable loss = model.loss(b.ids.to(kGpu), b.targets.to(kGpu));
    sum += loss.item();
    engine.backward(autograd::scale(loss, 1.f / static_cast<float>(s.accum)));
  }
  engine.step(s.lr, s.max_norm);
  return engine.average(sum / static_cast<double>(s.accum));
}

std::vector<double> gpu_losses(const strata::testing::TrainSpec& s,
                               std::shared_ptr<comm::Communicator> dp, const ZeroConfig& z) {
  models::gpt2::GPT2 model(strata::testing::tiny_config(s), s.seed);
  models::move_flat_units(model.flat_units(), kGpu);
  Engine engine(model, std::move(dp), z, strata::testing::adamw_factory(), DType::F32);
  std::vector<double> losses;
  for (int step = 0; step < s.steps; ++step) losses.push_back(gpu_step(engine, model, s, step));
  return losses;
}

TEST(EmulatedNccl, EveryZeroStageOnTheGpuReproducesOneProcess) {
  auto w = nccl_world();
  strata::testing::TrainSpec s;
  s.steps = 6;
  s.lr = 1e-2;
  s.max_norm = 0.5;
  // One process with the whole global batch: dp micro-batches per step.
  strata::testing::TrainSpec one = s;
  one.accum = s.accum * w->size();
  const std::vector<double> expected =
      gpu_losses(one, std::make_shared<comm::SelfCommunicator>("one"), ZeroConfig{});
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << "stage " << stage);
    ZeroConfig z;
    z.stage = stage;
    z.reduce_bucket_size = 1000;
    z.allgather_bucket_size = 1000;
    z.stage3_param_persistence_threshold = 0;
    z.stage3_prefetch_bucket_size = 20000;
    const std::vector<double> actual = gpu_losses(s, w, z);
    ASSERT_EQ(actual.size(), expected.size());
    for (size_t i = 0; i < actual.size(); ++i)
      EXPECT_LE(std::fabs(actual[i] - expected[i]), 1e-5 * std::fabs(expected[i]))
          << "step " << i << ": " << actual[i] << " vs one process " << expected[i];
    EXPECT_LT(expected.back(), expected.front()) << "the reference did not train";
  }
}

// A rank that never joins: the others' op gives up after STRATA_CUDA_EMU_NCCL_TIMEOUT_S, and the
// communicator reports it as NCCL's asynchronous error (a UserError naming the communicator),
// after which it refuses new ops. Its own communicator, so the others stay usable.
TEST(EmulatedNccl, AMissingRankIsAnErrorNotAHang) {
  auto w = strata::testing::test_world();
  if (w->size() < 2) GTEST_SKIP() << "needs two ranks";
  ::setenv("STRATA_CUDA_EMU_NCCL_TIMEOUT_S", "2", 1);
  {
    auto c = comm::make_nccl_communicator(w, kGpu, "lonely", std::chrono::seconds(120));
    if (w->rank() == 0) {
      Tensor t = tensor::ones({1000}, DType::F32, kGpu);
      try {
        c->allreduce(t)->wait();
        ADD_FAILURE() << "the allreduce finished without rank 1";
      } catch (const UserError& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("'lonely' (nccl, rank 0 of"), std::string::npos) << m;
        EXPECT_NE(m.find("NCCL failed"), std::string::npos) << m;
      }
      EXPECT_THROW(c->allreduce(t), UserError);
    }
    w->barrier();
  }
  ::unsetenv("STRATA_CUDA_EMU_NCCL_TIMEOUT_S");
}

// Two ranks on one GPU: ncclCommInitRank fails on every rank with NCCL's own words, as real
// NCCL's does, instead of running. Its own ctest (EmulatedNccl.SharedGpu.np2) sets
// STRATA_TEST_SHARED_GPU=1 and one device, so every rank takes device 0.
TEST(EmulatedNccl, TwoRanksOnOneGpuAreRefused) {
  if (std::getenv("STRATA_TEST_SHARED_GPU") == nullptr)
    GTEST_SKIP() << "runs as EmulatedNccl.SharedGpu.np2 (STRATA_TEST_SHARED_GPU=1)";
  auto w = strata::testing::test_world();
  ASSERT_GE(w->size(), 2);
  try {
    comm::make_nccl_communicator(w, Device::cuda(0), "shared", std::chrono::seconds(120));
    ADD_FAILURE() << "two ranks on cuda:0 made a communicator";
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'shared' (nccl, rank"), std::string::npos) << m;
    EXPECT_NE(m.find("ncclCommInitRank failed"), std::string::npos) << m;
    EXPECT_NE(m.find("Duplicate GPU detected"), std::string::npos) << m;
  }
  w->barrier();  // no rank is left waiting inside NCCL
}

}  // namespace
}  // namespace strata::parallel
