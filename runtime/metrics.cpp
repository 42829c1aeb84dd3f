#include "runtime/metrics.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"

namespace strata::runtime {

std::string to_json_line(const StepRecord& r) {
  // nlohmann::json prints doubles in shortest round-trip form.
  nlohmann::ordered_json j;
  j["step"] = r.step;
  j["loss"] = r.loss;
  j["lr"] = r.lr;
  j["grad_norm"] = r.grad_norm;
  j["tokens_per_s"] = r.tokens_per_s;
  j["mfu"] = r.mfu;
  j["step_s"] = r.step_s;
  nlohmann::ordered_json mem = nlohmann::ordered_json::object();
  for (const auto& [tier, bytes] : r.peak_bytes) mem[tier] = bytes;
  j["peak_bytes"] = mem;
  if (r.val_loss) j["val_loss"] = *r.val_loss;
  if (!r.pipeline_bubble.empty()) {
    j["pipeline_bubble"] = r.pipeline_bubble;
    j["pipeline_bubble_formula"] = r.pipeline_bubble_formula;
  }
  if (r.param_wait_ms) j["param_wait_ms"] = *r.param_wait_ms;
  if (!r.param_peak_bytes.empty()) {
    nlohmann::ordered_json pm = nlohmann::ordered_json::object();
    for (const auto& [tier, bytes] : r.param_peak_bytes) pm[tier] = bytes;
    j["param_peak_bytes"] = pm;
  }
  if (!r.grad_peak_bytes.empty()) {
    nlohmann::ordered_json gm = nlohmann::ordered_json::object();
    for (const auto& [tier, bytes] : r.grad_peak_bytes) gm[tier] = bytes;
    j["grad_peak_bytes"] = gm;
  }
  if (r.loss_scale) j["loss_scale"] = *r.loss_scale;
  if (r.skipped) j["skipped"] = true;
  return j.dump();
}

MetricsFile::MetricsFile(const std::string& path, int64_t keep_through) : path_(path) {
  std::vector<std::string> kept;
  if (keep_through > 0) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      // A torn last line (killed mid-write) is dropped like a record past the checkpoint, and
      // so is any line that is not a step record (an object with an integer "step"): a file
      // edited or damaged by hand must not stop the resume.
      if (j.is_discarded() || !j.is_object() || !j.contains("step") ||
          !j["step"].is_number_integer())
        continue;
      if (j["step"].get<int64_t>() <= keep_through) kept.push_back(line);
    }
  }
  std::string text;
  for (const auto& l : kept) text += l + "\n";
  write_file_atomically(path, text);  // Note [Atomic files]
  file_ = std::fopen(path.c_str(), "a");
  if (!file_) user_error("cannot append to the metrics file {}: {}", path, std::strerror(errno));
}

MetricsFile::~MetricsFile() {
  if (file_) std::fclose(file_);
}

void MetricsFile::append(const StepRecord& record) {
  std::string line = to_json_line(record);
  std::fprintf(file_, "%s\n", line.c_str());
  std::fflush(file_);
}

std::string format_bytes(int64_t bytes) {
  double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
  if (b >= 1024.0) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{} B", bytes);
}

ConsoleReporter::ConsoleReporter(const std::string& mode, int64_t total_steps)
    : total_(total_steps) {
  quiet_ = mode == "off";
  bar_ = mode == "bar" || (mode == "auto" && ::isatty(STDOUT_FILENO));
}

namespace {

std::string summary(const StepRecord& r) {
  std::string mem;
  for (const auto& [tier, bytes] : r.peak_bytes) {
    mem += fmt::format(" | {} {}", tier, format_bytes(bytes));
  }
  // No peak for this device (Note [GPU peaks]): no MFU, rather than 0%.
  const std::string mfu = r.mfu > 0 ? fmt::format("{:.1f}%", 100.0 * r.mfu) : std::string("-");
  std::string bubble;
  for (size_t s = 0; s < r.pipeline_bubble.size(); ++s)
    bubble += fmt::format("{}{:.1f}%", s ? "/" : " | bubble ", 100.0 * r.pipeline_bubble[s]);
  if (!bubble.empty())
    bubble += fmt::format(" (formula {:.1f}%)", 100.0 * r.pipeline_bubble_formula);
  if (r.param_wait_ms) mem += fmt::format(" | param wait {:.1f} ms", *r.param_wait_ms);
  return fmt::format("loss {:.4f} | lr {:.2e} | gnorm {:.3f} | {:.0f} tok/s | mfu {}{}{}", r.loss,
                     r.lr, r.grad_norm, r.tokens_per_s, mfu, bubble, mem);
}

}  // namespace

void ConsoleReporter::step(const StepRecord& r) {
  if (quiet_) return;
  if (!bar_) {
    fmt::print("step {}/{} | {}\n", r.step, total_, summary(r));
    std::fflush(stdout);
    return;
  }
  constexpr int kWidth = 24;
  int filled = total_ > 0 ? static_cast<int>(kWidth * r.step / total_) : kWidth;
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, '.');
  // \r + erase line: the bar rewrites itself in place.
  fmt::print("\r\x1b[2K[{}] {}/{} {}", bar, r.step, total_, summary(r));
  std::fflush(stdout);
  bar_open_ = true;
}

void ConsoleReporter::event(const std::string& text) {
  if (quiet_) return;
  if (bar_open_) {
    fmt::print("\n");
    bar_open_ = false;
  }
  fmt::print("{}\n", text);
  std::fflush(stdout);
}

void ConsoleReporter::finish() {
  if (bar_open_) fmt::print("\n");
  bar_open_ = false;
  std::fflush(stdout);
}

}  // namespace strata::runtime
