// Every op on operands with a zero-sized dimension (no rows, no columns, an empty batch or
// sequence, an empty contraction): the CUDA backend must do what the CPU backend does, giving
// the same (empty or zero-filled) outputs, or raising the same kind of error, and never launch a
// kernel with a zero grid dimension (an invalid launch configuration, an internal error on the
// device and on the emulator alike). A data loader's last partial batch, a prompt of length 0 or
// a fully masked batch reach these shapes. Skips itself without a GPU (CTest label `cuda`).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "tensor/cuda.h"
#include "tensor/ops.h"
#include "tests/support/op_table.h"

namespace strata::tensor {
namespace {

const Device kGpu = Device::cuda(0);

using strata::testing::DeviceSample;
using strata::testing::OpInfo;

// What one run gave: its outputs, or the kind of error it raised.
struct Outcome {
  std::vector<Tensor> outputs;
  std::string error;  // "" | "UserError" | "InternalError" | "other: <what>"
  std::string message;
};

Outcome run_case(const DeviceSample& c, Device d) {
  Outcome o;
  try {
    o.outputs = c.run(d);
  } catch (const UserError& e) {
    o.error = "UserError", o.message = e.what();
  } catch (const InternalError& e) {
    o.error = "InternalError", o.message = e.what();  // an op's own shape checks (STRATA_CHECK)
  } catch (const std::exception& e) {
    o.error = std::string("other: ") + e.what();
  }
  return o;
}

// The values of t as f32 bit patterns (NaN payloads compared as bits: the mean of no elements is
// a NaN on both devices).
std::vector<uint32_t> bits(const Tensor& t) {
  const Tensor h = t.to(Device::cpu()).to(DType::F32).contiguous();
  std::vector<uint32_t> out(static_cast<size_t>(h.numel()));
  if (!out.empty()) std::memcpy(out.data(), h.data<float>(), out.size() * 4);
  for (uint32_t& b : out)
    if ((b & 0x7f800000u) == 0x7f800000u && (b & 0x007fffffu) != 0) b = 0x7fc00000u;  // any NaN
  return out;
}

// The empty-shape samples of the op table (tests/support/op_table.h), one test per entry, e.g.
// OpTable/CudaEmptyShapes.EveryOpDoesWhatTheCpuDoes/norms.
class CudaEmptyShapes : public ::testing::TestWithParam<OpInfo> {};

TEST_P(CudaEmptyShapes, EveryOpDoesWhatTheCpuDoes) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible";
  for (DType dt : {DType::F32, DType::BF16}) {
    if (!GetParam().supports(dt)) continue;
    for (const DeviceSample& c : GetParam().empty(dt)) {
      SCOPED_TRACE(c.name + " " + std::string(dtype_name(dt)));
      const Outcome want = run_case(c, Device::cpu());
      const Outcome got = run_case(c, kGpu);
      // The CPU's errors are the ops' own checks; anything else is a defect there.
      EXPECT_EQ(want.error.find("other"), std::string::npos) << want.error;
      ASSERT_EQ(got.error, want.error) << "cpu: " << want.message << "\ncuda: " << got.message;
      ASSERT_EQ(got.outputs.size(), want.outputs.size());
      for (size_t i = 0; i < want.outputs.size(); ++i) {
        SCOPED_TRACE("output " + std::to_string(i));
        EXPECT_EQ(got.outputs[i].shape(), want.outputs[i].shape());
        EXPECT_EQ(got.outputs[i].dtype(), want.outputs[i].dtype());
        if (got.outputs[i].device() != Device::cpu()) {
          EXPECT_EQ(got.outputs[i].device(), kGpu);
        }
        EXPECT_EQ(bits(got.outputs[i]), bits(want.outputs[i]));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(OpTable, CudaEmptyShapes,
                         ::testing::ValuesIn(strata::testing::op_entries([](const OpInfo& e) {
                           return static_cast<bool>(e.empty);
                         })),
                         [](const ::testing::TestParamInfo<OpInfo>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace strata::tensor
