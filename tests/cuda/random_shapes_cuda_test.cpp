// Every op family on shapes drawn at random (fixed seeds; the random families of the op table,
// tests/support/op_table.h): the CUDA backend against the CPU backend, forward and backward, in
// f32, bf16 and f16. cuda_ops_test.cpp checks each kernel on
// hand-picked shapes; these draws reach the sizes nobody picked: row lengths that are not a
// multiple of a 128-bit pack or a warp, one-element dims, tails of every tile and block, causal
// attention with more queries than keys, vocabularies narrowed to any number of classes, and
// transposed or narrowed views as operands. 8 draws per family by default (about 15 s on the
// emulator); STRATA_RANDOM_SHAPES_DRAWS=N draws N (250 per family passed, in 5.5 minutes on the
// emulator). Skips itself without a GPU (CTest label `cuda`).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tensor/cuda.h"
#include "tensor/ops.h"
#include "tests/support/op_table.h"

namespace strata::tensor {
namespace {

const Device kGpu = Device::cuda(0);
const Device kCpu = Device::cpu();

// Strata's own attention kernels, held to one rounding of tolerance (cuDNN's, which round
// intermediates to the compute dtype, have their own test).
struct OwnAttentionKernel {
  OwnAttentionKernel() { ::setenv("STRATA_ATTENTION", "own", 1); }
  ~OwnAttentionKernel() { ::unsetenv("STRATA_ATTENTION"); }
};

using strata::testing::Draw;
using strata::testing::OpInfo;
using Case = strata::testing::RandomSample;

// One rounding of the output dtype (both backends round the f32 result once) plus the f32 noise
// of another summation order near 0, as in cuda_ops_test.cpp.
double max_abs(const Tensor& t) {
  double m = 0;
  for (float x : to_float_vector(t)) m = std::max(m, std::abs(static_cast<double>(x)));
  return m;
}

void expect_close(const Tensor& got, const Tensor& want, DType dt, const Case& c, size_t index,
                  double scale_floor) {
  ASSERT_EQ(got.shape(), want.shape());
  ASSERT_EQ(got.dtype(), want.dtype());
  EXPECT_EQ(got.device(), kGpu);
  const std::vector<float> g = to_float_vector(got.to(kCpu)), w = to_float_vector(want);
  std::vector<float> term(w.size(), 0.f);
  for (const auto& [i, t] : c.terms)
    if (i == index) term = to_float_vector(t);
  double rtol = c.f32_rtol, atol = c.f32_atol;
  if (dt == DType::BF16) rtol = 1.0 / 128, atol = 1e-3;
  if (dt == DType::F16) rtol = 1.0 / 1024, atol = 1e-4;
  if (dt != DType::F32 && c.rounds_intermediates) {
    const double scale = std::max(max_abs(want), scale_floor);
    rtol = 0, atol = (index == 1 ? 1e-3 : dt == DType::BF16 ? 2e-2 : 1e-2) * scale;
  }
  // The element furthest past its tolerance, named.
  size_t worst = 0;
  double excess = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (g[i] == w[i]) continue;  // equal infinities too
    const double diff = std::abs(static_cast<double>(g[i]) - w[i]);
    const double bound = atol + rtol * (std::abs(w[i]) + std::abs(term[i]));
    const double over = std::isnan(diff) ? 1e300 : diff - bound;
    if (over > excess) excess = over, worst = i;
  }
  EXPECT_EQ(excess, 0.0) << "element " << worst << ": got " << g[worst] << ", want " << w[worst]
                         << " (rtol " << rtol << ", atol " << atol << ")";
}

// The random-shape family of each op table entry (tests/support/op_table.h), one test per entry,
// e.g. OpTable/CudaRandomShapes.EveryOpFamilyAgreesWithTheCpu/attention.
class CudaRandomShapes : public ::testing::TestWithParam<OpInfo> {};

TEST_P(CudaRandomShapes, EveryOpFamilyAgreesWithTheCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible";
  OwnAttentionKernel own;
  const int draws = std::getenv("STRATA_RANDOM_SHAPES_DRAWS")
                        ? std::atoi(std::getenv("STRATA_RANDOM_SHAPES_DRAWS"))
                        : 8;
  const int family = GetParam().random.family;
  for (int i = 0; i < draws; ++i) {
    Draw r(static_cast<uint64_t>(family * 1000 + i + 1));
    const Case c = GetParam().random.draw(r);
    for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
      if (!GetParam().supports(dt)) continue;
      SCOPED_TRACE(c.name + " " + std::string(dtype_name(dt)) + " (family " +
                   std::to_string(family) + ", draw " + std::to_string(i) + ")");
      const std::vector<Tensor> want = c.run(dt, kCpu), got = c.run(dt, kGpu);
      ASSERT_EQ(got.size(), want.size());
      for (size_t o = 0; o < want.size(); ++o) {
        SCOPED_TRACE("output " + std::to_string(o));
        const double floor = c.rounds_intermediates && (o == 2 || o == 3) ? max_abs(want[4]) : 0;
        expect_close(got[o], want[o], dt, c, o, floor);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(OpTable, CudaRandomShapes,
                         ::testing::ValuesIn(strata::testing::op_entries([](const OpInfo& e) {
                           return static_cast<bool>(e.random.draw);
                         })),
                         [](const ::testing::TestParamInfo<OpInfo>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace strata::tensor
