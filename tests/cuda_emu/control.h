#pragma once
// Switches and counters of the CUDA emulator for tests and for whoever investigates a kernel
// (Note [CUDA emulator] in simt.h). Each setting also has an environment variable, read once.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata::cuda_emu {

// STRATA_CUDA_EMU_BLOCK_ORDER=reverse: blocks run from the last to the first, which exposes
// kernels that assume an order between blocks (the device promises none).
enum class BlockOrder { Forward, Reverse };
void set_block_order(BlockOrder order);
BlockOrder block_order();
// STRATA_CUDA_EMU_THREAD_ORDER=reverse: a block's threads start and wake from barriers from the
// highest index down (exposes a missing __syncthreads; forward order exposes the other half).
void set_thread_order(BlockOrder order);

struct Stats {
  uint64_t launches = 0;            // kernels run
  uint64_t blocks = 0;              // blocks run
  uint64_t threads = 0;             // emulated threads run
  uint64_t switches = 0;            // fiber switches
  uint64_t matmuls = 0;             // cublasLtMatmul calls run
  uint64_t device_allocations = 0;  // live cudaMalloc allocations
  uint64_t device_bytes = 0;        // bytes they hold
  uint64_t host_waits = 0;          // times the host waited for pending work (streams.h)
  uint64_t idle_waits = 0;          // those that left no work queued: the device would idle
};
Stats stats();

// Set by the runtime: the error the next cudaGetLastError returns.
void record_error(cudaError_t e);
// True for the default stream handles and every created, not yet destroyed stream.
bool valid_stream(cudaStream_t s);

}  // namespace strata::cuda_emu
