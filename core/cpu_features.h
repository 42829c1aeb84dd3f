#pragma once
#include <string>

namespace strata {

// What the CPU this process runs on can execute (CPUID + XGETBV: the OS must also save the
// wider registers for a feature to count).
struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512bf16 = false;
  bool amx_tile = false;
  bool amx_bf16 = false;
  std::string summary() const;
};

const CpuFeatures& cpu_features();

// Number of threads parallel kernels use (OpenMP's max threads).
int num_threads();

}  // namespace strata
