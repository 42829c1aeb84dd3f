// HostOffload (optim/host_offload.h) with the CPU as the "device", as CPU-only runs of the same
// code use it: the step is the AdamW step of the same groups, bit for bit, and a delayed step
// (Note [Delayed parameter update]) reaches the parameters only when it is finished; with a
// parameter fence the write-back goes through it.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "optim/adamw.h"
#include "optim/host_offload.h"
#include "tensor/ops.h"

namespace strata::optim {
namespace {

using tensor::Tensor;

Tensor rnd(int64_t n, uint64_t stream, float lo, float hi) {
  return tensor::uniform({n}, {92, stream}, lo, hi);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

std::unique_ptr<Optimizer> make_adamw(std::vector<ParamGroup> groups) {
  AdamWConfig c;
  c.lr = 1e-2;
  c.weight_decay = 0.1;
  return std::make_unique<AdamW>(std::move(groups), c);
}

struct Pair {
  std::unique_ptr<Optimizer> ref;  // AdamW over the device groups themselves
  std::unique_ptr<HostOffload> off;
  Tensor ref_grad, off_grad, off_params;
};

Pair make_pair(int64_t n, DType dtype, const HostOffloadOptions& options = {}) {
  Pair p;
  const Tensor init = rnd(n, 1, -1.f, 1.f);
  ParamGroup g;
  g.param = init.clone();
  g.grad = tensor::zeros({n}, dtype);
  if (dtype != DType::F32) g.low_precision_copy = init.to(dtype);
  g.segments = {{"w", 0, n - 5, true}};
  p.ref_grad = g.grad;
  std::vector<ParamGroup> groups;
  groups.push_back(std::move(g));
  p.ref = make_adamw(std::move(groups));
  std::vector<OffloadSlice> slices(1);
  slices[0].params = dtype == DType::F32 ? init.clone() : init.to(dtype);
  slices[0].grads = tensor::zeros({n}, dtype);
  slices[0].master = init;
  slices[0].segments = {{"w", 0, n - 5, true}};
  p.off_grad = slices[0].grads;
  p.off_params = slices[0].params;
  p.off = std::make_unique<HostOffload>(std::move(slices), make_adamw, options);
  return p;
}

void set_grads(Pair& p, int64_t n, DType dtype, uint64_t seed) {
  const Tensor g = rnd(n, seed, -1.f, 1.f).to(dtype);
  p.ref_grad.copy_(g);
  p.off_grad.copy_(g);
}

TEST(HostOffload, StepIsTheAdamWStepOfTheSameGroups) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (bool pin : {true, false}) {
      const int64_t n = 50'003;
      Pair p = make_pair(n, dtype, {.pin_memory = pin});
      for (int step = 0; step < 3; ++step) {
        set_grads(p, n, dtype, 10 + step);
        p.ref->set_grad_scale(0.25f * (step + 1));
        p.ref->step(1e-2);
        p.off->fetch_grads();
        p.off->step(1e-2, 0.25f * (step + 1));
      }
      const ParamGroup& r = p.ref->groups()[0];
      EXPECT_TRUE(same_bits(p.off->master(0), r.param)) << dtype_name(dtype) << " pin " << pin;
      EXPECT_TRUE(same_bits(p.off_params, dtype == DType::F32 ? r.param : r.low_precision_copy))
          << dtype_name(dtype) << " pin " << pin;
      EXPECT_EQ(p.off->optimizer().step_count(), 3);
    }
  }
}

// Note [Delayed parameter update]: the parameters keep their old values while the step runs on
// its thread; finish() makes them those of the undelayed step.
TEST(HostOffload, DelayedStepReachesTheParametersWhenFinished) {
  const int64_t n = 20'001;
  Pair p = make_pair(n, DType::BF16);
  set_grads(p, n, DType::BF16, 3);
  const Tensor before = p.off_params.clone();
  p.ref->step(1e-2);
  p.off->fetch_grads();
  p.off->step_async(1e-2);
  EXPECT_TRUE(p.off->pending());
  // The device parameters are the caller's to read meanwhile: unchanged until finish().
  EXPECT_TRUE(same_bits(p.off_params, before));
  p.off->finish();
  EXPECT_FALSE(p.off->pending());
  EXPECT_TRUE(same_bits(p.off_params, p.ref->groups()[0].low_precision_copy));
  EXPECT_FALSE(same_bits(p.off_params, before));
  // A second delayed step is finished by the next fetch_grads, as a training step does.
  set_grads(p, n, DType::BF16, 4);
  p.ref->step(2e-2);
  p.off->fetch_grads();
  p.off->step_async(2e-2);
  p.off->fetch_grads();
  EXPECT_FALSE(p.off->pending());
  EXPECT_TRUE(same_bits(p.off->master(0), p.ref->groups()[0].param));
}

// Checkpoint loads fill the masters; params_from_masters rounds them into the model's dtype.
TEST(HostOffload, ParamsFromMastersRewritesTheDeviceParameters) {
  const int64_t n = 4'097;
  Pair p = make_pair(n, DType::F16);
  const Tensor loaded = rnd(n, 9, -2.f, 2.f);
  tensor::Tensor(p.off->master(0)).copy_(loaded);
  p.off->params_from_masters();
  EXPECT_TRUE(same_bits(p.off_params, loaded.to(DType::F16)));
}

// Note [Write-back through the group fence]: a fence that plays a parameter tier (loads the
// stored slice before, stores it and overwrites the "device" slice after) gets every update: the
// stored slice is the AdamW step's, and each write-back is one before/after pair.
TEST(HostOffload, WriteBackThroughTheFenceStoresTheUpdatedSliceWhileLoaded) {
  const int64_t n = 10'007;
  for (DType dtype : {DType::F32, DType::BF16}) {
    Pair p = make_pair(n, dtype);
    Tensor stored = p.off_params.clone();
    const Tensor garbage = rnd(n, 77, 5.f, 6.f).to(dtype);
    std::vector<std::pair<size_t, bool>> calls;
    p.off->set_param_fence([&](size_t g, bool before) {
      calls.emplace_back(g, before);
      if (before) {
        p.off_params.copy_(stored);
      } else {
        stored.copy_(p.off_params);
        p.off_params.copy_(garbage);  // released: whatever the memory holds next
      }
    });
    for (int step = 0; step < 2; ++step) {
      set_grads(p, n, dtype, 20 + step);
      p.ref->step(1e-2);
      p.off->fetch_grads();
      p.off->step(1e-2);
    }
    const ParamGroup& r = p.ref->groups()[0];
    EXPECT_TRUE(same_bits(stored, dtype == DType::F32 ? r.param : r.low_precision_copy))
        << dtype_name(dtype);
    const std::vector<std::pair<size_t, bool>> want = {
        {0, true}, {0, false}, {0, true}, {0, false}};
    EXPECT_EQ(calls, want) << dtype_name(dtype);
  }
}

}  // namespace
}  // namespace strata::optim
