#include "runtime/train_config.h"

#include <fmt/format.h>

#include "core/error.h"
#include "models/registry.h"
#include "offload/host_budget.h"
#include "runtime/pipeline_config.h"

namespace strata::runtime {

namespace {

using config::Node;
using config::Reader;

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// ---------------------------------------------------------------------------------------------
// Sections: read, then check ranges. Each reader stays alive until the cross-field checks so
// their errors can point at the key.

void read_run(Reader& r, RunConfig& c) {
  r.get("dir", c.dir);
  r.get("seed", c.seed);
  r.get_enum("device", c.device, {"cpu", "cuda"});
  r.get_enum("dtype", c.dtype, {"auto", "fp32", "bf16", "fp16"});
  r.get("threads", c.threads);
  r.get_enum("matmul_tuning", c.matmul_tuning, {"off", "on"});
  r.get_enum("tf32", c.tf32, {"off", "on"});
  r.get("host_memory_budget", c.host_memory_budget);
}

void read_model(Reader& r, ModelSection& c) {
  r.get("name", c.name);
  r.get("config", c.config);
  r.get("init_from", c.init_from);
}

void read_data(Reader& r, DataSection& c) {
  r.require("train", c.train);
  r.get("val", c.val);
  r.get_enum("tokenizer", c.tokenizer, {"byte", "gpt2"});
  r.get("vocab", c.vocab);
  r.get("merges", c.merges);
  r.get("shuffle", c.shuffle);
}

void read_batch(Reader& r, BatchSection& c) {
  r.get("micro_batch_size", c.micro_batch_size);
  r.get("grad_accum_steps", c.grad_accum_steps);
  r.get("global_batch_size", c.global_batch_size);
  r.get("seq_len", c.seq_len);
}

void read_optimizer(Reader& r, OptimizerSection& c) {
  r.get_enum("name", c.name, {"adamw", "sgd"});
  r.get("lr", c.lr);
  std::vector<double> betas;
  if (r.get("betas", betas)) {
    if (betas.size() != 2)
      r.fail("betas", fmt::format("expected two numbers [beta1, beta2], got {}", betas.size()));
    c.beta1 = betas[0];
    c.beta2 = betas[1];
  }
  r.get("eps", c.eps);
  r.get("weight_decay", c.weight_decay);
  r.get("momentum", c.momentum);
  r.get("nesterov", c.nesterov);
  r.get("grad_clip", c.grad_clip);
}

void read_schedule(Reader& r, ScheduleSection& c) {
  r.get_enum("name", c.name, {"cosine", "linear", "constant"});
  r.get("warmup_steps", c.warmup_steps);
  r.get("min_lr", c.min_lr);
}

void read_training(Reader& r, TrainingSection& c) {
  r.get("steps", c.steps);
  r.get("log_every", c.log_every);
  r.get("eval_every", c.eval_every);
  r.get("eval_batches", c.eval_batches);
  r.get("sample_every", c.sample_every);
  r.get("sample_tokens", c.sample_tokens);
  r.get("sample_prompt", c.sample_prompt);
  r.get("temperature", c.temperature);
  r.get("top_k", c.top_k);
  r.get("top_p", c.top_p);
  r.get("checkpoint_every", c.checkpoint_every);
  r.get("keep_checkpoints", c.keep_checkpoints);
  r.get("final_checkpoint", c.final_checkpoint);
  r.get("resume", c.resume);
  r.get_enum("progress", c.progress, {"auto", "bar", "lines"});
  r.get("profile_steps", c.profile_steps);
  r.get("profile_start", c.profile_start);
}

void read_distributed(Reader& r, DistributedSection& c) {
  r.get_enum("backend", c.backend, {"auto", "self", "mpi", "nccl"});
  r.get("timeout_s", c.timeout_s);
}

void read_parallelism(Reader& r, ParallelismSection& c) {
  r.get("tensor_parallel_size", c.tensor_parallel_size);
  r.get("sequence_parallel", c.sequence_parallel);
  r.get("pipeline_parallel_size", c.pipeline_parallel_size);
  r.get_enum("pipeline_schedule", c.pipeline_schedule, {"gpipe", "1f1b", "interleaved"});
  r.get("virtual_pipeline_stages", c.virtual_pipeline_stages);
  r.get("pipeline_partition", c.pipeline_partition);
}

void read_zero(Reader& r, ZeroSection& c) {
  r.get("stage", c.stage);
  r.get("reduce_bucket_size", c.reduce_bucket_size);
  r.get("allgather_bucket_size", c.allgather_bucket_size);
  r.get("overlap_comm", c.overlap_comm);
  r.get("stage3_prefetch_bucket_size", c.stage3_prefetch_bucket_size);
  r.get("stage3_param_persistence_threshold", c.stage3_param_persistence_threshold);
  r.get("sub_group_size", c.sub_group_size);
  Reader o = r.section("offload_optimizer");
  OffloadOptimizerSection& off = c.offload_optimizer;
  o.get_enum("device", off.device, {"none", "cpu", "nvme"});
  o.get("pin_memory", off.pin_memory);
  o.get("nvme_path", off.nvme_path);
  o.get("buffer_count", off.buffer_count);
  o.get("pipeline_read", off.pipeline_read);
  o.get("pipeline_write", off.pipeline_write);
  o.get("delayed_param_update", off.delayed_param_update);
  o.get("delayed_param_update_start", off.delayed_param_update_start);
  Reader op = r.section("offload_param");
  OffloadParamSection& param = c.offload_param;
  op.get_enum("device", param.device, {"none", "cpu", "nvme"});
  op.get("nvme_path", param.nvme_path);
  op.get("pin_memory", param.pin_memory);
  op.get("buffer_count", param.buffer_count);
  op.get("buffer_size", param.buffer_size);
  op.get("max_in_cpu", param.max_in_cpu);
}

// zero_optimization.offload_param against the rest of the config (docs/config.md).
void validate_offload_param(const TrainConfig& c, Reader& zero) {
  const OffloadParamSection& p = c.zero.offload_param;
  Reader o = zero.section("offload_param");
  o.positive("buffer_count", static_cast<double>(p.buffer_count));
  o.positive("buffer_size", static_cast<double>(p.buffer_size));
  o.non_negative("max_in_cpu", static_cast<double>(p.max_in_cpu));
  if (!p.enabled()) return;
  if (c.zero.stage != 3)
    o.fail("device", fmt::format("{} offloads the parameter partitions of ZeRO-3 and needs "
                                 "zero_optimization.stage 3, got stage {}; set stage: 3 or "
                                 "offload_param.device: none",
                                 p.device, c.zero.stage));
  if (p.device == "nvme" && p.nvme_path.empty())
    o.fail("nvme_path",
           "is empty, but offload_param.device is nvme; set it to a directory on the NVMe drive "
           "(each rank writes its own swap file there)");
}

// zero_optimization.offload_optimizer against the rest of the config (docs/config.md).
void validate_offload(const TrainConfig& c, Reader& zero) {
  const OffloadOptimizerSection& off = c.zero.offload_optimizer;
  // A second reader of the section, for error locations (finish() has run already).
  Reader o = zero.section("offload_optimizer");
  o.non_negative("delayed_param_update_start", static_cast<double>(off.delayed_param_update_start));
  if (!off.enabled()) {
    if (off.delayed_param_update)
      o.fail("delayed_param_update",
             "delays the CPU optimizer's update, but offload_optimizer.device is none; set "
             "device: cpu or delayed_param_update: false");
    return;
  }
  o.positive("buffer_count", static_cast<double>(off.buffer_count));
  zero.positive("sub_group_size", static_cast<double>(c.zero.sub_group_size));
  if (off.device == "nvme" && off.nvme_path.empty())
    o.fail("device",
           "nvme keeps the optimizer states in a swap file, but nvme_path is empty: set "
           "zero_optimization.offload_optimizer.nvme_path to a directory on the NVMe drive");
  // Note [Offloaded step]: with the states on NVMe the host plays the device on a CPU-only run;
  // device cpu on one would move nothing.
  if (off.device == "cpu" && c.run.device != "cuda")
    o.fail("device", fmt::format("cpu moves the optimizer from the GPU to the host, but "
                                 "run.device is '{}': there is nothing to offload from; set "
                                 "run.device: cuda, device: nvme or device: none",
                                 c.run.device));
  if (c.zero.stage < 1)
    o.fail("device",
           fmt::format("offloading partitions the optimizer across data-parallel ranks and "
                       "needs zero_optimization.stage 1, 2 or 3, got stage {}",
                       c.zero.stage));
  if (c.zero.offload_param.device != "none" && off.delayed_param_update)
    o.fail("delayed_param_update",
           fmt::format("does not run with zero_optimization.offload_param yet (device {}); set "
                       "delayed_param_update: false or offload_param.device: none",
                       c.zero.offload_param.device));
  if (off.device == "nvme" && off.delayed_param_update)
    o.fail("delayed_param_update",
           "delays the CPU optimizer's update, which device nvme does not do; set device: cpu "
           "or delayed_param_update: false");
  if (c.optimizer.name != "adamw")
    o.fail("device", fmt::format("the offloaded optimizer is the CPU AdamW; optimizer.name is "
                                 "'{}' (set it to adamw or offload_optimizer.device: none)",
                                 c.optimizer.name));
}

void read_aio(Reader& r, AioSection& c) {
  r.get("block_size", c.block_size);
  r.get("queue_depth", c.queue_depth);
  r.get("thread_count", c.thread_count);
  r.get("single_submit", c.single_submit);
  r.get("overlap_events", c.overlap_events);
}

// The ranges of offload::AioConfig::validate, reported at the key.
void validate_aio(const AioSection& c, Reader& r) {
  if (c.block_size < 4096 || c.block_size % 4096 != 0 || c.block_size > (int64_t{1} << 30))
    r.fail("block_size", fmt::format("is {}; it must be a multiple of 4096 between 4 KiB and 1 GiB",
                                     c.block_size));
  if (c.queue_depth < 1 || c.queue_depth > 4096)
    r.fail("queue_depth", fmt::format("is {}; it must be between 1 and 4096", c.queue_depth));
  if (c.thread_count < 1 || c.thread_count > 64)
    r.fail("thread_count", fmt::format("is {}; it must be between 1 and 64", c.thread_count));
}

void read_fp16(Reader& r, Fp16Section& c) {
  r.get("loss_scale", c.loss_scale);
  r.get("initial_scale_power", c.initial_scale_power);
  r.get("loss_scale_window", c.loss_scale_window);
  r.get("hysteresis", c.hysteresis);
  r.get("min_loss_scale", c.min_loss_scale);
}

struct Readers {
  Reader run, model, data, batch, optimizer, schedule, training, distributed, parallelism, zero,
      fp16, aio;
};

// The model must exist and accept model.config; returns its shape for the checks that follow.
models::ModelShape check_model(Reader& r, const ModelSection& m, uint64_t seed) {
  const models::ModelRegistry& registry = models::ModelRegistry::global();
  if (!registry.contains(m.name)) {
    const std::string near = config::nearest(m.name, registry.names());
    r.fail("name", fmt::format("unknown model '{}'{}; known models: {}", m.name,
                               near.empty() ? "" : fmt::format(" (did you mean '{}'?)", near),
                               join(registry.names())));
  }
  models::ModelOptions options;
  options.seed = seed;
  options.overrides = m.config;
  try {
    return registry.shape(m.name, options);
  } catch (const UserError& e) {
    r.fail(m.config.empty() ? "name" : "config",
           fmt::format("model '{}' rejects this configuration: {}", m.name, e.what()));
  }
}

// Layouts the model cannot split (Note [Tensor-parallel shards] in models/nn/tensor_parallel.h),
// each naming the key and the numbers; then what `train` does not run yet.
void check_parallelism(const TrainConfig& c, const models::ModelShape& shape, Reader& r) {
  const ParallelismSection& p = c.parallelism;
  r.positive("tensor_parallel_size", static_cast<double>(p.tensor_parallel_size));
  r.positive("pipeline_parallel_size", static_cast<double>(p.pipeline_parallel_size));
  r.positive("virtual_pipeline_stages", static_cast<double>(p.virtual_pipeline_stages));
  const int64_t tp = p.tensor_parallel_size;
  const int64_t kv = shape.n_kv_head > 0 ? shape.n_kv_head : shape.n_head;
  const std::pair<const char*, int64_t> split[] = {
      {"attention heads", shape.n_head},
      {"key/value heads", kv},
      {"vocabulary rows (padded_vocab_size)", shape.padded_vocab_size}};
  for (const auto& [what, n] : split)
    if (n % tp != 0)
      r.fail("tensor_parallel_size",
             fmt::format("{} does not divide the {} {} of model '{}'; choose a divisor of {}", tp,
                         n, what, c.model.name, n));
  if (p.sequence_parallel && tp > 1 && c.batch.seq_len % tp != 0)
    r.fail("sequence_parallel",
           fmt::format("splits the sequence over tensor_parallel_size {}, but batch.seq_len {} "
                       "does not divide; choose a seq_len that is a multiple of {}",
                       tp, c.batch.seq_len, tp));
  check_pipeline_config(c, shape, r);
}

void validate(TrainConfig& c, Readers& r) {
  // run
  if (c.run.dir.empty()) r.run.fail("dir", "must not be empty; it is where the run writes");
  r.run.non_negative("threads", c.run.threads);
  if (c.run.dtype == "auto") c.run.dtype = c.run.device == "cuda" ? "bf16" : "fp32";
  if (c.run.matmul_tuning == "on" && c.run.device != "cuda")
    r.run.fail("matmul_tuning",
               fmt::format("is on, but it times cuBLASLt's GPU algorithms and run.device is "
                           "'{}'; set run.device: cuda or matmul_tuning: off",
                           c.run.device));
  if (c.run.tf32 == "on" && c.run.device != "cuda")
    r.run.fail("tf32",
               fmt::format("is on, but TF32 is the GPU tensor cores' format and run.device is "
                           "'{}' (the CPU computes fp32 matmuls in full f32); set run.device: cuda "
                           "or tf32: off",
                           c.run.device));
  try {
    offload::parse_host_budget(c.run.host_memory_budget, "");
  } catch (const UserError& e) {
    r.run.fail("host_memory_budget", e.what());
  }
  // bf16/fp16 run on the CPU too (Note [Mixed precision] in parallel/engine.h): the CPU
  // kernels widen to f32, so it saves model-state memory, not time.

  // fp16 (read whatever the dtype, so a shared config can carry it)
  r.fp16.non_negative("loss_scale", c.fp16.loss_scale);
  r.fp16.in_range("initial_scale_power", static_cast<double>(c.fp16.initial_scale_power), 0.0,
                  127.0, true);
  r.fp16.positive("loss_scale_window", static_cast<double>(c.fp16.loss_scale_window));
  r.fp16.positive("hysteresis", static_cast<double>(c.fp16.hysteresis));
  r.fp16.positive("min_loss_scale", c.fp16.min_loss_scale);

  // batch (sizes first: the model checks below compare against them)
  r.batch.positive("micro_batch_size", static_cast<double>(c.batch.micro_batch_size));
  r.batch.non_negative("grad_accum_steps", static_cast<double>(c.batch.grad_accum_steps));
  r.batch.non_negative("global_batch_size", static_cast<double>(c.batch.global_batch_size));
  r.batch.positive("seq_len", static_cast<double>(c.batch.seq_len));

  // model
  const models::ModelShape shape = check_model(r.model, c.model, c.run.seed);
  if (c.batch.seq_len > shape.max_seq_len)
    r.batch.fail("seq_len", fmt::format("{} is longer than the context of model '{}' ({} "
                                        "positions); lower it or raise model.config.n_positions",
                                        c.batch.seq_len, c.model.name, shape.max_seq_len));

  // data
  if (c.data.train.empty())
    r.data.fail("train", "must name the training shards, e.g. datasets/fortunes/train_*.bin");
  if (c.data.tokenizer == "gpt2") {
    const std::pair<const char*, const std::string*> files[] = {{"vocab", &c.data.vocab},
                                                                {"merges", &c.data.merges}};
    for (const auto& [key, value] : files)
      if (value->empty())
        r.data.fail(key, fmt::format("tokenizer gpt2 needs data.vocab (vocab.json) and "
                                     "data.merges (merges.txt); data.{} is not set",
                                     key));
  } else if (shape.vocab_size < 256) {
    r.data.fail("tokenizer", fmt::format("the byte tokenizer has 256 tokens but model '{}' has "
                                         "vocab_size {}; set model.config.vocab_size: 256",
                                         c.model.name, shape.vocab_size));
  }

  // optimizer
  r.optimizer.non_negative("lr", c.optimizer.lr);
  r.optimizer.in_range("betas", c.optimizer.beta1, 0.0, 1.0);
  r.optimizer.in_range("betas", c.optimizer.beta2, 0.0, 1.0);
  r.optimizer.positive("eps", c.optimizer.eps);
  r.optimizer.non_negative("weight_decay", c.optimizer.weight_decay);
  r.optimizer.in_range("momentum", c.optimizer.momentum, 0.0, 1.0);
  r.optimizer.non_negative("grad_clip", c.optimizer.grad_clip);

  // training
  const TrainingSection& t = c.training;
  r.training.positive("steps", static_cast<double>(t.steps));
  r.training.positive("log_every", static_cast<double>(t.log_every));
  r.training.non_negative("eval_every", static_cast<double>(t.eval_every));
  r.training.positive("eval_batches", static_cast<double>(t.eval_batches));
  r.training.non_negative("sample_every", static_cast<double>(t.sample_every));
  r.training.positive("sample_tokens", static_cast<double>(t.sample_tokens));
  r.training.non_negative("temperature", t.temperature);
  r.training.non_negative("top_k", static_cast<double>(t.top_k));
  if (!(t.top_p > 0.0 && t.top_p <= 1.0))
    r.training.fail("top_p",
                    fmt::format("must be in (0, 1] (1 = no nucleus cut), got {}", t.top_p));
  r.training.non_negative("checkpoint_every", static_cast<double>(t.checkpoint_every));
  r.training.non_negative("keep_checkpoints", static_cast<double>(t.keep_checkpoints));
  if (t.resume.empty()) r.training.fail("resume", "must be auto, never or a checkpoint directory");
  r.training.non_negative("profile_steps", static_cast<double>(t.profile_steps));
  r.training.positive("profile_start", static_cast<double>(t.profile_start));
  if (t.profile_steps > 0 && c.run.device != "cuda")
    r.training.fail("profile_steps",
                    fmt::format("is {} but times GPU ops; set run.device: cuda or profile_steps: 0",
                                t.profile_steps));
  else if (t.profile_steps > 0 && t.profile_start + t.profile_steps - 1 > t.steps)
    r.training.fail("profile_steps",
                    fmt::format("profiles steps {} to {}, past training.steps ({}); lower "
                                "profile_start or profile_steps",
                                t.profile_start, t.profile_start + t.profile_steps - 1, t.steps));
  if (t.eval_every > 0 && c.data.val.empty())
    r.training.fail("eval_every", fmt::format("is {} but data.val is not set; set data.val to "
                                              "the validation shards or eval_every: 0",
                                              t.eval_every));

  // distributed, zero_optimization
  r.distributed.positive("timeout_s", c.distributed.timeout_s);
  if (c.distributed.backend == "nccl" && c.run.device != "cuda")
    r.distributed.fail("backend", fmt::format("nccl communicates GPU memory but run.device is "
                                              "'{}'; use backend: mpi (or auto) on the CPU",
                                              c.run.device));
  check_parallelism(c, shape, r.parallelism);
  r.zero.in_range("stage", static_cast<double>(c.zero.stage), 0.0, 3.0, true);
  r.zero.positive("reduce_bucket_size", static_cast<double>(c.zero.reduce_bucket_size));
  r.zero.positive("allgather_bucket_size", static_cast<double>(c.zero.allgather_bucket_size));
  r.zero.non_negative("stage3_prefetch_bucket_size",
                      static_cast<double>(c.zero.stage3_prefetch_bucket_size));
  r.zero.non_negative("stage3_param_persistence_threshold",
                      static_cast<double>(c.zero.stage3_param_persistence_threshold));
  validate_offload(c, r.zero);
  validate_offload_param(c, r.zero);
  validate_aio(c.aio, r.aio);

  // schedule
  const ScheduleSection& s = c.schedule;
  r.schedule.non_negative("warmup_steps", static_cast<double>(s.warmup_steps));
  r.schedule.non_negative("min_lr", s.min_lr);
  if (s.name == "constant") {
    if (s.warmup_steps > t.steps)
      r.schedule.fail("warmup_steps",
                      fmt::format("{} is more than training.steps {}", s.warmup_steps, t.steps));
  } else {
    if (s.warmup_steps >= t.steps)
      r.schedule.fail("warmup_steps",
                      fmt::format("{} leaves no steps to decay over (training.steps is {}); "
                                  "the {} schedule needs warmup_steps < steps",
                                  s.warmup_steps, t.steps, s.name));
    if (s.min_lr > c.optimizer.lr)
      r.schedule.fail("min_lr", fmt::format("{} is above optimizer.lr {}; the {} schedule "
                                            "decays from lr down to min_lr",
                                            s.min_lr, c.optimizer.lr, s.name));
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------

void TrainConfig::resolve_batch(int dp) {
  STRATA_CHECK(dp >= 1, "resolve_batch: dp must be >= 1, got {}", dp);
  BatchSection& b = batch;
  const int64_t micro = b.micro_batch_size;
  if (micro <= 0) user_error("{}: batch.micro_batch_size must be positive, got {}", source, micro);
  const int64_t accum = b.grad_accum_steps_derived ? 0 : b.grad_accum_steps;
  const int64_t global = b.global_batch_size_derived ? 0 : b.global_batch_size;
  if (accum < 0 || global < 0)
    user_error(
        "{}: batch.grad_accum_steps ({}) and batch.global_batch_size ({}) must be >= 0 "
        "(0 = derive)",
        source, accum, global);
  const int64_t per_step = micro * dp;  // sequences of one micro-step over all ranks
  if (global == 0) {
    b.grad_accum_steps = accum == 0 ? 1 : accum;
    b.global_batch_size = per_step * b.grad_accum_steps;
    b.grad_accum_steps_derived = accum == 0;
    b.global_batch_size_derived = true;
    return;
  }
  if (accum == 0) {
    if (global % per_step != 0)
      user_error(
          "{}: batch.global_batch_size {} is not divisible by batch.micro_batch_size {} x "
          "{} data-parallel rank(s) = {}; make global_batch_size a multiple of {} (it is "
          "micro_batch_size x grad_accum_steps x dp)",
          source, global, micro, dp, per_step, per_step);
    b.grad_accum_steps = global / per_step;
    b.global_batch_size = global;
    b.grad_accum_steps_derived = true;
    b.global_batch_size_derived = false;
    return;
  }
  if (per_step * accum != global)
    user_error(
        "{}: batch.micro_batch_size {} x batch.grad_accum_steps {} x {} data-parallel "
        "rank(s) = {}, but batch.global_batch_size is {}; fix one of them, or set "
        "grad_accum_steps: 0 to derive it",
        source, micro, accum, dp, per_step * accum, global);
  b.grad_accum_steps_derived = false;
  b.global_batch_size_derived = false;
}

TrainConfig parse_train_config(const config::Node& root, const std::string& source) {
  TrainConfig c;
  c.source = source;
  Reader top(root, "", source);
  Readers r{top.section("run"),         top.section("model"),
            top.section("data"),        top.section("batch"),
            top.section("optimizer"),   top.section("schedule"),
            top.section("training"),    top.section("distributed"),
            top.section("parallelism"), top.section("zero_optimization"),
            top.section("fp16"),        top.section("aio")};
  read_run(r.run, c.run);
  read_model(r.model, c.model);
  read_data(r.data, c.data);
  read_batch(r.batch, c.batch);
  read_optimizer(r.optimizer, c.optimizer);
  read_schedule(r.schedule, c.schedule);
  read_training(r.training, c.training);
  read_distributed(r.distributed, c.distributed);
  read_parallelism(r.parallelism, c.parallelism);
  read_zero(r.zero, c.zero);
  read_fp16(r.fp16, c.fp16);
  read_aio(r.aio, c.aio);
  Reader checkpointing = top.section("activation_checkpointing");
  checkpointing.get("cpu_checkpointing", c.activation_checkpointing.cpu_checkpointing);
  // Unknown keys first: a misspelt key is the likely reason a value below looks wrong.
  top.finish();
  validate(c, r);
  const auto ac = c.model.config.find("activation_checkpointing");
  if (c.activation_checkpointing.cpu_checkpointing &&
      (ac == c.model.config.end() ||
       (ac->second != "true" && ac->second != "1" && ac->second != "on" && ac->second != "yes")))
    checkpointing.fail("cpu_checkpointing",
                       "is true, but nothing is checkpointed: set "
                       "model.config.activation_checkpointing: true");
  c.resolve_batch(1);
  return c;
}

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& sets) {
  Node root = config::load_file(path);
  for (const std::string& s : sets) config::apply_set(root, s);
  return parse_train_config(root, path);
}

}  // namespace strata::runtime
