// autograd::attention_qkv against the composition it replaces (split, reshape to heads,
// transpose, attention, transpose back, reshape): the same bits forward and backward, in f32 and
// bf16, plain and under activation checkpointing. Its finite-difference check is in
// gradcheck_test.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "autograd/checkpoint.h"
#include "autograd/functions.h"
#include "tensor/ops.h"

namespace strata::autograd {
namespace {

namespace tops = ::strata::tensor;

// The unfused composition, as models/gpt2/attention.cpp wrote it before attention_qkv.
Variable composed(const Variable& qkv, int64_t n_head, bool causal) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, D = C / n_head;
  std::vector<Variable> parts = split(qkv, {C, C, C}, -1);
  auto heads = [&](const Variable& t) { return transpose(reshape(t, {B, T, n_head, D}), 1, 2); };
  Variable y = attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), causal);
  return reshape(transpose(y, 1, 2), {B, T, C});
}

std::vector<uint32_t> bits(const Tensor& t) {
  std::vector<float> v = tops::to_float_vector(t);
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

struct Result {
  std::vector<uint32_t> y, dqkv;
};

// y and d(sum(w * y))/d(qkv) for a fresh leaf holding `x`.
template <typename Fn>
Result run(const Tensor& x, const Tensor& w, Fn fn) {
  Variable qkv(x.clone(), true);
  Variable y = fn(qkv);
  EXPECT_EQ(y.dtype(), x.dtype());
  sum_all(mul(y, Variable(w, false))).backward();
  EXPECT_EQ(qkv.grad().dtype(), x.dtype());
  return {bits(y.data()), bits(qkv.grad())};
}

TEST(AttentionQkv, MatchesTheUnfusedCompositionBitwise) {
  struct Shape5 {
    int64_t b, t, h, d;
  };
  uint64_t seed = 10;
  for (DType dt : {DType::F32, DType::BF16})
    for (Shape5 s : {Shape5{2, 7, 3, 4}, Shape5{1, 70, 2, 20}, Shape5{2, 65, 4, 16}})
      for (bool causal : {true, false}) {
        SCOPED_TRACE(fmt::format("{} B={} T={} H={} D={} causal={}", dtype_name(dt), s.b, s.t, s.h,
                                 s.d, causal));
        const int64_t C = s.h * s.d;
        const Tensor x = tops::randn({s.b, s.t, 3 * C}, {++seed, 1}).to(dt);
        const Tensor w = tops::randn({s.b, s.t, C}, {seed, 2}).to(dt);
        const Result want = run(x, w, [&](const Variable& v) { return composed(v, s.h, causal); });
        const Result got =
            run(x, w, [&](const Variable& v) { return attention_qkv(v, s.h, causal); });
        EXPECT_EQ(got.y, want.y);
        EXPECT_EQ(got.dqkv, want.dqkv);
      }
}

TEST(AttentionQkv, OutputIsAViewOfAttentionsBufferAndInputNeedNotBeContiguous) {
  const int64_t B = 2, T = 9, H = 2, D = 8, C = H * D;
  // A transposed qkv (last stride != 1) is made contiguous first: same values as a packed one.
  const Tensor x = tops::randn({B, 3 * C, T}, {3, 1});
  Variable packed(x.transpose(1, 2).contiguous(), true), strided(x.transpose(1, 2), true);
  Variable a = attention_qkv(packed, H, true), b = attention_qkv(strided, H, true);
  EXPECT_TRUE(a.data().is_contiguous());
  EXPECT_EQ(a.shape(), (Shape{B, T, C}));
  EXPECT_EQ(bits(a.data()), bits(b.data()));
}

TEST(AttentionQkv, GivesTheSameGradientsUnderActivationCheckpointing) {
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = tops::randn({2, 33, 3 * 24}, {5, 1}).to(dt);
    const Tensor w = tops::randn({2, 33, 24}, {5, 2}).to(dt);
    auto fn = [](const Variable& v) { return attention_qkv(v, 3, true); };
    const Result plain = run(x, w, fn);
    const Result ckpt = run(x, w, [&](const Variable& v) {
      return checkpoint([&](const std::vector<Variable>& in) { return std::vector{fn(in[0])}; },
                        {v})[0];
    });
    EXPECT_EQ(ckpt.y, plain.y);
    EXPECT_EQ(ckpt.dqkv, plain.dqkv);
  }
}

}  // namespace
}  // namespace strata::autograd
