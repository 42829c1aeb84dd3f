// Every Backend op, forward and backward, in BF16 and F16 against the f32 op on the same
// (widened) inputs: Note [Low-precision ops] in tensor/ops.h, checked op by op.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "offload/memory_stats.h"
#include "tensor/cpu/matmul.h"
#include "tensor_test_util.h"

namespace strata::tensor {
namespace {

using testing::rand;

constexpr DType kLowp[] = {DType::BF16, DType::F16};

// What an output's dtype must be: the op's compute dtype, F32 whatever it is, or I64 (indices).
enum class Out : uint8_t { Compute, F32, I64 };

struct Case {
  std::string name;
  // The op's inputs for compute dtype `dt`: float inputs in dt (f32-only ones such as mean/rstd
  // or lse in F32, as the contract says), integer ones as they are.
  std::function<std::vector<Tensor>(DType dt)> inputs;
  std::function<std::vector<Tensor>(const std::vector<Tensor>&)> run;
  std::vector<Out> outs;
  // Exact ops (copy, fill, embedding forward, dropout, max...) must equal round(f32 op) bit for
  // bit.
  bool exact = false;
  // The CPU widening adapter (Note [Widening adapter]) gives round(f32 op) bit for bit for every
  // op but the native oneDNN bf16 matmul.
  bool adapter_exact = true;
};

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

void check_case(const Case& c, DType dt) {
  SCOPED_TRACE(c.name + " " + std::string(dtype_name(dt)));
  const std::vector<Tensor> in = c.inputs(dt);
  std::vector<Tensor> in_f32;
  for (const Tensor& t : in) in_f32.push_back(widen(t));
  const std::vector<Tensor> got = c.run(in), ref = c.run(in_f32);
  ASSERT_EQ(got.size(), c.outs.size());
  ASSERT_EQ(ref.size(), c.outs.size());
  for (size_t o = 0; o < got.size(); ++o) {
    SCOPED_TRACE("output " + std::to_string(o));
    const DType want = c.outs[o] == Out::Compute ? dt
                       : c.outs[o] == Out::F32   ? DType::F32
                                                 : DType::I64;
    ASSERT_EQ(got[o].dtype(), want) << got[o].str();
    ASSERT_EQ(got[o].shape(), ref[o].shape());
    if (c.outs[o] == Out::I64) {
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

// Inputs in dt from f32 uniform values.
Tensor lp(const Shape& s, uint64_t seed, DType dt, float lo = -1.f, float hi = 1.f) {
  return rand(s, seed, lo, hi).to(dt);
}

std::vector<Case> elementwise_cases() {
  std::vector<Case> cs;
  const std::pair<const char*, BinaryOp> binaries[] = {{"add", BinaryOp::Add},
                                                       {"sub", BinaryOp::Sub},
                                                       {"mul", BinaryOp::Mul},
                                                       {"div", BinaryOp::Div}};
  for (auto [name, op] : binaries) {
    cs.push_back({std::string("binary_") + name,
                  [](DType dt) {
                    return std::vector<Tensor>{lp({4, 6, 10}, 1, dt),
                                               lp({6, 10}, 2, dt, 0.5f, 1.5f),
                                               lp({4, 1, 10}, 3, dt, 0.5f, 1.5f)};
                  },
                  [op](const std::vector<Tensor>& x) {
                    auto f = [op](const Tensor& a, const Tensor& b) {
                      Tensor out = Tensor::empty(broadcast_shapes(a.shape(), b.shape()), a.dtype());
                      backend_for(a.device()).binary(op, a, b, out);
                      return out;
                    };
                    // Full, row-broadcast, general broadcast, strided and scalar-like operands.
                    return std::vector<Tensor>{f(x[0], x[0]), f(x[0], x[1]), f(x[0], x[2]),
                                               f(x[0].transpose(0, 2), x[2].transpose(0, 2)),
                                               f(x[1].narrow(0, 0, 1), x[0])};
                  },
                  {Out::Compute, Out::Compute, Out::Compute, Out::Compute, Out::Compute}});
  }
  cs.push_back({"add_sub_mul_div_ops",
                [](DType dt) {
                  return std::vector<Tensor>{lp({3, 7}, 4, dt), lp({7}, 5, dt, 0.5f, 1.5f)};
                },
                [](const std::vector<Tensor>& x) {
                  return std::vector<Tensor>{add(x[0], x[1]), sub(x[0], x[1]), mul(x[0], x[1]),
                                             div(x[0], x[1])};
                },
                {Out::Compute, Out::Compute, Out::Compute, Out::Compute}});
  cs.push_back(
      {"affine_scale",
       [](DType dt) {
         return std::vector<Tensor>{lp({5, 9}, 6, dt)};
       },
       [](const std::vector<Tensor>& x) {
         return std::vector<Tensor>{affine(x[0].transpose(0, 1), 1.5f, -0.25f), scale(x[0], 0.3f)};
       },
       {Out::Compute, Out::Compute}});
  cs.push_back({"axpy",
                [](DType dt) {
                  return std::vector<Tensor>{lp({300}, 7, dt), lp({300}, 8, dt)};
                },
                [](const std::vector<Tensor>& x) {
                  Tensor y = x[1].clone();
                  axpy_(0.7f, x[0], y);
                  return std::vector<Tensor>{y};
                },
                {Out::Compute}});
  const std::pair<const char*, UnaryOp> unaries[] = {
      {"gelu", UnaryOp::Gelu}, {"silu", UnaryOp::Silu},     {"relu", UnaryOp::Relu},
      {"exp", UnaryOp::Exp},   {"log", UnaryOp::Log},       {"neg", UnaryOp::Neg},
      {"sqrt", UnaryOp::Sqrt}, {"square", UnaryOp::Square}, {"tanh", UnaryOp::Tanh}};
  for (auto [name, op] : unaries) {
    const bool positive = op == UnaryOp::Log || op == UnaryOp::Sqrt;
    cs.push_back({std::string("unary_") + name,
                  [positive](DType dt) {
                    return std::vector<Tensor>{
                        positive ? lp({7, 37}, 9, dt, 0.1f, 3.f) : lp({7, 37}, 9, dt, -3.f, 3.f),
                        lp({7, 37}, 10, dt)};
                  },
                  [op](const std::vector<Tensor>& x) {
                    return std::vector<Tensor>{unary(op, x[0]), unary_backward(op, x[0], x[1])};
                  },
                  {Out::Compute, Out::Compute},
                  /*exact=*/op == UnaryOp::Relu || op == UnaryOp::Neg});
  }
  cs.push_back(
      {"bias_add",
       [](DType dt) {
         return std::vector<Tensor>{lp({6, 11}, 11, dt), lp({11}, 12, dt)};
       },
       [](const std::vector<Tensor>& x) { return std::vector<Tensor>{bias_add(x[0], x[1])}; },
       {Out::Compute}});
  cs.push_back({"dropout",
                [](DType dt) {
                  return std::vector<Tensor>{lp({9, 41}, 13, dt)};
                },
                [](const std::vector<Tensor>& x) {
                  return std::vector<Tensor>{dropout(x[0], 0.3f, RngKey{5, 6}),
                                             dropout(x[0], 0.f, RngKey{5, 6})};
                },
                {Out::Compute, Out::Compute},
                /*exact=*/true});
  return cs;
}

std::vector<Case> memory_and_reduction_cases() {
  std::vector<Case> cs;
  cs.push_back(
      {"copy_fill_arange_concat",
       [](DType dt) {
         return std::vector<Tensor>{lp({4, 5}, 14, dt), lp({4, 3}, 15, dt)};
       },
       [](const std::vector<Tensor>& x) {
         const DType dt = x[0].dtype();
         Tensor filled = Tensor::empty({3, 4}, dt);
         filled.fill_(0.1);
         Tensor strided = Tensor::empty({5, 4}, dt);
         strided.copy_(x[0].transpose(0, 1));
         return std::vector<Tensor>{strided, filled, arange(40, dt), concat({x[0], x[1]}, 1)};
       },
       {Out::Compute, Out::Compute, Out::Compute, Out::Compute},
       /*exact=*/true});
  cs.push_back({"random",
                [](DType dt) {
                  return std::vector<Tensor>{Tensor::empty({3, 50}, dt)};
                },
                [](const std::vector<Tensor>& x) {
                  Tensor u = Tensor::empty(x[0].shape(), x[0].dtype());
                  Tensor n = Tensor::empty(x[0].shape(), x[0].dtype());
                  Backend& be = backend_for(x[0].device());
                  be.random_uniform(u, RngKey{3, 4}, -2.f, 2.f);
                  be.random_normal(n, RngKey{3, 5}, 0.5f, 2.f);
                  return std::vector<Tensor>{u, n};
                },
                {Out::Compute, Out::Compute},
                /*exact=*/true});
  cs.push_back({"sum_to",
                [](DType dt) {
                  return std::vector<Tensor>{lp({5, 6, 33}, 16, dt)};
                },
                [](const std::vector<Tensor>& x) {
                  return std::vector<Tensor>{sum_to(x[0], {6, 33}), sum_to(x[0], {5, 1, 33}),
                                             sum_to(x[0].transpose(0, 2), {33, 1, 1})};
                },
                {Out::Compute, Out::Compute, Out::Compute}});
  cs.push_back({"sum_mean_sum_all",
                [](DType dt) {
                  return std::vector<Tensor>{lp({6, 40, 7}, 17, dt)};
                },
                [](const std::vector<Tensor>& x) {
                  return std::vector<Tensor>{sum(x[0], 1), mean(x[0], 2, true), sum_all(x[0])};
                },
                {Out::Compute, Out::Compute, Out::Compute}});
  cs.push_back({"max",
                [](DType dt) {
                  return std::vector<Tensor>{lp({6, 40, 7}, 18, dt)};
                },
                [](const std::vector<Tensor>& x) {
                  MaxResult r = max(x[0], 1);
                  return std::vector<Tensor>{r.values, r.indices};
                },
                {Out::Compute, Out::I64},
                /*exact=*/true});
  return cs;
}

std::vector<Case> matmul_cases() {
  std::vector<Case> cs;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      cs.push_back({"matmul ta=" + std::to_string(ta) + " tb=" + std::to_string(tb),
                    [ta, tb](DType dt) {
                      return std::vector<Tensor>{
                          lp(ta ? Shape{2, 45, 30} : Shape{2, 30, 45}, 19, dt),
                          lp(tb ? Shape{27, 45} : Shape{45, 27}, 20, dt),
                          lp(tb ? Shape{2, 27, 45} : Shape{2, 45, 27}, 21, dt),
                          lp({2, 30, 27}, 22, dt)};
                    },
                    [ta, tb](const std::vector<Tensor>& x) {
                      Tensor accum = x[3].clone();  // beta != 0 reads the old output
                      matmul_out(x[0], x[1], accum, ta, tb, 0.5f, 0.75f);
                      Tensor mixed = Tensor::empty({2, 30, 27}, DType::F32);
                      matmul_out(x[0], x[2], mixed, ta, tb);
                      return std::vector<Tensor>{matmul(x[0], x[1], ta, tb),
                                                 matmul(x[0], x[2], ta, tb), accum, mixed};
                    },
                    {Out::Compute, Out::Compute, Out::Compute, Out::F32},
                    /*exact=*/false,
                    /*adapter_exact=*/false});
    }
  return cs;
}

std::vector<Case> nn_cases() {
  std::vector<Case> cs;
  cs.push_back({"layernorm",
                [](DType dt) {
                  Tensor x = lp({3, 5, 48}, 23, dt, -2.f, 3.f), w = lp({48}, 24, dt, 0.5f, 1.5f),
                         b = lp({48}, 25, dt);
                  NormResult r = layernorm(x, w, b, 1e-5f);  // mean, rstd: F32 from the lp run
                  return std::vector<Tensor>{x, w, b, lp({3, 5, 48}, 26, dt), r.mean, r.rstd};
                },
                [](const std::vector<Tensor>& x) {
                  NormResult r = layernorm(x[0], x[1], x[2], 1e-5f);
                  LayerNormGrads g = layernorm_backward(x[3], x[0], x[1], x[4], x[5]);
                  return std::vector<Tensor>{r.y, r.mean, r.rstd, g.dx, g.dweight, g.dbias};
                },
                {Out::Compute, Out::F32, Out::F32, Out::Compute, Out::Compute, Out::Compute}});
  cs.push_back({"rmsnorm",
                [](DType dt) {
                  Tensor x = lp({70, 40}, 27, dt, -2.f, 3.f), w = lp({40}, 28, dt, 0.5f, 1.5f);
                  NormResult r = rmsnorm(x, w, 1e-6f);
                  return std::vector<Tensor>{x, w, lp({70, 40}, 29, dt), r.rstd};
                },
                [](const std::vector<Tensor>& x) {
                  NormResult r = rmsnorm(x[0], x[1], 1e-6f);
                  RmsNormGrads g = rmsnorm_backward(x[2], x[0], x[1], x[3]);
                  return std::vector<Tensor>{r.y, r.rstd, g.dx, g.dweight};
                },
                {Out::Compute, Out::F32, Out::Compute, Out::Compute}});
  cs.push_back({"softmax",
                [](DType dt) {
                  Tensor x = lp({9, 33}, 30, dt, -4.f, 4.f);
                  return std::vector<Tensor>{x, softmax(x), lp({9, 33}, 31, dt)};
                },
                [](const std::vector<Tensor>& x) {
                  return std::vector<Tensor>{softmax(x[0]), softmax_backward(x[1], x[2])};
                },
                {Out::Compute, Out::Compute}});
  for (bool causal : {true, false}) {
    cs.push_back({std::string("attention causal=") + (causal ? "1" : "0"),
                  [](DType dt) {
                    Tensor q = lp({2, 3, 13, 16}, 32, dt), k = lp({2, 3, 21, 16}, 33, dt),
                           v = lp({2, 3, 21, 16}, 34, dt);
                    AttentionResult r = attention(q, k, v, true);
                    AttentionResult r2 = attention(q, k, v, false);
                    return std::vector<Tensor>{q,     k,      v,      r.out,
                                               r.lse, r2.out, r2.lse, lp({2, 3, 13, 16}, 35, dt)};
                  },
                  [causal](const std::vector<Tensor>& x) {
                    AttentionResult r = attention(x[0], x[1], x[2], causal);
                    const Tensor& out = causal ? x[3] : x[5];
                    const Tensor& lse = causal ? x[4] : x[6];
                    AttentionGrads g = attention_backward(x[0], x[1], x[2], out, lse, x[7], causal);
                    return std::vector<Tensor>{r.out, r.lse, g.dq, g.dk, g.dv};
                  },
                  {Out::Compute, Out::F32, Out::Compute, Out::Compute, Out::Compute}});
  }
  cs.push_back({"rotary",
                [](DType dt) {
                  auto [c, s] = rotary_tables(6, 8);
                  return std::vector<Tensor>{lp({2, 6, 3, 8}, 36, dt), c, s, c.to(dt), s.to(dt)};
                },
                [](const std::vector<Tensor>& x) {
                  // F32 tables (as rotary_tables makes them) and tables in the compute dtype.
                  return std::vector<Tensor>{rotary(x[0], x[1], x[2]),
                                             rotary(x[0], x[1], x[2], true),
                                             rotary(x[0], x[3], x[4])};
                },
                {Out::Compute, Out::Compute, Out::Compute}});
  cs.push_back(
      {"embedding_forward",
       [](DType dt) {
         return std::vector<Tensor>{lp({11, 20}, 37, dt),
                                    from_ints({3, 0, 10, 3, 7, 3}, {2, 3}, DType::I32)};
       },
       [](const std::vector<Tensor>& x) { return std::vector<Tensor>{embedding(x[0], x[1])}; },
       {Out::Compute},
       /*exact=*/true});
  cs.push_back({"embedding_backward",
                [](DType dt) {
                  // Repeated ids: several positions sum into one row, on top of its old value.
                  return std::vector<Tensor>{from_ints({3, 0, 10, 3, 7, 3, 3, 1}, {8}),
                                             lp({8, 70}, 38, dt), lp({11, 70}, 39, dt)};
                },
                [](const std::vector<Tensor>& x) {
                  Tensor dw = x[2].clone();
                  embedding_backward(x[0], x[1], dw);
                  return std::vector<Tensor>{dw};
                },
                {Out::Compute}});
  cs.push_back({"cross_entropy",
                [](DType dt) {
                  Tensor logits = lp({6, 29}, 40, dt, -5.f, 5.f);
                  Tensor targets = from_ints({3, -100, 28, 0, 5, 5}, {6});
                  CrossEntropyResult r = cross_entropy(logits, targets);
                  Tensor dloss = rand({6}, 41, 0.1f, 1.f);  // F32 whatever the compute dtype
                  return std::vector<Tensor>{logits, targets, r.lse, dloss};
                },
                [](const std::vector<Tensor>& x) {
                  CrossEntropyResult r = cross_entropy(x[0], x[1]);
                  return std::vector<Tensor>{r.losses, r.lse,
                                             cross_entropy_backward(x[0], x[1], x[2], x[3])};
                },
                {Out::F32, Out::F32, Out::Compute}});
  return cs;
}

TEST(LowpOps, ElementwiseMatchTheF32OpOnWidenedInputs) {
  for (const Case& c : elementwise_cases())
    for (DType dt : kLowp) check_case(c, dt);
}

TEST(LowpOps, MemoryAndReductionsMatchTheF32Op) {
  for (const Case& c : memory_and_reduction_cases())
    for (DType dt : kLowp) check_case(c, dt);
}

TEST(LowpOps, MatmulMatchesTheF32OpOnEveryEngine) {
  std::vector<cpu::MatmulEngine> engines{cpu::MatmulEngine::Eigen};
  if (cpu::have_onednn()) engines.push_back(cpu::MatmulEngine::OneDnn);
  for (cpu::MatmulEngine e : engines) {
    cpu::MatmulEngineScope scope(e);
    for (const Case& c : matmul_cases())
      for (DType dt : kLowp) check_case(c, dt);
  }
}

TEST(LowpOps, NormAttentionEmbeddingLossMatchTheF32Op) {
  for (const Case& c : nn_cases())
    for (DType dt : kLowp) check_case(c, dt);
}

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
