#include "runtime/op_profile.h"

#include <fmt/format.h>

#include <algorithm>

namespace strata::runtime {

namespace {

double per_step(double total, int64_t steps) {
  return total / static_cast<double>(steps > 0 ? steps : 1);
}

}  // namespace

double bound_ms(const tensor::CudaOpTime& op, int64_t steps, const PeakRates& peaks) {
  if (!peaks.known()) return 0.0;
  const double compute_ms = per_step(op.flops, steps) / (peaks.tflops * 1e12) * 1e3;
  const double memory_ms = per_step(op.bytes, steps) / (peaks.gbps * 1e9) * 1e3;
  return std::max(compute_ms, memory_ms);
}

double bound_ms(const std::vector<tensor::CudaOpTime>& ops, int64_t steps, const PeakRates& peaks) {
  double total = 0;
  for (const tensor::CudaOpTime& t : ops) total += bound_ms(t, steps, peaks);
  return total;
}

std::string op_time_table(const std::vector<tensor::CudaOpTime>& ops, int64_t steps, double step_ms,
                          const PeakRates& peaks) {
  const bool bound = peaks.known();
  const auto share = [&](double ms) {
    return step_ms > 0 ? fmt::format("{:.1f}%", 100.0 * ms / step_ms) : std::string("-");
  };
  const auto of_bound = [](double bound, double ms) {
    return ms > 0 ? fmt::format("{:.0f}%", 100.0 * bound / ms) : std::string("-");
  };
  std::string out =
      bound ? "| op | calls/step | ms/step | share of step | TFLOP/s | GB/s | GB/step | bound "
              "ms/step | % of bound |\n|---|---|---|---|---|---|---|---|---|\n"
            : "| op | calls/step | ms/step | share of step | TFLOP/s | GB/s |\n"
              "|---|---|---|---|---|---|\n";
  double total_ms = 0, total_calls = 0, total_gb = 0;
  for (const tensor::CudaOpTime& t : ops) {
    const double ms = per_step(t.ms, steps);
    total_ms += ms;
    total_calls += per_step(static_cast<double>(t.calls), steps);
    const std::string tflops =
        t.flops > 0 && t.ms > 0 ? fmt::format("{:.1f}", t.flops / (t.ms * 1e-3) / 1e12) : "";
    const std::string gbs =
        t.bytes > 0 && t.ms > 0 ? fmt::format("{:.0f}", t.bytes / (t.ms * 1e-3) / 1e9) : "";
    out += fmt::format("| {} | {:g} | {:.3f} | {} | {} | {} |", t.op,
                       per_step(static_cast<double>(t.calls), steps), ms, share(ms), tflops, gbs);
    if (bound) {
      const double gb = per_step(t.bytes, steps) / 1e9;
      const double b = bound_ms(t, steps, peaks);
      total_gb += gb;
      out += fmt::format(" {:.3f} | {:.3f} | {} |", gb, b, of_bound(b, ms));
    }
    out += "\n";
  }
  out +=
      fmt::format("| all ops | {:g} | {:.3f} | {} | | |", total_calls, total_ms, share(total_ms));
  if (bound) {
    const double b = bound_ms(ops, steps, peaks);
    out += fmt::format(" {:.3f} | {:.3f} | {} |", total_gb, b, of_bound(b, total_ms));
  }
  out += "\n";
  out += fmt::format("| step (host clock) | | {:.3f} | {} | | |{}\n", step_ms, share(step_ms),
                     bound ? " | | |" : "");
  return out;
}

}  // namespace strata::runtime
