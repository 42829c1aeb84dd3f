#pragma once
// Wall-clock timing for logs and benchmarks (never for asserting speed in tests).
#include <algorithm>
#include <chrono>
#include <vector>

namespace strata {

class Stopwatch {
 public:
  Stopwatch() : start_(Clock::now()) {}
  void restart() { start_ = Clock::now(); }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_;
};

// Median of repeated measurements (the benchmarks' statistic: robust to a noisy neighbour).
inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

}  // namespace strata
