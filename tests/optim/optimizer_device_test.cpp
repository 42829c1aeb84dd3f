// Note [Optimizer devices] on the host: what can be checked without a GPU. The GPU side (state on
// the device, the fused AdamW step, mixed devices rejected, SGD refused) is in
// tests/cuda/train_gpu_steps_test.cpp.
#include <gtest/gtest.h>

#include "core/error.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "optim_test_util.h"
#include "tensor/ops.h"

namespace strata::optim {
namespace {

using testing::make_group;
using testing::random_floats;
using testing::to_vector;

TEST(OptimizerDevice, HostGroupsKeepTheirStateOnTheHost) {
  AdamW adamw({make_group(random_floats(64, 1), random_floats(64, 2))});
  EXPECT_TRUE(adamw.device().is_cpu());
  for (const NamedTensor& t : adamw.state_dict().tensors) EXPECT_TRUE(t.tensor.device().is_cpu());
  SgdConfig momentum;
  momentum.momentum = 0.9;
  Sgd sgd({make_group(random_floats(64, 1), random_floats(64, 2))}, momentum);
  EXPECT_TRUE(sgd.device().is_cpu());  // SGD is refused on a GPU only
}

// load_state_dict copies contiguous f32 state of the right shape from wherever it lives; a
// non-contiguous source is rejected before anything is copied.
TEST(OptimizerDevice, LoadStateCopiesValuesAndRejectsNonContiguousSources) {
  AdamW src({make_group(random_floats(64, 1), random_floats(64, 2))});
  src.step(1e-2);
  AdamW dst({make_group(random_floats(64, 1), random_floats(64, 2))});
  dst.load_state_dict(src.state_dict());
  EXPECT_EQ(to_vector(dst.exp_avg(0)), to_vector(src.exp_avg(0)));
  EXPECT_EQ(to_vector(dst.exp_avg_sq(0)), to_vector(src.exp_avg_sq(0)));
  EXPECT_EQ(dst.step_count(), 1);

  OptimizerState strided = src.state_dict();
  strided.tensors[0].tensor =
      tensor::Tensor::empty({64, 2}, DType::F32).select(1, 0);  // 64 elements, stride 2
  ASSERT_FALSE(strided.tensors[0].tensor.is_contiguous());
  AdamW fresh({make_group(random_floats(64, 1), random_floats(64, 2))});
  EXPECT_THROW(fresh.load_state_dict(strided), UserError);
  EXPECT_EQ(fresh.step_count(), 0);
}

}  // namespace
}  // namespace strata::optim
