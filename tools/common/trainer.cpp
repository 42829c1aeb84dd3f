#include "tools/common/trainer.h"

#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "autograd/functions.h"
#include "autograd/rng_context.h"
#include "core/atomic_file.h"
#include "core/cpu_features.h"
#include "core/error.h"
#include "core/logging.h"
#include "core/timer.h"
#include "models/gpt2/hf_interop.h"
#include "models/registry.h"
#include "offload/memory_stats.h"
#include "optim/adamw.h"
#include "optim/grad_clip.h"
#include "optim/sgd.h"
#include "tensor/cuda.h"
#include "tools/common/checkpoint.h"
#include "tools/common/sampler.h"

namespace strata::tools {

namespace fs = std::filesystem;

namespace {

std::atomic<bool> g_stop{false};

// Matrices decay; biases, norm weights and other 1-D parameters do not (Note [Segments and
// weight decay] in optim/optimizer.h). The embeddings are matrices and decay, as in GPT-2/llm.c.
std::vector<optim::ParamGroup> unit_param_groups(models::CausalLM& model) {
  std::vector<optim::ParamGroup> groups;
  for (auto& u : model.flat_units()) {
    optim::ParamGroup g;
    g.param = u.params;
    g.grad = u.grads;
    for (size_t k = 0; k < u.names.size(); ++k) {
      g.segments.push_back({u.names[k], u.offsets[k], u.numels[k], u.shapes[k].ndim() >= 2});
    }
    groups.push_back(std::move(g));
  }
  return groups;
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c, models::CausalLM& model) {
  const auto& o = c.optimizer;
  if (o.name == "adamw") {
    optim::AdamWConfig ac;
    ac.lr = o.lr;
    ac.beta1 = o.beta1;
    ac.beta2 = o.beta2;
    ac.eps = o.eps;
    ac.weight_decay = o.weight_decay;
    return std::make_unique<optim::AdamW>(unit_param_groups(model), ac);
  }
  optim::SgdConfig sc;
  sc.lr = o.lr;
  sc.momentum = o.momentum;
  sc.nesterov = o.nesterov;
  sc.weight_decay = o.weight_decay;
  return std::make_unique<optim::Sgd>(unit_param_groups(model), sc);
}

// Runs `fn`, re-raising a user error with the config file in front: errors about the model or
// schedule sections come from layers that do not know which file the values came from.
template <typename Fn>
auto with_config_context(const TrainConfig& c, const char* section, Fn&& fn) {
  try {
    return fn();
  } catch (const UserError& e) {
    user_error("{}: {}: {}", c.source, section, e.what());
  }
}

void ensure_writable_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    user_error("run.dir '{}' cannot be created: {}; pick a writable run.dir", dir, ec.message());
  }
  if (!fs::is_directory(dir)) user_error("run.dir '{}' exists but is not a directory", dir);
  std::string probe = dir + "/.write_test";
  std::FILE* f = std::fopen(probe.c_str(), "w");
  if (!f) {
    user_error("run.dir '{}' is not writable ({}); pick a writable run.dir", dir,
               std::strerror(errno));
  }
  std::fclose(f);
  std::remove(probe.c_str());
}

}  // namespace

void Trainer::request_stop() {
  g_stop.store(true, std::memory_order_relaxed);
}
void Trainer::clear_stop() {
  g_stop.store(false, std::memory_order_relaxed);
}
bool Trainer::stop_requested() {
  return g_stop.load(std::memory_order_relaxed);
}

double training_flops_per_token(const models::ModelShape& s, int64_t seq_len) {
  // Position embeddings are a lookup, not a matmul; everything else (the tied head included) is.
  double n_matmul = static_cast<double>(s.num_parameters) -
                    static_cast<double>(s.family == "gpt2" ? s.max_seq_len * s.n_embd : 0);
  return 6.0 * n_matmul + 12.0 * static_cast<double>(s.n_layer * seq_len * s.n_embd);
}

