// bench_nvme: NVMe store read/write GB/s against fio on the same directory, block size and queue
// depth (direct=1), measured in the same run; and the pinned pool's allocation cost against a
// raw allocation + mlock (cudaHostAlloc where CUDA pins).
//
//   bench_nvme [--dir D] [--size-mib N] [--block-size B] [--queue-depth Q] [--threads T]
//              [--engine auto|io_uring|libaio] [--reps R] [--fixed-buffers 0|1]
//              [--fio-hugetlbfs auto|off|DIR]
//   (defaults: /tmp, 512 MiB, 1 MiB blocks, queue depth 8, 1 thread, auto, 7 rounds, 1, auto)
//
// Strata writes then reads one buffer of --size-mib through NvmeStore (pinned source and
// destination from one pool, store block = aio block), with block checksums on and off, and
// reads once more into a buffer the pool has just mapped. fio runs a sequential write then read
// job of the same size with the same engine, twice: with malloc'd buffers on 4 KiB pages (fio's
// default) and with buffers on huge pages from a hugetlbfs (--iomem=mmaphuge), the like-for-like
// reference, since Strata's pinned buffers are on huge pages too and the page size of the
// buffers alone moves O_DIRECT reads by 2x on a VM. Rounds interleave, medians compared, every
// round printed with the load average. Target: Strata >= 0.9 x fio (huge pages). What is and is
// not alike is printed with the results.
#include <sys/mman.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "offload/nvme_store.h"
#include "offload/pinned_allocator.h"
#include "tools/bench/bench_cli.h"

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
  int reps = 7;               // interleaved Strata/fio rounds; medians are reported
  bool fixed_buffers = true;  // register the pinned pool's buffers with io_uring
  IoEngineKind engine = IoEngineKind::Auto;
  std::string fio_hugetlbfs = "auto";  // auto: the first hugetlbfs in /proc/mounts; off: none
};

// Note [Bench command line]; nullopt: run.
std::optional<int> parse(int argc, char** argv, Args& a) {
  CLI::App app{"NVMe store read/write GB/s against fio on the same directory, blocks and depth",
               "bench_nvme"};
  strata::bench::value_option(app, "--dir", a.dir, "directory the files go to");
  strata::bench::value_option(app, "--size-mib", a.size_mib, "MiB written then read per round");
  strata::bench::value_option(app, "--block-size", a.block_size, "aio block size, bytes");
  strata::bench::value_option(app, "--queue-depth", a.queue_depth, "aio queue depth");
  strata::bench::value_option(app, "--threads", a.threads, "aio threads");
  std::string engine = "auto";
  strata::bench::value_option(app, "--engine", engine, "I/O engine")
      ->check(CLI::IsMember({"auto", "io_uring", "libaio"}));
  strata::bench::count_option(app, "--reps", a.reps, "interleaved Strata/fio rounds (medians)");
  strata::bench::value_option(app, "--fixed-buffers", a.fixed_buffers,
                              "register the pinned pool's buffers with io_uring (0 or 1)");
  strata::bench::value_option(app, "--fio-hugetlbfs", a.fio_hugetlbfs,
                              "fio's huge-page buffers: auto (the first hugetlbfs mounted), off, "
                              "or a hugetlbfs directory");
  if (std::optional<int> status = strata::bench::parse_args(app, argc, argv)) return status;
  a.engine = engine == "io_uring" ? IoEngineKind::IoUring
             : engine == "libaio" ? IoEngineKind::Libaio
                                  : IoEngineKind::Auto;
  return std::nullopt;
}

struct Rates {
  double write_gbs = 0, read_gbs = 0, fresh_read_gbs = 0;
};

std::string loadavg() {
  FILE* f = std::fopen("/proc/loadavg", "r");
  if (f == nullptr) return "?";
  char buf[128] = {0};
  const bool ok = std::fgets(buf, sizeof buf, f) != nullptr;
  std::fclose(f);
  std::string s = ok ? buf : "?";
  // "0.52 0.58 0.59 1/123 4567": the three averages are what says how busy the machine is.
  size_t cut = 0;
  for (int spaces = 0; cut < s.size() && spaces < 3; ++cut)
    if (s[cut] == ' ') ++spaces;
  return s.substr(0, cut > 0 ? cut - 1 : 0);
}

// AnonHugePages of this process, in MiB: how much of the pinned pool the kernel really put on
// transparent huge pages (Note [Pinned buffers on huge pages]).
double anon_huge_mib() {
  FILE* f = std::fopen("/proc/self/smaps_rollup", "r");
  if (f == nullptr) return -1;
  char line[256];
  double kb = -1;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::sscanf(line, "AnonHugePages: %lf kB", &kb) == 1) break;
  std::fclose(f);
  return kb < 0 ? -1 : kb / 1024;
}

