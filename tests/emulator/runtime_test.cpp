// The emulated CUDA runtime (cuda_emu/runtime.cpp) and device memory (Note [Emulated device
// memory]): the device it reports, copies checked against pointer kinds, the memory cap, poison,
// and the faults that replace silent host access to device memory. Streams: streams_test.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_emu/control.h"

namespace strata::cuda_emu {
namespace {

TEST(CudaEmuRuntime, ReportsOneHopperLikeDevice) {
  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  EXPECT_EQ(n, 1);
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaSetDevice(1), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  cudaDeviceProp p{};
  ASSERT_EQ(cudaGetDeviceProperties(&p, 0), cudaSuccess);
  EXPECT_STREQ(p.name, "Strata CUDA emulator of an NVIDIA H100 80GB HBM3");
  EXPECT_EQ(p.major * 10 + p.minor, 90);
  EXPECT_EQ(p.warpSize, 32);
  EXPECT_EQ(p.maxThreadsPerBlock, 1024);
  EXPECT_EQ(p.maxGridSize[1], 65535);
  int v = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  EXPECT_EQ(v, p.multiProcessorCount);
  ASSERT_EQ(cudaDeviceGetAttribute(&v, cudaDevAttrGlobalMemoryBusWidth, 0), cudaSuccess);
  EXPECT_EQ(v, p.memoryBusWidth);
  ASSERT_EQ(cudaDeviceGetAttribute(&v, cudaDevAttrClockRate, 0), cudaSuccess);
  EXPECT_EQ(v, 1980000);
  ASSERT_EQ(cudaDeviceGetAttribute(&v, cudaDevAttrMemoryClockRate, 0), cudaSuccess);
  EXPECT_EQ(v, 2619000);
}

TEST(CudaEmuRuntime, CopiesAreCheckedAgainstPointerKinds) {
  void* d = nullptr;
  void* d2 = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 64), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d2, 64), cudaSuccess);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(d) % 256, 0u);
  std::vector<char> h(64, 3), back(64, 0);
  EXPECT_EQ(cudaMemcpy(d, h.data(), 64, cudaMemcpyHostToDevice), cudaSuccess);
  // Each direction against the wrong kind of pointer.
  EXPECT_EQ(cudaMemcpy(d2, d, 64, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(back.data(), h.data(), 64, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(back.data(), d, 64, cudaMemcpyDeviceToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(d, h.data(), 64, cudaMemcpyHostToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  // Past the end of the allocation, and overlapping device ranges.
  EXPECT_EQ(cudaMemcpy(d, h.data(), 65, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(static_cast<char*>(d) + 8, d, 16, cudaMemcpyDeviceToDevice),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemsetAsync(h.data(), 0, 8, nullptr), cudaErrorInvalidValue);
  // What is right works, cudaMemcpyDefault included.
  EXPECT_EQ(cudaMemcpyAsync(d2, d, 64, cudaMemcpyDefault, nullptr), cudaSuccess);
  EXPECT_EQ(cudaMemsetAsync(static_cast<char*>(d2) + 60, 9, 4, nullptr), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(back.data(), d2, 64, cudaMemcpyDefault), cudaSuccess);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(back[i], i < 60 ? 3 : 9);
  // Frees must name what was allocated.
  EXPECT_EQ(cudaFree(static_cast<char*>(d) + 1), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFreeHost(d), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  EXPECT_EQ(cudaFree(d2), cudaSuccess);
  cudaGetLastError();
}

TEST(CudaEmuRuntime, PinnedMemoryIsHostMemory) {
  void* p = nullptr;
  ASSERT_EQ(cudaHostAlloc(&p, 4096, cudaHostAllocDefault), cudaSuccess);
  std::memset(p, 7, 4096);  // the host may touch it
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 4096), cudaSuccess);
  EXPECT_EQ(cudaMemcpyAsync(d, p, 4096, cudaMemcpyHostToDevice, nullptr), cudaSuccess);
  cudaPointerAttributes a{};
  ASSERT_EQ(cudaPointerGetAttributes(&a, p), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeHost);
  ASSERT_EQ(cudaPointerGetAttributes(&a, d), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeDevice);
  EXPECT_EQ(cudaFree(p), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFreeHost(p), cudaSuccess);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  cudaGetLastError();
}

TEST(CudaEmuRuntime, NewAllocationsHoldGarbageNotZeros) {
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 100), cudaSuccess);
  std::vector<unsigned char> h(100, 0);
  ASSERT_EQ(cudaMemcpy(h.data(), d, 100, cudaMemcpyDeviceToHost), cudaSuccess);
  for (unsigned char c : h) EXPECT_EQ(c, 0xff);  // NaN in every float format
  cudaFree(d);
}

TEST(CudaEmuRuntime, TheMemoryCapGivesOutOfMemory) {
  size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  EXPECT_EQ(total, size_t{4096} << 20);  // STRATA_CUDA_EMU_MEMORY_MIB's default
  void* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, total + 1), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  const Stats before = stats();
  void* a = nullptr;
  ASSERT_EQ(cudaMalloc(&a, 1 << 20), cudaSuccess);
  EXPECT_EQ(stats().device_allocations, before.device_allocations + 1);
  EXPECT_EQ(stats().device_bytes, before.device_bytes + (1 << 20));
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  EXPECT_EQ(free_bytes, total - stats().device_bytes);
  cudaFree(a);
  EXPECT_EQ(cudaMalloc(&d, 0), cudaSuccess);
  EXPECT_EQ(d, nullptr);
}

// A kernel reaches memory through a pointer stored in device memory (not in its parameters):
// the allocation is opened on first access.
__global__ void follow_pointer(int* const* table, int n) {
  int* p = table[0];
  for (int i = threadIdx.x; i < n; i += blockDim.x) p[i] = i * 2;
}

TEST(CudaEmuRuntime, KernelsReachMemoryThroughStoredPointers) {
  int* data = nullptr;
  int** table = nullptr;
  ASSERT_EQ(cudaMalloc(&data, 100 * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&table, sizeof(int*)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(table, &data, sizeof(int*), cudaMemcpyHostToDevice), cudaSuccess);
  STRATA_LAUNCH(1, 64, 0, nullptr, follow_pointer)(table, 100);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<int> h(100);
  ASSERT_EQ(cudaMemcpy(h.data(), data, 400, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(h[i], 2 * i);
  cudaFree(data);
  cudaFree(table);
}

// Note [Launch sites]: launches are counted where they are written, invalid ones not at all.
__global__ void count_blocks(int* out) {
  if (threadIdx.x == 0) out[blockIdx.x] = 1;
}

void launch_count_blocks(unsigned blocks, unsigned threads, int* out) {
  STRATA_LAUNCH(blocks, threads, 0, nullptr, count_blocks)(out);
}

TEST(CudaEmuRuntime, CountsEachLaunchSiteAndItsGeometry) {
  int* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, 200 * sizeof(int)), cudaSuccess);
  launch_count_blocks(4, 64, out);
  launch_count_blocks(200, 32, out);
  launch_count_blocks(131, 128, out);
  launch_count_blocks(2, 2048, out);  // too many threads: refused, not counted
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  const int own_line = __LINE__ + 1;
  STRATA_LAUNCH(132, 96, 0, nullptr, count_blocks)(out);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<LaunchSite> sites = launch_sites();
  int here = 0;
  for (const LaunchSite& s : sites)
    if (s.kernel == "count_blocks") {
      EXPECT_NE(s.file.find("runtime_test.cpp"), std::string::npos);
      ++here;
    }
  EXPECT_EQ(here, 2);  // the helper's launch and the test's own
  const LaunchSite* helper = nullptr;
  for (const LaunchSite& s : sites)
    if (s.kernel == "count_blocks" && s.launches == 3) helper = &s;
  ASSERT_NE(helper, nullptr);
  EXPECT_EQ(helper->blocks, 4u + 200u + 131u);
  EXPECT_EQ(helper->min_blocks, 4u);
  EXPECT_EQ(helper->max_blocks, 200u);
  EXPECT_EQ(helper->min_threads, 32u);
  EXPECT_EQ(helper->max_threads, 128u);
  EXPECT_EQ(helper->under_sms, 2u);  // 4 and 131 blocks; the device has 132 multiprocessors
  const LaunchSite* own = nullptr;
  for (const LaunchSite& s : sites)
    if (s.kernel == "count_blocks" && s.launches == 1) own = &s;
  ASSERT_NE(own, nullptr);
  EXPECT_EQ(own->line, own_line);
  EXPECT_EQ(own->blocks, 132u);
  EXPECT_EQ(own->under_sms, 0u);
  reset_launch_sites();
  launch_count_blocks(1, 32, out);
  ASSERT_EQ(launch_sites().size(), 1u);
  EXPECT_EQ(launch_sites()[0].launches, 1u);
  EXPECT_EQ(launch_sites()[0].min_blocks, 1u);
  cudaFree(out);
}

__global__ void write_past_end(float* p, int n) {
  if (threadIdx.x == 0) p[n + 16] = 1.f;  // in the guard page after the data
}

__global__ void write_through_null(float* p) {
  p[threadIdx.x] = 1.f;
}

using CudaEmuRuntimeDeathTest = ::testing::Test;

TEST(CudaEmuRuntimeDeathTest, HostCodeReadingDeviceMemoryAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 4096), cudaSuccess);
  EXPECT_DEATH(
      {
        volatile float x = d[3];
        (void)x;
      },
      "host code accessed device memory at 0x[0-9a-f]+ \\(byte offset 12 of a 4096-byte "
      "cudaMalloc allocation");
  cudaFree(d);
}

TEST(CudaEmuRuntimeDeathTest, KernelsOutOfBoundsOrOnBadAddressesAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 4096), cudaSuccess);
  EXPECT_DEATH((STRATA_LAUNCH(1, 32, 0, nullptr, write_past_end)(d, 1024), cudaDeviceSynchronize()),
               "write_past_end .*block \\(0,0,0\\) thread \\(0,0,0\\): out-of-bounds access at "
               "0x[0-9a-f]+, byte offset 4160 of a 4096-byte allocation");
  EXPECT_DEATH(
      (STRATA_LAUNCH(1, 32, 0, nullptr, write_through_null)(nullptr), cudaDeviceSynchronize()),
      "write_through_null .*: invalid address \\(nil\\)");
  cudaFree(d);
}

}  // namespace
}  // namespace strata::cuda_emu
