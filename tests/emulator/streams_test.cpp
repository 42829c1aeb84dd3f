// Streams and events of the emulated device (Note [Emulated streams] in streams.h): work waits
// in its stream until the host needs it, runs in stream order after what it waits for, and only
// the synchronization the program asked for orders it.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cuda_emu/control.h"
#include "cuda_emu/device_vector.h"
#include "cuda_emu/streams.h"

namespace strata::cuda_emu {
namespace {

__global__ void fill_with(int* p, int n, int v) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) p[i] = v;
}

__global__ void add_to(int* p, int n, int v) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) p[i] += v;
}

// Pinned host memory: copies into it are asynchronous (into pageable memory they are not).
struct Pinned {
  explicit Pinned(size_t n) : n(n) {
    EXPECT_EQ(cudaMallocHost(reinterpret_cast<void**>(&p), n * sizeof(int)), cudaSuccess);
    std::memset(p, 0, n * sizeof(int));
  }
  ~Pinned() { cudaFreeHost(p); }
  int* p = nullptr;
  size_t n;
};

struct Stream {
  explicit Stream(unsigned flags = cudaStreamNonBlocking) {
    EXPECT_EQ(cudaStreamCreateWithFlags(&s, flags), cudaSuccess);
  }
  ~Stream() { cudaStreamDestroy(s); }
  cudaStream_t s = nullptr;
};

struct Event {
  explicit Event(unsigned flags = cudaEventDisableTiming) {
    EXPECT_EQ(cudaEventCreateWithFlags(&e, flags), cudaSuccess);
  }
  ~Event() { cudaEventDestroy(e); }
  cudaEvent_t e = nullptr;
};

class CudaEmuStreams : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = stream_mode();
    set_stream_mode(StreamMode::Deferred);
    cudaGetLastError();
  }
  void TearDown() override { set_stream_mode(saved_); }

 private:
  StreamMode saved_ = StreamMode::Deferred;
};

TEST_F(CudaEmuStreams, WorkRunsWhenTheHostWaitsForIt) {
  Stream st;
  DeviceVector<int> d(64, 0);
  Pinned h(64);
  const uint64_t waits = stats().host_waits;
  STRATA_LAUNCH(1, 32, 0, st.s, fill_with)(d.get(), 64, 7);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(h.p, d.get(), 64 * sizeof(int), cudaMemcpyDeviceToHost, st.s),
            cudaSuccess);
  EXPECT_EQ(h.p[0], 0) << "an asynchronous copy into pinned memory has not run before a wait";
  EXPECT_EQ(stats().host_waits, waits);
  ASSERT_EQ(cudaStreamSynchronize(st.s), cudaSuccess);
  EXPECT_EQ(stats().host_waits, waits + 1);
  for (int i = 0; i < 64; ++i) ASSERT_EQ(h.p[i], 7);
}

// Stats::idle_waits: a wait for an event with more work queued behind it paces the host but
// leaves the device busy; a wait that runs everything queued leaves it idle.
TEST_F(CudaEmuStreams, AWaitLeavesTheDeviceIdleOnlyWhenNothingIsQueuedBehindIt) {
  Stream st;
  DeviceVector<int> d(64, 0);
  cudaEvent_t e;
  ASSERT_EQ(cudaEventCreate(&e), cudaSuccess);
  const Stats before = stats();
  STRATA_LAUNCH(1, 32, 0, st.s, fill_with)(d.get(), 64, 1);
  ASSERT_EQ(cudaEventRecord(e, st.s), cudaSuccess);
  STRATA_LAUNCH(1, 32, 0, st.s, fill_with)(d.get(), 64, 2);
  ASSERT_EQ(cudaEventSynchronize(e), cudaSuccess);
  EXPECT_EQ(stats().host_waits, before.host_waits + 1);
  EXPECT_EQ(stats().idle_waits, before.idle_waits);
  ASSERT_EQ(cudaStreamSynchronize(st.s), cudaSuccess);
  EXPECT_EQ(stats().host_waits, before.host_waits + 2);
  EXPECT_EQ(stats().idle_waits, before.idle_waits + 1);
  ASSERT_EQ(cudaEventDestroy(e), cudaSuccess);
}

