// The real cuDNN's verdict on Strata's attention graphs for GPUs that are not here (Note
// [Deviceless cuDNN plans] in tensor/cuda/sdpa_plan.h). No GPU is needed: cuDNN builds each plan
// for an H100 or an A100 described by its device properties, with the stand-in driver of
// stub_libcuda.cpp, and the tests want a finalized plan for every shape and layout Strata hands
// cuDNN in training - GPT-2's strided views at every size, f16, head dim 128, T not a multiple
// of 64, fewer queries than keys - and for the backward the deterministic engine's dP
// workspace (Note [cuDNN SDPA], determinism). They run in the main build (the toolkit's cuDNN,
// which is what CI has) and skip where cuDNN is not loadable or older than 9.8. On the GPU
// machine, test_cuda's CudnnAttention tests run the same graphs for real.
#include <dlfcn.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

#include "tensor/cuda/cudnn_sdpa.h"
#include "tensor/cuda/sdpa_plan.h"

namespace strata::tensor::cuda {
namespace {

// The properties cuDNN reads from a device, in the JSON form CUDNN_ATTR_DEVICEPROP_JSON_
// REPRESENTATION takes (what cuDNN serializes a real device's properties to): deviceVer is
// major * 100 + minor * 10, sizes in bytes, clocks in kHz. The values are those NVIDIA's
// datasheets and cudaGetDeviceProperties give for the parts; what the two parts share (CUDA's
// per-block and per-SM limits since Volta) is written once.
struct Gpu {
  const char* name;
  int sm;  // as cuda_sm_version()
  std::string json;
};

Gpu gpu(const char* name, const char* device_name, int sm, int64_t memory, int sms,
        int sm_clock_khz, int mem_clock_khz, int l2_bytes, int shared_optin_bytes) {
  return {name, sm,
          fmt::format(R"({{"cudaDeviceId": 0, "deviceName": "{}", "deviceVer": {},
  "driverVer": 13000, "totalGlobalMem": {}, "multiProcessorCount": {}, "smClockRateKHz": {},
  "memClockRateKHz": {}, "l2CacheSize": {}, "maxSharedMemoryPerBlock": 49152,
  "maxSharedMemoryPerBlockOptin": {}, "reservedSharedMemoryPerBlock": 1024,
  "regsPerBlock": 65536, "maxRegistersPerSM": 65536, "maxThreadsPerBlock": 1024,
  "maxThreadsPerSM": 2048, "maxCtasPerSM": 32, "warpSize": 32,
  "maxGridSize": [2147483647, 65535, 65535], "maxBlockSize": [1024, 1024, 64],
  "pciDeviceId": 0, "isTccDriver": 0, "supportCoopLaunch": 1}})",
                      device_name, sm * 10, memory, sms, sm_clock_khz, mem_clock_khz, l2_bytes,
                      shared_optin_bytes)};
}

const Gpu kH100 = gpu("H100 SXM5 80GB", "NVIDIA H100 80GB HBM3", 90, 85017755648, 132, 1980000,
                      2619000, 50 << 20, 227 << 10);
const Gpu kA100 = gpu("A100 SXM4 80GB", "NVIDIA A100-SXM4-80GB", 80, 85198045184, 108, 1410000,
                      1593000, 40 << 20, 163 << 10);

// Loads the stand-in driver once, by its path, so that cuDNN's dlopen("libcuda.so.1") finds it
// (a library already loaded under that soname). "" when it is the libcuda.so.1 of this process,
// else why not (a real driver loaded first: test_cuda is the test for that machine).
using KernelsFn = const char* (*)();
KernelsFn g_kernels = nullptr;

