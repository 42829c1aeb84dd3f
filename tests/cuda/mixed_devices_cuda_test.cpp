// Every op that takes more than one tensor, with one of them on the other device: a UserError
// naming the op and both devices, before any kernel runs. Without the check a CUDA kernel is
// handed a host pointer (an illegal address on the GPU, which poisons the CUDA context for the
// rest of the process) or the CPU backend reads a device pointer (a segfault). A model written
// in C++ that forgets one .to(device) reaches this. On the emulator device pointers are host
// pointers, so a missing check shows as an op that runs instead of an error. Skips itself
// without a GPU (CTest label `cuda`).
#include <gtest/gtest.h>

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
const Device kCpu = Device::cpu();

using strata::testing::MixedSample;
using strata::testing::OpInfo;

// The mixed-device samples of the op table (tests/support/op_table.h), one test per entry, e.g.
// OpTable/CudaMixedDevices.EveryOpNamesTheOperandOnTheOtherDevice/norms.
class CudaMixedDevices : public ::testing::TestWithParam<OpInfo> {};

TEST_P(CudaMixedDevices, EveryOpNamesTheOperandOnTheOtherDevice) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible";
  for (const MixedSample& c : GetParam().mixed) {
    SCOPED_TRACE(c.name);
    // All operands on one device: the op runs (so an error below is the device check's).
    for (Device d : {kCpu, kGpu}) {
      std::vector<Tensor> t = c.make(d);
      ASSERT_NO_THROW(c.run(t)) << d.str();
    }
    const size_t n = c.make(kCpu).size();
    for (size_t i = 0; i < n; ++i)
      for (Device home : {kCpu, kGpu}) {
        const Device other = home.is_cpu() ? kGpu : kCpu;
        const std::string where = c.name + ": operand " + std::to_string(i) + " on " + other.str() +
                                  ", the rest on " + home.str();
        std::vector<Tensor> t = c.make(home);
        t[i] = t[i].to(other);
        try {
          c.run(t);
          ADD_FAILURE() << where << ": ran";
        } catch (const UserError& e) {
          const std::string what = e.what();
          EXPECT_NE(what.find("different devices"), std::string::npos) << where << ": " << what;
        } catch (const std::exception& e) {
          ADD_FAILURE() << where << ": not a UserError: " << e.what();
        }
      }
  }
}

INSTANTIATE_TEST_SUITE_P(OpTable, CudaMixedDevices,
                         ::testing::ValuesIn(strata::testing::op_entries([](const OpInfo& e) {
                           return !e.mixed.empty();
                         })),
                         [](const ::testing::TestParamInfo<OpInfo>& info) {
                           return info.param.name;
                         });

// The one op that takes tensors on several devices: each one's squares are summed where it is
// (a ZeRO-Offload step holds some gradients on the host, some on the GPU).
TEST(CudaMixedDevices, GlobalNormSumsEachTensorWhereItIs) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible";
  const Tensor a = from_vector({3.f, 0.f}, {2}), b = from_vector({0.f, 4.f, 12.f}, {3});
  EXPECT_EQ(global_l2_norm({a, b.to(kGpu)}), 13.0);
  EXPECT_EQ(global_l2_norm({a.to(kGpu), b}), 13.0);
}

}  // namespace
}  // namespace strata::tensor