TEST_F(CudaEmuStreams, AStreamWaitsForAnotherOnlyThroughAnEvent) {
  Stream producer, consumer;
  DeviceVector<int> d(32, 0);
  Pinned h(32);
  // No event: syncing the consumer runs the consumer alone, which reads the old values.
  STRATA_LAUNCH(1, 32, 0, producer.s, fill_with)(d.get(), 32, 5);
  cudaMemcpyAsync(h.p, d.get(), 32 * sizeof(int), cudaMemcpyDeviceToHost, consumer.s);
  ASSERT_EQ(cudaStreamSynchronize(consumer.s), cudaSuccess);
  EXPECT_EQ(h.p[0], 0);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // With an event recorded after the producer's kernel, the consumer's copy waits for it.
  Event ready;
  STRATA_LAUNCH(1, 32, 0, producer.s, fill_with)(d.get(), 32, 9);
  ASSERT_EQ(cudaEventRecord(ready.e, producer.s), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(consumer.s, ready.e, 0), cudaSuccess);
  cudaMemcpyAsync(h.p, d.get(), 32 * sizeof(int), cudaMemcpyDeviceToHost, consumer.s);
  // Work the producer enqueues after the record is not waited for.
  STRATA_LAUNCH(1, 32, 0, producer.s, add_to)(d.get(), 32, 100);
  ASSERT_EQ(cudaStreamSynchronize(consumer.s), cudaSuccess);
  EXPECT_EQ(h.p[0], 9);
  ASSERT_EQ(cudaStreamSynchronize(producer.s), cudaSuccess);
  EXPECT_EQ(d.host()[0], 109);
}

