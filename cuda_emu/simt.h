#pragma once
// The emulator's SIMT engine: launches, the per-thread built-in variables, block barriers and
// warp collectives. Kernels reach it through device.h; tests through control.h.
//
// Note [CUDA emulator]
// A STRATA_CUDA_EMULATION build runs the CUDA backend on the CPU: the .cu files are compiled as
// C++ with device.h force-included, and libstrata_cuda_emu stands in for libcudart and
// libcublasLt. What runs is the kernels' own code, so indexing, reductions, shuffles and launch
// configurations are checked as written.
//   - A launch is enqueued on its stream (Note [Emulated streams]); when it runs, it runs on the
//     host thread that waits for it, blocks one after another (in reverse order, or in an
//     order of the launch's own, when asked: control.h; to expose code that assumes an order
//     between blocks). The threads of a
//     block are fibers on their own stacks, scheduled cooperatively: a thread runs until it
//     reaches a barrier or returns, then the next ready thread of the block runs. The context
//     switch is a few instructions of assembly (fiber.cpp); stacks are reused across launches.
//   - __syncthreads waits for every thread of the block. A warp intrinsic waits for every lane
//     named in its mask (warp = linear thread id / 32) and checks that they all called the same
//     intrinsic with the same mask. A mask naming a lane that has exited or does not exist, a
//     thread that exits while others wait for it at __syncthreads (or reaches __syncthreads after
//     some have exited: the programming guide requires every thread of the block), lanes that
//     disagree, and a block where no thread can proceed all abort with a message naming the
//     kernel, the block and what each thread waits for. Nothing hangs.
//   - A shuffle that reads a lane outside the mask (undefined on the device) returns all-ones
//     bits (NaN, -1), so a result that uses it shows.
//   - Launch configurations are validated as the hardware does (at most 1024 threads per block,
//     block.z <= 64, grid.y/z <= 65535, no zero dimension): a bad one runs nothing and sets
//     cudaErrorInvalidConfiguration for the next cudaGetLastError.
//   - Device memory is inaccessible to the host except while a kernel, memcpy or memset runs
//     (device_memory.h), so host code that dereferences a device pointer faults with a message.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace strata::cuda_emu {

// The current emulated thread's built-in variables, set by the scheduler at every switch. Plain
// globals (not thread_local): the device runs one operation at a time (device_memory.h), so only
// the host thread running the kernel reads them, and a global is one load.
extern uint3 g_thread_idx;
extern uint3 g_block_idx;
extern uint3 g_block_dim;
extern uint3 g_grid_dim;

struct LaunchConfig {
  dim3 grid;
  dim3 block;
  size_t shared_bytes;
  cudaStream_t stream;
  const char* kernel;  // the kernel expression as written at the launch
  const char* file;
  int line;
};

// A launched kernel with its arguments, kept until it runs (Note [Emulated streams]).
class KernelJob {
 public:
  virtual ~KernelJob() = default;
  // One emulated thread's run of the kernel.
  virtual void run_thread() = 0;
  // The parameter block (device pointers found in it are made accessible up front).
  const void* params = nullptr;
  size_t params_bytes = 0;
};

// Validates `config` and enqueues the kernel on its stream: when it runs, job->run_thread() runs
// once per thread of every block.
void launch(const LaunchConfig& config, std::shared_ptr<KernelJob> job);

// Counts a launch at its site (Note [Launch sites] in control.h; launch_sites.cpp).
void count_launch_site(const LaunchConfig& config);

enum class BlockOp : int { Sync, Count, And, Or };
// __syncthreads and its reducing forms; returns the reduction (0 for Sync).
int block_barrier(BlockOp op, int value);

enum class WarpOp : int { ShflIdx, ShflUp, ShflDown, ShflXor, Ballot, SyncWarp };
// A warp collective over the lanes in `mask`; `value` is this lane's operand (raw bits),
// `arg` the lane index, delta or xor mask. Returns this lane's result (raw bits).
uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int arg, int width);

// The lanes of the current warp that have not exited.
unsigned active_mask();

// Counts a cublasLtMatmul for Stats (control.h).
void count_matmul();
void count_graph_run();

}  // namespace strata::cuda_emu
