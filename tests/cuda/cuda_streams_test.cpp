// The CUDA backend beside a second stream: what the caching allocator (Note [GPU caching
// allocator]) does when a block another stream used is freed while that stream's work is pending.
// On the emulator's deferred streams (Note [Emulated streams]) the work stays pending until the
// host waits for it, so the "not ready" paths run every time; on a GPU they run when the side
// stream is still busy.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string_view>

#include "tensor/backend.h"
#include "tensor/cuda.h"
#include "tensor/cuda/cuda_backend.h"
#include "tensor/ops.h"

namespace strata::tensor {
namespace {

const Device kGpu = Device::cuda(0);

TEST(CudaStreams, ABlockHeldForAnotherStreamIsNotReusedAndItsPollingFailsNoLaunch) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible";
  auto& be = dynamic_cast<cuda::CudaBackend&>(backend_for(kGpu));
  cudaStream_t side = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), cudaSuccess);
  offload::GpuCachingAllocator& alloc = be.allocator();
  [[maybe_unused]] void* held = nullptr;
  {
    Tensor t = zeros({1 << 18}, DType::F32, kGpu);
    held = t.data_ptr();
    // The side stream writes t after the compute stream has zeroed it.
    cudaEvent_t zeroed = nullptr;
    ASSERT_EQ(cudaEventCreateWithFlags(&zeroed, cudaEventDisableTiming), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(zeroed, be.stream()), cudaSuccess);
    ASSERT_EQ(cudaStreamWaitEvent(side, zeroed, 0), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(t.data_ptr(), 0, t.nbytes(), side), cudaSuccess);
    ASSERT_EQ(cudaEventDestroy(zeroed), cudaSuccess);
    alloc.record_stream(t.data_ptr(), side);
  }  // freed: held back until an event recorded on `side` completes
  // The same request again polls that event (cudaEventQuery). While the side stream's memset is
  // pending the block must not come back, and the kernels launched next must not see the
  // query's cudaErrorNotReady as a launch failure.
  Tensor again = zeros({1 << 18}, DType::F32, kGpu);
#ifdef STRATA_CUDA_EMULATION
  // Deferred streams: the memset had not run when the allocator polled (on a GPU it may have).
  EXPECT_NE(again.data_ptr(), held) << "reused while the side stream's work was pending";
#endif
  Tensor x = full({256}, 1.5, DType::F32, kGpu);
  Tensor y = add(x, x).to(Device::cpu());
  for (int64_t i = 0; i < y.numel(); ++i) ASSERT_EQ(y.data<float>()[i], 3.f) << i;
  ASSERT_EQ(cudaStreamSynchronize(side), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(side), cudaSuccess);
}

// Note [GPU caching allocator], poisoning: STRATA_GPU_POISON=auto (unset) is on in the
// emulator's builds, where the CUDA tests run, and off on a GPU; on, a block that comes back from
// the cache holds 0xff bytes (NaN), not what its last owner wrote.
TEST(CudaAllocator, PoisonFillsReusedBlocksWithNan) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device visible";
  auto& be = dynamic_cast<cuda::CudaBackend&>(backend_for(kGpu));
  offload::GpuCachingAllocator& alloc = be.allocator();
  const char* env = std::getenv("STRATA_GPU_POISON");
  const std::string_view set = env ? env : "";
#ifdef STRATA_CUDA_EMULATION
  const char* dry = std::getenv("STRATA_CUDA_EMU_DRY_RUN");
  const bool emulated = dry == nullptr || *dry == '\0' || std::string_view(dry) == "0";
#else
  const bool emulated = false;
#endif
  const bool expected = set == "on" || ((set.empty() || set == "auto") && emulated);
  EXPECT_EQ(alloc.poison(), expected) << "STRATA_GPU_POISON='" << set << "'";

  const bool was = alloc.poison();
  alloc.set_poison(true);
  void* first = nullptr;
  {
    Tensor t = full({1000}, 2.5, DType::F32, kGpu);
    first = t.data_ptr();
  }
  Tensor again = Tensor::empty({1000}, DType::F32, kGpu);
  alloc.set_poison(was);
  ASSERT_EQ(again.data_ptr(), first) << "the same request should get the cached block back";
  Tensor host = again.to(Device::cpu());
  for (int64_t i = 0; i < host.numel(); ++i)
    ASSERT_TRUE(std::isnan(host.data<float>()[i]))
        << "element " << i << " is " << host.data<float>()[i];
}

}  // namespace
}  // namespace strata::tensor