TEST_F(CudaEmuStreams, TheLegacyStreamOrdersBlockingStreamsOnly) {
  DeviceVector<int> d(32, 0);
  Pinned h(32);
  Stream nonblocking(cudaStreamNonBlocking), blocking(cudaStreamDefault);
  STRATA_LAUNCH(1, 32, 0, nullptr, fill_with)(d.get(), 32, 3);
  cudaMemcpyAsync(h.p, d.get(), 32 * sizeof(int), cudaMemcpyDeviceToHost, nonblocking.s);
  ASSERT_EQ(cudaStreamSynchronize(nonblocking.s), cudaSuccess);
  EXPECT_EQ(h.p[0], 0) << "a non-blocking stream does not wait for the legacy stream";
  cudaMemcpyAsync(h.p, d.get(), 32 * sizeof(int), cudaMemcpyDeviceToHost, blocking.s);
  ASSERT_EQ(cudaStreamSynchronize(blocking.s), cudaSuccess);
  EXPECT_EQ(h.p[0], 3) << "a blocking stream waits for earlier legacy-stream work";
  // cudaMemcpy runs on the legacy stream: it waits for a blocking stream, not a non-blocking one.
  STRATA_LAUNCH(1, 32, 0, nonblocking.s, fill_with)(d.get(), 32, 4);
  std::vector<int> back(32, -1);
  ASSERT_EQ(cudaMemcpy(back.data(), d.get(), 32 * sizeof(int), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(back[0], 3);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  STRATA_LAUNCH(1, 32, 0, blocking.s, fill_with)(d.get(), 32, 6);
  ASSERT_EQ(cudaMemcpy(back.data(), d.get(), 32 * sizeof(int), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(back[0], 6);
}

TEST_F(CudaEmuStreams, CopiesFromPageableMemoryStageTheSourceButPinnedSourcesAreReadLater) {
  Stream st;
  DeviceVector<int> d(16, 0);
  std::vector<int> pageable(16, 1);
  ASSERT_EQ(
      cudaMemcpyAsync(d.get(), pageable.data(), 16 * sizeof(int), cudaMemcpyHostToDevice, st.s),
      cudaSuccess);
  std::fill(pageable.begin(), pageable.end(), 2);  // after the call: not seen
  ASSERT_EQ(cudaStreamSynchronize(st.s), cudaSuccess);
  EXPECT_EQ(d.host()[0], 1);
  Pinned pinned(16);
  std::fill(pinned.p, pinned.p + 16, 1);
  ASSERT_EQ(cudaMemcpyAsync(d.get(), pinned.p, 16 * sizeof(int), cudaMemcpyHostToDevice, st.s),
            cudaSuccess);
  std::fill(pinned.p, pinned.p + 16, 2);  // before the copy ran: seen, as on the device
  ASSERT_EQ(cudaStreamSynchronize(st.s), cudaSuccess);
  EXPECT_EQ(d.host()[0], 2);
  // Into pageable memory the copy is synchronous.
  STRATA_LAUNCH(1, 32, 0, st.s, fill_with)(d.get(), 16, 8);
  ASSERT_EQ(
      cudaMemcpyAsync(pageable.data(), d.get(), 16 * sizeof(int), cudaMemcpyDeviceToHost, st.s),
      cudaSuccess);
  EXPECT_EQ(pageable[15], 8);
}

TEST_F(CudaEmuStreams, QueriesReportNotReadyOnceAndLeaveItAsTheLastError) {
  Stream st;
  DeviceVector<int> d(32, 0);
  Event done;
  EXPECT_EQ(cudaEventQuery(done.e), cudaSuccess) << "a never-recorded event is complete";
  STRATA_LAUNCH(1, 32, 0, st.s, fill_with)(d.get(), 32, 1);
  ASSERT_EQ(cudaEventRecord(done.e, st.s), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(done.e), cudaErrorNotReady);
  EXPECT_EQ(cudaGetLastError(), cudaErrorNotReady);
  EXPECT_EQ(cudaEventQuery(done.e), cudaSuccess);
  STRATA_LAUNCH(1, 32, 0, st.s, fill_with)(d.get(), 32, 2);
  EXPECT_EQ(cudaStreamQuery(st.s), cudaErrorNotReady);
  EXPECT_EQ(cudaStreamQuery(st.s), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaErrorNotReady);
  EXPECT_EQ(d.host()[0], 2);
}

TEST_F(CudaEmuStreams, EventsTimeWhatRanAndAreCheckedHandles) {
  Stream st;
  Event a(cudaEventDefault), b(cudaEventDefault), quiet;
  DeviceVector<int> d(32, 0);
  ASSERT_EQ(cudaEventRecord(a.e, st.s), cudaSuccess);
  STRATA_LAUNCH(1, 32, 0, st.s, fill_with)(d.get(), 32, 1);
  ASSERT_EQ(cudaEventRecord(b.e, st.s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(quiet.e, st.s), cudaSuccess);
  float ms = -1.f;
  EXPECT_EQ(cudaEventElapsedTime(&ms, a.e, b.e), cudaErrorNotReady);
  ASSERT_EQ(cudaEventSynchronize(b.e), cudaSuccess);
  EXPECT_EQ(cudaEventElapsedTime(&ms, a.e, b.e), cudaSuccess);
  EXPECT_GE(ms, 0.f);
  EXPECT_EQ(cudaEventElapsedTime(&ms, a.e, quiet.e), cudaErrorInvalidResourceHandle);
  cudaEvent_t gone;
  ASSERT_EQ(cudaEventCreate(&gone), cudaSuccess);
  ASSERT_EQ(cudaEventDestroy(gone), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(gone), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaStreamWaitEvent(st.s, gone, 0), cudaErrorInvalidResourceHandle);
  cudaGetLastError();
}

TEST_F(CudaEmuStreams, ADestroyedStreamsWorkStillRunsAndItsHandleIsRefused) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  DeviceVector<int> d(32, 0);
  STRATA_LAUNCH(1, 32, 0, s, fill_with)(d.get(), 32, 4);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaMemsetAsync(d.get(), 0, 4, s), cudaErrorInvalidResourceHandle);
  cudaGetLastError();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(d.host()[0], 4);
}

TEST_F(CudaEmuStreams, TheDeviceDrainsTheNewestStreamFirst) {
  // Two streams write the same buffer with nothing ordering them: the device may run them in
  // either order, and the emulator picks the one against enqueue order.
  Stream older, newer;
  DeviceVector<int> d(32, 0);
  STRATA_LAUNCH(1, 32, 0, older.s, fill_with)(d.get(), 32, 1);
  STRATA_LAUNCH(1, 32, 0, newer.s, fill_with)(d.get(), 32, 2);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(d.host()[0], 1);
}

TEST_F(CudaEmuStreams, ImmediateModeRunsEverythingWhenEnqueued) {
  set_stream_mode(StreamMode::Immediate);
  Stream st;
  DeviceVector<int> d(32, 0);
  Pinned h(32);
  STRATA_LAUNCH(1, 32, 0, st.s, fill_with)(d.get(), 32, 7);
  cudaMemcpyAsync(h.p, d.get(), 32 * sizeof(int), cudaMemcpyDeviceToHost, st.s);
  EXPECT_EQ(h.p[0], 7);
}

TEST_F(CudaEmuStreams, FreeingWaitsForPendingWork) {
  Stream st;
  int* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 32 * sizeof(int)), cudaSuccess);
  Pinned h(32);
  STRATA_LAUNCH(1, 32, 0, st.s, fill_with)(d, 32, 3);
  cudaMemcpyAsync(h.p, d, 32 * sizeof(int), cudaMemcpyDeviceToHost, st.s);
  ASSERT_EQ(cudaFree(d), cudaSuccess);  // runs the kernel and the copy first
  EXPECT_EQ(h.p[31], 3);
}

}  // namespace
}  // namespace strata::cuda_emu
