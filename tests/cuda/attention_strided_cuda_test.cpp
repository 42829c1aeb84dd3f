// CUDA attention on strided operands (Note [Strided attention operands] in tensor/backend.h):
// q, k, v as views of one packed [B, T, 3, H, D] buffer, out as a [B, T, H, D] buffer, dq, dk, dv
// as views of one packed gradient buffer, and rows with padding between them. The own kernels
// (SIMT, and tensor cores for bf16/f16 with D 64 or 128) must give the bits of their contiguous
// call and agree with the CPU backend; cuDNN (bf16/f16) must take
// the packed views itself and agree with the CPU backend, and hand layouts it cannot describe to
// the own kernel. Every test skips itself without a GPU (cuDNN ones also without cuDNN).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "tensor/backend.h"
#include "tensor/cuda.h"
#include "tensor/cuda/cudnn_sdpa.h"
#include "tensor/cuda/kernels.h"
#include "tensor/ops.h"
#include "tests/cuda/attention_test_util.h"

namespace strata::tensor::cuda {
namespace {

const Device kGpu = Device::cuda(0);

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible"

#define SKIP_WITHOUT_CUDNN() \
  SKIP_WITHOUT_GPU();        \
  if (std::string why_; !cudnn_loaded(&why_)) GTEST_SKIP() << "cuDNN: " << why_

struct Problem {
  int64_t b, h, tq, tk, d;
  bool causal;
};

std::string name(DType dt, const Problem& p) {
  return fmt::format("{} B={} H={} Tq={} Tk={} D={}{}", dtype_name(dt), p.b, p.h, p.tq, p.tk, p.d,
                     p.causal ? " causal" : "");
}

enum class Layout {
  Contiguous,
  Packed,      // the slots of one [B, T, n, H, D] buffer (falls back to HeadsInner if Tq != Tk)
  HeadsInner,  // a [B, T, H, D] buffer seen as [B, H, T, D]
  WideRows,    // [B, H, T, D + 6] narrowed at offset 3: unaligned rows, cuDNN must refuse
  // A contiguous [B, H, T, D] one element into its buffer: every stride a multiple of the
  // 128-bit pack but no row 16-byte aligned, so only the pointer test keeps the kernels off
  // their pack loads (which the emulator's alignment check, like the GPU, would stop at).
  Shifted,
};

// Views of the [B, H, T, D] shapes in `layout`, in NaN-filled buffers on `dev` (appended to
// `buffers`).
std::vector<Tensor> views_in(Layout layout, const std::vector<Shape>& shapes, DType dt, Device dev,
                             std::vector<Tensor>& buffers) {
  std::vector<Tensor> views;
  bool same_t = true;
  for (const Shape& s : shapes) same_t = same_t && s[2] == shapes[0][2];
  if (layout == Layout::Packed && !same_t) layout = Layout::HeadsInner;
  if (layout == Layout::Packed) {
    const Shape& s = shapes[0];
    const auto n = static_cast<int64_t>(shapes.size());
    Tensor buf = full({s[0], s[2], n, s[1], s[3]}, NAN, dt, dev);
    buffers.push_back(buf);
    for (int64_t i = 0; i < n; ++i) views.push_back(buf.select(2, i).transpose(1, 2));
    return views;
  }
  for (const Shape& s : shapes) {
    Tensor buf;
    if (layout == Layout::Contiguous) {
      buf = full(s, NAN, dt, dev);
      views.push_back(buf);
    } else if (layout == Layout::Shifted) {
      buf = full({s[0] * s[1] * s[2] * s[3] + 1}, NAN, dt, dev);
      views.push_back(buf.narrow(0, 1, buf.numel() - 1).view(s));
    } else if (layout == Layout::HeadsInner) {
      buf = full({s[0], s[2], s[1], s[3]}, NAN, dt, dev);
      views.push_back(buf.transpose(1, 2));
    } else {
      buf = full({s[0], s[1], s[2], s[3] + 6}, NAN, dt, dev);
      views.push_back(buf.narrow(3, 3, s[3]));
    }
    buffers.push_back(buf);
  }
  return views;
}

int64_t count_nan(const Tensor& t) {
  int64_t n = 0;
  for (float x : to_float_vector(t)) n += std::isnan(x) ? 1 : 0;
  return n;
}

struct Outputs {
  Tensor out, lse, dq, dk, dv;
  AttentionPath forward_path = AttentionPath::None, backward_path = AttentionPath::None;
};

// Host inputs q, k, v, dout of problem p in dtype dt.
std::vector<Tensor> host_inputs(const Problem& p, DType dt) {
  auto make = [&](int64_t t, uint64_t stream) {
    return uniform({p.b, p.h, t, p.d}, {17, stream}, -1.f, 1.f).to(dt);
  };
  return {make(p.tq, 1), make(p.tk, 2), make(p.tk, 3), make(p.tq, 4)};
}

// Forward and backward through `dev`'s backend with the inputs in layout `in` and the outputs in
// layout `outl`; checks each output buffer was written inside its views only, and fully.
Outputs run(Device dev, const Problem& p, DType dt, const std::vector<Tensor>& host, Layout in,
            Layout outl) {
  Backend& be = backend_for(dev);
  const Shape qs{p.b, p.h, p.tq, p.d}, ks{p.b, p.h, p.tk, p.d};
  std::vector<Tensor> in_bufs, out_bufs, grad_bufs;
  std::vector<Tensor> qkv = views_in(in, {qs, ks, ks}, dt, dev, in_bufs);
  Tensor dout = views_in(in, {qs}, dt, dev, in_bufs)[0];
  for (int i = 0; i < 3; ++i) qkv[i].copy_(host[i]);
  dout.copy_(host[3]);
  const float scale = 1.f / std::sqrt(static_cast<float>(p.d));

  Outputs r;
  r.out = views_in(outl, {qs}, dt, dev, out_bufs)[0];
  r.lse = Tensor::empty({p.b, p.h, p.tq}, DType::F32, dev);
  set_last_attention_path(AttentionPath::None);
  be.attention_forward(qkv[0], qkv[1], qkv[2], p.causal, scale, r.out, r.lse);
  r.forward_path = last_attention_path();
  std::vector<Tensor> d = views_in(outl, {qs, ks, ks}, dt, dev, grad_bufs);
  r.dq = d[0], r.dk = d[1], r.dv = d[2];
  set_last_attention_path(AttentionPath::None);
  be.attention_backward(qkv[0], qkv[1], qkv[2], r.out, r.lse, dout, p.causal, scale, r.dq, r.dk,
                        r.dv);
  r.backward_path = last_attention_path();
  int64_t nan = 0, total = 0;
  for (const Tensor& b : out_bufs) nan += count_nan(b), total += b.numel();
  EXPECT_EQ(nan, total - r.out.numel()) << "out written outside (or not all over) its view";
  nan = total = 0;
  for (const Tensor& b : grad_bufs) nan += count_nan(b), total += b.numel();
  EXPECT_EQ(nan, total - r.dq.numel() - r.dk.numel() - r.dv.numel())
      << "dq, dk, dv written outside (or not all over) their views";
  return r;
}

// The CPU backend in f32 on the same (rounded) values: the reference.
Outputs cpu_reference(const Problem& p, const std::vector<Tensor>& host) {
  std::vector<Tensor> f32;
  for (const Tensor& t : host) f32.push_back(t.to(DType::F32));
  return run(Device::cpu(), p, DType::F32, f32, Layout::Contiguous, Layout::Contiguous);
}

// max |got - ref| <= tol * max |ref|, one number per tensor. An infinite reference value (the
// lse -inf of a causal row with no key, Tq > Tk) must be matched exactly.
void expect_close(const char* what, const Tensor& got, const Tensor& ref, double tol) {
  const std::vector<float> a = to_float_vector(got), b = to_float_vector(ref);
  ASSERT_EQ(a.size(), b.size()) << what;
  double err = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(b[i])) {
      ASSERT_EQ(a[i], b[i]) << what << "[" << i << "]";
      continue;
    }
    ASSERT_TRUE(std::isfinite(a[i])) << what << "[" << i << "] = " << a[i];
    err = std::max(err, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  EXPECT_LE(err, tol * std::max(scale, 1e-6))
      << what << ": max error " << err << " against max |ref| " << scale;
}

void expect_close(const Outputs& got, const Outputs& ref, double tol) {
  expect_close("out", got.out, ref.out, tol);
  expect_close("lse", got.lse, ref.lse, 1e-3);
  expect_close("dq", got.dq, ref.dq, tol);
  expect_close("dk", got.dk, ref.dk, tol);
  expect_close("dv", got.dv, ref.dv, tol);
}

std::vector<float> bits_of(const Tensor& t) {
  return to_float_vector(t);  // exact for every float dtype; compared with operator==
}

// Tolerance against the f32 CPU reference: the GPU rounds its outputs (and cuDNN P and dS) to dt.
double tolerance(DType dt) {
  return dt == DType::F32 ? 1e-4 : dt == DType::BF16 ? 2e-2 : 1e-2;
}

// The SIMT kernel's shapes (f32 always, and head dims the tensor-core kernel is not built for),
// then the tensor-core kernel's (bf16/f16 with D 64 or 128, Note [CUDA tensor-core attention]):
// tails in every tile, fewer queries than keys, and more (causal rows that see no key).
const std::vector<Problem> kOwnProblems = {
    {2, 2, 33, 33, 16, true},   {2, 2, 33, 33, 16, false}, {1, 2, 24, 40, 64, true},
    {2, 3, 100, 100, 64, true}, {1, 2, 70, 70, 64, false}, {1, 2, 40, 100, 64, false},
    {1, 2, 48, 20, 64, true},   {1, 2, 40, 40, 128, true},
};

// The own kernel attention takes for dtype dt and head dim d (STRATA_ATTENTION=own).
AttentionPath own_path(DType dt, int64_t d) {
  return dt != DType::F32 && (d == 64 || d == 128) ? AttentionPath::OwnTensorCore
                                                   : AttentionPath::Own;
}

TEST(StridedAttentionCuda, OwnKernelOnViewsGivesItsContiguousBitsAndMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  ScopedAttentionMode m("own");
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (const Problem& p : kOwnProblems) {
      SCOPED_TRACE(name(dt, p));
      const std::vector<Tensor> host = host_inputs(p, dt);
      const Outputs want = run(kGpu, p, dt, host, Layout::Contiguous, Layout::Contiguous);
      EXPECT_EQ(want.forward_path, own_path(dt, p.d));
      EXPECT_EQ(want.backward_path, own_path(dt, p.d));
      expect_close(want, cpu_reference(p, host), tolerance(dt));
      for (Layout in : {Layout::Packed, Layout::WideRows, Layout::Shifted})
        for (Layout outl :
             {Layout::Packed, Layout::HeadsInner, Layout::WideRows, Layout::Shifted}) {
          SCOPED_TRACE(fmt::format("layouts {} {}", static_cast<int>(in), static_cast<int>(outl)));
          const Outputs got = run(kGpu, p, dt, host, in, outl);
          // Only the addresses differ: the same arithmetic in the same order.
          EXPECT_EQ(bits_of(got.out), bits_of(want.out));
          EXPECT_EQ(bits_of(got.lse), bits_of(want.lse));
          EXPECT_EQ(bits_of(got.dq), bits_of(want.dq));
          EXPECT_EQ(bits_of(got.dk), bits_of(want.dk));
          EXPECT_EQ(bits_of(got.dv), bits_of(want.dv));
        }
    }
}

// The tensor-core kernel against the SIMT kernel on the same device and inputs (STRATA_ATTENTION
// own vs simt): both within the reference tolerance of each other, and simt really is the SIMT
// path.
TEST(StridedAttentionCuda, TensorCoreKernelAgreesWithTheSimtKernel) {
  SKIP_WITHOUT_GPU();
  for (DType dt : {DType::BF16, DType::F16})
    for (const Problem& p :
         {Problem{2, 3, 100, 100, 64, true}, Problem{1, 2, 40, 40, 128, false}}) {
      SCOPED_TRACE(name(dt, p));
      const std::vector<Tensor> host = host_inputs(p, dt);
      Outputs tc, simt;
      {
        ScopedAttentionMode m("own");
        tc = run(kGpu, p, dt, host, Layout::Packed, Layout::HeadsInner);
      }
      {
        ScopedAttentionMode m("simt");
        simt = run(kGpu, p, dt, host, Layout::Packed, Layout::HeadsInner);
      }
      EXPECT_EQ(tc.forward_path, AttentionPath::OwnTensorCore);
      EXPECT_EQ(simt.forward_path, AttentionPath::Own);
      EXPECT_EQ(simt.backward_path, AttentionPath::Own);
      expect_close(tc, simt, tolerance(dt));
    }
}

// Decode steps (Tq <= 16 < Tk, Note [CUDA decode attention]): the split-key forward, in runs of
// 32 keys and more, merged in run order. One query against 1000 keys (32 runs), rows whose
// causal limit leaves later runs empty (Tq 16 against 40 keys), key counts that end inside a
// chunk, head dims 32, 64 and 128. Against the CPU, and every layout gives the contiguous call's
// bits (the backward after it is the training kernels').
TEST(StridedAttentionCuda, DecodeStepsSplitTheKeysAndMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  ScopedAttentionMode m("own");
  const std::vector<Problem> problems = {
      {1, 2, 1, 1000, 64, true}, {2, 3, 1, 77, 64, false}, {1, 2, 16, 40, 64, true},
      {1, 2, 5, 300, 128, true}, {2, 2, 3, 33, 32, true},  {3, 1, 1, 2, 64, false},
  };
  EXPECT_EQ(attention_decode_splits(2, 1000, 132).splits, 32);
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (const Problem& p : problems) {
      SCOPED_TRACE(name(dt, p));
      const std::vector<Tensor> host = host_inputs(p, dt);
      const Outputs want = run(kGpu, p, dt, host, Layout::Contiguous, Layout::Contiguous);
      EXPECT_EQ(want.forward_path, AttentionPath::OwnDecode);
      EXPECT_EQ(want.backward_path, own_path(dt, p.d));
      expect_close(want, cpu_reference(p, host), tolerance(dt));
      for (Layout in : {Layout::Packed, Layout::WideRows, Layout::Shifted})
        for (Layout outl : {Layout::HeadsInner, Layout::WideRows, Layout::Shifted}) {
          SCOPED_TRACE(fmt::format("layouts {} {}", static_cast<int>(in), static_cast<int>(outl)));
          const Outputs got = run(kGpu, p, dt, host, in, outl);
          EXPECT_EQ(got.forward_path, AttentionPath::OwnDecode);
          EXPECT_EQ(bits_of(got.out), bits_of(want.out));
          EXPECT_EQ(bits_of(got.lse), bits_of(want.lse));
          EXPECT_EQ(bits_of(got.dq), bits_of(want.dq));
        }
    }
}

// STRATA_ATTENTION=simt keeps decode steps on the SIMT kernel; the two agree. Head dims the
// decode kernel is not built for (16) and prefills (Tq = Tk) do not take it.
TEST(StridedAttentionCuda, DecodeKernelAgreesWithTheSimtKernelAndKeepsToDecodeShapes) {
  SKIP_WITHOUT_GPU();
  for (DType dt : {DType::F32, DType::BF16}) {
    const Problem p{2, 3, 2, 500, 64, true};
    SCOPED_TRACE(name(dt, p));
    const std::vector<Tensor> host = host_inputs(p, dt);
    Outputs decode, simt;
    {
      ScopedAttentionMode m(nullptr);  // auto: decode steps skip cuDNN
      decode = run(kGpu, p, dt, host, Layout::Contiguous, Layout::Contiguous);
    }
    {
      ScopedAttentionMode m("simt");
      simt = run(kGpu, p, dt, host, Layout::Contiguous, Layout::Contiguous);
    }
    EXPECT_EQ(decode.forward_path, AttentionPath::OwnDecode);
    EXPECT_EQ(simt.forward_path, AttentionPath::Own);
    expect_close("out", decode.out, simt.out, tolerance(dt));
    expect_close("lse", decode.lse, simt.lse, 1e-3);
  }
  ScopedAttentionMode m("own");
  for (const Problem& p : {Problem{1, 2, 1, 40, 16, true}, Problem{1, 2, 8, 8, 64, true},
                           Problem{1, 2, 17, 40, 64, true}}) {
    SCOPED_TRACE(name(DType::BF16, p));
    const std::vector<Tensor> host = host_inputs(p, DType::BF16);
    const Outputs got = run(kGpu, p, DType::BF16, host, Layout::Contiguous, Layout::Contiguous);
    EXPECT_EQ(got.forward_path, own_path(DType::BF16, p.d));
    expect_close(got, cpu_reference(p, host), tolerance(DType::BF16));
  }
}

// How the keys are cut (no GPU needed): whole chunks of 32, every key in exactly one run, about
// 16 warps per multiprocessor where the keys allow it, one run when the rows alone fill the
// device.
TEST(AttentionDecodeSplits, CutTheKeysIntoRunsOfWholeChunks) {
  const DecodeSplits one = attention_decode_splits(2, 1000, 132);
  EXPECT_EQ(one.keys, 32);
  EXPECT_EQ(one.splits, 32);  // 2 rows x 32 runs: the keys allow no more
  const DecodeSplits xl = attention_decode_splits(25, 640, 132);  // GPT-2 1558M, one sample
  EXPECT_EQ(xl.keys, 32);
  EXPECT_EQ(xl.splits, 20);
  const DecodeSplits batch = attention_decode_splits(200, 640, 132);  // eight samples
  EXPECT_EQ(batch.keys, 64);
  EXPECT_EQ(batch.splits, 10);
  const DecodeSplits full = attention_decode_splits(100000, 5000, 132);
  EXPECT_EQ(full.splits, 1);
  EXPECT_GE(full.keys, 5000);
  for (int64_t rows : {1, 3, 25, 132, 2112, 5000})
    for (int64_t tk : {2, 31, 32, 33, 100, 1000, 4097})
      for (int sms : {1, 108, 132}) {
        SCOPED_TRACE(fmt::format("rows {} tk {} sms {}", rows, tk, sms));
        const DecodeSplits s = attention_decode_splits(rows, tk, sms);
        EXPECT_EQ(s.keys % 32, 0);
        EXPECT_GE(s.keys, 32);
        EXPECT_GE(s.splits * s.keys, tk);        // every key in a run
        EXPECT_LT((s.splits - 1) * s.keys, tk);  // no empty run
        const int64_t chunks = (tk + 31) / 32, want = int64_t{16} * sms;
        // As many runs as the keys and the device call for (within rounding to whole chunks).
        EXPECT_GE(s.splits * rows, std::min(chunks * rows, want) / 2);
        EXPECT_LE(s.splits, chunks);
      }
}

// The tensor-core kernel's grid has the heads in y and the batch in z, which hold at most 65535
// each (attention_tc_fits): a larger batch takes the SIMT kernel, whose grid is 1-D, and still
// matches the CPU (it was an invalid launch configuration, an internal error).
TEST(StridedAttentionCuda, BatchesBeyondTheTensorCoreGridTakeTheSimtKernel) {
  SKIP_WITHOUT_GPU();
  ScopedAttentionMode m("own");
  const Problem p{65536, 1, 2, 2, 64, true};
  const DType dt = DType::BF16;
  const std::vector<Tensor> host = host_inputs(p, dt);
  const Outputs got = run(kGpu, p, dt, host, Layout::Contiguous, Layout::Contiguous);
  EXPECT_EQ(got.forward_path, AttentionPath::Own);
  EXPECT_EQ(got.backward_path, AttentionPath::Own);
  expect_close(got, cpu_reference(p, host), tolerance(dt));
}

// GPT-2's layout: q, k, v in one [B, T, 3, H, D] buffer, out [B, T, H, D], dq, dk, dv in one
// [B, T, 3, H, D] buffer; cuDNN must run on these views itself.
// Where a known limit of the loaded cuDNN applies (Note [cuDNN SDPA limits]), that direction
// must take the own kernel instead, within the same tolerance.
TEST(StridedAttentionCuda, CudnnTakesPackedQkvViewsAndMatchesTheCpu) {
  SKIP_WITHOUT_CUDNN();
  for (DType dt : {DType::BF16, DType::F16})
    for (const Problem& p : {Problem{2, 3, 128, 128, 64, true}, Problem{2, 4, 200, 200, 64, false},
                             Problem{1, 2, 64, 64, 128, true}}) {
      SCOPED_TRACE(name(dt, p));
      const bool fwd_cudnn = cudnn_runs_here(p.tq, p.tk, p.d, p.causal, false);
      const bool bwd_cudnn = cudnn_runs_here(p.tq, p.tk, p.d, p.causal, true);
      ScopedAttentionMode m(fwd_cudnn && bwd_cudnn ? "cudnn" : "auto");
      const std::vector<Tensor> host = host_inputs(p, dt);
      const Outputs ref = cpu_reference(p, host);
      for (Layout outl : {Layout::Packed, Layout::HeadsInner}) {
        const Outputs got = run(kGpu, p, dt, host, Layout::Packed, outl);
        EXPECT_EQ(got.forward_path == AttentionPath::Cudnn, fwd_cudnn);
        EXPECT_EQ(got.backward_path == AttentionPath::Cudnn, bwd_cudnn);
        expect_close(got, ref, tolerance(dt));
      }
    }
}

// Rows that do not start 16-byte aligned cannot be described to cuDNN: auto falls back to the own
// kernel (and gives its contiguous bits), and the refusal names the reason.
TEST(StridedAttentionCuda, UnalignedViewsFallBackToTheOwnKernel) {
  SKIP_WITHOUT_GPU();
  const Problem p{1, 2, 64, 64, 64, true};
  const DType dt = DType::BF16;
  const std::vector<Tensor> host = host_inputs(p, dt);
  Outputs own;
  {
    ScopedAttentionMode m("own");
    own = run(kGpu, p, dt, host, Layout::Contiguous, Layout::Contiguous);
  }
  ScopedAttentionMode m("auto");
  for (Layout layout : {Layout::WideRows, Layout::Shifted}) {
    SCOPED_TRACE(static_cast<int>(layout));
    const Outputs got = run(kGpu, p, dt, host, layout, layout);
    EXPECT_EQ(got.forward_path, own_path(dt, p.d));
    EXPECT_EQ(got.backward_path, own_path(dt, p.d));
    EXPECT_EQ(bits_of(got.out), bits_of(own.out));
    EXPECT_EQ(bits_of(got.dq), bits_of(own.dq));
  }

  std::vector<Tensor> bufs;
  const Shape s{p.b, p.h, p.tq, p.d};
  std::vector<Tensor> v = views_in(Layout::WideRows, {s, s, s, s}, dt, kGpu, bufs);
  Tensor lse = Tensor::empty({p.b, p.h, p.tq}, DType::F32, kGpu);
  std::string why;
  EXPECT_FALSE(cudnn_sdpa_forward(nullptr, v[0], v[1], v[2], true, 0.125f, v[3], lse, &why));
  EXPECT_TRUE(why.find("16-byte aligned") != std::string::npos ||
              why.find("multiple of 8") != std::string::npos)
      << why;
  v = views_in(Layout::Shifted, {s, s, s, s}, dt, kGpu, bufs);  // strides fine, pointers not
  why.clear();
  EXPECT_FALSE(cudnn_sdpa_forward(nullptr, v[0], v[1], v[2], true, 0.125f, v[3], lse, &why));
  EXPECT_NE(why.find("16-byte aligned"), std::string::npos) << why;
}

// The op layer: views of a packed qkv go to the backend as they are, out comes back as a
// [B, T, H, D] buffer, and attention_backward_into fills a packed dqkv.
TEST(StridedAttentionCuda, OpsOnPackedQkvMatchTheCpuOps) {
  SKIP_WITHOUT_GPU();
  const int64_t B = 2, T = 40, H = 2, D = 16;
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor qkv_host = uniform({B, T, 3, H, D}, {23, 1}, -1.f, 1.f).to(dt);
    const Tensor g_host = uniform({B, T, H, D}, {23, 2}, -1.f, 1.f).to(dt);
    auto heads = [](const Tensor& packed, int i) { return packed.select(2, i).transpose(1, 2); };
    auto grads = [&](Device dev) {
      const Tensor qkv = qkv_host.to(dev), g = g_host.to(dev).transpose(1, 2);
      AttentionResult r = attention(heads(qkv, 0), heads(qkv, 1), heads(qkv, 2), true);
      EXPECT_TRUE(r.out.transpose(1, 2).is_contiguous());
      Tensor dqkv = full({B, T, 3, H, D}, NAN, dt, dev);
      attention_backward_into(heads(qkv, 0), heads(qkv, 1), heads(qkv, 2), r.out, r.lse, g, true,
                              0.f, heads(dqkv, 0), heads(dqkv, 1), heads(dqkv, 2));
      return std::vector<Tensor>{r.out, r.lse, dqkv};
    };
    const std::vector<Tensor> gpu = grads(kGpu), cpu = grads(Device::cpu());
    EXPECT_EQ(count_nan(gpu[2]), 0);
    expect_close("out", gpu[0], cpu[0], tolerance(dt));
    expect_close("lse", gpu[1], cpu[1], 1e-3);
    expect_close("dqkv", gpu[2], cpu[2], tolerance(dt));
  }
}

}  // namespace
}  // namespace strata::tensor::cuda
