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

namespace strata::tensor {
namespace {

const Device kGpu = Device::cuda(0);

struct Case {
  std::string name;
  std::function<std::vector<Tensor>(Device)> run;
};

// What one run gave: its outputs, or the kind of error it raised.
struct Outcome {
  std::vector<Tensor> outputs;
  std::string error;  // "" | "UserError" | "InternalError" | "other: <what>"
  std::string message;
};

Outcome run_case(const Case& c, Device d) {
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

// Every norm, forward and backward (dy = ds = x), with all its outputs and statistics.
std::vector<Tensor> all_norms(const Tensor& x, const Tensor& w, const Tensor& b) {
  NormResult ln = layernorm(x, w, b, 1e-5f);
  LayerNormGrads lg = layernorm_backward(x, x, w, ln.mean, ln.rstd);
  NormResult rn = rmsnorm(x, w, 1e-5f);
  RmsNormGrads rg = rmsnorm_backward(x, x, w, rn.rstd);
  AddNormResult al = add_layernorm(x, x, w, b, 1e-5f);
  LayerNormGrads alg = add_layernorm_backward(x, x, al.s, w, al.mean, al.rstd);
  AddNormResult ar = add_rmsnorm(x, x, w, 1e-5f);
  RmsNormGrads arg = add_rmsnorm_backward(x, Tensor(), ar.s, w, ar.rstd);
  return {ln.y,      ln.mean,    ln.rstd, lg.dx,   lg.dweight, lg.dbias,   rn.y,   rn.rstd,
          rg.dx,     rg.dweight, al.s,    al.y,    al.mean,    al.rstd,    alg.dx, alg.dweight,
          alg.dbias, ar.s,       ar.y,    ar.rstd, arg.dx,     arg.dweight};
}

std::vector<Case> cases(DType dt) {
  auto z = [dt](const Shape& s, Device d) { return zeros(s, dt, d); };
  auto r = [dt](const Shape& s, uint64_t stream, Device d) {
    return uniform(s, {7, stream}, -1.f, 1.f).to(dt).to(d);
  };
  auto f32 = [](const Shape& s, Device d) { return ones(s, DType::F32, d); };
  std::vector<Case> c;
  c.push_back({"binary", [=](Device d) {
                 const Tensor a = z({0, 5}, d), b = r({5}, 1, d);
                 return std::vector<Tensor>{add(a, b), sub(a, a), mul(b, a), div(a, b),
                                            add(z({3, 0}, d), z({0}, d))};
               }});
  c.push_back({"axpy_unary", [=](Device d) {
                 Tensor y = z({0, 4}, d);
                 axpy_(2.f, z({0, 4}, d), y);
                 return std::vector<Tensor>{
                     y, gelu(z({0, 3}, d)),
                     unary_backward(UnaryOp::Silu, z({2, 0}, d), z({2, 0}, d)),
                     bias_add(z({0, 4}, d), r({4}, 2, d)), dropout(z({0, 4}, d), 0.5f, {1, 2})};
               }});
  c.push_back({"reductions", [=](Device d) {
                 return std::vector<Tensor>{
                     sum(z({0, 3}, d), 0),
                     sum(z({3, 0}, d), 1),
                     mean(z({0, 3}, d), 1),
                     sum_to(z({0, 6}, d), {6}),
                     sum_to(z({5, 0}, d), {0}),
                     from_vector({static_cast<float>(sum_squares(z({0, 7}, d)))}, {1})};
               }});
  c.push_back({"sum_squares_many", [=](Device d) {
                 const std::vector<double> s = sum_squares_many({z({0}, d), r({9}, 3, d)});
                 return std::vector<Tensor>{
                     from_vector({static_cast<float>(s[0]), static_cast<float>(s[1])}, {2})};
               }});
  c.push_back({"max_empty_dim", [=](Device d) {
                 MaxResult m = max(z({3, 0}, d), 1);
                 return std::vector<Tensor>{m.values, m.indices.to(DType::F32)};
               }});
  c.push_back({"max_no_rows", [=](Device d) {
                 MaxResult m = max(z({0, 4}, d), 1);
                 return std::vector<Tensor>{m.values, m.indices.to(DType::F32)};
               }});
  c.push_back({"matmul", [=](Device d) {
                 Tensor o = r({3, 5}, 4, d);
                 matmul_out(z({3, 0}, d), z({0, 5}, d), o, false, false, 1.f, 0.5f);
                 return std::vector<Tensor>{matmul(z({0, 4}, d), r({4, 5}, 5, d)),
                                            matmul(z({3, 0}, d), z({0, 5}, d)),
                                            matmul(r({3, 4}, 6, d), z({4, 0}, d)),
                                            matmul(z({2, 0, 4}, d), r({4, 5}, 7, d)), o};
               }});
  const auto w = [=](Device d) { return r({5, 4}, 8, d); };
  const auto b = [=](Device d) { return r({5}, 9, d); };
  c.push_back({"linear", [=](Device d) {
                 return std::vector<Tensor>{linear(z({0, 4}, d), w(d), b(d)).y,
                                            linear(z({2, 0, 4}, d), w(d), Tensor()).y};
               }});
  c.push_back({"linear_gelu", [=](Device d) {
                 LinearResult g = linear(z({0, 4}, d), w(d), b(d), Activation::Gelu, true);
                 return std::vector<Tensor>{g.y, g.pre};
               }});
  c.push_back({"linear_no_features", [=](Device d) {  // K = 0: y = bias; N = 0: no outputs
                 LinearResult g = linear(z({3, 0}, d), z({5, 0}, d), b(d), Activation::Gelu, true);
                 return std::vector<Tensor>{linear(z({3, 0}, d), z({5, 0}, d), b(d)).y,
                                            linear(z({3, 0}, d), z({5, 0}, d), Tensor()).y, g.y,
                                            g.pre,
                                            linear(r({3, 4}, 11, d), z({0, 4}, d), z({0}, d)).y};
               }});
  c.push_back(
      {"linear_backward_no_features", [=](Device d) {
         LinearWeightGrads k0 = linear_backward_weight(r({3, 5}, 17, d), z({3, 0}, d), true);
         LinearWeightGrads n0 = linear_backward_weight(z({3, 0}, d), r({3, 4}, 18, d), true);
         LinearGeluGrads gg =
             linear_backward_gelu(r({3, 5}, 19, d), z({5, 0}, d), z({3, 0}, d), true);
         LinearGeluGrads p0 =
             linear_backward_gelu(z({3, 0}, d), z({0, 4}, d), r({3, 4}, 20, d), true);
         return std::vector<Tensor>{k0.dweight, k0.dbias, n0.dweight, n0.dbias,
                                    gg.dpre,    gg.dbias, p0.dpre,    p0.dbias};
       }});
  c.push_back({"linear_backward_weight", [=](Device d) {
                 LinearWeightGrads wg = linear_backward_weight(z({0, 5}, d), z({0, 4}, d), true);
                 return std::vector<Tensor>{wg.dweight, wg.dbias};
               }});
  c.push_back({"linear_backward_weight_into", [=](Device d) {
                 Tensor into = r({5, 4}, 10, d);
                 Tensor db = linear_backward_weight_into(z({0, 5}, d), z({0, 4}, d), into, true);
                 return std::vector<Tensor>{into, db};
               }});
  c.push_back({"linear_backward_gelu", [=](Device d) {
                 LinearGeluGrads gg = linear_backward_gelu(z({0, 5}, d), w(d), z({0, 4}, d), true);
                 return std::vector<Tensor>{gg.dpre, gg.dbias};
               }});
  c.push_back({"norms", [=](Device d) {
                 return all_norms(z({0, 8}, d), r({8}, 12, d), r({8}, 13, d));
               }});
  // No features: empty outputs, [0] weight gradients, NaN statistics (the mean of nothing), and
  // no kernel called (Note [Norms over no features] in tensor/ops.cpp).
  c.push_back({"norms_no_features", [=](Device d) {
                 return all_norms(z({3, 0}, d), z({0}, d), z({0}, d));
               }});
  c.push_back({"softmax_no_features", [=](Device d) {
                 const Tensor y = softmax(z({3, 0}, d));
                 return std::vector<Tensor>{y, softmax_backward(y, z({3, 0}, d))};
               }});
  c.push_back({"softmax", [=](Device d) {
                 const Tensor y = softmax(z({0, 5}, d));
                 return std::vector<Tensor>{y, softmax_backward(y, z({0, 5}, d))};
               }});
  for (const Shape& s : {Shape{0, 2, 4, 64}, Shape{1, 0, 4, 64}, Shape{1, 2, 0, 64}})
    c.push_back({"attention " + s.str(), [=](Device d) {
                   const Tensor q = z(s, d);
                   AttentionResult a = attention(q, q, q, true);
                   AttentionGrads g = attention_backward(q, q, q, a.out, a.lse, q, true);
                   return std::vector<Tensor>{a.out, a.lse, g.dq, g.dk, g.dv};
                 }});
  c.push_back({"attention_no_keys", [=](Device d) {  // queries, but no key to attend to
                 const Tensor q = r({1, 2, 3, 64}, 21, d), kv = z({1, 2, 0, 64}, d);
                 AttentionResult a = attention(q, kv, kv, false);
                 AttentionGrads g =
                     attention_backward(q, kv, kv, a.out, a.lse, r({1, 2, 3, 64}, 22, d), false);
                 return std::vector<Tensor>{a.out, a.lse, g.dq, g.dk, g.dv};
               }});
  c.push_back({"rotary", [=](Device d) {
                 auto [cos, sin] = rotary_tables(4, 8, 10000.0, 0, d);
                 return std::vector<Tensor>{rotary(z({0, 4, 2, 8}, d), cos.to(dt), sin.to(dt))};
               }});
  c.push_back({"embedding", [=](Device d) {
                 const Tensor ids = zeros({0}, DType::I32, d);
                 Tensor dw = r({10, 4}, 14, d);
                 embedding_backward(ids, z({0, 4}, d), dw);
                 return std::vector<Tensor>{
                     embedding(r({10, 4}, 15, d), ids),
                     embedding(r({10, 4}, 15, d), zeros({2, 0}, DType::I64, d)), dw};
               }});
  c.push_back(
      {"cross_entropy", [=](Device d) {
         const Tensor logits = z({0, 10}, d), t = zeros({0}, DType::I64, d);
         CrossEntropyResult ce = cross_entropy(logits, t);
         Tensor in_place = z({0, 10}, d);
         cross_entropy_backward_(in_place, t, ce.lse, f32({0}, d));
         Tensor fused = z({0, 10}, d);
         CrossEntropyResult fr = cross_entropy_fused_(fused, t, 1.f);
         return std::vector<Tensor>{
             ce.losses, ce.lse, ce.norm,   cross_entropy_backward(logits, t, ce.lse, f32({0}, d)),
             in_place,  fused,  fr.losses, fr.norm};
       }});
  c.push_back(
      {"concat_split", [=](Device d) {
         const Tensor a = r({2, 3}, 16, d);
         std::vector<Tensor> out{concat({a, z({0, 3}, d), a}, 0), concat({z({2, 0}, d), a}, 1)};
         for (const Tensor& p : split(a, {0, 2, 0, 1, 0}, 1)) out.push_back(p);
         return out;
       }});
  return c;
}

TEST(CudaEmptyShapes, EveryOpDoesWhatTheCpuDoes) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible";
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case& c : cases(dt)) {
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

}  // namespace
}  // namespace strata::tensor
