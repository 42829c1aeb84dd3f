#include "tools/estimate/machine_tables.h"

#include <fmt/format.h>
#include <sys/statvfs.h>

#include <algorithm>

#include "core/error.h"
#include "offload/hardware_probe.h"
#include "offload/host_budget.h"
#include "parallel/memory_tables.h"

namespace strata::tools {

// --device cpu: host memory and NVMe given, or measured (MemAvailable; the free space of
// --nvme-dir), as `train` would find them (run.host_memory_budget auto).
void print_cpu_strategies(const parallel::CpuFamily& family, const std::string& cpu_mem,
                          const std::string& nvme_size, const std::string& nvme_dir,
                          int64_t max_layers) {
  double host = 0, nvme = 0;
  std::string host_from, nvme_from;
  if (!cpu_mem.empty()) {
    host = parallel::parse_bytes(cpu_mem, "--cpu-mem");
    host_from = "--cpu-mem " + cpu_mem;
  } else {
    host = static_cast<double>(offload::auto_host_budget());
    host_from = "MemAvailable now less train's auto reserve";
  }
  if (!nvme_size.empty()) {
    nvme = parallel::parse_bytes(nvme_size, "--nvme");
    nvme_from = "--nvme " + nvme_size;
  } else {
    struct statvfs fs {};
    if (statvfs(nvme_dir.c_str(), &fs) != 0)
      user_error(
          "--nvme-dir '{}' cannot be measured (statvfs failed); give an existing directory "
          "or --nvme SIZE",
          nvme_dir);
    nvme = static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize);
    nvme_from = fmt::format("free in {}", nvme_dir);
  }
  fmt::print("{}",
             parallel::cpu_strategies_table(family, host, host_from, nvme, nvme_from, max_layers));
}

void print_hardware(const std::string& nvme_dir, int64_t probe_mib) {
  if (probe_mib < 1) user_error("--probe-mib {} must be 1 or more", probe_mib);
  offload::ProbeOptions o;
  o.nvme_dir = nvme_dir;
  o.nvme_bytes = static_cast<size_t>(probe_mib) << 20;
  o.gpu_bytes = o.nvme_bytes;
  o.triad_bytes = std::max<size_t>(o.nvme_bytes, size_t{96} << 20);
  const offload::HardwareProbe h = offload::probe_hardware(o);
  auto tb = [](double bytes) { return fmt::format("{:.3f}", bytes / parallel::kTiB); };
  fmt::print(
      "This machine's row of ZeRO-Infinity's Figure 2b (arXiv:2104.07857), measured (Note "
      "[Hardware probe] in offload/hardware_probe.h):\n"
      "memory in TiB, bandwidth in GB/s (1e9 bytes/s). The paper's DGX-2 node: 16 GPUs, 0.5 / "
      "1.5 / 28.0 TB of GPU / CPU / NVMe memory,\n600-900 GB/s GPU memory, 3.0 GB/s CPU and 1.6 "
      "GB/s NVMe per GPU when all 16 read at once (12.0 and 12.0 for one GPU alone).\n\n");
  fmt::print("{:>6}{:>6}{:>10}{:>10}{:>10}{:>12}{:>12}{:>12}{:>12}\n", "nodes", "GPUs", "GPU mem",
             "CPU mem", "NVMe", "GPU mem bw", "CPU triad", "NVMe read", "NVMe write");
  const std::string gpu_mem = h.gpu ? tb(h.gpu->memory_bytes * h.gpu->count) : "-";
  const std::string gpu_bw = h.gpu ? fmt::format("{:.1f}", h.gpu->device_gbs) : "-";
  fmt::print("{:>6}{:>6}{:>10}{:>10}{:>10}{:>12}{:>12.2f}{:>12.2f}{:>12.2f}\n", 1,
             h.gpu ? h.gpu->count : 0, gpu_mem, tb(h.cpu_memory_bytes), tb(h.nvme_bytes), gpu_bw,
             h.triad_gbs, h.nvme_read_gbs, h.nvme_write_gbs);
  fmt::print(
      "\nCPU: {} hardware threads, {:.1f} GiB memory ({:.1f} GiB available); STREAM "
      "triad over {} MiB on every thread: {:.2f} GB/s\n",
      h.cpu_threads, h.cpu_memory_bytes / parallel::kGiB, h.cpu_available_bytes / parallel::kGiB,
      h.triad_bytes >> 20, h.triad_gbs);
  fmt::print(
      "NVMe: '{}' ({:.1f} GiB, {:.1f} GiB free), {} MiB through the NVMe store ({}, {}, "
      "1 MiB blocks, queue depth 8): write {:.2f} GB/s, read {:.2f} GB/s\n",
      h.nvme_dir, h.nvme_bytes / parallel::kGiB, h.nvme_free_bytes / parallel::kGiB,
      h.nvme_io_bytes >> 20, h.nvme_engine, h.nvme_direct ? "O_DIRECT" : "page cache",
      h.nvme_write_gbs, h.nvme_read_gbs);
  if (h.gpu)
    fmt::print(
        "GPU: {} x {}, {:.1f} GiB each; host-to-device {:.1f} GB/s, device-to-host {:.1f} "
        "GB/s (pinned), device memory {:.1f} GB/s (copy, read + write)\n",
        h.gpu->count, h.gpu->name, h.gpu->memory_bytes / parallel::kGiB, h.gpu->h2d_gbs,
        h.gpu->d2h_gbs, h.gpu->device_gbs);
  else
    fmt::print("GPU: {}\n", h.no_gpu_reason);
}

}  // namespace strata::tools
