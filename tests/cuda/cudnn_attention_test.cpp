// cuDNN fused attention (tensor/cuda/cudnn_sdpa.cpp, Note [cuDNN SDPA]) against the CPU backend,
// and the STRATA_ATTENTION switch. The first tests need no GPU (the mode, and refusals that come
// before any device access); the rest skip themselves without a GPU or a loadable cuDNN.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "tensor/backend.h"
#include "tensor/cuda.h"
#include "tensor/cuda/cudnn_sdpa.h"
#include "tensor/tensor.h"
#include "tests/cuda/attention_test_util.h"

namespace strata::tensor::cuda {
namespace {

const Device kGpu = Device::cuda(0);

// The message of the UserError `f` raises ("" and a test failure when it raises none).
template <typename F>
std::string user_error_of(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a UserError";
  return "";
}

// Attention inputs on the host.
struct Inputs {
  Tensor q, k, v, dout;
};
Inputs host_inputs(int64_t b, int64_t h, int64_t tq, int64_t tk, int64_t d, DType dt) {
  auto make = [&](const Shape& s, uint64_t stream) {
    return uniform(s, {7, stream}, -1.f, 1.f).to(dt);
  };
  return {make({b, h, tq, d}, 1), make({b, h, tk, d}, 2), make({b, h, tk, d}, 3),
          make({b, h, tq, d}, 4)};
}

// ---- no GPU needed ----

TEST(CudnnAttention, ModeComesFromTheEnvironment) {
  {
    ScopedAttentionMode m(nullptr);
    EXPECT_EQ(attention_mode(), AttentionMode::Auto);
  }
  {
    ScopedAttentionMode m("");
    EXPECT_EQ(attention_mode(), AttentionMode::Auto);
  }
  {
    ScopedAttentionMode m("auto");
    EXPECT_EQ(attention_mode(), AttentionMode::Auto);
  }
  {
    ScopedAttentionMode m("own");
    EXPECT_EQ(attention_mode(), AttentionMode::Own);
  }
  {
    ScopedAttentionMode m("cudnn");
    EXPECT_EQ(attention_mode(), AttentionMode::Cudnn);
  }
  {
    ScopedAttentionMode m("simt");
    EXPECT_EQ(attention_mode(), AttentionMode::Simt);
  }
  ScopedAttentionMode m("flash");
  const std::string msg = user_error_of([] { attention_mode(); });
  EXPECT_NE(msg.find("STRATA_ATTENTION=flash"), std::string::npos) << msg;
  for (const char* choice : {"use auto (the default", "own (", "simt (", "cudnn ("})
    EXPECT_NE(msg.find(choice), std::string::npos) << msg;
}

TEST(CudnnAttention, RefusesWhatItCannotRunWithoutThrowing) {
  std::string why;
  // f32: cuDNN flash attention has no f32 path.
  Inputs f = host_inputs(1, 2, 16, 16, 64, DType::F32);
  Tensor out = Tensor::empty(f.q.shape()), lse = Tensor::empty({1, 2, 16});
  EXPECT_FALSE(cudnn_sdpa_forward(nullptr, f.q, f.k, f.v, true, 0.125f, out, lse, &why));
  EXPECT_NE(why.find("f32"), std::string::npos) << why;
  Tensor dq = Tensor::empty(f.q.shape()), dk = Tensor::empty(f.k.shape()),
         dv = Tensor::empty(f.v.shape());
  why.clear();
  EXPECT_FALSE(cudnn_sdpa_backward(nullptr, f.q, f.k, f.v, out, lse, f.dout, true, 0.125f, dq, dk,
                                   dv, &why));
  EXPECT_NE(why.find("f32"), std::string::npos) << why;
  // bf16, but on the host.
  Inputs b = host_inputs(1, 2, 16, 16, 64, DType::BF16);
  Tensor bout = Tensor::empty(b.q.shape(), DType::BF16);
  why.clear();
  EXPECT_FALSE(cudnn_sdpa_forward(nullptr, b.q, b.k, b.v, false, 0.125f, bout, lse, &why));
  EXPECT_NE(why.find("not on a CUDA device"), std::string::npos) << why;
}

TEST(CudnnAttention, CudnnModeTurnsARefusalIntoAUserError) {
  Inputs f = host_inputs(1, 2, 16, 16, 64, DType::F32);
  Tensor out = Tensor::empty(f.q.shape()), lse = Tensor::empty({1, 2, 16});
  {
    ScopedAttentionMode m("cudnn");
    const std::string msg = user_error_of(
        [&] { try_cudnn_attention_forward(nullptr, f.q, f.k, f.v, true, 0.125f, out, lse); });
    EXPECT_NE(msg.find("STRATA_ATTENTION=cudnn"), std::string::npos) << msg;
    EXPECT_NE(msg.find("bf16 or f16"), std::string::npos) << msg;
  }
  {
    ScopedAttentionMode m("auto");
    set_last_attention_path(AttentionPath::None);
    EXPECT_FALSE(try_cudnn_attention_forward(nullptr, f.q, f.k, f.v, true, 0.125f, out, lse));
    EXPECT_EQ(last_attention_path(), AttentionPath::Own);
  }
  {
    ScopedAttentionMode m("own");
    set_last_attention_path(AttentionPath::None);
    EXPECT_FALSE(try_cudnn_attention_forward(nullptr, f.q, f.k, f.v, true, 0.125f, out, lse));
    EXPECT_EQ(last_attention_path(), AttentionPath::Own);
  }
}

// Note [cuDNN SDPA limits]: each rule, on both sides of its boundary.
TEST(CudnnAttention, KnownLimitsFollowVersionAndArchitecture) {
  auto limit = [](int64_t version, int sm, int64_t tq, int64_t tk, int64_t d, bool causal,
                  bool backward) {
    return cudnn_sdpa_known_limit(version, sm, tq, tk, d, causal, backward);
  };
  auto has = [](const std::string& reason, const char* what) {
    return reason.find(what) != std::string::npos;
  };
  // GPT-2 training shapes on Ampere and Hopper: nothing, with any release but 9.10.0/9.10.1.
  for (int64_t v : {90000, 90600, 91002, 91300, 91500, 91900})
    for (int sm : {80, 86, 90})
      for (bool bwd : {false, true}) {
        EXPECT_EQ(limit(v, sm, 1024, 1024, 64, true, bwd), "") << v << " sm_" << sm;
        EXPECT_EQ(limit(v, sm, 2048, 2048, 128, true, bwd), "") << v << " sm_" << sm;
      }
  // Architecture.
  EXPECT_TRUE(has(limit(91900, 75, 1024, 1024, 64, true, false), "sm_80 or newer"));
  // The two releases with known bugs, both directions; 9.10.2 is fine.
  for (int64_t v : {91000, 91001})
    for (bool bwd : {false, true})
      EXPECT_TRUE(has(limit(v, 90, 1024, 1024, 64, true, bwd), "known bugs")) << v;
  EXPECT_EQ(limit(91002, 90, 1024, 1024, 64, true, true), "");
  // Backward head dim: 256 on Hopper, 128 on Ampere, 256 on Blackwell from 9.23.
  EXPECT_EQ(limit(91900, 90, 1024, 1024, 256, true, true), "");
  EXPECT_TRUE(has(limit(91900, 80, 1024, 1024, 256, true, true), "at most 128"));
  EXPECT_EQ(limit(91900, 80, 1024, 1024, 128, true, true), "");
  EXPECT_TRUE(has(limit(92200, 100, 1024, 1024, 256, true, true), "at most 128"));
  EXPECT_EQ(limit(92300, 100, 1024, 1024, 256, true, true), "");
  // Forward head dim on Ampere up to 9.9.
  EXPECT_TRUE(has(limit(90900, 80, 1024, 1024, 256, true, false), "at most 128"));
  EXPECT_EQ(limit(91002, 80, 1024, 1024, 256, true, false), "");
  EXPECT_EQ(limit(90900, 90, 1024, 1024, 256, true, false), "");
  // Backward with Tk not a multiple of 128 up to 9.15.0 (the forward is unaffected).
  EXPECT_TRUE(has(limit(91500, 90, 200, 200, 64, false, true), "multiple of 128"));
  EXPECT_TRUE(has(limit(91500, 90, 64, 64, 64, true, true), "multiple of 128"));
  EXPECT_EQ(limit(91500, 90, 256, 256, 64, true, true), "");
  EXPECT_EQ(limit(91500, 90, 200, 200, 64, false, false), "");
  EXPECT_EQ(limit(91501, 90, 200, 200, 64, false, true), "");
  // Tq = Tk = 1 backward.
  EXPECT_TRUE(has(limit(91900, 90, 1, 1, 64, false, true), "Tq = Tk = 1"));
  EXPECT_EQ(limit(91900, 90, 1, 1, 64, false, false), "");
  // Deterministic backward on Blackwell from 9.18.
  EXPECT_TRUE(has(limit(91700, 100, 1024, 1024, 64, true, true), "deterministic"));
  EXPECT_EQ(limit(91800, 100, 1024, 1024, 64, true, true), "");
  // Bottom-right causal: none before 9.3, then before 9.6 multiples of 64 only.
  EXPECT_TRUE(has(limit(90200, 90, 64, 256, 64, true, false), "no bottom-right"));
  EXPECT_TRUE(has(limit(90200, 90, 64, 256, 64, true, true), "no bottom-right"));
  EXPECT_EQ(limit(90200, 90, 64, 256, 64, false, false), "");
  EXPECT_EQ(limit(90200, 90, 256, 256, 64, true, false), "");
  EXPECT_EQ(limit(90300, 90, 64, 256, 64, true, false), "");
  EXPECT_TRUE(has(limit(90500, 90, 100, 256, 64, true, false), "bottom-right"));
  EXPECT_EQ(limit(90500, 90, 64, 256, 64, true, false), "");
  EXPECT_EQ(limit(90500, 90, 100, 256, 64, false, false), "");
  EXPECT_EQ(limit(90600, 90, 100, 256, 64, true, false), "");
}

// The mask's fill value by release: cudnn-frontend's choice.
TEST(CudnnAttention, MaskFillIsMinusInfinityFrom9_10AndTheLowestFloatBefore) {
  EXPECT_EQ(cudnn_sdpa_mask_fill(90900), std::numeric_limits<float>::lowest());
  EXPECT_EQ(cudnn_sdpa_mask_fill(90000), std::numeric_limits<float>::lowest());
  EXPECT_EQ(cudnn_sdpa_mask_fill(91000), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(cudnn_sdpa_mask_fill(91900), -std::numeric_limits<float>::infinity());
}

// ---- on the GPU ----

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible"

#define SKIP_WITHOUT_CUDNN() \
  SKIP_WITHOUT_GPU();        \
  if (std::string why_; !cudnn_loaded(&why_)) GTEST_SKIP() << "cuDNN: " << why_

// max |a - b| / max |ref|: one number per tensor, printed when over `tol`.
void expect_close(const char* what, const Tensor& got, const Tensor& ref, double tol) {
  const std::vector<float> a = to_float_vector(got), b = to_float_vector(ref);
  ASSERT_EQ(a.size(), b.size()) << what;
  double err = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(std::isfinite(a[i])) << what << "[" << i << "] = " << a[i];
    err = std::max(err, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  EXPECT_LE(err, tol * std::max(scale, 1e-6))
      << what << ": max error " << err << " against max |ref| " << scale;
}

struct Problem {
  int64_t b, h, tq, tk, d;
  bool causal;
};

// cuDNN (forced: STRATA_ATTENTION=cudnn) against the CPU backend in f32 on the same rounded
// inputs. The reference backward takes the CPU forward's out/lse, the GPU one cuDNN's own (what
// training does). Tolerance: the inputs are exact in both; cuDNN rounds P and dS to the io dtype
// before their matmuls and rounds its outputs, the CPU rounds nothing.
//
// Where a known limit of the loaded cuDNN applies to a direction (Note [cuDNN SDPA limits]), that
// direction must take the own kernel instead (under auto), with the same tolerance.
void check_against_cpu(DType dt, const Problem& p) {
  const bool fwd_cudnn = cudnn_runs_here(p.tq, p.tk, p.d, p.causal, false);
  const bool bwd_cudnn = cudnn_runs_here(p.tq, p.tk, p.d, p.causal, true);
  ScopedAttentionMode m(fwd_cudnn && bwd_cudnn ? "cudnn" : "auto");
  const double tol = dt == DType::BF16 ? 2e-2 : 1e-2;
  const float scale = 1.f / std::sqrt(static_cast<float>(p.d));
  Inputs in = host_inputs(p.b, p.h, p.tq, p.tk, p.d, dt);
  auto f32 = [](const Tensor& t) { return t.to(DType::F32); };
  auto gpu = [](const Tensor& t) { return t.to(kGpu); };
  Backend& cpu_be = backend_for(Device::cpu());
  Backend& gpu_be = backend_for(kGpu);
  const Shape rows = {p.b, p.h, p.tq};

  Tensor out_ref = Tensor::empty(in.q.shape()), lse_ref = Tensor::empty(rows);
  cpu_be.attention_forward(f32(in.q), f32(in.k), f32(in.v), p.causal, scale, out_ref, lse_ref);
  Tensor q = gpu(in.q), k = gpu(in.k), v = gpu(in.v), dout = gpu(in.dout);
  Tensor out = Tensor::empty(in.q.shape(), dt, kGpu), lse = Tensor::empty(rows, DType::F32, kGpu);
  set_last_attention_path(AttentionPath::None);
  gpu_be.attention_forward(q, k, v, p.causal, scale, out, lse);
  EXPECT_EQ(last_attention_path() == AttentionPath::Cudnn, fwd_cudnn);
  expect_close("out", out, out_ref, tol);
  expect_close("lse", lse, lse_ref, 1e-3);  // f32 statistics of exact products

  Tensor dq_ref = Tensor::empty(in.q.shape()), dk_ref = Tensor::empty(in.k.shape()),
         dv_ref = Tensor::empty(in.v.shape());
  cpu_be.attention_backward(f32(in.q), f32(in.k), f32(in.v), out_ref, lse_ref, f32(in.dout),
                            p.causal, scale, dq_ref, dk_ref, dv_ref);
  Tensor dq = Tensor::empty(in.q.shape(), dt, kGpu), dk = Tensor::empty(in.k.shape(), dt, kGpu),
         dv = Tensor::empty(in.v.shape(), dt, kGpu);
  set_last_attention_path(AttentionPath::None);
  gpu_be.attention_backward(q, k, v, out, lse, dout, p.causal, scale, dq, dk, dv);
  EXPECT_EQ(last_attention_path() == AttentionPath::Cudnn, bwd_cudnn);
  expect_close("dq", dq, dq_ref, tol);
  expect_close("dk", dk, dk_ref, tol);
  expect_close("dv", dv, dv_ref, tol);
}

std::string name(DType dt, const Problem& p) {
  return fmt::format("{} B={} H={} Tq={} Tk={} D={}{}", dtype_name(dt), p.b, p.h, p.tq, p.tk, p.d,
                     p.causal ? " causal" : "");
}

// The emulated cuDNN reports this release while in scope (STRATA_CUDA_EMU_CUDNN_VERSION, read at
// each call; a real libcudnn ignores it).
struct ScopedEmulatedCudnnVersion {
  explicit ScopedEmulatedCudnnVersion(const char* version) {
    if (const char* old = std::getenv("STRATA_CUDA_EMU_CUDNN_VERSION")) saved = old;
    setenv("STRATA_CUDA_EMU_CUDNN_VERSION", version, 1);
  }
  ~ScopedEmulatedCudnnVersion() {
    if (saved)
      setenv("STRATA_CUDA_EMU_CUDNN_VERSION", saved->c_str(), 1);
    else
      unsetenv("STRATA_CUDA_EMU_CUDNN_VERSION");
  }
  std::optional<std::string> saved;
};

TEST(CudnnAttention, AgreesWithTheCpuBackend) {
  SKIP_WITHOUT_CUDNN();
  for (DType dt : {DType::BF16, DType::F16})
    for (int64_t d : {64, 128})
      for (bool causal : {false, true})
        for (int64_t t : {128, 200}) {
          if (d == 128 && t != 128) continue;  // T not a multiple of 64 once is enough
          const Problem p{2, 3, t, t, d, causal};
          SCOPED_TRACE(name(dt, p));
          check_against_cpu(dt, p);
        }
}

// Fewer queries than keys (decoding a suffix against a longer cache): the causal mask is aligned
// bottom-right (Note [cuDNN SDPA], masking).
TEST(CudnnAttention, AgreesWithFewerQueriesThanKeys) {
  SKIP_WITHOUT_CUDNN();
  for (bool causal : {false, true}) {
    const Problem p{1, 2, 64, 192, 64, causal};
    SCOPED_TRACE(name(DType::BF16, p));
    check_against_cpu(DType::BF16, p);
  }
}

// Note [cuDNN SDPA], decoding: under auto a decode step (Tq <= 16 < Tk) runs the own split-key
// decode kernel without trying cuDNN, so a KV-cached generation builds no plan per cache length;
// 17 queries, or as many queries as keys (a prompt), still go to cuDNN, and
// STRATA_ATTENTION=cudnn sends a decode step there too. The own kernel's result is the CPU
// backend's within bf16 rounding.
TEST(CudnnAttention, DecodeStepsRunTheOwnKernelUnderAuto) {
  SKIP_WITHOUT_CUDNN();
  Backend& be = backend_for(kGpu);
  auto forward = [&](int64_t tq, int64_t tk) {
    Inputs in = host_inputs(1, 2, tq, tk, 64, DType::BF16);
    Tensor out = Tensor::empty({1, 2, tq, 64}, DType::BF16, kGpu);
    Tensor lse = Tensor::empty({1, 2, tq}, DType::F32, kGpu);
    set_last_attention_path(AttentionPath::None);
    be.attention_forward(in.q.to(kGpu), in.k.to(kGpu), in.v.to(kGpu), true, 0.125f, out, lse);
    Tensor ref_out = Tensor::empty({1, 2, tq, 64}, DType::BF16);
    Tensor ref_lse = Tensor::empty({1, 2, tq}, DType::F32);
    backend_for(Device::cpu()).attention_forward(in.q, in.k, in.v, true, 0.125f, ref_out, ref_lse);
    expect_close("out", out.to(Device::cpu()), ref_out, 2e-2);
    return last_attention_path();
  };
  {
    ScopedAttentionMode m("auto");
    for (int64_t tq : {1, 3, 16}) {
      SCOPED_TRACE(tq);
      EXPECT_EQ(forward(tq, 192), AttentionPath::OwnDecode);  // Note [CUDA decode attention]
    }
    if (cudnn_runs_here(17, 192, 64, true, false)) {
      EXPECT_EQ(forward(17, 192), AttentionPath::Cudnn);
    }
    if (cudnn_runs_here(16, 16, 64, true, false)) {
      EXPECT_EQ(forward(16, 16), AttentionPath::Cudnn);
    }
  }
  ScopedAttentionMode m("cudnn");
  if (cudnn_runs_here(1, 192, 64, true, false)) {
    EXPECT_EQ(forward(1, 192), AttentionPath::Cudnn);
  }
}

// Before cuDNN 9.10 the causal mask fills hidden scores with the lowest finite float instead of
// -inf (cudnn_sdpa_mask_fill, as cudnn-frontend does); the results must not change. Plain and
// bottom-right causal, forward and backward through cuDNN.
TEST(CudnnAttention, AgreesWithTheCpuBackendOnReleasesBefore9_10) {
  SKIP_WITHOUT_CUDNN();
  ScopedEmulatedCudnnVersion release("90900");
  if (cudnn_loaded_version() >= 91000)
    GTEST_SKIP() << "the loaded cuDNN is " << cudnn_loaded_version() << " (a real libcudnn)";
  for (const Problem& p : {Problem{2, 3, 128, 128, 64, true}, Problem{1, 2, 128, 256, 64, true}}) {
    SCOPED_TRACE(name(DType::BF16, p));
    ASSERT_TRUE(cudnn_runs_here(p.tq, p.tk, p.d, p.causal, false));
    ASSERT_TRUE(cudnn_runs_here(p.tq, p.tk, p.d, p.causal, true));
    check_against_cpu(DType::BF16, p);
  }
}

// docs/design.md decision 9: the same inputs give the same bits (the backward's dQ included).
TEST(CudnnAttention, CudnnAttentionIsDeterministic) {
  SKIP_WITHOUT_CUDNN();
  ScopedAttentionMode m("cudnn");
  const Problem p{4, 8, 512, 512, 64, true};
  if (!cudnn_runs_here(p.tq, p.tk, p.d, p.causal, false) ||
      !cudnn_runs_here(p.tq, p.tk, p.d, p.causal, true))
    GTEST_SKIP() << "the loaded cuDNN does not run this shape here";
  Inputs in = host_inputs(p.b, p.h, p.tq, p.tk, p.d, DType::BF16);
  Tensor q = in.q.to(kGpu), k = in.k.to(kGpu), v = in.v.to(kGpu), dout = in.dout.to(kGpu);
  Backend& be = backend_for(kGpu);
  auto run = [&] {
    Tensor out = Tensor::empty(q.shape(), DType::BF16, kGpu);
    Tensor lse = Tensor::empty({p.b, p.h, p.tq}, DType::F32, kGpu);
    be.attention_forward(q, k, v, true, 0.125f, out, lse);
    Tensor dq = Tensor::empty(q.shape(), DType::BF16, kGpu),
           dk = Tensor::empty(k.shape(), DType::BF16, kGpu),
           dv = Tensor::empty(v.shape(), DType::BF16, kGpu);
    be.attention_backward(q, k, v, out, lse, dout, true, 0.125f, dq, dk, dv);
    EXPECT_EQ(last_attention_path(), AttentionPath::Cudnn);
    return std::vector<std::vector<float>>{to_float_vector(out), to_float_vector(lse),
                                           to_float_vector(dq), to_float_vector(dk),
                                           to_float_vector(dv)};
  };
  const auto first = run(), second = run();
  const char* names[] = {"out", "lse", "dq", "dk", "dv"};
  for (size_t i = 0; i < first.size(); ++i)
    EXPECT_TRUE(first[i] == second[i]) << names[i] << " differs between two identical runs";
}

// A shape that the loaded cuDNN has a known limit for goes to the own kernel under auto and is a
// UserError naming the limit under cudnn, while the other direction still runs cuDNN. On the
// emulator STRATA_CUDA_EMU_CUDNN_VERSION makes its cuDNN report 9.15.0, whose backward needs Tk
// a multiple of 128; a real cuDNN ignores the variable, and newer releases have no such limit
// (the test then skips).
TEST(CudnnAttention, AKnownLimitGoesToTheOwnKernel) {
  SKIP_WITHOUT_CUDNN();
  ScopedEmulatedCudnnVersion release("91500");
  const Problem p{1, 2, 200, 200, 64, true};
  if (cudnn_runs_here(p.tq, p.tk, p.d, p.causal, true))
    GTEST_SKIP() << "the loaded cuDNN (" << cudnn_loaded_version()
                 << ") has no known limit for a backward with Tk 200";
  ASSERT_TRUE(cudnn_runs_here(p.tq, p.tk, p.d, p.causal, false));

  Inputs in = host_inputs(p.b, p.h, p.tq, p.tk, p.d, DType::BF16);
  Tensor q = in.q.to(kGpu), k = in.k.to(kGpu), v = in.v.to(kGpu), dout = in.dout.to(kGpu);
  Backend& be = backend_for(kGpu);
  const float scale = 0.125f;
  Tensor out = Tensor::empty(q.shape(), DType::BF16, kGpu);
  Tensor lse = Tensor::empty({p.b, p.h, p.tq}, DType::F32, kGpu);
  auto grads = [&] {
    return std::vector<Tensor>{Tensor::empty(q.shape(), DType::BF16, kGpu),
                               Tensor::empty(k.shape(), DType::BF16, kGpu),
                               Tensor::empty(v.shape(), DType::BF16, kGpu)};
  };
  std::vector<Tensor> got = grads(), own = grads();
  {
    ScopedAttentionMode m("auto");
    set_last_attention_path(AttentionPath::None);
    be.attention_forward(q, k, v, p.causal, scale, out, lse);
    EXPECT_EQ(last_attention_path(), AttentionPath::Cudnn);
    set_last_attention_path(AttentionPath::None);
    be.attention_backward(q, k, v, out, lse, dout, p.causal, scale, got[0], got[1], got[2]);
    EXPECT_NE(last_attention_path(), AttentionPath::Cudnn);
    EXPECT_NE(last_attention_path(), AttentionPath::None);
  }
  {
    ScopedAttentionMode m("own");  // what auto must have run: the own kernel's bits
    be.attention_backward(q, k, v, out, lse, dout, p.causal, scale, own[0], own[1], own[2]);
  }
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(to_float_vector(got[i]) == to_float_vector(own[i])) << "gradient " << i;
  ScopedAttentionMode m("cudnn");
  const std::string msg = user_error_of([&] {
    be.attention_backward(q, k, v, out, lse, dout, p.causal, scale, got[0], got[1], got[2]);
  });
  EXPECT_NE(msg.find("multiple of 128"), std::string::npos) << msg;
  EXPECT_NE(msg.find("9.15.0"), std::string::npos) << msg;
}

TEST(CudnnAttention, CudnnModeWithF32InputsIsAClearError) {
  SKIP_WITHOUT_GPU();
  ScopedAttentionMode m("cudnn");
  Inputs in = host_inputs(1, 2, 32, 32, 64, DType::F32);
  Tensor q = in.q.to(kGpu), k = in.k.to(kGpu), v = in.v.to(kGpu);
  Tensor out = Tensor::empty(q.shape(), DType::F32, kGpu);
  Tensor lse = Tensor::empty({1, 2, 32}, DType::F32, kGpu);
  const std::string msg =
      user_error_of([&] { backend_for(kGpu).attention_forward(q, k, v, true, 0.125f, out, lse); });
  EXPECT_NE(msg.find("STRATA_ATTENTION=cudnn"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dtype f32"), std::string::npos) << msg;
}

// auto sends f32 to the own kernel and says so in last_attention_path().
TEST(CudnnAttention, AutoUsesTheOwnKernelForF32) {
  SKIP_WITHOUT_GPU();
  ScopedAttentionMode m(nullptr);
  Inputs in = host_inputs(1, 2, 32, 32, 64, DType::F32);
  Tensor out = Tensor::empty(in.q.shape(), DType::F32, kGpu);
  Tensor lse = Tensor::empty({1, 2, 32}, DType::F32, kGpu);
  set_last_attention_path(AttentionPath::None);
  backend_for(kGpu).attention_forward(in.q.to(kGpu), in.k.to(kGpu), in.v.to(kGpu), false, 0.125f,
                                      out, lse);
  EXPECT_EQ(last_attention_path(), AttentionPath::Own);
}

}  // namespace
}  // namespace strata::tensor::cuda
