// Note [Emulator dry run] (control.h): with STRATA_CUDA_EMU_DRY_RUN=1 the device does no work but
// counts it, copies to the host still run, and device memory is neither poisoned nor touched.
// These tests skip in an ordinary run; CTest's EmulatorDryRun runs them with the variable set
// (cuda_emu/CMakeLists.txt). Compiled like a .cu file, so its kernel is a real kernel.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdint>
#include <vector>

#include "cuda_emu/control.h"
#include "cuda_emu/device_vector.h"

namespace strata::cuda_emu {
namespace {

__global__ void fill_sevens(int* out) {
  out[blockIdx.x * blockDim.x + threadIdx.x] = 7;
}

#define SKIP_WITHOUT_DRY_RUN() \
  if (!dry_run()) GTEST_SKIP() << "runs under CTest's EmulatorDryRun (STRATA_CUDA_EMU_DRY_RUN=1)"

TEST(EmulatorDryRun, CountsDeviceWorkWithoutDoingIt) {
  SKIP_WITHOUT_DRY_RUN();
  DeviceVector<int> d(256, 5);  // the upload does not reach the device
  std::vector<int> h = d.host();
  for (int v : h) ASSERT_EQ(v, 0) << "no poison and no upload: a dry run's memory reads zero";
  const Stats before = stats();
  STRATA_LAUNCH(4, 64, 0, nullptr, fill_sevens)(d.get());
  EXPECT_EQ(cudaMemsetAsync(d.get(), 1, 16, nullptr), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  h = d.host();  // waits for the launch and the memset, which return at once
  const Stats after = stats();
  for (int v : h) ASSERT_EQ(v, 0);
  EXPECT_EQ(after.launches - before.launches, 1u);
  EXPECT_EQ(after.host_waits - before.host_waits, 1u);
  // A launch the hardware would refuse is still refused.
  STRATA_LAUNCH(1, 2048, 0, nullptr, fill_sevens)(d.get());
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(stats().launches, after.launches);
}

TEST(EmulatorDryRun, LargeAllocationsTakeNoHostMemory) {
  SKIP_WITHOUT_DRY_RUN();
  // 3 GiB of device memory: allocated, written by a launch and a memset, read back in part. The
  // process's peak resident size may not grow by more than a small fraction of it.
  rusage before{};
  getrusage(RUSAGE_SELF, &before);
  constexpr size_t kBytes = size_t{3} << 30;
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, kBytes), cudaSuccess) << "set STRATA_CUDA_EMU_MEMORY_MIB above 3072";
  STRATA_LAUNCH(1024, 256, 0, nullptr, fill_sevens)(static_cast<int*>(p));
  EXPECT_EQ(cudaMemsetAsync(p, 0, kBytes, nullptr), cudaSuccess);
  std::vector<char> tail(1 << 20);
  EXPECT_EQ(cudaMemcpy(tail.data(), static_cast<char*>(p) + kBytes - tail.size(), tail.size(),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  rusage after{};
  getrusage(RUSAGE_SELF, &after);
  const long grown_kib = after.ru_maxrss - before.ru_maxrss;
  EXPECT_LT(grown_kib, 64 * 1024) << "KiB of host memory for 3 GiB of untouched device memory";
}

}  // namespace
}  // namespace strata::cuda_emu
