#pragma once
// Measures this machine's memory tiers: the sizes of GPU, CPU and NVMe memory and the
// bandwidth of each, the row Figure 2b of ZeRO-Infinity (arXiv:2104.07857) gives for a DGX-2,
// measured here (`estimate --hardware`, docs/tables.md). Short runs: a few seconds in all.
//
// Note [Hardware probe]
// - CPU memory bandwidth: a STREAM triad a[i] = b[i] + s·c[i] over three float arrays far
//   larger than the caches, on every core (one thread per hardware thread, contiguous slices),
//   counted the STREAM way (12 bytes per element; the write-allocate read is not counted).
//   The best of a few repetitions.
// - NVMe: one buffer written and read back through offload::NvmeStore (a file in the given
//   directory, the store's default aio settings: 1 MiB blocks, queue depth 8, O_DIRECT where
//   the filesystem takes it), checksums off; the read is checked against what was written.
//   What the directory's device is (an NVMe drive, a virtual disk, tmpfs) is not known here:
//   the number is that directory's.
// - GPU (a CUDA build with a device): host-to-device and device-to-host copies from pinned
//   memory, and a device-to-device copy counted as read + write (2 x bytes), timed by events.
#include <cstddef>
#include <optional>
#include <string>

namespace strata::offload {

struct GpuProbe {
  std::string name;
  int count = 0;
  double memory_bytes = 0;  // of device 0
  double h2d_gbs = 0, d2h_gbs = 0, device_gbs = 0;
};

struct HardwareProbe {
  int cpu_threads = 0;
  double cpu_memory_bytes = 0;     // MemTotal
  double cpu_available_bytes = 0;  // MemAvailable
  double triad_gbs = 0;
  size_t triad_bytes = 0;  // of the three arrays together

  std::string nvme_dir;
  double nvme_bytes = 0;       // the directory's filesystem: size
  double nvme_free_bytes = 0;  // and what is free
  double nvme_write_gbs = 0, nvme_read_gbs = 0;
  size_t nvme_io_bytes = 0;
  bool nvme_direct = false;  // O_DIRECT was used
  std::string nvme_engine;   // io_uring or libaio

  std::optional<GpuProbe> gpu;  // empty: no GPU (or a build without CUDA)
  std::string no_gpu_reason;
};

struct ProbeOptions {
  std::string nvme_dir = "/tmp";
  size_t nvme_bytes = size_t{256} << 20;
  size_t triad_bytes = size_t{384} << 20;  // three arrays of 128 MiB
  size_t gpu_bytes = size_t{256} << 20;
};

// strata::user_error when nvme_dir cannot hold the test file or a size is 0.
HardwareProbe probe_hardware(const ProbeOptions& options);

// GB/s of the triad over `bytes` in all (three arrays), best of `reps`, on all hardware threads.
double triad_bandwidth_gbs(size_t bytes, int reps);

}  // namespace strata::offload
