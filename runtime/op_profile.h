#pragma once
// The per-op device-time table that bench_gpt2_cuda --profile and `train` (training.profile_steps)
// print (Note [CUDA op profiler] in tensor/cuda/profiler.cpp).
//
// Note [Roofline bound]
// Given the device's peaks (Note [GPU peaks] in device_peaks.h), each op also gets a bound: the
// time its FLOPs take at the peak FLOP/s or its bytes at the peak bandwidth, whichever is longer,
// per step. The bytes are those of the op's operands (each read or written once), so the bound
// is a floor no kernel can beat, not a prediction; `% of bound` (bound over measured time) says
// how close an op came to it. Summed over ops it is the least time the step's work could take on
// this device with these kernels' FLOPs and memory traffic: a step's MFU cannot exceed its model
// FLOPs over that time. Rows are per op name, summed over its calls (an op's calls are all
// compute-bound or all memory-bound in practice: GEMMs and attention compute, the rest memory).
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/cuda.h"

namespace strata::runtime {

struct PeakRates {
  double tflops = 0;  // the peak the ops' FLOPs count against (the dtype's; 0 = unknown)
  double gbps = 0;    // DRAM bandwidth (0 = unknown)
  bool known() const { return tflops > 0 && gbps > 0; }
};

// The roofline bound of one step's ops, in ms (Note [Roofline bound]); 0 when `peaks` is not
// known. `ops` holds totals over `steps` steps.
double bound_ms(const tensor::CudaOpTime& op, int64_t steps, const PeakRates& peaks);
double bound_ms(const std::vector<tensor::CudaOpTime>& ops, int64_t steps, const PeakRates& peaks);

// A markdown table of `ops` (totals over `steps` steps): per op its calls per step, device ms
// per step, share of `step_ms` (the steps' wall time each, by the host's clock), TFLOP/s where it
// counts FLOPs and GB/s where it counts bytes, and, when `peaks` is known, GB per step, the bound
// and the share of it reached; then the sum over ops and the step itself.
std::string op_time_table(const std::vector<tensor::CudaOpTime>& ops, int64_t steps, double step_ms,
                          const PeakRates& peaks = {});

}  // namespace strata::runtime
