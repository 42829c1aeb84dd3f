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

namespace strata::tensor {
namespace {

const Device kGpu = Device::cuda(0);
const Device kCpu = Device::cpu();

struct Case {
  std::string name;
  std::function<std::vector<Tensor>(Device)> make;  // the operands, all on one device
  std::function<void(std::vector<Tensor>&)> run;
};

Tensor r(const Shape& s, uint64_t stream, Device d) {
  return uniform(s, {11, stream}, -1.f, 1.f).to(d);
}
Tensor ids(const Shape& s, int64_t n, Device d) {
  std::vector<float> v(static_cast<size_t>(s.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(static_cast<int64_t>(i) % n);
  return from_vector(v, s).to(DType::I64).to(d);
}

std::vector<Case> cases() {
  std::vector<Case> c;
  using V = std::vector<Tensor>;
  const auto two = [](Device d) { return V{r({3, 4}, 1, d), r({3, 4}, 2, d)}; };
  c.push_back({"add", two, [](V& t) { add(t[0], t[1]); }});
  c.push_back({"sub", two, [](V& t) { sub(t[0], t[1]); }});
  c.push_back({"mul", two, [](V& t) { mul(t[0], t[1]); }});
  c.push_back({"div", two, [](V& t) { div(t[0], t[1]); }});
  c.push_back({"axpy_", two, [](V& t) { axpy_(2.f, t[0], t[1]); }});
  c.push_back({"unary_backward", two, [](V& t) { unary_backward(UnaryOp::Gelu, t[0], t[1]); }});
  c.push_back({"bias_add",
               [](Device d) {
                 return V{r({3, 4}, 1, d), r({4}, 2, d)};
               },
               [](V& t) { bias_add(t[0], t[1]); }});
  c.push_back({"sum_squares_many", two, [](V& t) { sum_squares_many({t[0], t[1]}); }});
  c.push_back({"matmul",
               [](Device d) {
                 return V{r({3, 4}, 1, d), r({4, 5}, 2, d)};
               },
               [](V& t) { matmul(t[0], t[1]); }});
  c.push_back({"matmul_out",
               [](Device d) {
                 return V{r({3, 4}, 1, d), r({4, 5}, 2, d), r({3, 5}, 3, d)};
               },
               [](V& t) { matmul_out(t[0], t[1], t[2], false, false, 1.f, 1.f); }});
  c.push_back({"linear",
               [](Device d) {
                 return V{r({3, 4}, 1, d), r({5, 4}, 2, d), r({5}, 3, d)};
               },
               [](V& t) { linear(t[0], t[1], t[2], Activation::Gelu, true); }});
  c.push_back({"linear_backward_weight",
               [](Device d) {
                 return V{r({3, 5}, 1, d), r({3, 4}, 2, d)};
               },
               [](V& t) { linear_backward_weight(t[0], t[1], true); }});
  c.push_back({"linear_backward_weight_into",
               [](Device d) {
                 return V{r({3, 5}, 1, d), r({3, 4}, 2, d), r({5, 4}, 3, d)};
               },
               [](V& t) { linear_backward_weight_into(t[0], t[1], t[2], true); }});
  c.push_back({"linear_backward_gelu",
               [](Device d) {
                 return V{r({3, 5}, 1, d), r({5, 4}, 2, d), r({3, 4}, 3, d)};
               },
               [](V& t) { linear_backward_gelu(t[0], t[1], t[2], true); }});
  const auto norm_in = [](Device d) { return V{r({3, 8}, 1, d), r({8}, 2, d), r({8}, 3, d)}; };
  c.push_back({"layernorm", norm_in, [](V& t) { layernorm(t[0], t[1], t[2], 1e-5f); }});
  c.push_back({"rmsnorm",
               [](Device d) {
                 return V{r({3, 8}, 1, d), r({8}, 2, d)};
               },
               [](V& t) { rmsnorm(t[0], t[1], 1e-5f); }});
  // Backward operands: dy, x, weight, then the statistics the forward gave (made on d).
  c.push_back({"layernorm_backward",
               [](Device d) {
                 const Tensor x = r({3, 8}, 1, d), w = r({8}, 2, d);
                 NormResult n = layernorm(x, w, r({8}, 3, d), 1e-5f);
                 return V{r({3, 8}, 4, d), x, w, n.mean, n.rstd};
               },
               [](V& t) { layernorm_backward(t[0], t[1], t[2], t[3], t[4]); }});
  c.push_back({"rmsnorm_backward",
               [](Device d) {
                 const Tensor x = r({3, 8}, 1, d), w = r({8}, 2, d);
                 return V{r({3, 8}, 4, d), x, w, rmsnorm(x, w, 1e-5f).rstd};
               },
               [](V& t) { rmsnorm_backward(t[0], t[1], t[2], t[3]); }});
  const auto add_norm_in = [](Device d) {
    return V{r({3, 8}, 1, d), r({3, 8}, 5, d), r({8}, 2, d), r({8}, 3, d)};
  };
  c.push_back(
      {"add_layernorm", add_norm_in, [](V& t) { add_layernorm(t[0], t[1], t[2], t[3], 1e-5f); }});
  c.push_back({"add_rmsnorm",
               [](Device d) {
                 return V{r({3, 8}, 1, d), r({3, 8}, 5, d), r({8}, 2, d)};
               },
               [](V& t) { add_rmsnorm(t[0], t[1], t[2], 1e-5f); }});
  c.push_back(
      {"add_layernorm_backward",
       [](Device d) {
         const Tensor w = r({8}, 2, d);
         AddNormResult n = add_layernorm(r({3, 8}, 1, d), r({3, 8}, 5, d), w, r({8}, 3, d), 1e-5f);
         return V{r({3, 8}, 4, d), r({3, 8}, 6, d), n.s, w, n.mean, n.rstd};
       },
       [](V& t) { add_layernorm_backward(t[0], t[1], t[2], t[3], t[4], t[5]); }});
  c.push_back({"add_rmsnorm_backward",
               [](Device d) {
                 const Tensor w = r({8}, 2, d);
                 AddNormResult n = add_rmsnorm(r({3, 8}, 1, d), r({3, 8}, 5, d), w, 1e-5f);
                 return V{r({3, 8}, 4, d), r({3, 8}, 6, d), n.s, w, n.rstd};
               },
               [](V& t) { add_rmsnorm_backward(t[0], t[1], t[2], t[3], t[4]); }});
  c.push_back({"softmax_backward", two, [](V& t) { softmax_backward(t[0], t[1]); }});
  const auto qkv = [](Device d) {
    return V{r({1, 2, 4, 8}, 1, d), r({1, 2, 4, 8}, 2, d), r({1, 2, 4, 8}, 3, d)};
  };
  c.push_back({"attention", qkv, [](V& t) { attention(t[0], t[1], t[2], true); }});
  const auto attn_bwd_in = [](Device d) {
    V t{r({1, 2, 4, 8}, 1, d), r({1, 2, 4, 8}, 2, d), r({1, 2, 4, 8}, 3, d)};
    AttentionResult a = attention(t[0], t[1], t[2], true);
    t.insert(t.end(), {a.out, a.lse, r({1, 2, 4, 8}, 4, d)});
    return t;
  };
  c.push_back({"attention_backward", attn_bwd_in,
               [](V& t) { attention_backward(t[0], t[1], t[2], t[3], t[4], t[5], true); }});
  c.push_back({"attention_backward_into",
               [=](Device d) {
                 V t = attn_bwd_in(d);
                 for (int i = 0; i < 3; ++i)
                   t.push_back(Tensor::empty({1, 2, 4, 8}, DType::F32, d));
                 return t;
               },
               [](V& t) {
                 attention_backward_into(t[0], t[1], t[2], t[3], t[4], t[5], true, 0.f, t[6], t[7],
                                         t[8]);
               }});
  c.push_back({"rotary",
               [](Device d) {
                 auto [cos, sin] = rotary_tables(4, 8, 10000.0, 0, d);
                 return V{r({1, 4, 2, 8}, 1, d), cos, sin};
               },
               [](V& t) { rotary(t[0], t[1], t[2]); }});
  c.push_back({"embedding",
               [](Device d) {
                 return V{r({10, 4}, 1, d), ids({6}, 10, d)};
               },
               [](V& t) { embedding(t[0], t[1]); }});
  c.push_back({"embedding_backward",
               [](Device d) {
                 return V{ids({6}, 10, d), r({6, 4}, 1, d), r({10, 4}, 2, d)};
               },
               [](V& t) { embedding_backward(t[0], t[1], t[2]); }});
  c.push_back({"cross_entropy",
               [](Device d) {
                 return V{r({6, 10}, 1, d), ids({6}, 10, d)};
               },
               [](V& t) { cross_entropy(t[0], t[1]); }});
  const auto ce_bwd_in = [](Device d) {
    const Tensor logits = r({6, 10}, 1, d), t = ids({6}, 10, d);
    return V{logits, t, cross_entropy(logits, t).lse, ones({6}, DType::F32, d)};
  };
  c.push_back({"cross_entropy_backward", ce_bwd_in,
               [](V& t) { cross_entropy_backward(t[0], t[1], t[2], t[3]); }});
  c.push_back({"cross_entropy_backward_", ce_bwd_in,
               [](V& t) { cross_entropy_backward_(t[0], t[1], t[2], t[3]); }});
  c.push_back({"cross_entropy_fused_",
               [](Device d) {
                 return V{r({6, 10}, 1, d), ids({6}, 10, d)};
               },
               [](V& t) { cross_entropy_fused_(t[0], t[1], 1.f); }});
  c.push_back({"scale_unless_equal_",
               [](Device d) {
                 return V{r({3, 4}, 1, d), r({1}, 2, d)};
               },
               [](V& t) { scale_unless_equal_(t[0], t[1], 1.f); }});
  c.push_back({"concat", two, [](V& t) { concat({t[0], t[1]}, 0); }});
  return c;
}

TEST(CudaMixedDevices, EveryOpNamesTheOperandOnTheOtherDevice) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible";
  for (const Case& c : cases()) {
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
