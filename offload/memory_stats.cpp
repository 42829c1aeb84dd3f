#include "offload/memory_stats.h"

#include <fmt/format.h>

namespace strata::offload {

std::string_view tier_name(Tier t) {
  switch (t) {
    case Tier::Gpu:
      return "gpu";
    case Tier::Host:
      return "host";
    case Tier::Pinned:
      return "pinned";
    case Tier::Nvme:
      return "nvme";
  }
  return "?";
}

std::string_view category_name(Category c) {
  switch (c) {
    case Category::Param:
      return "param";
    case Category::Grad:
      return "grad";
    case Category::Optimizer:
      return "optimizer";
    case Category::Activation:
      return "activation";
    case Category::Workspace:
      return "workspace";
    case Category::Comm:
      return "comm";
  }
  return "?";
}

void MemoryStats::Counter::add(int64_t bytes) {
  int64_t now = current.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t prev = peak.load(std::memory_order_relaxed);
  while (now > prev && !peak.compare_exchange_weak(prev, now, std::memory_order_relaxed)) {
  }
}

void MemoryStats::on_alloc(Tier t, Category c, int64_t bytes) {
  pair_[static_cast<int>(t)][static_cast<int>(c)].add(bytes);
  tier_[static_cast<int>(t)].add(bytes);
}

void MemoryStats::on_free(Tier t, Category c, int64_t bytes) {
  pair_[static_cast<int>(t)][static_cast<int>(c)].add(-bytes);
  tier_[static_cast<int>(t)].add(-bytes);
}

Usage MemoryStats::usage(Tier t, Category c) const {
  const Counter& k = pair_[static_cast<int>(t)][static_cast<int>(c)];
  return {k.current.load(), k.peak.load()};
}

Usage MemoryStats::tier_usage(Tier t) const {
  const Counter& k = tier_[static_cast<int>(t)];
  return {k.current.load(), k.peak.load()};
}

void MemoryStats::reset_peaks() {
  for (auto& row : pair_)
    for (auto& k : row) k.peak.store(k.current.load());
  for (auto& k : tier_) k.peak.store(k.current.load());
}

std::string MemoryStats::report() const {
  std::string out;
  for (int t = 0; t < kNumTiers; ++t) {
    Usage tu = tier_usage(static_cast<Tier>(t));
    if (tu.peak == 0) continue;
    out +=
        fmt::format("{:<7} total current {:>10.2f} MiB peak {:>10.2f} MiB\n",
                    tier_name(static_cast<Tier>(t)), tu.current / 1048576.0, tu.peak / 1048576.0);
    for (int c = 0; c < kNumCategories; ++c) {
      Usage u = usage(static_cast<Tier>(t), static_cast<Category>(c));
      if (u.peak == 0) continue;
      out += fmt::format("  {:<10} current {:>10.2f} MiB peak {:>10.2f} MiB\n",
                         category_name(static_cast<Category>(c)), u.current / 1048576.0,
                         u.peak / 1048576.0);
    }
  }
  return out;
}

MemoryStats& MemoryStats::global() {
  static MemoryStats stats;
  return stats;
}

namespace {
thread_local Category tl_category = Category::Activation;
}

Category current_category() {
  return tl_category;
}
CategoryScope::CategoryScope(Category c) : saved_(tl_category) {
  tl_category = c;
}
CategoryScope::~CategoryScope() {
  tl_category = saved_;
}

}  // namespace strata::offload
