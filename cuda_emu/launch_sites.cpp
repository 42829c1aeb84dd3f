// Note [Launch sites] (control.h): every launch counted by its site (file, line, kernel
// expression), with its grid and block sizes, for the launch-site reports of the benchmarks.
#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_emu/control.h"
#include "cuda_emu/simt.h"

namespace strata::cuda_emu {

namespace {

// Note [Launch sites] (control.h), keyed by file, line and kernel expression.
struct LaunchSites {
  std::mutex mutex;
  std::map<std::tuple<std::string, int, std::string>, LaunchSite> sites;
};

LaunchSites& launch_site_table() {
  static LaunchSites* table = new LaunchSites;  // never destroyed: launches may outlive statics
  return *table;
}

}  // namespace

void count_launch_site(const LaunchConfig& config) {
  const uint64_t blocks = uint64_t{config.grid.x} * config.grid.y * config.grid.z;
  const auto threads = static_cast<uint32_t>(config.block.x * config.block.y * config.block.z);
  LaunchSites& t = launch_site_table();
  std::lock_guard<std::mutex> lock(t.mutex);
  LaunchSite& s = t.sites[{config.file, config.line, config.kernel}];
  if (s.launches == 0) {
    s.kernel = config.kernel;
    s.file = config.file;
    s.line = config.line;
    s.min_blocks = s.max_blocks = blocks;
    s.min_threads = s.max_threads = threads;
  }
  ++s.launches;
  s.blocks += blocks;
  s.min_blocks = std::min(s.min_blocks, blocks);
  s.max_blocks = std::max(s.max_blocks, blocks);
  s.min_threads = std::min(s.min_threads, threads);
  s.max_threads = std::max(s.max_threads, threads);
  if (blocks < static_cast<uint64_t>(kMultiprocessors)) ++s.under_sms;
}

std::vector<LaunchSite> launch_sites() {
  LaunchSites& t = launch_site_table();
  std::lock_guard<std::mutex> lock(t.mutex);
  std::vector<LaunchSite> out;
  out.reserve(t.sites.size());
  for (const auto& [key, site] : t.sites) out.push_back(site);
  return out;
}

uint64_t launches_of(const std::string& kernel) {
  uint64_t n = 0;
  for (const LaunchSite& s : launch_sites())
    if (s.kernel.find(kernel) != std::string::npos) n += s.launches;
  return n;
}

void reset_launch_sites() {
  LaunchSites& t = launch_site_table();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.sites.clear();
}

}  // namespace strata::cuda_emu