double estimated_peak_flops(const std::string& device) {
  if (device != "cpu") return 0.0;  // the CUDA backend reports its own peak
  double mhz = 0.0;
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("cpu MHz", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) mhz = std::max(mhz, std::atof(line.c_str() + colon + 1));
    }
  }
  if (mhz <= 0.0) mhz = 2500.0;
  const auto& f = cpu_features();
  double per_cycle = f.avx512f ? 64.0 : (f.avx2 && f.fma ? 32.0 : 8.0);
  return static_cast<double>(num_threads()) * mhz * 1e6 * per_cycle;
}

Trainer::Trainer(TrainConfig config) : config_(std::move(config)), generator_(config_.run.seed) {
  const TrainConfig& c = config_;
  if (c.run.device == "cuda") {
    // Fails with a clear message when the build has no CUDA backend or no device is visible.
    with_config_context(c, "run.device", [] { tensor::init_cuda(0); });
    // The CUDA backend runs every op, but the model zoo still builds parameters on the host and
    // AdamW steps host buffers; moving flat units to the GPU is the remaining step (docs/gpu.md).
    user_error(
        "{}: run.device: cuda: training on the GPU is not wired into `train` yet (the CUDA "
        "op backend exists; models and the optimizer still live on the host); use "
        "run.device: cpu",
        c.source);
  }
  if (c.run.threads > 0) omp_set_num_threads(c.run.threads);
  config_yaml_ = to_yaml(c);

  // 1. Everything that can fail on bad input, before the run directory is touched.
  const auto& registry = models::ModelRegistry::global();
  models::ModelOptions mopts;
  mopts.seed = c.run.seed;
  mopts.overrides = c.model.config;
  models::ModelShape shape =
      with_config_context(c, "model", [&] { return registry.shape(c.model.name, mopts); });
  model_ = with_config_context(c, "model", [&] { return registry.create(c.model.name, mopts); });
  if (c.batch.seq_len > model_->max_seq_len()) {
    user_error(
        "{}: batch.seq_len {} is longer than the model's context ({} positions); lower "
        "batch.seq_len or raise model.config.n_positions",
        c.source, c.batch.seq_len, model_->max_seq_len());
  }
  if (!c.model.init_from.empty()) models::load_hf_gpt2(*model_, c.model.init_from);

  tokenizer_ = make_tokenizer(c.data.tokenizer, c.data.vocab, c.data.merges);
  if (tokenizer_->vocab_size() > model_->vocab_size()) {
    user_error(
        "{}: data.tokenizer '{}' has {} tokens but model '{}' has vocab_size {}; set "
        "model.config.vocab_size to at least {}",
        c.source, tokenizer_->name(), tokenizer_->vocab_size(), c.model.name, model_->vocab_size(),
        tokenizer_->vocab_size());
  }
  DataLoaderOptions dopts;
  dopts.pattern = c.data.train;
  dopts.config_key = "data.train";
  dopts.seq_len = c.batch.seq_len;
  dopts.vocab_size = model_->vocab_size();
  dopts.shuffle = c.data.shuffle;
  dopts.seed = c.run.seed;
  train_data_ = std::make_unique<DataLoader>(dopts);
  if (!c.data.val.empty()) {
    dopts.pattern = c.data.val;
    dopts.config_key = "data.val";
    dopts.shuffle = false;
    val_data_ = std::make_unique<DataLoader>(dopts);
  }

  optimizer_ = with_config_context(c, "optimizer", [&] { return make_optimizer(c, *model_); });
  optim::LrScheduleConfig sc;
  sc.kind =
      with_config_context(c, "schedule", [&] { return optim::parse_lr_schedule(c.schedule.name); });
  sc.lr = c.optimizer.lr;
  sc.min_lr = c.schedule.min_lr;
  sc.warmup_steps = c.schedule.warmup_steps;
  sc.max_steps = c.training.steps;
  schedule_ =
      with_config_context(c, "schedule", [&] { return std::make_unique<optim::LrSchedule>(sc); });

  // 2. Resume: find the checkpoint before writing anything.
  std::string resume_from;
  if (c.training.resume == "auto") {
    if (fs::is_directory(c.run.dir)) {
      if (auto latest = find_latest_checkpoint(c.run.dir)) resume_from = *latest;
    }
  } else if (c.training.resume != "never") {
    resume_from = c.training.resume;
    if (!fs::is_directory(resume_from)) {
      user_error("{}: training.resume: checkpoint directory '{}' does not exist", c.source,
                 resume_from);
    }
  } else if (fs::is_directory(c.run.dir) && find_latest_checkpoint(c.run.dir)) {
    user_error(
        "{}: training.resume is 'never' but run.dir '{}' already holds checkpoints; "
        "use resume: auto to continue, or pick a new run.dir (nothing was overwritten)",
        c.source, c.run.dir);
  }
  if (!resume_from.empty()) {
    TrainerState st = load_checkpoint(resume_from, *model_, optimizer_.get());
    if (st.model_name != c.model.name) {
      user_error("checkpoint {} was written for model '{}' but the config asks for '{}'",
                 resume_from, st.model_name, c.model.name);
    }
    step_ = st.step;
    samples_consumed_ = st.samples_consumed;
    generator_.set_state(st.rng_seed, st.rng_offset);
    last_saved_step_ = step_;
    last_checkpoint_ = resume_from;
  }

  // 3. The run directory.
  ensure_writable_dir(c.run.dir);
  write_file_atomically(c.run.dir + "/config.yaml", config_yaml_);
  metrics_ = std::make_unique<MetricsFile>(c.run.dir + "/metrics.jsonl", step_);
  console_ = std::make_unique<ConsoleReporter>(c.training.progress, c.training.steps);

  flops_per_token_ = training_flops_per_token(shape, c.batch.seq_len);
  peak_flops_ = estimated_peak_flops(c.run.device);
  console_->event(fmt::format(
      "strata train: model {} ({:.2f}M parameters) | {} | global batch {} x {} tokens "
      "(micro {} x accum {}) | {} train samples{}",
      c.model.name, static_cast<double>(shape.num_parameters) / 1e6, c.run.device,
      c.batch.global_batch_size, c.batch.seq_len, c.batch.micro_batch_size,
      c.batch.grad_accum_steps, train_data_->num_samples(),
      resume_from.empty() ? std::string()
                          : fmt::format(" | resumed from {} at step {}", resume_from, step_)));
}

