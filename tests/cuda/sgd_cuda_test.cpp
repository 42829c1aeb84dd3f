// optim::Sgd on GPU groups (the multi-tensor kernel of Note [CUDA SGD], optim/cuda/sgd_cuda.h)
// against the same optimizer on CPU groups holding the same values: the kernel promises the CPU
// loop's IEEE operations in its order, so the tests want equal bits, not closeness. GPU tests
// skip themselves without a device.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "optim/sgd.h"
#include "tensor/cuda.h"
#include "tensor/ops.h"
#include "tests/optim/optim_test_util.h"

namespace strata::optim {
namespace {

using tensor::Tensor;
const Device kGpu = Device::cuda(0);

#define SKIP_WITHOUT_GPU() \
  if (!tensor::cuda_available()) GTEST_SKIP() << "no CUDA device visible"

std::vector<uint8_t> host_bytes(const Tensor& t) {
  const Tensor h = t.to(Device::cpu()).contiguous();
  std::vector<uint8_t> out(h.nbytes());
  if (!out.empty()) std::memcpy(out.data(), h.data_ptr(), out.size());
  return out;
}

// A GPU copy of `t`; shifted: one element into its allocation, so not 16-byte aligned (as a
// ZeRO partition of a flat buffer may be) and the kernel takes its one-element path.
Tensor on_gpu(const Tensor& t, bool shifted) {
  if (!shifted) return t.to(kGpu);
  Tensor g = tensor::concat({t.narrow(0, 0, 1), t}, 0).to(kGpu).narrow(0, 1, t.numel());
  EXPECT_NE(reinterpret_cast<uintptr_t>(g.data_ptr()) % 16, 0u);
  return g;
}

struct GroupSpec {
  int64_t n;
  DType grad_dtype;
  DType copy_dtype;  // F32: no model copy
  bool shifted;
  int segments;  // alternating decay / no decay, with a gap before the last one
};

// The groups of one test, on the CPU and (same values) on the GPU.
struct Groups {
  std::vector<ParamGroup> cpu, gpu;
};

Groups make_groups(const std::vector<GroupSpec>& specs) {
  Groups out;
  uint32_t seed = 11;
  for (const GroupSpec& s : specs) {
    ParamGroup c;
    c.param = testing::make_tensor(testing::random_floats(s.n, seed++));
    c.grad = testing::make_tensor(testing::random_floats(s.n, seed++)).to(s.grad_dtype);
    if (s.copy_dtype != DType::F32) c.low_precision_copy = tensor::zeros({s.n}, s.copy_dtype);
    const int64_t len = s.n / (s.segments + 1);
    for (int k = 0; k < s.segments; ++k) {
      const int64_t at = k * len + (k + 1 == s.segments ? len / 2 : 0);  // a gap: no segment
      c.segments.push_back(
          {fmt::format("s{}", k), at, k + 1 == s.segments ? s.n - at : len, k % 2 == 0});
    }
    ParamGroup g = c;
    g.param = on_gpu(c.param, s.shifted);
    g.grad = on_gpu(c.grad, s.shifted);
    if (c.low_precision_copy.defined())
      g.low_precision_copy = on_gpu(c.low_precision_copy, s.shifted);
    out.cpu.push_back(c);
    out.gpu.push_back(g);
  }
  return out;
}

// New gradients for both sides (momentum then sees gradients that change between steps).
void new_gradients(Groups& gs, uint32_t seed) {
  for (size_t i = 0; i < gs.cpu.size(); ++i) {
    const Tensor fresh =
        testing::make_tensor(
            testing::random_floats(gs.cpu[i].grad.numel(), seed + static_cast<uint32_t>(i)))
            .to(gs.cpu[i].grad.dtype());
    Tensor(gs.cpu[i].grad).copy_(fresh);
    Tensor(gs.gpu[i].grad).copy_(fresh.to(kGpu));
  }
}

void expect_same(const Sgd& cpu, const Sgd& gpu, const std::string& what) {
  ASSERT_EQ(cpu.groups().size(), gpu.groups().size());
  for (size_t i = 0; i < cpu.groups().size(); ++i) {
    EXPECT_EQ(host_bytes(cpu.groups()[i].param), host_bytes(gpu.groups()[i].param))
        << what << ": param of group " << i;
    if (cpu.groups()[i].low_precision_copy.defined()) {
      EXPECT_EQ(host_bytes(cpu.groups()[i].low_precision_copy),
                host_bytes(gpu.groups()[i].low_precision_copy))
          << what << ": model copy of group " << i;
    }
    const Tensor cb = cpu.momentum_buffer(i), gb = gpu.momentum_buffer(i);
    ASSERT_EQ(cb.defined(), gb.defined());
    if (cb.defined()) {
      EXPECT_TRUE(gb.device().is_cuda());
      EXPECT_EQ(host_bytes(cb), host_bytes(gb)) << what << ": momentum buffer of group " << i;
    }
  }
}

// Forty-odd runs (two launches of at most 32 buffers), F32/BF16/F16 gradients, BF16/F16 model
// copies, element counts that are no multiple of 4 (the packed path's tail) and unaligned
// buffers (the one-element path).
const std::vector<GroupSpec> kGroups = {
    {4099, DType::F32, DType::F32, false, 37},
    {1000, DType::BF16, DType::BF16, false, 3},
    {517, DType::F16, DType::F16, true, 4},
    {66, DType::BF16, DType::F32, true, 1},
};

struct Case {
  const char* name;
  SgdConfig config;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

class SgdCuda : public ::testing::TestWithParam<Case> {};

TEST_P(SgdCuda, GpuGroupsGiveTheCpuBits) {
  SKIP_WITHOUT_GPU();
  Groups gs = make_groups(kGroups);
  Sgd cpu(gs.cpu, GetParam().config), gpu(gs.gpu, GetParam().config);
  ASSERT_TRUE(gpu.device().is_cuda());
  const double lrs[] = {1e-2, 5e-3, 2e-2};
  const float scales[] = {0.5f, 1.f, 0.25f};
  for (int step = 0; step < 3; ++step) {
    if (step > 0) new_gradients(gs, 100 + 10 * static_cast<uint32_t>(step));
    cpu.set_grad_scale(scales[step]);
    gpu.set_grad_scale(scales[step]);
    cpu.step(lrs[step]);
    gpu.step(lrs[step]);
    expect_same(cpu, gpu, fmt::format("step {}", step + 1));
  }
  // Resume across devices: the GPU's state read on the host and loaded into a fresh CPU
  // optimizer over the GPU's values continues with the GPU's bits (the first-step rule
  // included: the step count comes with the state).
  Groups again = make_groups(kGroups);
  for (size_t i = 0; i < again.cpu.size(); ++i) {
    Tensor(again.cpu[i].param).copy_(gs.gpu[i].param.to(Device::cpu()));
    Tensor(again.cpu[i].grad).copy_(gs.cpu[i].grad);
  }
  Sgd resumed(again.cpu, GetParam().config);
  OptimizerState st = gpu.state_dict();
  for (NamedTensor& t : st.tensors) t.tensor = t.tensor.to(Device::cpu());
  resumed.load_state_dict(st);
  gpu.step(3e-3);
  resumed.step(3e-3);
  expect_same(resumed, gpu, "resumed step");
}

SgdConfig config(double momentum, double dampening, double weight_decay, bool nesterov) {
  SgdConfig c;
  c.momentum = momentum;
  c.dampening = dampening;
  c.weight_decay = weight_decay;
  c.nesterov = nesterov;
  return c;
}

INSTANTIATE_TEST_SUITE_P(Configs, SgdCuda,
                         ::testing::Values(Case{"Plain", config(0.0, 0.0, 0.0, false)},
                                           Case{"PlainDecay", config(0.0, 0.0, 0.05, false)},
                                           Case{"Momentum", config(0.9, 0.0, 0.0, false)},
                                           Case{"MomentumDampeningDecay",
                                                config(0.9, 0.25, 0.01, false)},
                                           Case{"Nesterov", config(0.8, 0.0, 0.1, true)}),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
}  // namespace strata::optim
