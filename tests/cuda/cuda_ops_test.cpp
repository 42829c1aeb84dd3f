// CUDA backend vs the CPU backend (the reference): every op, forward and backward, on the same
// inputs. Skips itself when no GPU is visible (CTest label `cuda`); the no-GPU error path is
// checked everywhere.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "tensor/cuda.h"
#include "tensor/ops.h"

namespace strata::tensor {
namespace {

const Device kGpu = Device::cuda(0);

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible"

Tensor rnd(const Shape& s, uint64_t stream, float lo = -2.f, float hi = 2.f) {
  return uniform(s, {42, stream}, lo, hi);
}

// One case: builds its inputs on `device` from CPU originals and returns its outputs.
struct Case {
  std::string name;
  std::function<std::vector<Tensor>(Device)> run;
  double atol = 1e-5, rtol = 1e-4;
};

std::vector<Case> cases() {
  const Tensor a = rnd({4, 33, 17}, 1), b = rnd({33, 17}, 2), pos = rnd({4, 33, 17}, 3, 0.1f, 3.f);
  const Tensor m1 = rnd({3, 40, 24}, 4), m2 = rnd({24, 56}, 5), m3 = rnd({3, 56, 24}, 6);
  const Tensor x2 = rnd({37, 96}, 7), w = rnd({96}, 8), bias = rnd({96}, 9), dy = rnd({37, 96}, 10);
  const Tensor q = rnd({2, 3, 29, 40}, 11), k = rnd({2, 3, 29, 40}, 12),
               v = rnd({2, 3, 29, 40}, 13);
  const Tensor dout = rnd({2, 3, 29, 40}, 14);
  const Tensor emb = rnd({50, 24}, 15), ids = from_ints({3, 7, 3, 49, 0, 3, 12}, {7}, DType::I32);
  const Tensor logits = rnd({7, 50}, 16, -5.f, 5.f);
  const Tensor targets = from_ints({1, -100, 49, 0, 3, 3, 20}, {7});
  const Tensor dloss = rnd({7}, 17);
  const Tensor rx = rnd({2, 5, 3, 8}, 18);
  auto on = [](const Tensor& t, Device d) { return t.to(d); };
  std::vector<Case> c;
  c.push_back({"binary_broadcast", [=](Device d) {
                 return std::vector<Tensor>{add(on(a, d), on(b, d)), sub(on(a, d), on(b, d)),
                                            mul(on(a, d), on(b, d)), div(on(a, d), on(pos, d))};
               }});
  c.push_back({"binary_strided", [=](Device d) {
                 return std::vector<Tensor>{
                     add(on(a, d).transpose(1, 2), on(a, d).transpose(1, 2))};
               }});
  c.push_back({"affine_axpy", [=](Device d) {
                 Tensor y = on(a, d).clone();
                 axpy_(0.5f, on(pos, d), y);
                 return std::vector<Tensor>{affine(on(a, d).transpose(0, 2), 3.f, -1.f), y};
               }});
  for (UnaryOp op : {UnaryOp::Gelu, UnaryOp::Silu, UnaryOp::Relu, UnaryOp::Exp, UnaryOp::Log,
                     UnaryOp::Neg, UnaryOp::Sqrt, UnaryOp::Square, UnaryOp::Tanh}) {
    c.push_back({"unary_" + std::to_string(static_cast<int>(op)), [=](Device d) {
                   return std::vector<Tensor>{unary(op, on(pos, d)),
                                              unary_backward(op, on(pos, d), on(a, d))};
                 }});
  }
  c.push_back({"bias_dropout", [=](Device d) {
                 return std::vector<Tensor>{bias_add(on(x2, d), on(bias, d)),
                                            dropout(on(x2, d), 0.3f, {5, 6})};
               }});
  c.push_back({"reductions", [=](Device d) {
                 MaxResult mx = max(on(a, d), 1);
                 return std::vector<Tensor>{
                     sum(on(a, d), 0),
                     mean(on(a, d), 2),
                     mx.values,
                     mx.indices.to(DType::F32),
                     sum_to(on(a, d), {1, 17}),
                     sum_all(on(a, d)),
                     from_vector({static_cast<float>(sum_squares(on(a, d)))}, {1})};
               }});
  c.push_back({"matmul_f32", [=](Device d) {
                 Tensor o = matmul(on(m1, d), on(m2, d));
                 matmul_out(on(m1, d), on(m3, d), o, false, true, 0.5f, 2.f);
                 return std::vector<Tensor>{o, matmul(on(m1, d), on(m1, d), true, false)};
               }});
  c.push_back({"matmul_bf16",
               [=](Device d) {
                 return std::vector<Tensor>{
                     matmul(on(m1, d).to(DType::BF16), on(m2, d).to(DType::BF16))};
               },
               2e-2, 2e-2});
  c.push_back({"layernorm", [=](Device d) {
                 NormResult r = layernorm(on(x2, d), on(w, d), on(bias, d), 1e-5f);
                 LayerNormGrads g =
                     layernorm_backward(on(dy, d), on(x2, d), on(w, d), r.mean, r.rstd);
                 return std::vector<Tensor>{r.y, r.mean, r.rstd, g.dx, g.dweight, g.dbias};
               }});
  c.push_back(
      {"rmsnorm_softmax", [=](Device d) {
         NormResult r = rmsnorm(on(x2, d), on(w, d), 1e-6f);
         RmsNormGrads g = rmsnorm_backward(on(dy, d), on(x2, d), on(w, d), r.rstd);
         Tensor s = softmax(on(x2, d));
         return std::vector<Tensor>{r.y, g.dx, g.dweight, s, softmax_backward(s, on(dy, d))};
       }});
  for (bool causal : {false, true}) {
    c.push_back({std::string("attention_") + (causal ? "causal" : "full"), [=](Device d) {
                   AttentionResult r = attention(on(q, d), on(k, d), on(v, d), causal, 0.f);
                   AttentionGrads g = attention_backward(on(q, d), on(k, d), on(v, d), r.out, r.lse,
                                                         on(dout, d), causal, 0.f);
                   return std::vector<Tensor>{r.out, r.lse, g.dq, g.dk, g.dv};
                 }});
  }
  c.push_back({"rotary", [=](Device d) {
                 auto [cs, sn] = rotary_tables(5, 8, 10000.0, 0, d);
                 return std::vector<Tensor>{rotary(on(rx, d), cs, sn, false),
                                            rotary(on(rx, d), cs, sn, true)};
               }});
  c.push_back({"embedding_cross_entropy", [=](Device d) {
                 Tensor dw = zeros({50, 24}, DType::F32, d);
                 embedding_backward(on(ids, d), on(rnd({7, 24}, 19), d), dw);
                 CrossEntropyResult ce = cross_entropy(on(logits, d), on(targets, d), -100);
                 return std::vector<Tensor>{embedding(on(emb, d), on(ids, d)), dw, ce.losses,
                                            ce.lse,
                                            cross_entropy_backward(on(logits, d), on(targets, d),
                                                                   ce.lse, on(dloss, d), -100)};
               }});
  c.push_back({"copy_cast_fill_random", [=](Device d) {
                 Tensor h = on(a, d).transpose(0, 1).to(DType::F16).to(DType::F32);
                 Tensor bf = on(a, d).to(DType::BF16).to(DType::F32);
                 Tensor i = on(a, d).to(DType::I32).to(DType::F32);
                 return std::vector<Tensor>{h,
                                            bf,
                                            i,
                                            full({3, 5}, 2.5, DType::F32, d),
                                            arange(11, DType::F32, d),
                                            randn({1001}, {7, 8}, 0.f, 1.f, d),
                                            uniform({1001}, {7, 9}, -1.f, 1.f, d),
                                            concat({on(a, d), on(a, d)}, 1)};
               }});
  return c;
}

TEST(CudaOps, AgreeWithTheCpuBackend) {
  SKIP_WITHOUT_GPU();
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    std::vector<Tensor> want = c.run(Device::cpu());
    std::vector<Tensor> got = c.run(kGpu);
    ASSERT_EQ(want.size(), got.size());
    for (size_t i = 0; i < want.size(); ++i) {
      SCOPED_TRACE("output " + std::to_string(i));
      EXPECT_EQ(got[i].device(), kGpu);
      Tensor g = got[i].to(Device::cpu()).to(DType::F32), w = want[i].to(DType::F32);
      EXPECT_TRUE(allclose(g, w, c.rtol, c.atol)) << "max |diff| " << max_abs_diff(g, w);
    }
  }
}

TEST(CudaOps, SameInputsGiveTheSameBits) {
  SKIP_WITHOUT_GPU();
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    std::vector<Tensor> r1 = c.run(kGpu), r2 = c.run(kGpu);
    for (size_t i = 0; i < r1.size(); ++i) EXPECT_EQ(max_abs_diff(r1[i], r2[i]), 0.0);
  }
}

TEST(CudaOps, BadTokenIdsAreUserErrors) {
  SKIP_WITHOUT_GPU();
  Tensor w = zeros({10, 4}, DType::F32, kGpu);
  EXPECT_THROW(embedding(w, from_ints({1, 10}, {2}).to(kGpu)), UserError);
  EXPECT_THROW(
      cross_entropy(zeros({2, 10}, DType::F32, kGpu), from_ints({1, 12}, {2}).to(kGpu), -100),
      UserError);
}

TEST(CudaOps, WithoutADeviceInitFailsClearly) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is visible";
  EXPECT_EQ(cuda_device_count(), 0);
  try {
    init_cuda(0);
    FAIL() << "init_cuda succeeded without a device";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("device: cuda requested"), std::string::npos) << e.what();
  }
  // The op layer reaches the same error instead of crashing.
  EXPECT_THROW(zeros({2}, DType::F32, kGpu), UserError);
}

}  // namespace
}  // namespace strata::tensor