Trainer::~Trainer() = default;

std::vector<std::pair<std::string, int64_t>> Trainer::peak_bytes() const {
  std::vector<std::pair<std::string, int64_t>> out;
  const auto& stats = offload::MemoryStats::global();
  for (int t = 0; t < offload::kNumTiers; ++t) {
    auto tier = static_cast<offload::Tier>(t);
    int64_t peak = stats.tier_usage(tier).peak;
    if (peak > 0) out.emplace_back(std::string(offload::tier_name(tier)), peak);
  }
  return out;
}

void Trainer::train_step(StepRecord& record) {
  const auto& b = config_.batch;
  const int64_t M = b.micro_batch_size, A = b.grad_accum_steps, G = b.global_batch_size;
  Stopwatch watch;
  autograd::GeneratorScope rng_scope(generator_);
  optimizer_->zero_grad();
  double loss_sum = 0.0;
  const int64_t base = step_ * G + static_cast<int64_t>(rank_) * M * A;
  for (int64_t m = 0; m < A; ++m) {
    Batch batch = train_data_->batch(base + m * M, M);
    autograd::Variable loss = model_->loss(batch.ids, batch.targets);
    loss_sum += static_cast<double>(loss.item());
    (A == 1 ? loss : autograd::scale(loss, 1.0f / static_cast<float>(A))).backward();
  }
  double grad_norm = config_.optimizer.grad_clip > 0.0
                         ? optim::clip_grad_norm(optimizer_->grads(), config_.optimizer.grad_clip)
                         : optim::global_grad_norm(optimizer_->grads());
  double lr = schedule_->lr(step_);
  optimizer_->step(lr);
  ++step_;
  samples_consumed_ += G;
  double dt = watch.seconds();

  record.step = step_;
  record.loss = static_cast<float>(loss_sum / static_cast<double>(A));
  record.lr = lr;
  record.grad_norm = grad_norm;
  record.step_s = dt;
  double tokens = static_cast<double>(G * b.seq_len);
  record.tokens_per_s = tokens / dt;
  record.mfu = peak_flops_ > 0.0 ? flops_per_token_ * tokens / dt / peak_flops_ : 0.0;
  record.peak_bytes = peak_bytes();
}