std::string use_stub_driver() {
  static std::once_flag once;
  static std::string why;
  std::call_once(once, [] {
    if (!dlopen(STRATA_STUB_LIBCUDA, RTLD_NOW | RTLD_GLOBAL)) {
      const char* e = dlerror();
      why = std::string("cannot load the stand-in driver: ") + (e ? e : STRATA_STUB_LIBCUDA);
      return;
    }
    void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    g_kernels =
        cuda ? reinterpret_cast<KernelsFn>(dlsym(cuda, "strata_stub_libcuda_kernels")) : nullptr;
    if (!g_kernels) why = "libcuda.so.1 in this process is not the stand-in driver";
  });
  return why;
}

#define SKIP_WITHOUT_DEVICELESS_CUDNN()                                                    \
  do {                                                                                     \
    if (std::string why_; !cudnn_loaded(&why_)) GTEST_SKIP() << "cuDNN: " << why_;         \
    if (cudnn_loaded_version() < 90800)                                                    \
      GTEST_SKIP() << "cuDNN " << cudnn_loaded_version() << " builds no deviceless plans"; \
    if (std::string why_ = use_stub_driver(); !why_.empty()) GTEST_SKIP() << why_;         \
  } while (0)

struct Shape {
  int64_t b, h, tq, tk, d;
  bool causal;
  bool bf16 = true;
  bool gpt2_layout = false;  // q, k, v, dq, dk, dv in packed [B, T, 3, H, D]; o, do [B, T, H, D]
};

SdpaKey key_of(const Shape& s, bool backward) {
  SdpaKey k;
  k.b = s.b, k.h = s.h, k.tq = s.tq, k.tk = s.tk, k.d = s.d;
  k.bf16 = s.bf16, k.causal = s.causal, k.backward = backward;
  for (int op = 0; op < (backward ? 8 : 4); ++op) {
    const bool on_k = op == kSdpaK || op == kSdpaV || op == kSdpaDK || op == kSdpaDV;
    const int64_t t = on_k ? s.tk : s.tq;
    if (!s.gpt2_layout) {
      k.strides[op] = k.packed(t);
    } else if (op == kSdpaO || op == kSdpaDO) {  // Note [GPT-2 attention layout]
      k.strides[op] = {t * s.h * s.d, s.d, s.h * s.d};
    } else {
      k.strides[op] = {t * 3 * s.h * s.d, s.d, 3 * s.h * s.d};
    }
  }
  return k;
}

// Builds the forward and backward plans of `s` for `gpu` and checks them; prints the engine,
// workspace and kernel of each.
void expect_plans(const Gpu& gpu, const Shape& s) {
  for (bool backward : {false, true}) {
    const SdpaKey key = key_of(s, backward);
    SCOPED_TRACE(std::string(gpu.name) + (backward ? " backward " : " forward ") + key.str());
    const std::string limit =
        cudnn_sdpa_known_limit(cudnn_loaded_version(), gpu.sm, s.tq, s.tk, s.d, s.causal, backward);
    if (!limit.empty()) {  // Strata would not ask cuDNN: the own kernel runs
      std::printf("NOTE %s: a known limit of this cuDNN applies (%s)\n", key.str().c_str(),
                  limit.c_str());
      continue;
    }
    const std::string before = g_kernels();
    DevicelessSdpaPlan plan;
    std::string err;
    ASSERT_TRUE(build_sdpa_plan_deviceless(key, gpu.json, &plan, &err)) << err;
    std::string kernels = std::string(g_kernels()).substr(before.size());
    while (!kernels.empty() && kernels.back() == '\n') kernels.pop_back();
    std::printf("%s %s %s: engine %s, workspace %lld bytes, kernel %s\n", gpu.name,
                backward ? "backward" : "forward", key.str().c_str(), plan.engine.c_str(),
                static_cast<long long>(plan.workspace_bytes), kernels.c_str());
    EXPECT_FALSE(kernels.empty()) << "cuDNN finalized the plan without loading a kernel";
    if (backward) {
      // The deterministic backward keeps dP (B*H*Tq*Tk in the io type) in its workspace
      // instead of accumulating dQ with atomics (Note [cuDNN SDPA], determinism).
      const int64_t dp = s.b * s.h * s.tq * s.tk * 2;
      EXPECT_GE(plan.workspace_bytes, dp);
    }
  }
}