// Source and destination stay in one pinned pool for the whole run: the swapper's steady state,
// and what fio does with its iodepth x bs buffers (docs/offload.md, "Read destinations").
struct StrataSide {
  StrataSide(const Args& a) : bytes(a.size_mib << 20) {
    src = pinned.allocate(bytes, Category::Optimizer);
    dst = pinned.allocate(bytes, Category::Optimizer);
    std::mt19937_64 rng(1);
    for (size_t i = 0; i < bytes / 8; ++i) static_cast<uint64_t*>(src.ptr)[i] = rng();
    std::memset(dst.ptr, 0, bytes);
  }
  ~StrataSide() {
    pinned.deallocate(src);
    pinned.deallocate(dst);
  }
  size_t bytes;
  PinnedAllocator pinned;
  Block src, dst;
  bool dst_warm = false;
  int64_t fixed_ios = 0, refusals = 0;  // over all stores
};

Rates strata_rates(const Args& a, StrataSide& side, bool checksum, bool fresh,
                   std::string* engine_used) {
  NvmeConfig c;
  c.paths = {a.dir};
  c.block_bytes = a.block_size;
  c.o_direct = ODirect::On;
  c.checksum = checksum;
  c.aio.block_size = a.block_size;
  c.aio.queue_depth = a.queue_depth;
  c.aio.intra_op_parallelism = a.threads;
  c.aio.engine = a.engine;
  c.aio.fixed_buffers = a.fixed_buffers;
  NvmeStore store(c);
  store.engine().set_buffer_table(side.pinned.buffer_table());  // as the swapper does
  *engine_used = std::string(io_engine_name(store.engine().kind()));
  const size_t bytes = side.bytes;
  Block home = store.allocate(bytes, Category::Optimizer);
  // One untimed write first: like fio's layout job, it makes the timed write an overwrite of
  // extents that already exist. Then one timed write and one timed read, as fio's jobs.
  store.write(home, side.src.ptr, bytes).wait();
  if (!side.dst_warm) {  // fio's buffers take all but their first read warm: dst's first, untimed
    store.read(home, side.dst.ptr, bytes).wait();
    side.dst_warm = true;
  }
  std::memset(side.dst.ptr, 0, bytes);
  Rates r;
  auto t0 = Clock::now();
  store.write(home, side.src.ptr, bytes).wait();
  r.write_gbs = bytes / seconds_since(t0) / 1e9;
  t0 = Clock::now();
  store.read(home, side.dst.ptr, bytes).wait();
  r.read_gbs = bytes / seconds_since(t0) / 1e9;
  if (std::memcmp(side.src.ptr, side.dst.ptr, bytes) != 0)
    strata::user_error("bench_nvme: data mismatch");
  if (fresh) {
    // A buffer the pool has just taken from the kernel (another pool size than src and dst),
    // as a first swap-in gets; handed back to the kernel afterwards so every round's is new.
    Block f = side.pinned.allocate(bytes + 1, Category::Optimizer);
    t0 = Clock::now();
    store.read(home, f.ptr, bytes).wait();
    r.fresh_read_gbs = bytes / seconds_since(t0) / 1e9;
    if (std::memcmp(side.src.ptr, f.ptr, bytes) != 0)
      strata::user_error("bench_nvme: data mismatch (fresh destination)");
    side.pinned.deallocate(f);
    side.pinned.release_pool();
  }
  store.deallocate(home);
  side.fixed_ios += store.engine().fixed_buffer_ios();
  side.refusals += store.engine().fixed_buffer_refusals();
  return r;
}

// Where fio's huge-page reference takes its buffers, or why it is skipped.
struct HugeFio {
  std::string buffer_file;  // --iomem=mmaphuge:<this>; empty: skipped
  size_t page_bytes = 0;
  std::string skipped_because;
};

constexpr long kHugetlbfsMagic = 0x958458f6;  // statfs f_type of a hugetlbfs (linux/magic.h)

long read_long(const std::string& path) {
  std::ifstream f(path);
  long v = -1;
  f >> v;
  return f ? v : -1;
}

