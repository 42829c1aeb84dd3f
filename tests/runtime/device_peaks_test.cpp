// A GPU's peaks (Note [GPU peaks] in runtime/device_peaks.h) and the profiler table's
// roofline bound (Note [Roofline bound] in runtime/op_profile.h), from device facts and op
// totals given here: no GPU needed.
#include <gtest/gtest.h>

#include "runtime/device_peaks.h"
#include "runtime/op_profile.h"

namespace strata::runtime {
namespace {

// What the drivers report (cudaGetDeviceProperties, cudaDevAttrClockRate/MemoryClockRate).
tensor::CudaDeviceFacts facts(const char* name, int major, int minor, int sms, int clock_mhz,
                              int memory_clock_mhz, int bus_width_bits) {
  tensor::CudaDeviceFacts f;
  f.name = name;
  f.major = major;
  f.minor = minor;
  f.sms = sms;
  f.clock_khz = clock_mhz * 1000;
  f.memory_clock_khz = memory_clock_mhz * 1000;
  f.bus_width_bits = bus_width_bits;
  return f;
}

TEST(DevicePeaks, AnH100SxmTakesItsDatasheetNotItsClock) {
  const DevicePeaks p = device_peaks(facts("NVIDIA H100 80GB HBM3", 9, 0, 132, 1980, 2619, 5120));
  EXPECT_DOUBLE_EQ(p.tensor_tflops, 989.4);  // 132 x 4096 x 1980 MHz would be 1070.5
  EXPECT_DOUBLE_EQ(p.fp32_tflops, 66.9);
  EXPECT_NEAR(p.memory_gbps, 3352.3, 0.1);  // 2619 MHz x 2 x 640 bytes: the datasheet's 3.35 TB/s
  EXPECT_NE(p.source.find("H100 SXM datasheet"), std::string::npos) << p.source;
  EXPECT_DOUBLE_EQ(p.tflops_for(DType::BF16), 989.4);
  EXPECT_DOUBLE_EQ(p.tflops_for(DType::F16), 989.4);
  EXPECT_DOUBLE_EQ(p.tflops_for(DType::F32), 66.9);  // no TF32 in Strata's f32 matmuls
  // With TF32 on (Note [TF32]) f32 counts against the tensor cores' dense TF32 peak; the 16-bit
  // dtypes keep theirs.
  EXPECT_DOUBLE_EQ(p.tf32_tflops, 494.7);
  EXPECT_DOUBLE_EQ(p.tflops_for(DType::F32, /*tf32=*/true), 494.7);
  EXPECT_DOUBLE_EQ(p.tflops_for(DType::BF16, /*tf32=*/true), 989.4);
}

TEST(DevicePeaks, TheNvlAndPcieVariantsAreNotTakenForTheSxm) {
  EXPECT_DOUBLE_EQ(
      device_peaks(facts("NVIDIA H100 PCIe", 9, 0, 114, 1755, 1593, 5120)).tensor_tflops, 756.5);
  EXPECT_DOUBLE_EQ(
      device_peaks(facts("NVIDIA H100 NVL", 9, 0, 132, 1785, 2619, 6144)).tensor_tflops, 835.5);
  EXPECT_DOUBLE_EQ(device_peaks(facts("NVIDIA H200", 9, 0, 132, 1980, 3201, 6144)).tensor_tflops,
                   989.4);
  EXPECT_DOUBLE_EQ(
      device_peaks(facts("NVIDIA H200 NVL", 9, 0, 132, 1785, 3201, 6144)).tensor_tflops, 835.5);
  EXPECT_DOUBLE_EQ(
      device_peaks(facts("NVIDIA GH200 480GB", 9, 0, 132, 1980, 2619, 5120)).tensor_tflops, 989.4);
  const DevicePeaks a100 =
      device_peaks(facts("NVIDIA A100-SXM4-80GB", 8, 0, 108, 1410, 1593, 5120));
  EXPECT_DOUBLE_EQ(a100.tensor_tflops, 312.0);
  EXPECT_DOUBLE_EQ(a100.fp32_tflops, 19.5);
  EXPECT_DOUBLE_EQ(a100.tf32_tflops, 156.0);
  EXPECT_DOUBLE_EQ(device_peaks(facts("NVIDIA H100 PCIe", 9, 0, 114, 1755, 1593, 5120)).tf32_tflops,
                   378.0);
  EXPECT_NEAR(a100.memory_gbps, 2039.0, 0.1);
}

TEST(DevicePeaks, OtherAmpereAndHopperPartsAreEstimatedFromSmsAndClock) {
  // An L4 (sm_89): 58 SMs x 2040 MHz x 1024 = 121.2 TFLOP/s, its datasheet's dense bf16.
  const DevicePeaks l4 = device_peaks(facts("NVIDIA L4", 8, 9, 58, 2040, 6251, 192));
  EXPECT_NEAR(l4.tensor_tflops, 121.2, 0.05);
  EXPECT_NEAR(l4.fp32_tflops, 30.3, 0.05);
  EXPECT_NEAR(l4.tf32_tflops, 60.6, 0.05);  // 58 x 2040 MHz x 512: its datasheet's dense TF32
  EXPECT_NEAR(l4.memory_gbps, 300.0, 0.1);
  EXPECT_NE(l4.source.find("estimated"), std::string::npos) << l4.source;
  // An unnamed sm_90 at an H100 SXM's clock: the clock's peak, above the datasheet's.
  EXPECT_NEAR(device_peaks(facts("Hopper", 9, 0, 132, 1980, 2619, 5120)).tensor_tflops, 1070.5,
              0.05);
  // sm_80 other than an A100 (an A30: 56 SMs x 1440 MHz x 2048 = 165 TFLOP/s, its datasheet's).
  EXPECT_NEAR(device_peaks(facts("NVIDIA A30", 8, 0, 56, 1440, 1215, 3072)).tensor_tflops, 165.2,
              0.05);
}

TEST(DevicePeaks, AnUnknownArchitectureOrMissingClockHasNoPeak) {
  const DevicePeaks b = device_peaks(facts("NVIDIA B200", 10, 0, 148, 1965, 3996, 8192));
  EXPECT_EQ(b.tensor_tflops, 0.0);
  EXPECT_EQ(b.tflops_for(DType::BF16), 0.0);
  EXPECT_NE(b.source.find("sm_100"), std::string::npos) << b.source;
  EXPECT_GT(b.memory_gbps, 0.0);  // the bandwidth needs no table
  const DevicePeaks no_clock = device_peaks(facts("Ampere", 8, 6, 84, 0, 9751, 384));
  EXPECT_EQ(no_clock.tensor_tflops, 0.0);
  EXPECT_NE(no_clock.source.find("no SM count or clock"), std::string::npos) << no_clock.source;
}

tensor::CudaOpTime op(const char* name, int64_t calls, double ms, double flops, double bytes) {
  return {name, calls, ms, flops, bytes};
}

TEST(RooflineBound, EachOpIsBoundByItsSlowerResource) {
  const PeakRates peaks{1000.0, 2000.0};  // 1e15 FLOP/s, 2e12 B/s
  // Over 2 steps: a GEMM of 4e12 FLOPs and 2e9 bytes per step: 4 ms compute, 1 ms memory.
  const auto gemm = op("matmul", 20, 10.0, 8e12, 4e9);
  EXPECT_DOUBLE_EQ(bound_ms(gemm, 2, peaks), 4.0);
  // A memory-bound op: 6e9 bytes per step take 3 ms; no FLOPs counted.
  const auto norm = op("layernorm_forward", 4, 8.0, 0, 12e9);
  EXPECT_DOUBLE_EQ(bound_ms(norm, 2, peaks), 3.0);
  EXPECT_DOUBLE_EQ(bound_ms({gemm, norm}, 2, peaks), 7.0);
  // Unknown peaks: no bound.
  EXPECT_EQ(bound_ms(gemm, 2, PeakRates{0.0, 2000.0}), 0.0);
  EXPECT_EQ(bound_ms(gemm, 2, PeakRates{1000.0, 0.0}), 0.0);
}

TEST(RooflineBound, TheTableGivesEachOpsBoundAndTheShareReached) {
  const std::vector<tensor::CudaOpTime> ops = {op("matmul", 20, 10.0, 8e12, 4e9),
                                               op("layernorm_forward", 4, 8.0, 0, 12e9)};
  const std::string t = op_time_table(ops, 2, 20.0, PeakRates{1000.0, 2000.0});
  // Per step: matmul 5 ms measured against a 4 ms bound (80%), 2 GB; the norm 4 ms against 3 (75%).
  EXPECT_NE(t.find("| % of bound |"), std::string::npos) << t;
  EXPECT_NE(t.find("| matmul | 10 | 5.000 | 25.0% | 800.0 | 400 | 2.000 | 4.000 | 80% |"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("| layernorm_forward | 2 | 4.000 | 20.0% |  | 1500 | 6.000 | 3.000 | 75% |"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("| all ops | 12 | 9.000 | 45.0% | | | 8.000 | 7.000 | 78% |"), std::string::npos)
      << t;
  // Without peaks, the table has no bound columns.
  const std::string plain = op_time_table(ops, 2, 20.0);
  EXPECT_EQ(plain.find("bound"), std::string::npos) << plain;
  EXPECT_NE(plain.find("| matmul | 10 | 5.000 | 25.0% | 800.0 | 400 |\n"), std::string::npos)
      << plain;
}

}  // namespace
}  // namespace strata::runtime
