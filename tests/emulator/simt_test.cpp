// The CUDA emulator's SIMT engine (Note [CUDA emulator] in simt.h): launches, barriers, warp
// shuffles, launch validation and the aborts that replace hangs. This file is compiled like a
// .cu file of the emulation build (device.h force-included), so its kernels are real kernels.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <set>
#include <vector>

#include "cuda_emu/control.h"
#include "cuda_emu/device_vector.h"

namespace strata::cuda_emu {
namespace {

// ---- kernels ----

__global__ void write_ids(int* out) {
  const int block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const int threads = blockDim.x * blockDim.y * blockDim.z;
  const int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  out[block * threads + t] = block * 100000 + t;
}

// Every thread writes, the barrier, then every thread reads its neighbour's value: without a
// real barrier the first threads would read the 0xff poison.
__global__ void rotate_through_shared(const int* in, int* out) {
  __shared__ int sh[256];
  const int t = threadIdx.x;
  sh[t] = in[blockIdx.x * blockDim.x + t];
  __syncthreads();
  out[blockIdx.x * blockDim.x + t] = sh[(t + 1) % blockDim.x];
}

__global__ void barrier_reductions(const int* pred, int* out) {
  const int p = pred[threadIdx.x];
  const int c = __syncthreads_count(p);
  const int a = __syncthreads_and(p);
  const int o = __syncthreads_or(p);
  if (threadIdx.x == 0) {
    out[0] = c;
    out[1] = a;
    out[2] = o;
  }
}

// out[4 * t + 0..3] = xor/down/up/idx shuffles of (t * 10) within the warp.
__global__ void shuffles(int* out, int width) {
  const int t = threadIdx.x;
  const int v = t * 10;
  out[4 * t + 0] = __shfl_xor_sync(0xffffffffu, v, 5, width);
  out[4 * t + 1] = __shfl_down_sync(0xffffffffu, v, 3, width);
  out[4 * t + 2] = __shfl_up_sync(0xffffffffu, v, 3, width);
  out[4 * t + 3] = __shfl_sync(0xffffffffu, v, 7, width);
}

__global__ void shuffle_wide(const double* in, double* dout, int64_t* iout) {
  const int t = threadIdx.x;
  dout[t] = __shfl_xor_sync(0xffffffffu, in[t], 1);
  iout[t] = __shfl_sync(0xffffffffu, int64_t{1} << (32 + t % 31), 31 - t % 32);
}

__global__ void ballots(unsigned* out) {
  const int t = threadIdx.x;
  out[t] = __ballot_sync(0xffffffffu, t % 3 == 0);
  out[64 + t] = __any_sync(0xffffffffu, t == 17);
  out[128 + t] = __all_sync(0xffffffffu, t < 100);
}

// A warp sum the way common.cuh's block_sum starts it.
__global__ void warp_sums(const float* in, float* out) {
  float v = in[blockIdx.x * blockDim.x + threadIdx.x];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) out[(blockIdx.x * blockDim.x + threadIdx.x) / 32] = v;
}

// Half the warp shuffles among itself (mask 0x0000ffff), the other half but lane 20 reads lane 20,
// which its mask leaves out: that value is undefined and comes back as all ones.
__global__ void partial_masks(int* out) {
  const int t = threadIdx.x;
  if (t < 16)
    out[t] = __shfl_xor_sync(0x0000ffffu, t, 8);
  else if (t != 20)
    out[t] = __shfl_sync(0xffef0000u, t, 20);
  else
    out[t] = -2;
}

__global__ void block_order_probe(int* order, int* next) {
  if (threadIdx.x == 0) order[(*next)++] = blockIdx.x;
}

__global__ void noop() {}

TEST(CudaEmu, EveryThreadOfEveryBlockRunsOnceWithItsOwnIndices) {
  const dim3 grid(3, 2, 2), block(8, 4, 2);
  const int n = 12 * 64;
  DeviceVector<int> out(n, -7);
  const Stats before = stats();
  STRATA_LAUNCH(grid, block, 0, nullptr, write_ids)(out.get());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<int> h = out.host();
  for (int b = 0; b < 12; ++b)
    for (int t = 0; t < 64; ++t) ASSERT_EQ(h[b * 64 + t], b * 100000 + t) << b << " " << t;
  const Stats after = stats();
  EXPECT_EQ(after.launches - before.launches, 1u);
  EXPECT_EQ(after.blocks - before.blocks, 12u);
  EXPECT_EQ(after.threads - before.threads, static_cast<uint64_t>(n));
}

TEST(CudaEmu, SyncthreadsIsABlockBarrier) {
  std::vector<int> in(3 * 256);
  std::iota(in.begin(), in.end(), 1);
  DeviceVector<int> din(in), dout(in.size());
  STRATA_LAUNCH(3, 256, 0, nullptr, rotate_through_shared)(din.get(), dout.get());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<int> h = dout.host();
  for (int b = 0; b < 3; ++b)
    for (int t = 0; t < 256; ++t) EXPECT_EQ(h[b * 256 + t], in[b * 256 + (t + 1) % 256]);
}

TEST(CudaEmu, SyncthreadsCountAndOr) {
  std::vector<int> pred(96, 0);
  for (int t = 0; t < 96; t += 7) pred[t] = 1;
  DeviceVector<int> dp(pred), out(3);
  STRATA_LAUNCH(1, 96, 0, nullptr, barrier_reductions)(dp.get(), out.get());
  EXPECT_EQ(out.host(), (std::vector<int>{14, 0, 1}));
  DeviceVector<int> all(std::vector<int>(96, 1));
  STRATA_LAUNCH(1, 96, 0, nullptr, barrier_reductions)(all.get(), out.get());
  EXPECT_EQ(out.host(), (std::vector<int>{96, 1, 1}));
}

TEST(CudaEmu, ShufflesFollowTheProgrammingGuide) {
  for (int width : {32, 8}) {
    SCOPED_TRACE(width);
    DeviceVector<int> out(64 * 4);
    STRATA_LAUNCH(1, 64, 0, nullptr, shuffles)(out.get(), width);
    const std::vector<int> h = out.host();
    for (int t = 0; t < 64; ++t) {
      const int lane = t % 32, base = t - lane, seg = lane / width * width;
      // xor: a lane of a later segment gives the lane's own value
      const int x = lane ^ 5;
      EXPECT_EQ(h[4 * t + 0], (x >= seg + width ? lane : x) * 10 + base * 10);
      const int d = lane + 3 < seg + width ? lane + 3 : lane;
      EXPECT_EQ(h[4 * t + 1], (base + d) * 10);
      const int u = lane - 3 >= seg ? lane - 3 : lane;
      EXPECT_EQ(h[4 * t + 2], (base + u) * 10);
      EXPECT_EQ(h[4 * t + 3], (base + seg + 7 % width) * 10);
    }
  }
}

TEST(CudaEmu, ShufflesMove64BitValues) {
  std::vector<double> in(32);
  for (int t = 0; t < 32; ++t) in[t] = 1.0 / (t + 3);
  DeviceVector<double> din(in), dout(32);
  DeviceVector<int64_t> iout(32);
  STRATA_LAUNCH(1, 32, 0, nullptr, shuffle_wide)(din.get(), dout.get(), iout.get());
  const std::vector<double> d = dout.host();
  const std::vector<int64_t> i = iout.host();
  for (int t = 0; t < 32; ++t) {
    EXPECT_EQ(d[t], in[t ^ 1]);
    EXPECT_EQ(i[t], int64_t{1} << (32 + (31 - t) % 31));
  }
}

TEST(CudaEmu, BallotAnyAll) {
  DeviceVector<unsigned> out(192);
  STRATA_LAUNCH(1, 64, 0, nullptr, ballots)(out.get());
  const std::vector<unsigned> h = out.host();
  for (int t = 0; t < 64; ++t) {
    unsigned want = 0;
    for (int l = 0; l < 32; ++l)
      if ((t / 32 * 32 + l) % 3 == 0) want |= 1u << l;
    EXPECT_EQ(h[t], want) << t;
    EXPECT_EQ(h[64 + t], t < 32 ? 1u : 0u);
    EXPECT_EQ(h[128 + t], 1u);
  }
}

TEST(CudaEmu, WarpSumsMatchASequentialTree) {
  std::vector<float> in(256);
  for (int i = 0; i < 256; ++i) in[i] = static_cast<float>(i % 13) - 6.f;
  DeviceVector<float> din(in), dout(8);
  STRATA_LAUNCH(2, 128, 0, nullptr, warp_sums)(din.get(), dout.get());
  const std::vector<float> h = dout.host();
  for (int w = 0; w < 8; ++w) {
    float want = 0;
    for (int l = 0; l < 32; ++l) want += in[w * 32 + l];
    EXPECT_EQ(h[w], want);
  }
}

TEST(CudaEmu, PartialMasksAndUndefinedLanes) {
  DeviceVector<int> out(32);
  STRATA_LAUNCH(1, 32, 0, nullptr, partial_masks)(out.get());
  const std::vector<int> h = out.host();
  for (int t = 0; t < 16; ++t) EXPECT_EQ(h[t], t ^ 8);
  for (int t = 16; t < 32; ++t) EXPECT_EQ(h[t], t == 20 ? -2 : -1) << "lane 20 is outside the mask";
}

// Each thread reads its neighbour's (t ^ 1) shared-memory write, with or without a barrier
// between; `salt` makes every launch's values new, so a stale value from an earlier one shows.
__global__ void neighbour_read(int* out, int salt, bool barrier) {
  __shared__ int s[64];
  s[threadIdx.x] = static_cast<int>(threadIdx.x) + salt;
  if (barrier) __syncthreads();
  out[threadIdx.x] = s[threadIdx.x ^ 1u];
}

TEST(CudaEmu, EachThreadOrderExposesHalfOfAMissingBarrier) {
  DeviceVector<int> out(64);
  int salt = 1000;
  // Which threads read a value not yet written, in each order.
  auto stale = [&](BlockOrder order, bool barrier) {
    set_thread_order(order);
    salt += 1000;
    STRATA_LAUNCH(1, 64, 0, nullptr, neighbour_read)(out.get(), salt, barrier);
    set_thread_order(BlockOrder::Forward);
    const std::vector<int> h = out.host();
    std::vector<int> bad;
    for (int t = 0; t < 64; ++t)
      if (h[t] != (t ^ 1) + salt) bad.push_back(t);
    return bad;
  };
  const std::vector<int> none;
  EXPECT_EQ(stale(BlockOrder::Forward, true), none);
  EXPECT_EQ(stale(BlockOrder::Reverse, true), none);
  const std::vector<int> fwd = stale(BlockOrder::Forward, false);
  const std::vector<int> rev = stale(BlockOrder::Reverse, false);
  ASSERT_EQ(fwd.size(), 32u);  // the even threads read ahead of their neighbour
  ASSERT_EQ(rev.size(), 32u);  // the odd ones
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(fwd[i], 2 * i);
    EXPECT_EQ(rev[i], 2 * i + 1);
  }
}

