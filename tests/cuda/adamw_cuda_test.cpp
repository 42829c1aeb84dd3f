// The fused multi-tensor AdamW on the GPU (optim/cuda/adamw_cuda.h) against the CPU scalar
// kernel: Note [CUDA AdamW] promises the same IEEE operations in the same order, so the tests
// want equal bits, not closeness. GPU tests skip themselves without a device.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "optim/adamw_kernel.h"
#include "tensor/cuda.h"
#include "tensor/ops.h"
#include "tests/cuda/optim_cuda_test_util.h"

#ifdef STRATA_OPTIM_HAVE_CUDA
#include "optim/cuda/adamw_cuda.h"

namespace strata::optim {
namespace {

using tensor::Tensor;
const Device kGpu = Device::cuda(0);

using cuda_test::rnd;
using cuda_test::same_bits;
constexpr uint64_t kSeed = 77;  // of rnd's draws

cuda::AdamWCudaScalars gpu_scalars(const AdamWScalars& s, float grad_scale) {
  return {s.decay_factor,    s.beta1,     s.one_minus_beta1,       s.beta2,
          s.one_minus_beta2, s.step_size, s.bias_correction2_sqrt, s.eps,
          grad_scale};
}

// One parameter buffer: CPU originals, updated on the CPU by hand and on the GPU by the launcher.
struct Buf {
  int64_t n;
  bool decay;
  DType grad_dtype, copy_dtype;  // copy_dtype F32 here means "no model copy"
  Tensor param, grad, m, v;      // CPU, before the step
  Tensor gpu_param, gpu_grad, gpu_m, gpu_v, gpu_copy;

  // shifted: every GPU buffer starts one element into its allocation, as a ZeRO partition of a
  // flat buffer may, so none is 16-byte aligned.
  Buf(int64_t n_, bool decay_, DType gdt, DType cdt, uint64_t seed, bool shifted = false)
      : n(n_), decay(decay_), grad_dtype(gdt), copy_dtype(cdt) {
    param = rnd(kSeed, n, seed, -1.f, 1.f);
    grad = rnd(kSeed, n, seed + 1, -3.f, 3.f).to(gdt);
    m = rnd(kSeed, n, seed + 2, -0.1f, 0.1f);
    v = rnd(kSeed, n, seed + 3, 0.f, 0.01f);
    auto on_gpu = [&](const Tensor& t) {
      if (!shifted) return t.to(kGpu);
      Tensor g = tensor::concat({t.narrow(0, 0, 1), t}, 0).to(kGpu).narrow(0, 1, n);
      EXPECT_NE(reinterpret_cast<uintptr_t>(g.data_ptr()) % 16, 0u);
      return g;
    };
    gpu_param = on_gpu(param);
    gpu_grad = on_gpu(grad);
    gpu_m = on_gpu(m);
    gpu_v = on_gpu(v);
    if (cdt != DType::F32) gpu_copy = on_gpu(tensor::zeros({n}, cdt));
  }

  cuda::AdamWCudaTensor gpu_args() {
    cuda::AdamWCudaTensor t;
    t.param = gpu_param.data<float>();
    t.grad = gpu_grad.data_ptr();
    t.grad_dtype = static_cast<int>(grad_dtype);
    t.exp_avg = gpu_m.data<float>();
    t.exp_avg_sq = gpu_v.data<float>();
    t.model_copy = gpu_copy.defined() ? gpu_copy.data_ptr() : nullptr;
    t.copy_dtype = static_cast<int>(copy_dtype);
    t.numel = n;
    t.weight_decay = decay;
    return t;
  }

