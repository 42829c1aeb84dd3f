#pragma once
// A GPU's peak FLOP/s and memory bandwidth: the denominators of MFU (`train`'s log,
// bench_gpt2_cuda) and of the profiler's roofline bound (op_profile.h).
//
// Note [GPU peaks]
// - FLOP/s. MFU is quoted against NVIDIA's datasheet numbers (989.4 dense bf16 TFLOP/s for an
//   H100 SXM), which are not SMs x the clock the driver reports: an H100 SXM reports 1980 MHz,
//   and 132 SMs x 4096 bf16 FLOP per SM per clock x 1980 MHz is 1070 TFLOP/s. So devices whose
//   name says which datasheet applies (H100 SXM/PCIe/NVL, H200 and its NVL, GH200, A100) take
//   its dense numbers; any other sm_80/86/87/89/90 device gets SMs x clock x FLOP per SM per
//   clock of its architecture (tensor cores with f32 accumulate: 2048 on sm_80, 1024 on
//   sm_86/87/89, 4096 on sm_90; f32 on the CUDA cores: 128 on sm_80, 256 on the rest), marked as
//   an estimate (GeForce cards run bf16 with f32 accumulate at half their architecture's rate,
//   so it overstates theirs); other architectures get 0, and MFU is not reported.
// - Which peak: bf16 and f16 runs count against the tensor cores' dense peak; f32 runs against
//   the CUDA cores' f32 peak, since Strata's f32 matmuls do not use TF32 unless asked to (Note
//   [TF32] in tensor/cuda.h); with TF32 on they count against the tensor cores' dense TF32 peak
//   (half the bf16 one on every architecture here: 494.7 TFLOP/s on an H100 SXM, 156 on an A100;
//   per SM and clock 1024 on sm_80, 512 on sm_86/87/89, 2048 on sm_90).
// - Bandwidth: the memory clock x 2 (double data rate) x the bus width, from the driver (an H100
//   SXM: 2619 MHz x 2 x 640 bytes = 3352 GB/s, its datasheet's 3.35 TB/s).
#include <string>

#include "core/dtype.h"
#include "tensor/cuda.h"

namespace strata::runtime {

struct DevicePeaks {
  double tensor_tflops = 0;  // dense bf16/f16 on the tensor cores, f32 accumulate
  double fp32_tflops = 0;    // f32 on the CUDA cores
  double tf32_tflops = 0;    // dense TF32 on the tensor cores, f32 accumulate
  double memory_gbps = 0;    // DRAM bandwidth, GB/s (1e9 bytes)
  std::string source;        // where the FLOP/s come from, for the log
  // The peak an op in `dtype` counts against: tensor_tflops for bf16/f16; for f32 fp32_tflops,
  // or tf32_tflops when its matmuls run on TF32 (Note [TF32]).
  double tflops_for(DType dtype, bool tf32 = false) const;
};

DevicePeaks device_peaks(const tensor::CudaDeviceFacts& facts);

}  // namespace strata::runtime
