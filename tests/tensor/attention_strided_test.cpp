// Attention on strided operands (Note [Strided attention operands] in tensor/backend.h): the CPU
// backend reads q, k, v, out, dout and writes out, dq, dk, dv through their strides, in place,
// with the bits of the contiguous call, in f32 and bf16; the op layer hands such views over
// without copying and returns [B, T, H, D] buffers seen as [B, H, T, D].
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "tensor/backend.h"
#include "tensor/ops.h"

namespace strata::tensor {
namespace {

struct Config {
  int64_t b, h, tq, tk, d;
  bool causal;
  float scale;
};

std::string name(const Config& c, DType dt) {
  return fmt::format("B={} H={} Tq={} Tk={} D={} causal={} {}", c.b, c.h, c.tq, c.tk, c.d, c.causal,
                     dtype_name(dt));
}

// Small odd shapes (fully masked rows included), and shapes across the 64-row/64-key blocks with
// D both a multiple of the 16-wide tiles and not (the padded-V path).
const std::vector<Config> kConfigs = {
    {2, 3, 7, 7, 4, true, 0.6f},       {2, 3, 5, 9, 4, false, 0.5f},
    {2, 3, 9, 5, 4, true, 0.7f},       {1, 2, 130, 130, 20, true, 0.25f},
    {1, 2, 70, 150, 64, true, 0.125f}, {2, 2, 65, 65, 32, false, 0.2f},
    {2, 3, 100, 100, 16, true, 0.25f},
};

enum class Layout {
  Contiguous,
  Packed,      // the operands are the slots of one [B, T, n, H, D] buffer (qkv, dqkv)
  HeadsInner,  // a [B, T, H, D] buffer seen as [B, H, T, D]
  WideRows,    // [B, H, T, D + 6] narrowed to D at offset 3: rows D + 6 apart, unaligned
};

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::Contiguous:
      return "contiguous";
    case Layout::Packed:
      return "packed";
    case Layout::HeadsInner:
      return "heads-inner";
    case Layout::WideRows:
      return "wide-rows";
  }
  return "?";
}

// Views of the given [B, H, T, D] shapes laid out as `layout` in NaN-filled buffers (appended
// to `buffers`); Packed needs one T for all.
std::vector<Tensor> views_in(Layout layout, const std::vector<Shape>& shapes, DType dt,
                             std::vector<Tensor>& buffers) {
  std::vector<Tensor> views;
  if (layout == Layout::Packed) {
    const Shape& s = shapes[0];
    const auto n = static_cast<int64_t>(shapes.size());
    Tensor buf = full({s[0], s[2], n, s[1], s[3]}, NAN, dt);
    buffers.push_back(buf);
    for (int64_t i = 0; i < n; ++i) views.push_back(buf.select(2, i).transpose(1, 2));
    return views;
  }
  for (const Shape& s : shapes) {
    Tensor buf;
    if (layout == Layout::Contiguous) {
      buf = full(s, NAN, dt);
      views.push_back(buf);
    } else if (layout == Layout::HeadsInner) {
      buf = full({s[0], s[2], s[1], s[3]}, NAN, dt);
      views.push_back(buf.transpose(1, 2));
    } else {
      buf = full({s[0], s[1], s[2], s[3] + 6}, NAN, dt);
      views.push_back(buf.narrow(3, 3, s[3]));
    }
    buffers.push_back(buf);
  }
  return views;
}