TEST(DevicelessCudnn, PlansEveryGpt2SizeOnGpt2sLayoutOnHopperAndAmpere) {
  SKIP_WITHOUT_DEVICELESS_CUDNN();
  std::printf("cuDNN %lld\n", static_cast<long long>(cudnn_loaded_version()));
  // bench_gpt2_cuda --fill's micro-batches on an 80 GB GPU (docs/gpu.md), T = 1024, head dim 64.
  struct Size {
    const char* name;
    int64_t b, h;
  };
  for (const Gpu* gpu : {&kH100, &kA100})
    for (Size m : {Size{"gpt2", 128, 12}, Size{"gpt2-medium", 64, 16}, Size{"gpt2-large", 32, 20},
                   Size{"gpt2-xl", 16, 25}}) {
      SCOPED_TRACE(m.name);
      expect_plans(*gpu, Shape{m.b, m.h, 1024, 1024, 64, true, true, true});
    }
}

TEST(DevicelessCudnn, PlansTheShapesTheGpuTestsRun) {
  SKIP_WITHOUT_DEVICELESS_CUDNN();
  for (const Gpu* gpu : {&kH100, &kA100}) {
    // CudnnAttention.AgreesWithTheCpuBackend: bf16 and f16, D 64 (T 128 and 200) and 128.
    for (bool bf16 : {true, false})
      for (bool causal : {false, true}) {
        expect_plans(*gpu, Shape{2, 3, 128, 128, 64, causal, bf16});
        expect_plans(*gpu, Shape{2, 3, 200, 200, 64, causal, bf16});
        expect_plans(*gpu, Shape{2, 3, 128, 128, 128, causal, bf16});
      }
    // CudnnAttention.AgreesWithFewerQueriesThanKeys: the causal mask aligned bottom-right.
    for (bool causal : {false, true}) expect_plans(*gpu, Shape{1, 2, 64, 192, 64, causal});
    // A LLaMA-style head dim 128 at T 2048, contiguous.
    expect_plans(*gpu, Shape{4, 32, 2048, 2048, 128, true});
  }
}

// A graph no engine runs comes back as false, not as a plan: the backward with a head dim that is
// not a multiple of 8 or above 256, which cudnn_sdpa_backward does not hand cuDNN (Note [cuDNN
// SDPA]); asked anyway, cuDNN has no engine for them. (It does plan a forward at head dim 520
// on the H100, so that limit is Strata's own for the forward.)
TEST(DevicelessCudnn, AGraphNoEngineRunsIsRefused) {
  SKIP_WITHOUT_DEVICELESS_CUDNN();
  for (int64_t d : {12, 264}) {
    SCOPED_TRACE(d);
    DevicelessSdpaPlan plan;
    std::string err;
    EXPECT_FALSE(build_sdpa_plan_deviceless(key_of(Shape{1, 2, 128, 128, d, false}, true),
                                            kH100.json, &plan, &err));
    EXPECT_NE(err.find("no engine config finalized"), std::string::npos) << err;
    EXPECT_TRUE(plan.engine.empty());
  }
}

TEST(DevicelessCudnn, BadDevicePropertiesAreAnErrorNotAPlan) {
  SKIP_WITHOUT_DEVICELESS_CUDNN();
  DevicelessSdpaPlan plan;
  std::string err;
  EXPECT_FALSE(build_sdpa_plan_deviceless(key_of(Shape{1, 2, 128, 128, 64, true}, false),
                                          R"({"deviceName": "no such GPU"})", &plan, &err));
  EXPECT_NE(err.find("device properties"), std::string::npos) << err;
}

}  // namespace
}  // namespace strata::tensor::cuda
