#include "tools/bench/emulator_stats.h"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>

#if defined(STRATA_CUDA_EMULATION)
#include "cuda_emu/control.h"
#endif

namespace strata::bench {

namespace {

// The emulated device's multiprocessors, against which a launch's grid is counted short.
#if defined(STRATA_CUDA_EMULATION)
constexpr int kSiteMultiprocessors = strata::cuda_emu::kMultiprocessors;
#else
constexpr int kSiteMultiprocessors = 0;  // --launches is refused
#endif

// "min-max", or one number when they agree.
std::string span(uint64_t lo, uint64_t hi) {
  return lo == hi ? fmt::format("{}", lo) : fmt::format("{}-{}", lo, hi);
}

}  // namespace

bool dry_run() {
#if defined(STRATA_CUDA_EMULATION)
  return strata::cuda_emu::dry_run();
#else
  return false;
#endif
}

DeviceCounts device_counts() {
  DeviceCounts c;
#if defined(STRATA_CUDA_EMULATION)
  const strata::cuda_emu::Stats s = strata::cuda_emu::stats();
  c.launches = s.launches;
  c.matmuls = s.matmuls;
  c.graph_runs = s.graph_runs;
  c.idle_waits = s.idle_waits;
#endif
  return c;
}

void reset_sites() {
#if defined(STRATA_CUDA_EMULATION)
  strata::cuda_emu::reset_launch_sites();
#endif
}

std::vector<SiteRow> read_sites() {
  std::vector<SiteRow> rows;
#if defined(STRATA_CUDA_EMULATION)
  for (const strata::cuda_emu::LaunchSite& s : strata::cuda_emu::launch_sites())
    rows.push_back({s.kernel, fmt::format("{}:{}", s.file, s.line), s.launches, s.blocks,
                    s.min_blocks, s.max_blocks, s.under_sms, s.min_threads, s.max_threads});
#endif
  return rows;
}

void print_launches(const std::string& name, std::vector<SiteRow> sites, int64_t batch,
                    int64_t seq_len, const std::string& dtype, int steps_run) {
  // Paths from the directory all sites share (the repository's root when they span it).
  std::string prefix = sites.empty() ? std::string() : sites.front().where;
  for (const SiteRow& s : sites) {
    size_t k = 0;
    while (k < prefix.size() && k < s.where.size() && prefix[k] == s.where[k]) ++k;
    prefix.resize(k);
  }
  prefix.resize(prefix.rfind('/') == std::string::npos ? 0 : prefix.rfind('/') + 1);
  std::sort(sites.begin(), sites.end(), [](const SiteRow& a, const SiteRow& b) {
    return std::tie(b.under_sms, b.launches, a.where) < std::tie(a.under_sms, a.launches, b.where);
  });
  const auto steps = static_cast<uint64_t>(steps_run);
  uint64_t launches = 0, under = 0, under_sites = 0;
  for (const SiteRow& s : sites) {
    launches += s.launches;
    under += s.under_sms;
    under_sites += s.under_sms > 0 ? 1 : 0;
  }
  fmt::print(
      "\nKernel launches per step by site, {} at B = {}, T = {}, {} ({} timed steps; the grids "
      "a GPU gets, on an emulated device of {} multiprocessors)\n\n",
      name, batch, seq_len, dtype, steps_run, kSiteMultiprocessors);
  fmt::print(
      "| kernel | launched at | launches/step | blocks per launch | mean blocks | threads per "
      "block | launches/step under {} blocks |\n|---|---|---|---|---|---|---|\n",
      kSiteMultiprocessors);
  for (const SiteRow& s : sites)
    fmt::print("| `{}` | {} | {:.4g} | {} | {:.0f} | {} | {:.4g} |\n", s.kernel,
               s.where.substr(prefix.size()), static_cast<double>(s.launches) / steps,
               span(s.min_blocks, s.max_blocks),
               static_cast<double>(s.blocks) / static_cast<double>(s.launches),
               span(s.min_threads, s.max_threads), static_cast<double>(s.under_sms) / steps);
  fmt::print(
      "\n{:.4g} of {:.4g} kernel launches per step ({} of {} sites) have fewer blocks than the "
      "{} multiprocessors: those leave some idle while they run.\n",
      static_cast<double>(under) / steps, static_cast<double>(launches) / steps, under_sites,
      sites.size(), kSiteMultiprocessors);
}

}  // namespace strata::bench
