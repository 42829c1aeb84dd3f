#pragma once
// Streams and events of the emulated device (Note [Emulated streams]).
//
// Note [Emulated streams]
// By default (STRATA_CUDA_EMU_STREAMS=deferred) device work does not run when it is enqueued:
// every kernel, async copy or memset and cuBLASLt matmul waits in its stream's queue until the
// host needs it, and then only what is needed runs. So host code that reads a result without
// waiting for it sees the old bytes, and a stream that uses another stream's result without an
// event between them runs first; either way the test fails as it would on a GPU on a bad day.
//   - What makes work run: cudaStreamSynchronize (that stream), cudaEventSynchronize (that
//     stream up to the record), cudaDeviceSynchronize, cudaFree and cudaFreeHost (everything,
//     as the real calls synchronize the device), and the copies the CUDA runtime documents as
//     synchronous: cudaMemcpy unless device to device, and cudaMemcpyAsync into pageable host
//     memory. cudaMemcpyAsync from pageable host memory snapshots the source at the call (the
//     real runtime stages it); from pinned memory it reads the source when it runs.
//   - Work runs in stream order, after whatever it waits for: an event recorded earlier
//     (cudaStreamWaitEvent takes the record current at the call), and the legacy default
//     stream's rules (it waits for all blocking streams, they wait for it; streams created with
//     cudaStreamNonBlocking wait for neither). cudaDeviceSynchronize drains the newest stream
//     first, so an order the program did not ask for is the one that happens.
//   - cudaEventQuery and cudaStreamQuery of unfinished work return cudaErrorNotReady (which, as
//     on the device, is also what the next cudaGetLastError returns) and then run that work, so
//     a polling loop ends and both answers are exercised.
//   - Stats::host_waits counts the host waits for pending work, Stats::idle_waits those after
//     which nothing was left queued on the stream waited for (on a GPU, that stream then idles
//     until the host enqueues more; a wait for old work with more queued behind it only paces
//     the host).
//     STRATA_CUDA_EMU_TRACE_WAITS=1 prints the host stack at each.
//   - The queue belongs to the device, not to a host thread: whichever host thread waits runs
//     the work (holding the scheduler's mutex, one operation at a time).
// STRATA_CUDA_EMU_STREAMS=immediate runs everything when it is enqueued, as a device that is
// always idle would.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>

namespace strata::cuda_emu {

enum class StreamMode { Deferred, Immediate };
// Drains everything pending, then switches.
void set_stream_mode(StreamMode mode);
StreamMode stream_mode();

// Enqueues `op` on stream `s` (a handle valid_stream accepted). In immediate mode, or when
// called while device work runs, `op` runs at once. `op` opens its own DeviceOp.
void enqueue(cudaStream_t s, std::function<void()> op);
// Enqueues `op` and waits for it (and what it waits for) to finish.
void enqueue_and_wait(cudaStream_t s, std::function<void()> op);
// Runs all work pending anywhere (cudaDeviceSynchronize).
void drain_all();
// How many times the host has waited for pending work (Stats::host_waits, control.h).
uint64_t host_waits();
// How many of them left nothing queued (Stats::idle_waits).
uint64_t idle_waits();

}  // namespace strata::cuda_emu