// fio --iomem=mmaphuge maps iodepth x bs (+ one page of alignment, rounded up to whole huge
// pages) from a file in a hugetlbfs, which only has the pages set aside in nr_hugepages. The
// benchmark only looks: mounting and sysctls are the user's (the skip message says how).
HugeFio find_huge_fio(const Args& a) {
  HugeFio h;
  if (a.fio_hugetlbfs == "off" || a.fio_hugetlbfs == "none") {
    h.skipped_because = "--fio-hugetlbfs off.";
    return h;
  }
  const size_t fio_bytes = size_t(a.queue_depth * a.threads) * a.block_size;
  // fio maps iodepth x bs + 4 KiB rounded up to huge pages; fio 3.33 was seen holding one page
  // more (HugePages_Free + HugePages_Rsvd during a job), so one page of slack.
  const auto pages_needed = [&](size_t page) { return (fio_bytes + 4096 + page - 1) / page + 1; };
  const auto how_to = [&](size_t page, const std::string& mnt, bool mounted) {
    const size_t pages = pages_needed(page) + 8;  // 8 more for whoever else uses them
    return fmt::format(
        "To enable it (as root): `mkdir -p {0} && mount -t hugetlbfs none {0}`{1} and "
        "`echo {2} > /proc/sys/vm/nr_hugepages` (default-size huge pages; {3} needed here, the "
        "rest is slack), then run again (or pass --fio-hugetlbfs DIR).",
        mnt, mounted ? " (done already)" : "", pages, pages - 8);
  };
  std::string dir = a.fio_hugetlbfs;
  if (dir == "auto") {
    dir.clear();
    std::ifstream mounts("/proc/mounts");
    std::string dev, mnt, type, rest;
    while (mounts >> dev >> mnt >> type && std::getline(mounts, rest))
      if (type == "hugetlbfs") {
        dir = mnt;
        break;
      }
    if (dir.empty()) {
      h.skipped_because =
          "no hugetlbfs is mounted (/proc/mounts). " + how_to(2u << 20, "/mnt/huge", false);
      return h;
    }
  }
  struct statfs st {};
  if (::statfs(dir.c_str(), &st) != 0 || static_cast<long>(st.f_type) != kHugetlbfsMagic)
    strata::user_error(
        "bench_nvme: --fio-hugetlbfs {} is not a directory on a mounted hugetlbfs; mount one "
        "(`mount -t hugetlbfs none {}`), pass another, or leave the option out (auto) or 'off'",
        dir, dir);
  h.page_bytes = static_cast<size_t>(st.f_bsize);  // a hugetlbfs reports its huge page size
  const size_t need = pages_needed(h.page_bytes);
  const std::string sys =
      fmt::format("/sys/kernel/mm/hugepages/hugepages-{}kB/", h.page_bytes >> 10);
  const long free_pages = read_long(sys + "free_hugepages");
  if (free_pages < static_cast<long>(need)) {
    h.skipped_because = fmt::format(
        "{} ({} KiB pages) has {} huge pages free (nr_hugepages {}); fio's {} MiB of buffers "
        "need {}. {}",
        dir, h.page_bytes >> 10, std::max(free_pages, 0L), read_long(sys + "nr_hugepages"),
        fio_bytes >> 20, need, how_to(h.page_bytes, dir, true));
    return h;
  }
  if (::access(dir.c_str(), W_OK) != 0) {
    h.skipped_because = fmt::format("{} is not writable by this user.", dir);
    return h;
  }
  h.buffer_file = fmt::format("{}/strata_bench_fio.{}", dir, ::getpid());
  return h;
}