std::vector<uint32_t> bits(const Tensor& t) {
  std::vector<float> v = to_float_vector(t);
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

int64_t count_nan(const Tensor& t) {
  int64_t n = 0;
  for (float x : to_float_vector(t)) n += std::isnan(x) ? 1 : 0;
  return n;
}

struct Outputs {
  Tensor out, lse, dq, dk, dv;
};

// Forward and backward through the CPU backend itself (no op-layer copies) with q, k, v, dout
// taking `in` and out, dq, dk, dv taking `outl`. Checks that the kernels wrote each output view
// fully and nothing of its buffer outside it.
Outputs run_backend(const Config& c, DType dt, Layout in, Layout outl, const Tensor& q,
                    const Tensor& k, const Tensor& v, const Tensor& g) {
  Backend& be = backend_for(Device::cpu());
  const Shape qs{c.b, c.h, c.tq, c.d}, ks{c.b, c.h, c.tk, c.d};
  std::vector<Tensor> in_bufs, out_bufs, grad_bufs;
  const bool square = c.tq == c.tk;
  const Layout kv_in = in == Layout::Packed && !square ? Layout::HeadsInner : in;
  std::vector<Tensor> qkv = views_in(kv_in, {qs, ks, ks}, dt, in_bufs);
  std::vector<Tensor> dout = views_in(in, {qs}, dt, in_bufs);
  qkv[0].copy_(q), qkv[1].copy_(k), qkv[2].copy_(v), dout[0].copy_(g);

  Outputs r;
  r.out = views_in(outl, {qs}, dt, out_bufs)[0];
  r.lse = Tensor::empty({c.b, c.h, c.tq}, DType::F32);
  be.attention_forward(qkv[0], qkv[1], qkv[2], c.causal, c.scale, r.out, r.lse);
  const Layout grad_l = outl == Layout::Packed && !square ? Layout::HeadsInner : outl;
  std::vector<Tensor> d = views_in(grad_l, {qs, ks, ks}, dt, grad_bufs);
  r.dq = d[0], r.dk = d[1], r.dv = d[2];
  be.attention_backward(qkv[0], qkv[1], qkv[2], r.out, r.lse, dout[0], c.causal, c.scale, r.dq,
                        r.dk, r.dv);
  for (const std::vector<Tensor>* bufs : {&out_bufs, &grad_bufs}) {
    int64_t nan = 0, total = 0;
    for (const Tensor& b : *bufs) nan += count_nan(b), total += b.numel();
    const int64_t written = bufs == &out_bufs ? r.out.numel() : 2 * r.dk.numel() + r.dq.numel();
    EXPECT_EQ(nan, total - written) << "outputs written outside (or not all over) their views";
  }
  return r;
}

TEST(AttentionStrided, BackendGivesTheContiguousBitsOnViews) {
  uint64_t seed = 40;
  for (DType dt : {DType::F32, DType::BF16})
    for (const Config& c : kConfigs) {
      ++seed;
      const Tensor q = randn({c.b, c.h, c.tq, c.d}, {seed, 1}, 0.f, 1.5f).to(dt);
      const Tensor k = randn({c.b, c.h, c.tk, c.d}, {seed, 2}, 0.f, 1.5f).to(dt);
      const Tensor v = randn({c.b, c.h, c.tk, c.d}, {seed, 3}).to(dt);
      const Tensor g = randn({c.b, c.h, c.tq, c.d}, {seed, 4}).to(dt);
      const Outputs want = run_backend(c, dt, Layout::Contiguous, Layout::Contiguous, q, k, v, g);
      for (Layout in : {Layout::Contiguous, Layout::Packed, Layout::HeadsInner, Layout::WideRows})
        for (Layout outl : {Layout::Packed, Layout::HeadsInner, Layout::WideRows}) {
          SCOPED_TRACE(name(c, dt) + " in " + layout_name(in) + " out " + layout_name(outl));
          const Outputs got = run_backend(c, dt, in, outl, q, k, v, g);
          EXPECT_EQ(bits(got.out), bits(want.out));
          EXPECT_EQ(bits(got.lse), bits(want.lse));
          EXPECT_EQ(bits(got.dq), bits(want.dq));
          EXPECT_EQ(bits(got.dk), bits(want.dk));
          EXPECT_EQ(bits(got.dv), bits(want.dv));
        }
    }
}

TEST(AttentionStrided, OpsUseUnitStrideViewsInPlace) {
  const int64_t B = 2, T = 37, H = 3, D = 8;
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor qkv = randn({B, T, 3, H, D}, {7, 1}).to(dt);
    const Tensor q = qkv.select(2, 0).transpose(1, 2), k = qkv.select(2, 1).transpose(1, 2),
                 v = qkv.select(2, 2).transpose(1, 2);
    const Tensor g = randn({B, T, H, D}, {7, 2}).to(dt).transpose(1, 2);
    AttentionResult r = attention(q, k, v, true);
    // out is a [B, T, H, D] buffer: merging the heads back is a view.
    EXPECT_TRUE(r.out.transpose(1, 2).is_contiguous());
    AttentionResult want = attention(q.contiguous(), k.contiguous(), v.contiguous(), true);
    EXPECT_EQ(bits(r.out), bits(want.out));
    EXPECT_EQ(bits(r.lse), bits(want.lse));

    AttentionGrads wg = attention_backward(q.contiguous(), k.contiguous(), v.contiguous(),
                                           want.out.contiguous(), want.lse, g.contiguous(), true);
    EXPECT_TRUE(wg.dq.transpose(1, 2).is_contiguous());
    Tensor dqkv = full({B, T, 3, H, D}, NAN, dt);
    attention_backward_into(q, k, v, r.out, r.lse, g, true, 0.f, dqkv.select(2, 0).transpose(1, 2),
                            dqkv.select(2, 1).transpose(1, 2), dqkv.select(2, 2).transpose(1, 2));
    EXPECT_EQ(count_nan(dqkv), 0);
    EXPECT_EQ(bits(dqkv.select(2, 0).transpose(1, 2)), bits(wg.dq));
    EXPECT_EQ(bits(dqkv.select(2, 1).transpose(1, 2)), bits(wg.dk));
    EXPECT_EQ(bits(dqkv.select(2, 2).transpose(1, 2)), bits(wg.dv));

    // A D stride other than 1, and a broadcast (stride 0) head dim, are copied first: same bits.
    const Tensor qt = q.contiguous().transpose(2, 3).contiguous().transpose(2, 3);
    ASSERT_NE(qt.stride(3), 1);
    EXPECT_EQ(bits(attention(qt, k, v, true).out), bits(want.out));
    const Tensor k1 = k.narrow(1, 0, 1).contiguous(), v1 = v.narrow(1, 0, 1).contiguous();
    const Tensor kb = k1.expand({B, H, T, D}), vb = v1.expand({B, H, T, D});
    ASSERT_EQ(kb.stride(1), 0);
    EXPECT_EQ(bits(attention(q, kb, vb, true).out),
              bits(attention(q, kb.contiguous(), vb.contiguous(), true).out));
  }
}

}  // namespace
}  // namespace strata::tensor
