#include "tools/common/op_profile.h"

#include <fmt/format.h>

namespace strata::tools {

std::string op_time_table(const std::vector<tensor::CudaOpTime>& ops, int64_t steps,
                          double step_ms) {
  const double n = static_cast<double>(steps > 0 ? steps : 1);
  const auto share = [&](double ms) {
    return step_ms > 0 ? fmt::format("{:.1f}%", 100.0 * ms / step_ms) : std::string("-");
  };
  std::string out =
      "| op | calls/step | ms/step | share of step | TFLOP/s | GB/s |\n"
      "|---|---|---|---|---|---|\n";
  double total_ms = 0, total_calls = 0;
  for (const tensor::CudaOpTime& t : ops) {
    const double ms = t.ms / n;
    total_ms += ms;
    total_calls += static_cast<double>(t.calls) / n;
    const std::string tflops =
        t.flops > 0 && t.ms > 0 ? fmt::format("{:.1f}", t.flops / (t.ms * 1e-3) / 1e12) : "";
    const std::string gbs =
        t.bytes > 0 && t.ms > 0 ? fmt::format("{:.0f}", t.bytes / (t.ms * 1e-3) / 1e9) : "";
    out += fmt::format("| {} | {:g} | {:.3f} | {} | {} | {} |\n", t.op,
                       static_cast<double>(t.calls) / n, ms, share(ms), tflops, gbs);
  }
  out +=
      fmt::format("| all ops | {:g} | {:.3f} | {} | | |\n", total_calls, total_ms, share(total_ms));
  out += fmt::format("| step (host clock) | | {:.3f} | {} | | |\n", step_ms, share(step_ms));
  return out;
}

}  // namespace strata::tools