// One fio job with Strata's total queue depth (queue_depth x threads): the same I/Os in flight on
// the same single file. `iomem` empty: fio's default malloc'd buffers.
std::optional<double> fio_rate(const Args& a, const std::string& engine, bool write,
                               const HugeFio* huge = nullptr, std::string* cmd_out = nullptr) {
  std::string iomem;
  if (huge != nullptr)  // fio unlinks the file when the job ends
    iomem =
        fmt::format(" --iomem=mmaphuge:{} --hugepage-size={}", huge->buffer_file, huge->page_bytes);
  const std::string cmd = fmt::format(
      "fio --name=strata_bench --directory={} --rw={} --bs={} --iodepth={} --ioengine={} "
      "--direct=1 --size={}m --numjobs=1{} --output-format=json",
      a.dir, write ? "write" : "read", a.block_size, a.queue_depth * a.threads, engine, a.size_mib,
      iomem);
  if (cmd_out != nullptr) *cmd_out = cmd;
  FILE* p = ::popen((cmd + " 2>/dev/null").c_str(), "r");
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
  Args a;
  if (const std::optional<int> status = parse(argc, argv, a)) return *status;
  try {
    // A shared or virtual disk drifts by 2x from one second to the next, so one pass of each
    // says little: rounds interleave Strata (checksum on, off) and fio (malloc, huge pages), and
    // medians are compared.
    std::string engine;
    const bool have_fio = ::system("command -v fio >/dev/null 2>&1") == 0;
    const HugeFio huge = have_fio ? find_huge_fio(a) : HugeFio{};
    const bool have_huge = have_fio && !huge.buffer_file.empty();
    const std::string load_before = loadavg();
    StrataSide side(a);
    const double huge_mib = anon_huge_mib();
    // One fio reference: its buffers, per-round rates, and the first command that failed.
    struct FioRef {
      const HugeFio* iomem = nullptr;  // null: fio's default malloc'd buffers
      std::vector<double> w, r;
      int failures = 0;
      std::string failed_cmd;
      std::optional<double> last_w, last_r;
      void run(const Args& a, const std::string& engine) {
        std::string cmd;
        last_w = fio_rate(a, engine, true, iomem, &cmd);
        if (last_w) last_r = fio_rate(a, engine, false, iomem, &cmd);
        if (last_w && last_r) {
          w.push_back(*last_w);
          r.push_back(*last_r);
        } else {
          last_w = last_r = std::nullopt;
          if (failures++ == 0) failed_cmd = cmd;
        }
      }
    };
    FioRef fio_malloc, fio_huge;
    fio_huge.iomem = &huge;
    std::vector<double> on_w, on_r, off_w, off_r, fresh_r;
    std::vector<std::string> rounds;
    bool fio_laid_out = false;
    const auto opt = [](std::optional<double> v) {
      return v ? fmt::format("{:.3f}", *v) : std::string("-");
    };
    for (int rep = 0; rep < a.reps; ++rep) {
      // Each run follows the previous one's writes (and the host's write-back of them), so the
      // four runs of a round take turns in every position: no side always goes first. Round 0
      // starts with Strata, which tells fio which engine `auto` chose.
      Rates on, off;
      fio_malloc.last_w = fio_malloc.last_r = fio_huge.last_w = fio_huge.last_r = std::nullopt;
      for (int slot = 0; slot < 4; ++slot) {
        const int which = (slot + rep) % 4;
        if (which == 0) {
          on = strata_rates(a, side, true, false, &engine);
        } else if (which == 1) {
          off = strata_rates(a, side, false, true, &engine);
        } else if (have_fio && (which == 2 || have_huge)) {
          // Strata's store reserves its extents up front; fio's first write job lays out
          // its file (one file for both references), so fio writes once to lay it out and the
          // timed jobs overwrite it.
          if (!fio_laid_out) fio_rate(a, engine, true);
          fio_laid_out = true;
          (which == 2 ? fio_malloc : fio_huge).run(a, engine);
        }
      }
      on_w.push_back(on.write_gbs);
      on_r.push_back(on.read_gbs);
      off_w.push_back(off.write_gbs);
      off_r.push_back(off.read_gbs);
      fresh_r.push_back(off.fresh_read_gbs);
      rounds.push_back(fmt::format(
          "| {} | {:.3f} | {:.3f} | {} | {} | {:.3f} | {:.3f} | {:.3f} | {} | {} |", rep,
          on.write_gbs, off.write_gbs, opt(fio_malloc.last_w), opt(fio_huge.last_w), on.read_gbs,
          off.read_gbs, off.fresh_read_gbs, opt(fio_malloc.last_r), opt(fio_huge.last_r)));
    }
    if (have_fio) std::remove((a.dir + "/strata_bench.0.0").c_str());
    if (have_huge) std::remove(huge.buffer_file.c_str());  // fio unlinks it; in case it did not
    const std::string load_after = loadavg();
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v.empty() ? 0.0 : v[v.size() / 2];
    };
    auto med = [&](const std::vector<double>& v) {
      return v.empty() ? std::nullopt : std::optional<double>(median(v));
    };
    std::printf("## NVMe store vs fio\n\n");
    std::printf(
        "dir %s, %zu MiB, block_size %zu, queue_depth %d, threads %d, engine %s; medians of %d "
        "interleaved rounds; load average %s before, %s after\n\n",
        a.dir.c_str(), a.size_mib, a.block_size, a.queue_depth, a.threads, engine.c_str(), a.reps,
        load_before.c_str(), load_after.c_str());
    const int qd = a.queue_depth * a.threads;
    std::printf(
        "Like with like: both sides use O_DIRECT (fio --direct=1, so no page cache on either side) "
        "on one file of %zu MiB in the same directory, written once untimed, then one timed "
        "sequential write and one timed sequential read per round: the same bytes, %zu-byte I/Os "
        "with %d in flight through %s (fio: one job at that iodepth). Within a round, Strata "
        "(checksum on), Strata (checksum off), fio (malloc) and fio (huge pages) take turns going "
        "first. The page size of the buffers moves O_DIRECT throughput by up to 2x on a VM (the "
        "kernel pins one folio per huge page and the block layer merges larger requests), so "
        "fio runs twice: with its default %d x %zu-byte malloc'd buffers on 4 KiB pages, and "
        "with the same buffers on huge pages from a hugetlbfs (--iomem=mmaphuge). Strata moves "
        "the data to and from its pinned pool, whose buffers are on (transparent) huge pages, so "
        "the like-for-like reference is fio (huge pages): huge pages against huge pages, and the "
        "'vs fio huge' ratios are the ones to hold to the 0.9 target; the 'vs fio malloc' ratios "
        "credit Strata with its buffers' page size as well as its I/O path. Left different: "
        "Strata's buffers are registered with io_uring (fixed buffers %s), fio's are not, and "
        "Strata reads into a buffer that has taken reads before (the swapper's steady state). "
        "'fresh destination' reads into a buffer the pool has just mapped, whose first DMA can "
        "cost more on a VM (docs/offload.md, 'Read destinations').\n\n",
        a.size_mib, a.block_size, qd, engine.c_str(), qd, a.block_size,
        a.fixed_buffers ? "on" : "off");
    if (have_fio && !have_huge)
      std::printf(
          "**fio huge-page reference skipped**: %s Without it the only reference is fio on 4 KiB "
          "pages, which flatters Strata: there is no like-for-like ratio in this run.\n\n",
          huge.skipped_because.c_str());
    else if (have_huge)
      std::printf("fio huge-page buffers: %s (%zu KiB pages).\n\n", huge.buffer_file.c_str(),
                  huge.page_bytes >> 10);
    std::printf(
        "Pinned source + destination: %.0f MiB, %.0f MiB of it mapped for huge pages; "
        "AnonHugePages of the process: %.0f MiB. Registered (fixed) buffers %s: %lld chunks "
        "went through them, %lld registrations refused.\n\n",
        2.0 * side.bytes / 1048576, side.pinned.huge_page_bytes() / 1048576.0, huge_mib,
        a.fixed_buffers ? "on" : "off", static_cast<long long>(side.fixed_ios),
        static_cast<long long>(side.refusals));
    if (!have_fio) std::printf("fio not found: reporting Strata's numbers only\n\n");
    std::printf(
        "| op | strata GB/s (checksum) | strata GB/s (no checksum) | fio malloc GB/s | fio huge "
        "GB/s | vs fio malloc (checksum) | vs fio malloc (no checksum) | vs fio huge (checksum) | "
        "vs fio huge (no checksum) |\n|---|---|---|---|---|---|---|---|---|\n");
    const auto ratio = [](std::optional<double> x, std::optional<double> ref) {
      return x && ref ? fmt::format("{:.2f}", *x / *ref) : std::string("-");
    };
    const auto row = [&](const char* op, std::optional<double> with, std::optional<double> without,
                         std::optional<double> fm, std::optional<double> fh) {
      std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", op, opt(with).c_str(),
                  opt(without).c_str(), opt(fm).c_str(), opt(fh).c_str(), ratio(with, fm).c_str(),
                  ratio(without, fm).c_str(), ratio(with, fh).c_str(), ratio(without, fh).c_str());
    };
    row("write", median(on_w), median(off_w), med(fio_malloc.w), med(fio_huge.w));
    row("read", median(on_r), median(off_r), med(fio_malloc.r), med(fio_huge.r));
    row("read, fresh destination (no checksum)", std::nullopt, median(fresh_r), med(fio_malloc.r),
        med(fio_huge.r));
    for (const FioRef* f : {&fio_malloc, &fio_huge})
      if (f->failures > 0)
        std::printf(
            "\n(fio %s failed or its JSON could not be read in %d of %d rounds; medians are over "
            "the rest. Run it by hand to see why: `%s`)\n",
            f == &fio_huge ? "huge pages" : "malloc", f->failures, a.reps, f->failed_cmd.c_str());
    std::printf(
        "\n### Rounds (GB/s)\n\n| round | write (checksum) | write (no checksum) | fio malloc "
        "write | fio huge write | read (checksum) | read (no checksum) | read fresh (no "
        "checksum) | fio malloc read | fio huge read |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n");
    for (const std::string& line : rounds) std::printf("%s\n", line.c_str());

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