TEST(CudaEmu, BlocksRunForwardOrReversed) {
  DeviceVector<int> order(5), next(1, 0);
  STRATA_LAUNCH(5, 32, 0, nullptr, block_order_probe)(order.get(), next.get());
  EXPECT_EQ(order.host(), (std::vector<int>{0, 1, 2, 3, 4}));
  const BlockOrder saved = block_order();
  set_block_order(BlockOrder::Reverse);
  DeviceVector<int> next2(1, 0);
  STRATA_LAUNCH(5, 32, 0, nullptr, block_order_probe)(order.get(), next2.get());
  set_block_order(saved);
  EXPECT_EQ(order.host(), (std::vector<int>{4, 3, 2, 1, 0}));
}

TEST(CudaEmu, ShuffledBlocksRunOnceEachInOrdersOfTheirOwn) {
  const BlockOrder saved = block_order();
  set_block_order(BlockOrder::Shuffle);
  const std::vector<int> forward = {0, 1, 2, 3, 4, 5, 6, 7, 8},
                         reverse = {8, 7, 6, 5, 4, 3, 2, 1, 0};
  std::set<std::vector<int>> seen;
  for (int launch = 0; launch < 20; ++launch) {
    DeviceVector<int> order(9), next(1, 0);
    STRATA_LAUNCH(9, 32, 0, nullptr, block_order_probe)(order.get(), next.get());
    std::vector<int> o = order.host();
    seen.insert(o);
    std::sort(o.begin(), o.end());
    EXPECT_EQ(o, forward) << "every block once";
  }
  set_block_order(saved);
  seen.erase(forward);
  seen.erase(reverse);
  EXPECT_GE(seen.size(), 3u) << "orders other than forward and reverse, and not one alone";
}

