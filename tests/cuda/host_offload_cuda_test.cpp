// ZeRO-Offload's optimizer side on the GPU (optim/host_offload.h): gradients copied to pinned host
// memory on a copy stream, the CPU AdamW, the parameters written back in the model's dtype. Note
// [Host offload] promises the fused GPU AdamW's bits, so the tests want equal bits. On the
// emulator's deferred streams (Note [Emulated streams]) a missing event between the compute
// stream and the copy stream leaves old bytes where new ones belong, so the ordering is tested
// too. GPU tests skip themselves without a device.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "offload/copy_stream.h"
#include "offload/memory_stats.h"
#include "optim/adamw.h"
#include "optim/host_offload.h"
#include "tensor/cuda.h"
#include "tensor/ops.h"
#include "tests/cuda/optim_cuda_test_util.h"

namespace strata::optim {
namespace {

using tensor::Tensor;
const Device kGpu = Device::cuda(0);

using cuda_test::rnd;
using cuda_test::same_bits;
constexpr uint64_t kSeed = 91;  // of rnd's draws

AdamWConfig config() {
  AdamWConfig c;
  c.lr = 1e-2;
  c.beta1 = 0.9;
  c.beta2 = 0.95;
  c.weight_decay = 0.1;
  return c;
}

std::unique_ptr<Optimizer> make_adamw(std::vector<ParamGroup> groups) {
  return std::make_unique<AdamW>(std::move(groups), config());
}

// Two slices of odd sizes, each with a decayed and a decay-free segment and a gap (padding).
const std::vector<int64_t> kSizes = {1003, 70001};
std::vector<Segment> segments_of(int64_t n) {
  return {{"w", 0, n / 2, true}, {"b", n / 2, n / 2 - 7, false}};
}

class HostOffloadGpu : public ::testing::TestWithParam<DType> {};

TEST_P(HostOffloadGpu, StepsGiveTheFusedGpuAdamWBits) {
  SKIP_WITHOUT_GPU();
  const DType dtype = GetParam();
  const bool mixed = dtype != DType::F32;
  std::vector<ParamGroup> ref_groups;
  std::vector<OffloadSlice> slices;
  std::vector<Tensor> ref_grads, off_grads, off_params;
  for (size_t i = 0; i < kSizes.size(); ++i) {
    const int64_t n = kSizes[i];
    const Tensor init = rnd(kSeed, n, 10 * i, -1.f, 1.f);
    ParamGroup g;
    g.param = init.to(kGpu);
    g.grad = tensor::zeros({n}, dtype, kGpu);
    if (mixed) g.low_precision_copy = init.to(dtype).to(kGpu);
    g.segments = segments_of(n);
    ref_grads.push_back(g.grad);
    ref_groups.push_back(std::move(g));

    OffloadSlice s;
    s.params = init.to(dtype).to(kGpu);
    s.grads = tensor::zeros({n}, dtype, kGpu);
    s.master = init.to(kGpu);
    s.segments = segments_of(n);
    off_grads.push_back(s.grads);
    off_params.push_back(s.params);
    slices.push_back(std::move(s));
  }
  AdamW ref(std::move(ref_groups), config());
  ASSERT_TRUE(ref.device().is_cuda());
  HostOffload off(std::move(slices), make_adamw);
  ASSERT_TRUE(off.optimizer().device().is_cpu());

  const float scales[] = {1.f, 0.5f, 1.f / 3.f};
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < kSizes.size(); ++i) {
      // Written on the compute stream: the copy stream must wait for it.
      const Tensor g = rnd(kSeed, kSizes[i], 100 + 10 * step + i, -2.f, 2.f).to(dtype);
      ref_grads[i].copy_(g);
      off_grads[i].copy_(g);
    }
    ref.set_grad_scale(scales[step]);
    ref.step(1e-2 * (step + 1));
    off.fetch_grads();
    off.step(1e-2 * (step + 1), scales[step]);
  }
  const OptimizerState ref_state = ref.state_dict();
  const OptimizerState off_state = off.optimizer().state_dict();
  ASSERT_EQ(ref_state.tensors.size(), off_state.tensors.size());
  for (size_t k = 0; k < ref_state.tensors.size(); ++k) {
    EXPECT_EQ(ref_state.tensors[k].name, off_state.tensors[k].name);
    EXPECT_TRUE(off_state.tensors[k].tensor.device().is_cpu());
    EXPECT_TRUE(same_bits(off_state.tensors[k].tensor, ref_state.tensors[k].tensor))
        << ref_state.tensors[k].name;
  }
  for (size_t i = 0; i < kSizes.size(); ++i) {
    const ParamGroup& r = ref.groups()[i];
    EXPECT_TRUE(same_bits(off.master(i), r.param)) << "master " << i;
    // What the next forward reads: the GPU step's model copy (its fp32 param when fp32).
    EXPECT_TRUE(same_bits(off_params[i], mixed ? r.low_precision_copy : r.param))
        << "device params " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, HostOffloadGpu,
                         ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// Note [Every byte is accounted]: the masters and moments (12 bytes per parameter) leave the GPU;
// the host holds the masters and the gradient and model-copy staging pinned, the moments pageable.
TEST(HostOffloadGpuMemory, OptimizerStatesAreChargedToTheHostTiers) {
  SKIP_WITHOUT_GPU();
  using offload::Category;
  using offload::Tier;
  const offload::MemoryStats& stats = offload::MemoryStats::global();
  auto now = [&](Tier t, Category c) { return stats.usage(t, c).current; };
  const int64_t n = 4096;
  const Tensor init = rnd(kSeed, n, 7, -1.f, 1.f);
  std::vector<OffloadSlice> slices(1);
  slices[0].params = init.to(DType::BF16).to(kGpu);
  slices[0].grads = tensor::zeros({n}, DType::BF16, kGpu);
  slices[0].master = init;  // on the host already
  slices[0].segments = segments_of(n);
  const int64_t gpu_opt = now(Tier::Gpu, Category::Optimizer);
  const int64_t pinned_opt = now(Tier::Pinned, Category::Optimizer);
  const int64_t pinned_grad = now(Tier::Pinned, Category::Grad);
  const int64_t pinned_param = now(Tier::Pinned, Category::Param);
  const int64_t host_opt = now(Tier::Host, Category::Optimizer);
  {
    HostOffload off(std::move(slices), make_adamw);
    EXPECT_EQ(now(Tier::Gpu, Category::Optimizer) - gpu_opt, 0);
    EXPECT_EQ(now(Tier::Pinned, Category::Optimizer) - pinned_opt, 4 * n);  // fp32 masters
    EXPECT_EQ(now(Tier::Host, Category::Optimizer) - host_opt, 8 * n);      // exp_avg, exp_avg_sq
    EXPECT_EQ(now(Tier::Pinned, Category::Grad) - pinned_grad, 2 * n);      // bf16 gradients
    EXPECT_EQ(now(Tier::Pinned, Category::Param) - pinned_param, 2 * n);    // bf16 model copy
  }
  EXPECT_EQ(now(Tier::Pinned, Category::Optimizer), pinned_opt);
  EXPECT_EQ(now(Tier::Host, Category::Optimizer), host_opt);
}

// Note [Copy stream]: a copy after wait_for(compute) sees what the compute stream wrote; an op
// enqueued on the compute stream after order_before(compute) sees what the copy brought.
TEST(CopyStreamGpu, EventsOrderCopiesAgainstTheComputeStream) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 1 << 16;
  Tensor dev = tensor::zeros({n}, DType::F32, kGpu);
  Tensor src = tensor::full({n}, 2.5, DType::F32, kGpu);
  dev.copy_(src);  // enqueued on the compute stream, not run yet on deferred streams
  offload::CopyStream copies(true);
  std::vector<float> host(n, 0.f);
  Tensor pinned = tensor::zeros({n}, DType::F32);
  copies.wait_for(tensor::cuda_current_stream());
  copies.to_host(pinned.data_ptr(), dev.data_ptr(), pinned.nbytes());
  copies.synchronize();
  for (int64_t i = 0; i < n; i += 997) ASSERT_EQ(pinned.data<float>()[i], 2.5f) << i;
  for (int64_t i = 0; i < n; ++i) pinned.data<float>()[i] = 4.f;
  copies.to_device(dev.data_ptr(), pinned.data_ptr(), pinned.nbytes());
  copies.order_before(tensor::cuda_current_stream());
  const Tensor doubled = tensor::add(dev, dev).to(Device::cpu());
  for (int64_t i = 0; i < n; i += 997) ASSERT_EQ(doubled.data<float>()[i], 8.f) << i;
}

}  // namespace
}  // namespace strata::optim
