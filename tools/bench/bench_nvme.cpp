// bench_nvme: NVMe store read/write GB/s against fio on the same directory, block size and queue
// depth (direct=1), measured in the same run; and the pinned pool's allocation cost against a
// raw allocation + mlock (cudaHostAlloc where CUDA pins).
//
//   bench_nvme [--dir D] [--size-mib N] [--block-size B] [--queue-depth Q] [--threads T]
//              [--engine auto|io_uring|libaio]
//   (defaults: /tmp, 512 MiB, 1 MiB blocks, queue depth 8, 1 thread, auto)
//
// Strata writes then reads one buffer of --size-mib through NvmeStore (pinned source and
// destination, store block = aio block), with block checksums on and off. fio runs a sequential
// write then read job of the same size with the same engine; rounds interleave, medians compared.
// Target: Strata >= 0.9 x fio.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "offload/nvme_store.h"
#include "offload/pinned_allocator.h"

namespace {

using namespace strata::offload;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Args {
  std::string dir = "/tmp";
  size_t size_mib = 512;
  size_t block_size = size_t{1} << 20;
  int queue_depth = 8;
  int threads = 1;
  int reps = 7;  // interleaved Strata/fio rounds; medians are reported
  IoEngineKind engine = IoEngineKind::Auto;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (i + 1 >= argc) strata::user_error("bench_nvme: {} needs a value", k);
    std::string v = argv[++i];
    if (k == "--dir")
      a.dir = v;
    else if (k == "--size-mib")
      a.size_mib = std::stoul(v);
    else if (k == "--block-size")
      a.block_size = std::stoul(v);
    else if (k == "--queue-depth")
      a.queue_depth = std::stoi(v);
    else if (k == "--reps")
      a.reps = std::max(1, std::stoi(v));
    else if (k == "--threads")
      a.threads = std::stoi(v);
    else if (k == "--engine")
      a.engine = v == "io_uring" ? IoEngineKind::IoUring
                 : v == "libaio" ? IoEngineKind::Libaio
                                 : IoEngineKind::Auto;
    else
      strata::user_error("bench_nvme: unknown option {}", k);
  }
  return a;
}

struct Rates {
  double write_gbs = 0, read_gbs = 0;
};

Rates strata_rates(const Args& a, bool checksum, std::string* engine_used) {
  NvmeConfig c;
  c.paths = {a.dir};
  c.block_bytes = a.block_size;
  c.o_direct = ODirect::On;
  c.checksum = checksum;
  c.aio.block_size = a.block_size;
  c.aio.queue_depth = a.queue_depth;
  c.aio.intra_op_parallelism = a.threads;
  c.aio.engine = a.engine;
  NvmeStore store(c);
  *engine_used = std::string(io_engine_name(store.engine().kind()));
  const size_t bytes = a.size_mib << 20;
  PinnedAllocator pinned;
  Block src = pinned.allocate(bytes, Category::Optimizer);
  Block dst = pinned.allocate(bytes, Category::Optimizer);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i < bytes / 8; ++i) static_cast<uint64_t*>(src.ptr)[i] = rng();
  std::memset(dst.ptr, 0, bytes);
  Block home = store.allocate(bytes, Category::Optimizer);
  // One untimed write first: like fio's layout job, it makes the timed write an overwrite of
  // extents that already exist. Then one timed write and one timed read, as fio's jobs.
  store.write(home, src.ptr, bytes).wait();
  Rates r;
  auto t0 = Clock::now();
  store.write(home, src.ptr, bytes).wait();
  r.write_gbs = bytes / seconds_since(t0) / 1e9;
  t0 = Clock::now();
  store.read(home, dst.ptr, bytes).wait();
  r.read_gbs = bytes / seconds_since(t0) / 1e9;
  if (std::memcmp(src.ptr, dst.ptr, bytes) != 0) strata::user_error("bench_nvme: data mismatch");
  store.deallocate(home);
  pinned.deallocate(src);
  pinned.deallocate(dst);
  return r;
}

std::optional<double> fio_rate(const Args& a, const std::string& engine, bool write) {
  const std::string cmd = fmt::format(
      "fio --name=strata_bench --directory={} --rw={} --bs={} --iodepth={} --ioengine={} "
      "--direct=1 --size={}m --numjobs=1 --output-format=json 2>/dev/null",
      a.dir, write ? "write" : "read", a.block_size, a.queue_depth, engine, a.size_mib);
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return std::nullopt;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  if (::pclose(p) != 0) return std::nullopt;
  auto j = nlohmann::json::parse(out, nullptr, false);
  if (j.is_discarded() || !j.contains("jobs") || j["jobs"].empty()) return std::nullopt;
  return j["jobs"][0][write ? "write" : "read"]["bw_bytes"].get<double>() / 1e9;
}

