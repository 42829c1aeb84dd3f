#pragma once
// The per-op device-time table that bench_gpt2_cuda --profile and `train` (training.profile_steps)
// print (Note [CUDA op profiler] in tensor/cuda/profiler.cpp).
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/cuda.h"

namespace strata::tools {

// A markdown table of `ops` (totals over `steps` steps): per op its calls per step, device ms
// per step, share of `step_ms` (the steps' wall time each, by the host's clock), TFLOP/s where it
// counts FLOPs and GB/s where it counts bytes; then the sum over ops and the step itself.
std::string op_time_table(const std::vector<tensor::CudaOpTime>& ops, int64_t steps,
                          double step_ms);

}  // namespace strata::tools
