// cuDNN fused attention (tensor/cuda/cudnn_sdpa.cpp, Note [cuDNN SDPA]) against the CPU backend,
// and the STRATA_ATTENTION switch. The first tests need no GPU (the mode, and refusals that come
// before any device access); the rest skip themselves without a GPU or a loadable cuDNN.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "tensor/backend.h"
#include "tensor/cuda.h"
#include "tensor/cuda/cudnn_sdpa.h"
#include "tensor/tensor.h"

namespace strata::tensor::cuda {
namespace {

const Device kGpu = Device::cuda(0);

// Sets STRATA_ATTENTION (nullptr: unsets it) for one scope.
class ScopedAttentionMode {
 public:
  explicit ScopedAttentionMode(const char* value) {
    if (const char* old = std::getenv("STRATA_ATTENTION")) old_ = old;
    if (value)
      setenv("STRATA_ATTENTION", value, 1);
    else
      unsetenv("STRATA_ATTENTION");
  }
  ~ScopedAttentionMode() {
    if (old_)
      setenv("STRATA_ATTENTION", old_->c_str(), 1);
    else
      unsetenv("STRATA_ATTENTION");
  }

 private:
  std::optional<std::string> old_;
};

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
  for (const char* choice : {"use own", "simt (", "cudnn (", "auto ("})
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
void check_against_cpu(DType dt, const Problem& p) {
  ScopedAttentionMode m("cudnn");
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
  EXPECT_EQ(last_attention_path(), AttentionPath::Cudnn);
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
  EXPECT_EQ(last_attention_path(), AttentionPath::Cudnn);
  expect_close("dq", dq, dq_ref, tol);
  expect_close("dk", dk, dk_ref, tol);
  expect_close("dv", dv, dv_ref, tol);
}

std::string name(DType dt, const Problem& p) {
  return fmt::format("{} B={} H={} Tq={} Tk={} D={}{}", dtype_name(dt), p.b, p.h, p.tq, p.tk, p.d,
                     p.causal ? " causal" : "");
}

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

// DESIGN.md decision 9: the same inputs give the same bits (the backward's dQ included).
TEST(CudnnAttention, CudnnAttentionIsDeterministic) {
  SKIP_WITHOUT_CUDNN();
  ScopedAttentionMode m("cudnn");
  const Problem p{4, 8, 512, 512, 64, true};
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