float Trainer::evaluate() {
  if (!val_data_) return NAN;
  autograd::NoGradGuard no_grad;
  model_->eval();
  const int64_t M = config_.batch.micro_batch_size;
  double sum = 0.0;
  int64_t n = std::max<int64_t>(1, config_.training.eval_batches);
  for (int64_t i = 0; i < n; ++i) {
    Batch batch = val_data_->batch(i * M, M);
    sum += static_cast<double>(model_->loss(batch.ids, batch.targets).item());
  }
  model_->train();
  return static_cast<float>(sum / static_cast<double>(n));
}

std::string Trainer::sample_text() {
  std::vector<int32_t> prompt;
  if (!config_.training.sample_prompt.empty()) {
    prompt = tokenizer_->encode(config_.training.sample_prompt);
  }
  if (prompt.empty()) {
    const DataLoader& d = val_data_ ? *val_data_ : *train_data_;
    prompt.push_back(static_cast<int32_t>(tensor::to_int_vector(d.batch(0, 1).ids)[0]));
  }
  SampleOptions so;
  so.max_new_tokens = config_.training.sample_tokens;
  so.temperature = config_.training.temperature;
  so.top_k = config_.training.top_k;
  so.seed = config_.run.seed + static_cast<uint64_t>(step_);
  std::vector<int32_t> out = sample(*model_, prompt, so);
  return tokenizer_->decode(out);
}

void Trainer::save(const char* why) {
  if (last_saved_step_ == step_) return;
  TrainerState st;
  st.step = step_;
  st.samples_consumed = samples_consumed_;
  st.rng_seed = generator_.seed();
  st.rng_offset = generator_.offset();
  st.model_name = config_.model.name;
  Stopwatch watch;
  last_checkpoint_ = save_checkpoint(config_.run.dir, *model_, optimizer_.get(), st, config_yaml_,
                                     config_.training.keep_checkpoints);
  last_saved_step_ = step_;
  console_->event(
      fmt::format("checkpoint ({}): {} [{:.2f} s]", why, last_checkpoint_, watch.seconds()));
}

Trainer::Outcome Trainer::run(int64_t stop_at) {
  const auto& t = config_.training;
  if (step_ >= t.steps) {
    console_->event(fmt::format("already trained to step {} (training.steps = {}); nothing to do",
                                step_, t.steps));
    return Outcome::Finished;
  }
  while (step_ < t.steps) {
    if (stop_requested() || (stop_at >= 0 && step_ >= stop_at)) {
      console_->finish();
      save("interrupted");
      return Outcome::Interrupted;
    }
    StepRecord record;
    train_step(record);
    bool last = step_ == t.steps;
    if (val_data_ && ((t.eval_every > 0 && step_ % t.eval_every == 0) || last)) {
      record.val_loss = evaluate();
    }
    metrics_->append(record);
    history_.push_back(record);
    if (t.log_every > 0 && (step_ % t.log_every == 0 || last)) console_->step(record);
    if (record.val_loss) {
      console_->event(fmt::format("step {}: val loss {:.4f}", step_, *record.val_loss));
    }
    if (!std::isfinite(record.loss)) {
      console_->event(fmt::format("step {}: loss is {}; lower optimizer.lr or enable grad_clip",
                                  step_, record.loss));
    }
    if ((t.sample_every > 0 && step_ % t.sample_every == 0) || (last && t.sample_every > 0)) {
      console_->event(fmt::format("sample at step {}:\n{}\n---", step_, sample_text()));
    }
    if (t.checkpoint_every > 0 && step_ % t.checkpoint_every == 0) save("periodic");
  }
  console_->finish();
  save("final");
  return Outcome::Finished;
}

}  // namespace strata::tools