  // The CPU reference: the scalar kernel on the widened, scaled gradient (the same IEEE
  // operations Note [CUDA AdamW] adds in front of Note [AdamW arithmetic]).
  void check(const AdamWScalars& with_decay, const AdamWScalars& without_decay, float scale) {
    Tensor g = grad.to(DType::F32).contiguous().clone();
    float* gp = g.data<float>();
    for (int64_t i = 0; i < n; ++i) gp[i] = gp[i] * scale;
    Tensor p = param.clone(), em = m.clone(), ev = v.clone();
    Tensor copy = copy_dtype != DType::F32 ? tensor::zeros({n}, copy_dtype) : Tensor();
    AdamWBuffers b;
    b.param = p.data<float>();
    b.grad = g.data<float>();
    b.exp_avg = em.data<float>();
    b.exp_avg_sq = ev.data<float>();
    b.low_precision = copy.defined() ? copy.data_ptr() : nullptr;
    b.low_precision_dtype = copy_dtype;
    b.numel = n;
    adamw_update(b, decay ? with_decay : without_decay, Isa::Scalar);
    EXPECT_TRUE(same_bits(gpu_param, p)) << "param, n = " << n;
    EXPECT_TRUE(same_bits(gpu_m, em)) << "exp_avg, n = " << n;
    EXPECT_TRUE(same_bits(gpu_v, ev)) << "exp_avg_sq, n = " << n;
    if (copy.defined()) {
      EXPECT_TRUE(same_bits(gpu_copy, copy)) << "model copy, n = " << n;
    }
  }
};

void run_case(std::vector<Buf>& bufs, float grad_scale) {
  const AdamWScalars s = adamw_scalars(3e-3, 0.9, 0.95, 1e-8, 0.1, 7);
  const AdamWScalars s0 = adamw_scalars(3e-3, 0.9, 0.95, 1e-8, 0.0, 7);
  std::vector<cuda::AdamWCudaTensor> list;
  for (Buf& b : bufs) list.push_back(b.gpu_args());
  ASSERT_EQ(
      cuda::launch_adamw_multi_tensor(list.data(), static_cast<int>(list.size()),
                                      gpu_scalars(s, grad_scale), tensor::cuda_current_stream()),
      0);
  // Reading back copies on the same stream after the step (Note [CUDA streams]).
  for (Buf& b : bufs) b.check(s, s0, grad_scale);
}

TEST(CudaAdamW, F32MatchesTheCpuScalarKernelBitwise) {
  SKIP_WITHOUT_GPU();
  std::vector<Buf> bufs;
  // Sizes around block and grid-stride boundaries, one buffer without weight decay, and more
  // buffers than one launch packs (kMaxTensors = 32).
  const int64_t sizes[] = {1, 255, 256, 257, 1000, 300001};
  uint64_t seed = 1;
  for (int64_t n : sizes) bufs.emplace_back(n, true, DType::F32, DType::F32, seed += 10);
  bufs.emplace_back(4099, false, DType::F32, DType::F32, seed += 10);
  for (int i = 0; i < 30; ++i)
    bufs.emplace_back(37 + i, i % 3 != 0, DType::F32, DType::F32, seed += 10);
  run_case(bufs, 1.f);
}

TEST(CudaAdamW, LowPrecisionGradsScaleAndModelCopyMatchTheCpuByHand) {
  SKIP_WITHOUT_GPU();
  std::vector<Buf> bufs;
  bufs.emplace_back(100003, true, DType::BF16, DType::BF16, 501);
  bufs.emplace_back(4097, false, DType::BF16, DType::BF16, 511);
  bufs.emplace_back(2049, true, DType::F16, DType::F16, 521);
  bufs.emplace_back(513, true, DType::F32, DType::BF16, 531);
  bufs.emplace_back(17, true, DType::BF16, DType::F32, 541);  // no model copy
  run_case(bufs, 0.3f);  // not a power of two: the scaling multiply rounds
}

TEST(CudaAdamW, GradScaleOneWithBf16GradsIsTheWidenedGradient) {
  SKIP_WITHOUT_GPU();
  std::vector<Buf> bufs;
  bufs.emplace_back(65537, true, DType::BF16, DType::BF16, 601);
  run_case(bufs, 1.f);
}

// Buffers that do not start 16-byte aligned take the one-element path (Note [CUDA AdamW]): on the
// GPU a 128-bit load from them stops the kernel, and so does the emulator's alignment check.
TEST(CudaAdamW, UnalignedBuffersMatchTheCpuScalarKernelBitwise) {
  SKIP_WITHOUT_GPU();
  std::vector<Buf> bufs;
  bufs.emplace_back(1001, true, DType::F32, DType::F32, 701, true);
  bufs.emplace_back(4099, true, DType::BF16, DType::BF16, 711, true);
  bufs.emplace_back(257, false, DType::F16, DType::F16, 721, true);
  bufs.emplace_back(300, true, DType::F32, DType::F32, 731);  // aligned, in the same launch
  run_case(bufs, 0.5f);
}

// Runs without a GPU: argument checks happen before anything touches the device.
TEST(CudaAdamW, BadDtypesEnqueueNothing) {
  cuda::AdamWCudaTensor t;
  t.grad_dtype = static_cast<int>(DType::I32);
  t.numel = 4;
  EXPECT_EQ(cuda::launch_adamw_multi_tensor(&t, 1, {}, nullptr), -1);
  t.grad_dtype = static_cast<int>(DType::BF16);
  t.model_copy = &t;  // never written: the dtype check fails first
  t.copy_dtype = static_cast<int>(DType::U8);
  EXPECT_EQ(cuda::launch_adamw_multi_tensor(&t, 1, {}, nullptr), -1);
  EXPECT_EQ(cuda::launch_adamw_multi_tensor(nullptr, 0, {}, nullptr), 0);
}

}  // namespace
}  // namespace strata::optim
#endif  // STRATA_OPTIM_HAVE_CUDA
