#include "offload/host_budget.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <utility>

#include "core/error.h"

namespace strata::offload {

namespace {

std::atomic<int64_t> g_limit{0};
std::mutex g_source_mu;
std::string& source_string() {
  static std::string* s = new std::string();  // never destroyed: read by allocators at exit
  return *s;
}

std::string mib(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  return b >= 1073741824.0 ? fmt::format("{:.2f} GiB", b / 1073741824.0)
                           : fmt::format("{:.1f} MiB", b / 1048576.0);
}

}  // namespace

int64_t HostMemoryBudget::limit() {
  return g_limit.load(std::memory_order_relaxed);
}

std::string HostMemoryBudget::source() {
  std::lock_guard<std::mutex> lock(g_source_mu);
  return source_string();
}

void HostMemoryBudget::set(int64_t limit_bytes, std::string source) {
  STRATA_CHECK(limit_bytes >= 0, "host memory budget {} is negative", limit_bytes);
  std::lock_guard<std::mutex> lock(g_source_mu);
  source_string() = std::move(source);
  g_limit.store(limit_bytes, std::memory_order_relaxed);
}

int64_t HostMemoryBudget::in_use(const MemoryStats& stats) {
  return stats.tier_usage(Tier::Host).current + stats.tier_usage(Tier::Pinned).current;
}

void HostMemoryBudget::check(const MemoryStats& stats, Category category, int64_t bytes) {
  const int64_t lim = limit();
  if (lim <= 0) return;
  const int64_t used = in_use(stats);
  if (used + bytes <= lim) return;
  std::string live;
  for (int c = 0; c < kNumCategories; ++c) {
    const auto cat = static_cast<Category>(c);
    const int64_t b = stats.usage(Tier::Host, cat).current + stats.usage(Tier::Pinned, cat).current;
    if (b == 0) continue;
    live += fmt::format("{}{} {}", live.empty() ? "" : ", ", category_words(cat), mib(b));
  }
  user_error(
      "host memory budget exceeded by {}: allocating {} more would bring this process's host "
      "memory to {}, over the budget of {} ({}); in use now: {}; make the run smaller (for "
      "activations: batch.micro_batch_size or batch.seq_len) or raise the budget",
      category_words(category), mib(bytes), mib(used + bytes), mib(lim), source(),
      live.empty() ? std::string("nothing") : live);
}

HostBudgetScope::HostBudgetScope(int64_t limit_bytes, std::string source)
    : saved_limit_(HostMemoryBudget::limit()), saved_source_(HostMemoryBudget::source()) {
  HostMemoryBudget::set(limit_bytes, std::move(source));
}

HostBudgetScope::~HostBudgetScope() {
  HostMemoryBudget::set(saved_limit_, std::move(saved_source_));
}

int64_t available_host_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t value = 0;
  std::string unit;
  while (in >> key >> value) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return value * 1024;  // the kernel prints kB (KiB)
  }
  return 0;
}

int64_t auto_host_budget_reserve(int64_t available) {
  return std::max<int64_t>(int64_t{1} << 30, available / 16);
}

int64_t auto_host_budget() {
  const int64_t available = available_host_memory();
  return std::max<int64_t>(0, available - auto_host_budget_reserve(available));
}

int64_t parse_host_budget(std::string_view text, std::string_view key) {
  if (text == "auto") return -1;
  if (text == "none") return 0;
  const std::string where = key.empty() ? std::string() : fmt::format("{}: ", key);
  auto bad = [&]() -> int64_t {
    user_error(
        "{}'{}' is not a memory size; use auto (what the machine has free), none (no budget), "
        "a byte count (1073741824) or a size with a unit (512MiB, 20GiB, 1.5TiB, 64GB)",
        where, text);
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  if (i == 0) return bad();
  const std::string number(text.substr(0, i));
  char* end = nullptr;
  const double value = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !std::isfinite(value)) return bad();
  std::string_view unit = text.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  static const std::pair<std::string_view, double> kUnits[] = {{"", 1.0},
                                                               {"B", 1.0},
                                                               {"KiB", 1024.0},
                                                               {"MiB", 1048576.0},
                                                               {"GiB", 1073741824.0},
                                                               {"TiB", 1099511627776.0},
                                                               {"KB", 1e3},
                                                               {"MB", 1e6},
                                                               {"GB", 1e9},
                                                               {"TB", 1e12}};
  for (const auto& [name, scale] : kUnits) {
    if (unit != name) continue;
    const double bytes = value * scale;
    if (bytes > 9.0e18) return bad();
    if (bytes < 1048576.0) {
      user_error("{}{} is below 1 MiB, too small for any run; give a size such as 20GiB, or none",
                 where, text);
    }
    return static_cast<int64_t>(bytes);
  }
  return bad();
}

std::string_view category_words(Category c) {
  switch (c) {
    case Category::Param:
      return "parameters";
    case Category::Grad:
      return "gradients";
    case Category::Optimizer:
      return "optimizer states";
    case Category::Activation:
      return "activations";
    case Category::Workspace:
      return "workspace buffers";
    case Category::Comm:
      return "communication buffers";
  }
  return "?";
}

}  // namespace strata::offload
