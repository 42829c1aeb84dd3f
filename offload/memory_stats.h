#pragma once
// Per-tier, per-category memory accounting.
//
// Note [Every byte is accounted]
// Each allocation made through an `Allocator` carries a tier (where the bytes live) and a category
// (what they are for). `MemoryStats` keeps current and peak bytes for every (tier, category) pair
// and for every tier as a whole; `train` reports them and `estimate` predicts the same categories,
// so the ZeRO papers' memory tables are checked against measurements. Updates are atomic and
// lock-free so allocators on any thread can report.
#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata::offload {

enum class Tier : uint8_t { Gpu, Host, Pinned, Nvme };
inline constexpr int kNumTiers = 4;

enum class Category : uint8_t { Param, Grad, Optimizer, Activation, Workspace, Comm };
inline constexpr int kNumCategories = 6;

std::string_view tier_name(Tier t);
std::string_view category_name(Category c);

struct Usage {
  int64_t current = 0;
  int64_t peak = 0;
};

class MemoryStats {
 public:
  void on_alloc(Tier t, Category c, int64_t bytes);
  void on_free(Tier t, Category c, int64_t bytes);

  Usage usage(Tier t, Category c) const;
  Usage tier_usage(Tier t) const;  // peak of the tier's total, not the sum of category peaks
  // Restarts peaks from the current values (e.g. per training step).
  void reset_peaks();
  std::string report() const;  // human-readable table of the non-zero entries

  // The process-wide instance every allocator reports to.
  static MemoryStats& global();

 private:
  struct Counter {
    std::atomic<int64_t> current{0};
    std::atomic<int64_t> peak{0};
    void add(int64_t bytes);
  };
  std::array<std::array<Counter, kNumCategories>, kNumTiers> pair_{};
  std::array<Counter, kNumTiers> tier_{};
};

// The category new allocations are charged to on this thread when the caller does not say.
// Scoped: `CategoryScope s(Category::Param);` charges everything allocated in scope to params.
Category current_category();
class CategoryScope {
 public:
  explicit CategoryScope(Category c);
  ~CategoryScope();
  CategoryScope(const CategoryScope&) = delete;
  CategoryScope& operator=(const CategoryScope&) = delete;

 private:
  Category saved_;
};

}  // namespace strata::offload
