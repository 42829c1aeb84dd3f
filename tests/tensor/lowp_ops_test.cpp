// Every Backend op, forward and backward, in BF16 and F16 against the f32 op on the same
// (widened) inputs: Note [Low-precision ops] in tensor/ops.h, checked op by op on the low-precision
// samples of the op table (tests/support/op_table.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "offload/memory_stats.h"
#include "tensor/cpu/matmul.h"
#include "tensor_test_util.h"
#include "tests/support/op_table.h"

namespace strata::tensor {
namespace {

using testing::rand;

constexpr DType kLowp[] = {DType::BF16, DType::F16};

using strata::testing::LowpOut;
using strata::testing::LowpSample;
using strata::testing::lp;
using strata::testing::OpInfo;

// Relative tolerance of Note [Low-precision ops]: 2 ulp at the output's magnitude.
double rel_tol(DType dt) {
  return dt == DType::BF16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -10);
}

Tensor widen(const Tensor& t) {
  return t.defined() && is_floating(t.dtype()) ? t.to(DType::F32) : t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  if (!(a.shape() == b.shape()) || a.dtype() != b.dtype()) return false;
  Tensor ac = a.contiguous(), bc = b.contiguous();
  return std::memcmp(ac.data_ptr(), bc.data_ptr(), ac.nbytes()) == 0;
}

void check_case(const LowpSample& c, DType dt) {
  SCOPED_TRACE(c.name + " " + std::string(dtype_name(dt)));
  const std::vector<Tensor> in = c.inputs(dt);
  std::vector<Tensor> in_f32;
  for (const Tensor& t : in) in_f32.push_back(widen(t));
  const std::vector<Tensor> got = c.run(in), ref = c.run(in_f32);
  ASSERT_EQ(got.size(), c.outs.size());
  ASSERT_EQ(ref.size(), c.outs.size());
  for (size_t o = 0; o < got.size(); ++o) {
    SCOPED_TRACE("output " + std::to_string(o));
    const DType want = c.outs[o] == LowpOut::Compute ? dt
                       : c.outs[o] == LowpOut::F32   ? DType::F32
                                                     : DType::I64;
    ASSERT_EQ(got[o].dtype(), want) << got[o].str();
    ASSERT_EQ(got[o].shape(), ref[o].shape());
    if (c.outs[o] == LowpOut::I64) {
      EXPECT_EQ(to_int_vector(got[o]), to_int_vector(ref[o]));
      continue;
    }
    // The reference: round(f32 op on the widened inputs) into the output's dtype.
    const Tensor rounded = ref[o].to(want);
    if (c.exact || (c.adapter_exact && got[o].device().is_cpu())) {
      EXPECT_TRUE(same_bits(got[o], rounded)) << "max abs diff " << max_abs_diff(got[o], rounded);
      continue;
    }
    const std::vector<float> g = to_float_vector(got[o]), r = to_float_vector(rounded);
    double scale = 0;
    for (float v : r) scale = std::max(scale, std::fabs(static_cast<double>(v)));
    const double rel = want == DType::F32 ? 1e-5 : rel_tol(dt);
    const double atol = rel * 1e-2 * scale;  // values near 0 next to the tensor's magnitude
    for (size_t i = 0; i < g.size(); ++i)
      ASSERT_LE(std::fabs(static_cast<double>(g[i]) - r[i]), rel * std::fabs(r[i]) + atol)
          << "element " << i << ": " << g[i] << " vs " << r[i];
  }
}

// One test per op table entry with low-precision samples (tests/support/op_table.h): each
// sample in BF16 and F16, on every CPU matmul engine where the sample asks for it.
class LowpOps : public ::testing::TestWithParam<OpInfo> {};

TEST_P(LowpOps, MatchTheF32OpOnWidenedInputs) {
  for (const LowpSample& c : GetParam().lowp) {
    std::vector<cpu::MatmulEngine> engines{cpu::MatmulEngine::Eigen};
    if (c.every_matmul_engine && cpu::have_onednn()) engines.push_back(cpu::MatmulEngine::OneDnn);
    for (cpu::MatmulEngine e : engines) {
      // Only the samples that ask for an engine pin one; the others run on the default.
      std::optional<cpu::MatmulEngineScope> scope;
      if (c.every_matmul_engine) scope.emplace(e);
      for (DType dt : kLowp)
        if (GetParam().supports(dt)) check_case(c, dt);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(OpTable, LowpOps,
                         ::testing::ValuesIn(strata::testing::op_entries([](const OpInfo& e) {
                           return !e.lowp.empty();
                         })),
                         [](const ::testing::TestParamInfo<OpInfo>& info) {
                           return info.param.name;
                         });

TEST(LowpOps, SumSquaresOfLowPrecisionIsADoubleOfTheWidenedValues) {
  for (DType dt : kLowp) {
    Tensor x = lp({37, 29}, 42, dt);
    double ref = 0;
    for (float v : to_float_vector(x)) ref += static_cast<double>(v) * v;
    EXPECT_NEAR(sum_squares(x), ref, 1e-12 * ref) << dtype_name(dt);
  }
}

TEST(LowpOps, AxpyAccumulatesAcrossDtypesRoundingOnce) {
  const std::vector<DType> all{DType::F32, DType::BF16, DType::F16};
  for (DType xd : all)
    for (DType yd : all) {
      SCOPED_TRACE(std::string(dtype_name(xd)) + " into " + std::string(dtype_name(yd)));
      Tensor x = lp({257}, 43, xd), y = lp({257}, 44, yd);
      const std::vector<float> xv = to_float_vector(x), yv = to_float_vector(y);
      axpy_(-0.3f, x, y);
      ASSERT_EQ(y.dtype(), yd);
      std::vector<float> want(xv.size());
      for (size_t i = 0; i < xv.size(); ++i) want[i] = yv[i] + -0.3f * xv[i];
      // y = round_y(f32(y) + alpha * f32(x)): exactly the f32 result rounded once.
      EXPECT_TRUE(same_bits(y, from_vector(want, {257}, yd)));
    }
}

TEST(LowpOps, WideningTemporariesAreChargedToWorkspace) {
  auto& stats = offload::MemoryStats::global();
  Tensor x = lp({64, 256}, 45, DType::BF16);
  stats.reset_peaks();
  const int64_t ws_before = stats.usage(offload::Tier::Host, offload::Category::Workspace).current;
  Tensor y = gelu(x);
  const offload::Usage ws = stats.usage(offload::Tier::Host, offload::Category::Workspace);
  // x and the result widened to f32 (2 x 64 KiB) lived in the workspace, and are gone.
  EXPECT_GE(ws.peak - ws_before, 2 * 64 * 256 * 4);
  EXPECT_EQ(ws.current, ws_before);
}

// Note [Low-precision ops]: operands of one op share a dtype; the error names the op and them.
TEST(LowpOps, MismatchedDtypesAreUserErrorsNamingTheOpAndOperands) {
  auto expect_error = [](const std::function<void()>& f, const std::vector<std::string>& words) {
    try {
      f();
      ADD_FAILURE() << "no error";
    } catch (const UserError& e) {
      for (const std::string& w : words)
        EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what() << " lacks " << w;
    }
  };
  Tensor b = lp({4, 8}, 46, DType::BF16), f = rand({4, 8}, 47), h = lp({4, 8}, 48, DType::F16);
  Tensor wf = rand({8}, 49);
  expect_error([&] { add(b, f); }, {"add", "bf16[4, 8]", "f32[4, 8]"});
  expect_error([&] { matmul(b, h, false, true); }, {"matmul", "bf16", "f16"});
  expect_error(
      [&] {
        Tensor out = Tensor::empty({4, 4}, DType::F16);
        matmul_out(b, b, out, false, true);
      },
      {"matmul", "output", "f16"});
  expect_error([&] { layernorm(b, wf, wf, 1e-5f); }, {"layernorm", "bf16", "f32"});
  expect_error([&] { unary_backward(UnaryOp::Gelu, b, f); }, {"unary_backward"});
  NormResult r = layernorm(b, wf.to(DType::BF16), wf.to(DType::BF16), 1e-5f);
  expect_error(
      [&] { layernorm_backward(b, b, wf.to(DType::BF16), r.mean.to(DType::BF16), r.rstd); },
      {"layernorm_backward", "mean", "f32"});
  Tensor targets = from_ints({0, 1, 2, 3}, {4});
  CrossEntropyResult ce = cross_entropy(b, targets);
  expect_error([&] { cross_entropy_backward(b, targets, ce.lse, ones({4}, DType::BF16)); },
               {"cross_entropy_backward", "dloss"});
  auto [c, s] = rotary_tables(2, 8);
  expect_error(
      [&] {
        rotary(lp({1, 2, 1, 8}, 50, DType::BF16), c.to(DType::F16), s.to(DType::F16));
      },
      {"rotary", "f16"});
}

}  // namespace
}  // namespace strata::tensor