// Microseconds per allocate + free of a `bytes` buffer.
double pool_cost_us(size_t bytes, int iters) {
  PinnedAllocator pinned;
  pinned.deallocate(pinned.allocate(bytes, Category::Workspace));  // warm the pool
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) {
    Block b = pinned.allocate(bytes, Category::Workspace);
    static_cast<char*>(b.ptr)[0] = 1;
    pinned.deallocate(b);
  }
  return seconds_since(t0) / iters * 1e6;
}

double raw_cost_us(size_t bytes, int iters) {
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) {
    void* p = std::aligned_alloc(4096, bytes);
    if (mlock(p, bytes) != 0) strata::user_error("bench_nvme: mlock failed (ulimit -l)");
    static_cast<char*>(p)[0] = 1;
    munlock(p, bytes);
    std::free(p);
  }
  return seconds_since(t0) / iters * 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    // A shared or virtual disk drifts by 2x from one second to the next, so one pass of each
    // says little: rounds interleave Strata (checksum on, off) and fio, and medians are compared.
    std::string engine;
    const bool have_fio = ::system("command -v fio >/dev/null 2>&1") == 0;
    std::vector<double> on_w, on_r, off_w, off_r, fio_w, fio_r;
    bool fio_failed = false;
    for (int rep = 0; rep < a.reps; ++rep) {
      // Whichever Strata run comes first in a round follows fio's jobs (and the host's
      // write-back of them); alternating the order keeps that from biasing one of the two.
      Rates on, off;
      if (rep % 2 == 0) {
        on = strata_rates(a, true, &engine);
        off = strata_rates(a, false, &engine);
      } else {
        off = strata_rates(a, false, &engine);
        on = strata_rates(a, true, &engine);
      }
      on_w.push_back(on.write_gbs);
      on_r.push_back(on.read_gbs);
      off_w.push_back(off.write_gbs);
      off_r.push_back(off.read_gbs);
      if (have_fio) {
        // Strata's store reserves its extents up front; fio's first write job lays out its
        // file, so fio writes once to lay it out and the timed jobs overwrite it.
        if (rep == 0) fio_rate(a, engine, true);  // lays out fio's file
        auto w = fio_rate(a, engine, true), r = fio_rate(a, engine, false);
        if (w && r) {
          fio_w.push_back(*w);
          fio_r.push_back(*r);
        } else {
          fio_failed = true;
        }
      }
    }
    if (have_fio) std::remove((a.dir + "/strata_bench.0.0").c_str());
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v.empty() ? 0.0 : v[v.size() / 2];
    };
    const Rates on{median(on_w), median(on_r)}, off{median(off_w), median(off_r)};
    std::optional<double> fw, fr;
    if (!fio_w.empty()) {
      fw = median(fio_w);
      fr = median(fio_r);
    }
    std::printf("## NVMe store vs fio\n\n");
    std::printf(
        "dir %s, %zu MiB, block_size %zu, queue_depth %d, threads %d, engine %s; medians of %d "
        "interleaved rounds\n\n",
        a.dir.c_str(), a.size_mib, a.block_size, a.queue_depth, a.threads, engine.c_str(), a.reps);
    if (!have_fio) std::printf("fio not found: reporting Strata's numbers only\n\n");
    std::printf(
        "| op | strata GB/s (checksum) | strata GB/s (no checksum) | fio GB/s | ratio "
        "(checksum) | ratio (no checksum) |\n|---|---|---|---|---|---|\n");
    auto row = [&](const char* op, double with, double without, std::optional<double> fio) {
      if (fio)
        std::printf("| %s | %.3f | %.3f | %.3f | %.2f | %.2f |\n", op, with, without, *fio,
                    with / *fio, without / *fio);
      else
        std::printf("| %s | %.3f | %.3f | - | - | - |\n", op, with, without);
    };
    row("write", on.write_gbs, off.write_gbs, fw);
    row("read", on.read_gbs, off.read_gbs, fr);
    if (fio_failed) std::printf("\n(fio ran but its JSON could not be read in some rounds)\n");

    std::printf("\n## Pinned pool allocation cost\n\n");
    std::printf("| size | pool us/op | raw alloc+mlock us/op | speedup |\n|---|---|---|---|\n");
    for (size_t mib : {1, 16, 64}) {
      const size_t bytes = mib << 20;
      const int iters = mib >= 64 ? 20 : 100;
      const double pool = pool_cost_us(bytes, iters), raw = raw_cost_us(bytes, iters);
      std::printf("| %zu MiB | %.2f | %.1f | %.0fx |\n", mib, pool, raw, raw / pool);
    }
    return 0;
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "bench_nvme: %s\n", e.what());
    return 1;
  }
}
