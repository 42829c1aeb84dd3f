// The CUDA op profiler (Note [CUDA op profiler] in tensor/cuda/profiler.cpp): what it counts per
// op (calls, FLOPs, bytes, a device time), nesting, the attention path in the name, and a whole
// GPU training step covered op by op. The times themselves are only checked for sanity: on the
// emulator they are the emulator's. Every test skips itself without a GPU.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "autograd/functions.h"
#include "core/error.h"
#include "core/timer.h"
#include "models/flat_params.h"
#include "models/gpt2/gpt2.h"
#include "offload/memory_stats.h"
#include "parallel/engine.h"
#include "comm/self_communicator.h"
#include "tensor/backend.h"
#include "tensor/cuda.h"
#include "tests/parallel/engine_test_util.h"
#include "runtime/device_peaks.h"

namespace strata {
namespace {

using tensor::Tensor;
const Device kGpu = Device::cuda(0);

#define SKIP_WITHOUT_GPU() \
  if (!tensor::cuda_available()) GTEST_SKIP() << "no CUDA device visible"

std::map<std::string, tensor::CudaOpTime> by_name(const std::vector<tensor::CudaOpTime>& rows) {
  std::map<std::string, tensor::CudaOpTime> m;
  for (const auto& r : rows) {
    EXPECT_TRUE(m.emplace(r.op, r).second) << "two rows for " << r.op;
    EXPECT_GE(r.calls, 1) << r.op;
    EXPECT_GE(r.ms, 0.0) << r.op;
  }
  return m;
}

Tensor gpu_uniform(const tensor::Shape& s, uint64_t stream, DType dt = DType::F32) {
  return tensor::uniform(s, {5, stream}, -1.f, 1.f).to(dt).to(kGpu);
}

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Note [Fused cross-entropy gradient]: in a LossGradientScope the consuming loss runs one fused
// kernel when its logits want a gradient, and the plain forward under NoGradGuard (the kernel
// that ran is the evidence: the logits are gone once the call returns).
TEST(CudaProfiler, TheLossIsFusedOnlyWhenAGradientIsWanted) {
  SKIP_WITHOUT_GPU();
  const Tensor targets = tensor::from_ints({1, 4, 0, 9}, {4}).to(kGpu);
  for (bool grad : {true, false}) {
    SCOPED_TRACE(grad ? "grad" : "no grad");
    const autograd::LossGradientScope scope(1.f);
    std::optional<autograd::NoGradGuard> no_grad;
    if (!grad) no_grad.emplace();
    autograd::Variable logits(gpu_uniform({4, 10}, 40), true);
    tensor::cuda_profile_start();
    autograd::Variable loss = autograd::cross_entropy_consuming(std::move(logits), targets);
    (void)loss.data().to(Device::cpu());
    const auto rows = by_name(tensor::cuda_profile_stop());
    EXPECT_EQ(rows.count("cross_entropy_fused"), grad ? 1u : 0u);
    EXPECT_EQ(rows.count("cross_entropy_forward"), grad ? 0u : 1u);
    EXPECT_EQ(loss.requires_grad(), grad);
  }
}

// Note [Replayed forwards]: mlp_gelu's first GEMM writes the GELU input (pre) for backward only
// when a graph is built now or later. Without one the GEMM runs GELU_BIAS and writes h alone: the
// profile's linear_forward bytes and the device's activation peak both drop by pre's bytes, and
// the output is the same up to the epilogue's choice of algorithm (the emulator's is the same).
TEST(CudaProfiler, TheMlpWritesItsGeluInputOnlyForAGraph) {
  SKIP_WITHOUT_GPU();
  const int64_t N = 64, C = 32;
  const DType dt = DType::BF16;
  auto param = [&](const tensor::Shape& s, uint64_t stream) {
    return autograd::Variable(gpu_uniform(s, stream, dt), true);
  };
  const autograd::Variable x = param({N, C}, 50), w1 = param({4 * C, C}, 51),
                           b1 = param({4 * C}, 52), w2 = param({C, 4 * C}, 53), b2 = param({C}, 54);
  auto& stats = offload::MemoryStats::global();
  struct Call {
    Tensor y;
    double linear_bytes = 0;
    int64_t peak = 0;
  };
  auto call = [&](bool grad) {
    std::optional<autograd::NoGradGuard> no_grad;
    if (!grad) no_grad.emplace();
    const int64_t before = stats.usage(offload::Tier::Gpu, offload::Category::Activation).current;
    stats.reset_peaks();
    tensor::cuda_profile_start();
    Call c;
    c.y = autograd::mlp_gelu(x, w1, b1, w2, b2).data().to(Device::cpu());
    c.linear_bytes = by_name(tensor::cuda_profile_stop()).at("linear_forward").bytes;
    c.peak = stats.usage(offload::Tier::Gpu, offload::Category::Activation).peak - before;
    return c;
  };
  const Call with_grad = call(true), without = call(false);
  const int64_t pre_bytes = N * 4 * C * static_cast<int64_t>(dtype_size(dt));
  EXPECT_DOUBLE_EQ(with_grad.linear_bytes - without.linear_bytes, static_cast<double>(pre_bytes));
  EXPECT_EQ(with_grad.peak - without.peak, pre_bytes)
      << with_grad.peak << " bytes with grad, " << without.peak << " without";
  EXPECT_LT(tensor::max_abs_diff(with_grad.y.to(DType::F32), without.y.to(DType::F32)), 2e-2);
}

TEST(CudaProfiler, CountsEachOpWithItsFlopsAndBytes) {
  SKIP_WITHOUT_GPU();
  const int64_t m = 48, k = 32, n = 40;
  Tensor a = gpu_uniform({m, k}, 1), b = gpu_uniform({k, n}, 2);
  Tensor out = Tensor::empty({m, n}, DType::F32, kGpu), y = Tensor::empty({m, k}, DType::F32, kGpu);
  tensor::Backend& be = tensor::backend_for(kGpu);
  tensor::cuda_profile_start();
  be.matmul(a, b, out, false, false, 1.f, 0.f);
  be.matmul(a, b, out, false, false, 1.f, 0.f);
  be.affine(a, 2.f, 1.f, y);
  const auto rows = by_name(tensor::cuda_profile_stop());
  ASSERT_EQ(rows.size(), 2u);
  const tensor::CudaOpTime& mm = rows.at("matmul");
  EXPECT_EQ(mm.calls, 2);
  EXPECT_DOUBLE_EQ(mm.flops, 2.0 * 2.0 * m * n * k);
  EXPECT_DOUBLE_EQ(mm.bytes, 2.0 * 4.0 * (m * k + k * n + m * n));
  const tensor::CudaOpTime& af = rows.at("affine");
  EXPECT_EQ(af.calls, 1);
  EXPECT_EQ(af.flops, 0.0);
  EXPECT_DOUBLE_EQ(af.bytes, 2.0 * 4.0 * m * k);
  // A stop clears the totals: the next start-stop with nothing between has no rows.
  tensor::cuda_profile_start();
  EXPECT_TRUE(tensor::cuda_profile_stop().empty());
}

TEST(CudaProfiler, NothingIsRecordedWhileOff) {
  SKIP_WITHOUT_GPU();
  Tensor a = gpu_uniform({64}, 3), y = Tensor::empty({64}, DType::F32, kGpu);
  tensor::Backend& be = tensor::backend_for(kGpu);
  be.affine(a, 2.f, 1.f, y);  // before any start
  tensor::cuda_profile_start();
  tensor::cuda_profile_stop();
  be.affine(a, 2.f, 1.f, y);  // after the stop
  tensor::cuda_profile_start();
  EXPECT_TRUE(tensor::cuda_profile_stop().empty());
}

// linear's fallback (STRATA_LINEAR_EPILOGUE=off) runs its GEMM through the backend's matmul:
// timed once, as linear_forward, with the linear's FLOPs.
TEST(CudaProfiler, AnOpInsideAnotherCountsAsTheOuterOne) {
  SKIP_WITHOUT_GPU();
  ScopedEnv off("STRATA_LINEAR_EPILOGUE", "off");
  const int64_t m = 16, k = 24, n = 32;
  Tensor x = gpu_uniform({m, k}, 4), w = gpu_uniform({n, k}, 5), bias = gpu_uniform({n}, 6);
  Tensor y = Tensor::empty({m, n}, DType::F32, kGpu), pre;
  tensor::cuda_profile_start();
  tensor::backend_for(kGpu).linear_forward(x, w, bias, tensor::Activation::Gelu, y, pre);
  const auto rows = by_name(tensor::cuda_profile_stop());
  ASSERT_EQ(rows.size(), 1u) << "the inner matmul has a row of its own";
  EXPECT_EQ(rows.at("linear_forward").calls, 1);
  EXPECT_DOUBLE_EQ(rows.at("linear_forward").flops, 2.0 * m * n * k);
}

// The attention rows name the path that ran; FLOPs count the causal half (with the diagonal).
TEST(CudaProfiler, AttentionNamesItsPathAndCountsTheCausalPairs) {
  SKIP_WITHOUT_GPU();
  ScopedEnv simt("STRATA_ATTENTION", "simt");
  const int64_t B = 1, H = 2, T = 24, D = 16;
  Tensor q = gpu_uniform({B, H, T, D}, 7), k = gpu_uniform({B, H, T, D}, 8),
         v = gpu_uniform({B, H, T, D}, 9), dout = gpu_uniform({B, H, T, D}, 10);
  Tensor out = Tensor::empty(q.shape(), DType::F32, kGpu),
         lse = Tensor::empty({B, H, T}, DType::F32, kGpu);
  Tensor dq = Tensor::empty(q.shape(), DType::F32, kGpu),
         dk = Tensor::empty(q.shape(), DType::F32, kGpu),
         dv = Tensor::empty(q.shape(), DType::F32, kGpu);
  tensor::Backend& be = tensor::backend_for(kGpu);
  tensor::cuda_profile_start();
  be.attention_forward(q, k, v, true, 0.25f, out, lse);
  be.attention_backward(q, k, v, out, lse, dout, true, 0.25f, dq, dk, dv);
  const auto rows = by_name(tensor::cuda_profile_stop());
  const double pairs = T * (T + 1) / 2.0;
  ASSERT_TRUE(rows.count("attention_forward[own]")) << rows.begin()->first;
  ASSERT_TRUE(rows.count("attention_backward[own]"));
  EXPECT_DOUBLE_EQ(rows.at("attention_forward[own]").flops, B * H * pairs * 2.0 * D * 2.0);
  EXPECT_DOUBLE_EQ(rows.at("attention_backward[own]").flops, B * H * pairs * 2.0 * D * 5.0);
}

// A GPU training step (Engine::train_step: bf16, fused AdamW, gradient clipping) under the
// profiler: the model's ops, the optimizer and the gradient norm each have a row; the ops' device
// time fits in the step's wall time.
TEST(CudaProfiler, ATrainingStepIsCoveredOpByOp) {
  SKIP_WITHOUT_GPU();
  testing::TrainSpec s;
  s.max_norm = 1.0;
  auto model = std::make_unique<models::gpt2::GPT2>(testing::tiny_config(s), s.seed);
  models::move_flat_units(model->flat_units(), kGpu);
  parallel::Engine engine(*model, std::make_shared<comm::SelfCommunicator>("dp"), {},
                          testing::adamw_factory(), DType::BF16);
  auto step = [&](int i) {
    parallel::TrainStepInputs in;
    in.batch = [&](int64_t) {
      testing::Batch b = testing::make_batch(i * s.micro, s.micro);
      return parallel::MicroBatch{b.ids.to(kGpu), b.targets.to(kGpu)};
    };
    in.lr = s.lr;
    in.max_norm = s.max_norm;
    engine.train_step(in);  // Note [Train step]
  };
  step(0);  // plans and heuristics outside the profiled step
  tensor::cuda_profile_start();
  Stopwatch watch;
  step(1);
  model->flat_units().front().params.narrow(0, 0, 1).to(Device::cpu());  // waits for the step
  const double wall_ms = watch.seconds() * 1e3;
  const auto rows = by_name(tensor::cuda_profile_stop());
  // The loss's forward and backward are one kernel: the step knows the loss's gradient (Note
  // [Fused cross-entropy gradient]).
  for (const char* op : {"adamw", "sum_squares", "linear_forward", "linear_backward_weight",
                         "cross_entropy_fused", "embedding_forward", "embedding_backward",
                         "add_layernorm_forward", "add_layernorm_backward"})
    EXPECT_TRUE(rows.count(op)) << op << " has no row";
  EXPECT_EQ(rows.at("adamw").calls, 1);
  EXPECT_GT(rows.at("adamw").bytes, 0.0);
  EXPECT_EQ(rows.count("cross_entropy_backward"), 0u);
  int attention = 0;
  double total_ms = 0;
  for (const auto& [op, r] : rows) {
    if (op.rfind("attention_forward[", 0) == 0) attention += static_cast<int>(r.calls);
    total_ms += r.ms;
  }
  EXPECT_EQ(attention, s.n_layer);
  EXPECT_LE(total_ms, wall_ms * 1.01 + 0.1);
}

// Note [GPU peaks]: what the driver says of the device (on the emulator, an H100 SXM's numbers),
// enough for a peak on the architectures Strata targets; an index that is not visible is a
// UserError naming the visible ones.
TEST(CudaDeviceFacts, TheDeviceGivesItsPeaksAndAMissingIndexIsNamed) {
  SKIP_WITHOUT_GPU();
  const tensor::CudaDeviceFacts f = tensor::cuda_device_facts(0);
  EXPECT_FALSE(f.name.empty());
  EXPECT_GE(f.major, 8) << f.name;
  EXPECT_GT(f.sms, 0) << f.name;
  EXPECT_GT(f.clock_khz, 0) << f.name;
  EXPECT_GT(f.memory_clock_khz, 0) << f.name;
  EXPECT_GT(f.bus_width_bits, 0) << f.name;
  EXPECT_GT(f.total_bytes, 0) << f.name;
  const runtime::DevicePeaks p = runtime::device_peaks(f);
  EXPECT_GT(p.tensor_tflops, p.fp32_tflops) << p.source;
  EXPECT_GT(p.fp32_tflops, 0.0) << p.source;
  EXPECT_GT(p.memory_gbps, 100.0) << p.source;
  const int n = tensor::cuda_device_count();
  try {
    tensor::cuda_device_facts(n);
    ADD_FAILURE() << "device " << n << " of " << n << " gave facts";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("only {} CUDA device(s) are visible", n)),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace strata
