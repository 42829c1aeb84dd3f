// models::move_flat_units on a machine without a GPU: moving to where the units are is the
// identity, and a move to a GPU that is not there fails clearly and leaves the units as they were.
// The move to a GPU itself is tested in tests/cuda/train_gpu_test.cpp.
#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "models/flat_params.h"
#include "models/gpt2/gpt2.h"
#include "tensor/cuda.h"

namespace strata::models {
namespace {

gpt2::GPT2Config tiny() {
  gpt2::GPT2Config c = gpt2::preset("gpt2-tiny");
  c.n_layer = 2;
  return c;
}

std::vector<float> values(const tensor::Tensor& t) {
  return tensor::to_float_vector(t);
}

TEST(MoveFlatUnits, ToTheCpuIsTheIdentity) {
  gpt2::GPT2 model(tiny(), 3);
  std::vector<FlatUnit>& units = model.flat_units();
  std::vector<const void*> params, grads;
  std::vector<std::vector<float>> before;
  for (const FlatUnit& u : units) {
    params.push_back(u.params.data_ptr());
    grads.push_back(u.grads.data_ptr());
    before.push_back(values(u.params));
  }
  move_flat_units(units, Device::cpu());
  for (size_t i = 0; i < units.size(); ++i) {
    EXPECT_EQ(units[i].params.data_ptr(), params[i]) << units[i].name;  // not even reallocated
    EXPECT_EQ(units[i].grads.data_ptr(), grads[i]) << units[i].name;
    EXPECT_EQ(values(units[i].params), before[i]) << units[i].name;
    // Every parameter is still a view into its unit's buffer.
    for (size_t k = 0; k < units[i].variables.size(); ++k)
      EXPECT_EQ(units[i].variables[k].data().storage(), units[i].params.storage());
  }
}

TEST(MoveFlatUnits, WithoutAGpuFailsClearlyAndKeepsTheUnits) {
  if (tensor::cuda_available()) GTEST_SKIP() << "a GPU is visible: the move would succeed";
  gpt2::GPT2 model(tiny(), 3);
  std::vector<FlatUnit>& units = model.flat_units();
  const std::vector<float> before = values(units.front().params);
  EXPECT_THROW(move_flat_units(units, Device::cuda(0)), UserError);
  for (const FlatUnit& u : units) {
    EXPECT_TRUE(u.params.device().is_cpu()) << u.name;
    EXPECT_TRUE(u.grads.device().is_cpu()) << u.name;
  }
  EXPECT_EQ(values(units.front().params), before);
  EXPECT_EQ(units.front().variables.front().data().storage(), units.front().params.storage());
}

}  // namespace
}  // namespace strata::models