TEST(CudaEmu, BadLaunchConfigurationsRunNothingAndSetTheError) {
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  DeviceVector<int> out(4, 5);
  const uint64_t launches = stats().launches;
  const dim3 bad[] = {dim3(1025), dim3(32, 33), dim3(1, 1, 65), dim3(0)};
  for (const dim3& b : bad) {
    STRATA_LAUNCH(1, b, 0, nullptr, write_ids)(out.get());
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration) << b.x << "x" << b.y << "x" << b.z;
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the error is not sticky";
  }
  STRATA_LAUNCH(dim3(1, 65536), 32, 0, nullptr, write_ids)(out.get());
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  STRATA_LAUNCH(dim3(1, 1, 70000), 32, 0, nullptr, write_ids)(out.get());
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  STRATA_LAUNCH(0, 32, 0, nullptr, write_ids)(out.get());
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(stats().launches, launches);
  EXPECT_EQ(out.host(), (std::vector<int>(4, 5)));
  // The limits themselves are fine.
  STRATA_LAUNCH(dim3(1, 65535), 1, 0, nullptr, noop)();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  STRATA_LAUNCH(1, 1024, 0, nullptr, noop)();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  STRATA_LAUNCH(1, dim3(16, 1, 64), 0, nullptr, noop)();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(CudaEmu, ALaunchOnADestroyedStreamIsAnError) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  STRATA_LAUNCH(1, 32, 0, s, noop)();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  STRATA_LAUNCH(1, 32, 0, s, noop)();
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
}

