#include "offload/hardware_probe.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "core/error.h"
#include "offload/nvme_store.h"

#if STRATA_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace strata::offload {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Runs fn(begin, end) over [0, n) split into one contiguous slice per thread.
template <typename Fn>
void parallel_slices(size_t n, int threads, Fn fn) {
  std::vector<std::thread> pool;
  const size_t per = (n + static_cast<size_t>(threads) - 1) / static_cast<size_t>(threads);
  for (int t = 0; t < threads; ++t) {
    const size_t begin = std::min(n, per * static_cast<size_t>(t));
    const size_t end = std::min(n, begin + per);
    pool.emplace_back([=] { fn(begin, end); });
  }
  for (std::thread& th : pool) th.join();
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float[], FreeDeleter>;

Buffer aligned_floats(size_t n) {
  const size_t bytes = (n * sizeof(float) + 4095) / 4096 * 4096;
  void* p = std::aligned_alloc(4096, bytes);
  if (p == nullptr) user_error("cannot allocate {} MiB for the hardware probe", bytes >> 20);
  return Buffer(static_cast<float*>(p));
}

// /proc/meminfo's `key` in bytes; 0 if absent.
double meminfo_bytes(const char* key) {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return 0;
  char line[256];
  double kb = 0;
  const size_t len = std::strlen(key);
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::strncmp(line, key, len) == 0 && line[len] == ':') {
      std::sscanf(line + len + 1, "%lf", &kb);
      break;
    }
  std::fclose(f);
  return kb * 1024;
}

#if STRATA_HAVE_CUDA
void cuda_check(cudaError_t e, const char* what) {
  STRATA_CHECK(e == cudaSuccess, "{}: {}", what, cudaGetErrorString(e));
}

// GB/s of one copy of `bytes` of `kind`, best of 3 after a warm-up, timed by events.
double copy_gbs(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, double counted) {
  cudaEvent_t start, stop;
  cuda_check(cudaEventCreate(&start), "cudaEventCreate");
  cuda_check(cudaEventCreate(&stop), "cudaEventCreate");
  cuda_check(cudaMemcpy(dst, src, bytes, kind), "cudaMemcpy");
  float best = 0;
  for (int i = 0; i < 3; ++i) {
    cuda_check(cudaEventRecord(start, nullptr), "cudaEventRecord");
    cuda_check(cudaMemcpyAsync(dst, src, bytes, kind, nullptr), "cudaMemcpyAsync");
    cuda_check(cudaEventRecord(stop, nullptr), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    if (i == 0 || ms < best) best = ms;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return counted * static_cast<double>(bytes) / (static_cast<double>(best) * 1e-3) / 1e9;
}
#endif

void probe_gpu(const ProbeOptions& o, HardwareProbe& out) {
#if STRATA_HAVE_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    out.no_gpu_reason = "no GPU (the CUDA runtime found no device)";
    return;
  }
  GpuProbe g;
  g.count = count;
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  g.name = prop.name;
  size_t free_bytes = 0, total_bytes = 0;
  cuda_check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  g.memory_bytes = static_cast<double>(total_bytes);
  void *host = nullptr, *a = nullptr, *b = nullptr;
  cuda_check(cudaHostAlloc(&host, o.gpu_bytes, cudaHostAllocDefault), "cudaHostAlloc");
  cuda_check(cudaMalloc(&a, o.gpu_bytes), "cudaMalloc");
  cuda_check(cudaMalloc(&b, o.gpu_bytes), "cudaMalloc");
  std::memset(host, 1, o.gpu_bytes);
  g.h2d_gbs = copy_gbs(a, host, o.gpu_bytes, cudaMemcpyHostToDevice, 1);
  g.d2h_gbs = copy_gbs(host, a, o.gpu_bytes, cudaMemcpyDeviceToHost, 1);
  g.device_gbs = copy_gbs(b, a, o.gpu_bytes, cudaMemcpyDeviceToDevice, 2);  // read + write
  cudaFree(a);
  cudaFree(b);
  cudaFreeHost(host);
  out.gpu = g;
#else
  (void)o;
  out.no_gpu_reason = "no GPU (this build has no CUDA backend: STRATA_WITH_CUDA=OFF)";
#endif
}

void probe_nvme(const ProbeOptions& o, HardwareProbe& out) {
  out.nvme_dir = o.nvme_dir;
  struct statvfs fs {};
  if (statvfs(o.nvme_dir.c_str(), &fs) != 0)
    user_error("--nvme-dir '{}' cannot be read ({}); give a directory on the drive to measure",
               o.nvme_dir, std::strerror(errno));
  out.nvme_bytes = static_cast<double>(fs.f_blocks) * static_cast<double>(fs.f_frsize);
  out.nvme_free_bytes = static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize);
  if (out.nvme_free_bytes < 2.0 * static_cast<double>(o.nvme_bytes))
    user_error("--nvme-dir '{}' has {:.0f} MiB free; the probe writes {} MiB there", o.nvme_dir,
               out.nvme_free_bytes / 1048576, o.nvme_bytes >> 20);

  NvmeConfig config;  // the store's defaults: DeepSpeed's aio settings
  config.paths = {o.nvme_dir};
  config.checksum = false;
  NvmeStore store(config);
  out.nvme_direct = store.direct();
  out.nvme_engine = std::string(io_engine_name(store.engine().kind()));
  out.nvme_io_bytes = o.nvme_bytes;
  const size_t n = o.nvme_bytes / sizeof(float);
  Buffer src = aligned_floats(n), dst = aligned_floats(n);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<float>(i % 1021);
  std::memset(dst.get(), 0, o.nvme_bytes);
  Block home = store.allocate(o.nvme_bytes, Category::Optimizer);
  // An untimed first write lays out the file's extents; the timed one overwrites them.
  store.write(home, src.get(), o.nvme_bytes).wait();
  auto t0 = Clock::now();
  store.write(home, src.get(), o.nvme_bytes).wait();
  out.nvme_write_gbs = static_cast<double>(o.nvme_bytes) / seconds_since(t0) / 1e9;
  t0 = Clock::now();
  store.read(home, dst.get(), o.nvme_bytes).wait();
  out.nvme_read_gbs = static_cast<double>(o.nvme_bytes) / seconds_since(t0) / 1e9;
  STRATA_CHECK(std::memcmp(src.get(), dst.get(), o.nvme_bytes) == 0,
               "the probe read back other bytes than it wrote to '{}'", o.nvme_dir);
  store.deallocate(home);
}

}  // namespace

