#pragma once
// estimate's tables of this machine (tools/estimate.cpp): `--table strategies --device cpu`, the
// largest GPT-2 per placement without a GPU (Note [CPU placement model] in
// parallel/cpu_capacity.h), and `--hardware`, its tiers measured (offload/hardware_probe.h).
#include <cstdint>
#include <string>

#include "parallel/cpu_capacity.h"

namespace strata::tools {

// Host memory `cpu_mem` and NVMe `nvme_size` as given (e.g. "10GiB"), or when empty measured:
// MemAvailable, the free space of `nvme_dir`, as `train` would find them.
void print_cpu_strategies(const parallel::CpuFamily& family, const std::string& cpu_mem,
                          const std::string& nvme_size, const std::string& nvme_dir,
                          int64_t max_layers);

// This machine's row of ZeRO-Infinity's Figure 2b, measured with `probe_mib` MiB per probe and
// the NVMe store in `nvme_dir`.
void print_hardware(const std::string& nvme_dir, int64_t probe_mib);

}  // namespace strata::tools