// ---- what aborts instead of hanging ----

__global__ void half_block_syncs(int* out) {
  if (threadIdx.x < 32) {
    __syncthreads();
    out[threadIdx.x] = 1;
  }
}

__global__ void exit_then_sync(int* out) {
  if (threadIdx.x < 32) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void shuffle_with_exited_lane(int* out) {
  if (threadIdx.x == 5) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x), 1);
}

__global__ void shuffle_vs_barrier(int* out) {
  int v = threadIdx.x;
  if (threadIdx.x == 31)
    __syncthreads();
  else
    v = __shfl_xor_sync(0xffffffffu, v, 1);
  out[threadIdx.x] = v;
}

__global__ void mismatched_collectives(int* out) {
  if (threadIdx.x % 2 == 0)
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
  else
    out[threadIdx.x] = __ballot_sync(0xffffffffu, 1);
}

__global__ void mask_beyond_block(int* out) {
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
}

using CudaEmuDeathTest = ::testing::Test;

TEST(CudaEmuDeathTest, ABarrierThatCannotCompleteAbortsNamingTheKernel) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  DeviceVector<int> out(64);
  EXPECT_DEATH(
      (STRATA_LAUNCH(1, 64, 0, nullptr, half_block_syncs)(out.get()), cudaDeviceSynchronize()),
      "half_block_syncs.*exited while 32 other threads wait for it at __syncthreads");
  EXPECT_DEATH(
      (STRATA_LAUNCH(1, 64, 0, nullptr, exit_then_sync)(out.get()), cudaDeviceSynchronize()),
      "exit_then_sync.*reached __syncthreads after [0-9]+ threads of the block exited");
}

TEST(CudaEmuDeathTest, AShuffleNamingAnExitedLaneAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  DeviceVector<int> out(32);
  EXPECT_DEATH((STRATA_LAUNCH(1, 32, 0, nullptr, shuffle_with_exited_lane)(out.get()),
                cudaDeviceSynchronize()),
               "shuffle_with_exited_lane.*(exited while lane [0-9]+ waits for it|which have "
               "exited)");
}

TEST(CudaEmuDeathTest, ADeadlockAbortsWithWhatEveryThreadWaitsFor) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  DeviceVector<int> out(32);
  EXPECT_DEATH(
      (STRATA_LAUNCH(1, 32, 0, nullptr, shuffle_vs_barrier)(out.get()), cudaDeviceSynchronize()),
      "shuffle_vs_barrier.*deadlock, no thread can proceed:.*1 of 32 threads wait at "
      "__syncthreads.*warp 0 lanes 0-30 wait at __shfl_xor_sync\\(mask 0xffffffff\\); "
      "lane 31 is at __syncthreads");
}

TEST(CudaEmuDeathTest, LanesThatDisagreeOrMasksBeyondTheBlockAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  DeviceVector<int> out(32);
  EXPECT_DEATH((STRATA_LAUNCH(1, 32, 0, nullptr, mismatched_collectives)(out.get()),
                cudaDeviceSynchronize()),
               "mismatched_collectives.*meets lane [0-9]+ at");
  EXPECT_DEATH(
      (STRATA_LAUNCH(1, 16, 0, nullptr, mask_beyond_block)(out.get()), cudaDeviceSynchronize()),
      "mask_beyond_block.*names lanes 16-31, which do not exist");
}

}  // namespace
}  // namespace strata::cuda_emu