double triad_bandwidth_gbs(size_t bytes, int reps) {
  STRATA_USER_CHECK(bytes >= 3 * 4096 && reps >= 1, "triad of {} bytes, {} repetitions", bytes,
                    reps);
  const size_t n = bytes / 3 / sizeof(float);
  const int threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  Buffer a = aligned_floats(n), b = aligned_floats(n), c = aligned_floats(n);
  float* pa = a.get();
  const float* pb = b.get();
  const float* pc = c.get();
  // First touch by the threads that use each slice.
  parallel_slices(n, threads, [&](size_t begin, size_t end) {
    std::fill(a.get() + begin, a.get() + end, 0.f);
    std::fill(b.get() + begin, b.get() + end, 1.f);
    std::fill(c.get() + begin, c.get() + end, 2.f);
  });
  double best = 0;
  for (int r = 0; r <= reps; ++r) {  // the first run warms up
    const auto t0 = Clock::now();
    parallel_slices(n, threads, [=](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) pa[i] = pb[i] + 0.5f * pc[i];
    });
    const double s = seconds_since(t0);
    if (r > 0 && (best == 0 || s < best)) best = s;
  }
  STRATA_CHECK(pa[n / 2] == 2.f, "triad result {}", pa[n / 2]);
  return 12.0 * static_cast<double>(n) / best / 1e9;
}

HardwareProbe probe_hardware(const ProbeOptions& o) {
  STRATA_USER_CHECK(o.nvme_bytes >= 4096 && o.triad_bytes >= 3 * 4096 && o.gpu_bytes > 0,
                    "hardware probe sizes must be at least 4 KiB");
  HardwareProbe out;
  out.cpu_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  out.cpu_memory_bytes = meminfo_bytes("MemTotal");
  out.cpu_available_bytes = meminfo_bytes("MemAvailable");
  out.triad_bytes = o.triad_bytes;
  out.triad_gbs = triad_bandwidth_gbs(o.triad_bytes, 5);
  probe_nvme(o, out);
  probe_gpu(o, out);
  return out;
}

}  // namespace strata::offload
