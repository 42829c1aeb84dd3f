#include "runtime/device_peaks.h"

#include <fmt/format.h>

namespace strata::runtime {

namespace {

// NVIDIA's datasheets, dense (half the "with sparsity" tensor figure). The first entry whose
// `match` is in the device's name applies, so the NVL and PCIe parts come before their SXM kin.
struct Datasheet {
  const char* match;
  const char* part;
  double tensor_tflops, fp32_tflops, tf32_tflops;
};
constexpr Datasheet kDatasheets[] = {
    {"H100 NVL", "H100 NVL", 835.5, 60.0, 417.5},
    {"H100 PCIe", "H100 PCIe", 756.5, 51.2, 378.0},
    {"H100", "H100 SXM", 989.4, 66.9, 494.7},
    {"H200 NVL", "H200 NVL", 835.5, 60.0, 417.5},
    {"H200", "H200 SXM / GH200", 989.4, 66.9, 494.7},
    {"A100", "A100", 312.0, 19.5, 156.0},
};

// FLOP per SM per clock: tensor cores (bf16/f16, f32 accumulate), f32 on the CUDA cores, and TF32
// on the tensor cores.
struct PerClock {
  double tensor, fp32, tf32;
};

bool per_clock(int major, int minor, PerClock& out) {
  const int cc = major * 10 + minor;
  switch (cc) {
    case 80:
      out = {2048, 128, 1024};
      return true;
    case 86:
    case 87:
    case 89:
      out = {1024, 256, 512};
      return true;
    case 90:
      out = {4096, 256, 2048};
      return true;
    default:
      return false;
  }
}

}  // namespace

double DevicePeaks::tflops_for(DType dtype, bool tf32) const {
  if (dtype != DType::F32) return tensor_tflops;
  return tf32 ? tf32_tflops : fp32_tflops;
}

DevicePeaks device_peaks(const tensor::CudaDeviceFacts& f) {
  DevicePeaks p;
  p.memory_gbps = 2.0 * static_cast<double>(f.memory_clock_khz) * 1e3 *
                  (static_cast<double>(f.bus_width_bits) / 8.0) / 1e9;
  for (const Datasheet& d : kDatasheets) {
    if (f.name.find(d.match) == std::string::npos) continue;
    p.tensor_tflops = d.tensor_tflops;
    p.fp32_tflops = d.fp32_tflops;
    p.tf32_tflops = d.tf32_tflops;
    p.source = fmt::format("NVIDIA's {} datasheet", d.part);
    return p;
  }
  PerClock pc{};
  if (!per_clock(f.major, f.minor, pc)) {
    p.source = fmt::format("unknown for sm_{}{}", f.major, f.minor);
    return p;
  }
  if (f.sms <= 0 || f.clock_khz <= 0) {
    p.source = "unknown: the driver reports no SM count or clock";
    return p;
  }
  const double sm_hz = static_cast<double>(f.sms) * static_cast<double>(f.clock_khz) * 1e3;
  p.tensor_tflops = sm_hz * pc.tensor / 1e12;
  p.fp32_tflops = sm_hz * pc.fp32 / 1e12;
  p.tf32_tflops = sm_hz * pc.tf32 / 1e12;
  p.source = fmt::format("estimated: {} SMs x {} MHz x {:g} bf16 FLOP per SM per clock (sm_{}{})",
                         f.sms, f.clock_khz / 1000, pc.tensor, f.major, f.minor);
  return p;
}

}  // namespace strata::runtime
