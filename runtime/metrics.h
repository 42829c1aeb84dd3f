#pragma once
// What `train` reports each step: a console view (a progress bar on a terminal, plain lines
// otherwise) and a metrics file of JSON lines, one record per step, in the run directory.
//
// Note [Metrics file]
// run_dir/metrics.jsonl holds one JSON object per optimizer step: {"step", "loss", "lr",
// "grad_norm", "tokens_per_s", "mfu", "step_s", "peak_bytes": {tier: bytes}} plus "val_loss" on
// evaluation steps, under pipeline parallelism "pipeline_bubble" (each stage's measured idle
// share of the step, stage order) and "pipeline_bubble_formula" ((p - 1) / (m + p - 1)), and with
// zero_optimization.offload_param "param_wait_ms" (how long this rank's step waited for parameter
// reads) and "param_peak_bytes": {tier: bytes} (the peak of Category::Param per tier since the
// first step: what the parameters occupied where); with the gradients on NVMe (ZeRO-3 with
// offload_optimizer.device nvme) "grad_peak_bytes", the same for Category::Grad; with run.dtype
// fp16 "loss_scale" (the scale after the step's update, Note [Dynamic loss scaling]); and
// "skipped": true on a step whose update was skipped (an inf/nan gradient). Floats are written
// in their shortest round-trip form, so two runs can be compared bitwise from their files. On
// resume the file is cut back to the records of steps the checkpoint covers (rewritten atomically),
// so it always describes one consistent run.
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace strata::runtime {

struct StepRecord {
  int64_t step = 0;  // optimizer steps completed, 1-based in reports
  float loss = 0.f;
  double lr = 0.0;
  double grad_norm = 0.0;
  double tokens_per_s = 0.0;
  double mfu = 0.0;  // fraction of the estimated peak (Note [MFU])
  double step_s = 0.0;
  std::vector<std::pair<std::string, int64_t>> peak_bytes;  // per memory tier in use
  std::optional<float> val_loss;
  // Pipeline parallelism: each stage's measured idle share of the step, and (p - 1) / (m + p - 1).
  std::vector<double> pipeline_bubble;
  double pipeline_bubble_formula = 0.0;
  std::optional<double> param_wait_ms;                            // offload_param only
  std::vector<std::pair<std::string, int64_t>> param_peak_bytes;  // offload_param only
  std::vector<std::pair<std::string, int64_t>> grad_peak_bytes;   // gradients on NVMe only
  std::optional<double> loss_scale;  // fp16 only: the scale after this step's update
  bool skipped = false;              // the optimizer did not run (overflow)
};

std::string to_json_line(const StepRecord& record);

class MetricsFile {
 public:
  // Opens run_dir/metrics.jsonl for appending, first dropping records with step > keep_through
  // (Note [Metrics file]); keep_through = 0 starts a fresh file.
  MetricsFile(const std::string& path, int64_t keep_through);
  ~MetricsFile();
  MetricsFile(const MetricsFile&) = delete;
  MetricsFile& operator=(const MetricsFile&) = delete;

  void append(const StepRecord& record);  // written and flushed at once
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

// Console output. `mode` is "bar", "lines", "auto" (bar when stdout is a terminal) or "off"
// (nothing: ranks other than 0, Note [Distributed training]).
class ConsoleReporter {
 public:
  ConsoleReporter(const std::string& mode, int64_t total_steps);
  void step(const StepRecord& record);
  // A line that must stay on screen (eval result, sample, checkpoint): ends the bar line first.
  void event(const std::string& text);
  void finish();
  bool bar() const { return bar_; }

 private:
  bool quiet_ = false;
  bool bar_ = false;
  bool bar_open_ = false;
  int64_t total_ = 0;
};

// "12.3 MiB"
std::string format_bytes(int64_t bytes);

}  // namespace strata::runtime
