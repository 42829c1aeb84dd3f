#pragma once
// Switches and counters of the CUDA emulator for tests and for whoever investigates a kernel
// (Note [CUDA emulator] in simt.h). Each setting also has an environment variable, read once.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

namespace strata::cuda_emu {

// STRATA_CUDA_EMU_BLOCK_ORDER=reverse: blocks run from the last to the first, which exposes
// kernels that assume an order between blocks (the device promises none). =shuffle: each launch
// runs its blocks in an order of its own, b = (a k + c) mod blocks for the k-th block run, with a
// coprime to the count and a, c drawn per launch from STRATA_CUDA_EMU_SEED (default 1) and the
// launch's number: neither forward nor reverse, so a kernel that needs a block to run before one
// other than its neighbour shows it too. (Threads take forward or reverse only.)
enum class BlockOrder { Forward, Reverse, Shuffle };
void set_block_order(BlockOrder order);
BlockOrder block_order();
// STRATA_CUDA_EMU_THREAD_ORDER=reverse: a block's threads start and wake from barriers from the
// highest index down (exposes a missing __syncthreads; forward order exposes the other half).
void set_thread_order(BlockOrder order);

// STRATA_CUDA_EMU_CUDNN_VERSION=N (read at each cudnnGetVersion call): the emulated cuDNN reports
// release N instead of the headers' (cuda_emu/cudnn.cpp).

// Note [Emulator dry run]
// STRATA_CUDA_EMU_DRY_RUN=1 (read once, at the first device operation): the device does no work.
// Launches, cuBLASLt matmuls and cuDNN graph executions are enqueued, ordered, waited for and
// counted as always, but when their turn comes they return at once; so do memsets and every copy
// into device memory. Copies from the device to the host still run (they read zeros), so the host
// code takes its usual path: losses and gradient norms come back finite. Allocations are not
// poisoned, and since nothing writes device memory its pages are never touched: a run can ask for
// the 80 GB of an H100 on a machine with a fraction of that (STRATA_CUDA_EMU_MEMORY_MIB sets the
// cap). What such a run measures is the host's side of a step, the runtime calls included, and
// how much device memory the step takes; nothing it computes means anything.
// tools/bench/run_host_overhead.sh runs bench_gpt2_cuda this way.
bool dry_run();

struct Stats {
  uint64_t launches = 0;            // kernels run
  uint64_t blocks = 0;              // blocks run
  uint64_t threads = 0;             // emulated threads run
  uint64_t switches = 0;            // fiber switches
  uint64_t matmuls = 0;             // cublasLtMatmul calls run
  uint64_t graph_runs = 0;          // cudnnBackendExecute calls run
  uint64_t device_allocations = 0;  // live cudaMalloc allocations
  uint64_t device_bytes = 0;        // bytes they hold
  uint64_t host_waits = 0;          // times the host waited for pending work (streams.h)
  uint64_t idle_waits = 0;          // those that left no work queued: the device would idle
};
Stats stats();

// The emulated device's multiprocessors (an H100 SXM's 132), as cudaGetDeviceProperties says.
inline constexpr int kMultiprocessors = 132;

// Note [Launch sites]
// Every valid launch is counted at its STRATA_LAUNCH (file and line), dry runs included: how
// often, and with how many blocks of how many threads. The host code that picks a launch's
// geometry is the code a GPU runs, so these are the grids the GPU would get (the emulated device
// has an H100's 132 multiprocessors). A launch with fewer blocks than multiprocessors leaves some
// of them idle for its whole run; bench_gpt2_cuda --launches lists a training step's sites.
struct LaunchSite {
  std::string kernel;  // the kernel expression as written (template arguments unexpanded)
  std::string file;
  int line = 0;
  uint64_t launches = 0;
  uint64_t blocks = 0;  // over all launches
  uint64_t min_blocks = 0, max_blocks = 0;
  uint32_t min_threads = 0, max_threads = 0;  // per block
  uint64_t under_sms = 0;                     // launches with fewer blocks than kMultiprocessors
};
// Totals since the process started or the last reset_launch_sites, ordered by file and line.
std::vector<LaunchSite> launch_sites();
void reset_launch_sites();
// Launches so far of the sites whose kernel expression contains `kernel`.
uint64_t launches_of(const std::string& kernel);

// Set by the runtime: the error the next cudaGetLastError returns.
void record_error(cudaError_t e);
// True for the default stream handles and every created, not yet destroyed stream.
bool valid_stream(cudaStream_t s);

}  // namespace strata::cuda_emu
