// TrainConfig back to YAML: `train --print-config`, the run folder's config.yaml and each
// checkpoint's copy. Every key parse_train_config reads is written here, so a saved config loads
// back to the same values (the TrainConfig round-trip tests; DocsSnippets feeds the docs' blocks
// through --print-config).
#include <fmt/format.h>

#include "runtime/train_config.h"

namespace strata::runtime {

namespace {

using config::Node;

struct Emit {
  Node& map;
  void operator()(const char* key, const std::string& v) { map.set(key, {}, Node::scalar(v, {})); }
  void operator()(const char* key, const char* v) { (*this)(key, std::string(v)); }
  void operator()(const char* key, int64_t v) { (*this)(key, std::to_string(v)); }
  void operator()(const char* key, int v) { (*this)(key, std::to_string(v)); }
  void operator()(const char* key, uint64_t v) { (*this)(key, std::to_string(v)); }
  void operator()(const char* key, bool v) { (*this)(key, std::string(v ? "true" : "false")); }
  // fmt's shortest representation that reads back to the same double.
  void operator()(const char* key, double v) { (*this)(key, fmt::format("{}", v)); }
};

Node& section(Node& root, const char* key) {
  return root.set(key, {}, Node::map({}));
}

}  // namespace

std::string to_yaml(const TrainConfig& c) {
  Node root = Node::map({});
  {
    Emit e{section(root, "run")};
    e("dir", c.run.dir);
    e("seed", c.run.seed);
    e("device", c.run.device);
    e("dtype", c.run.dtype);
    e("threads", c.run.threads);
    e("matmul_tuning", c.run.matmul_tuning);
    e("tf32", c.run.tf32);
    e("host_memory_budget", c.run.host_memory_budget);
  }
  {
    Node& m = section(root, "model");
    Emit e{m};
    e("name", c.model.name);
    Node& overrides = m.set("config", {}, Node::map({}));
    for (const auto& [k, v] : c.model.config) overrides.set(k, {}, Node::scalar(v, {}));
    e("init_from", c.model.init_from);
  }
  {
    Emit e{section(root, "data")};
    e("train", c.data.train);
    e("val", c.data.val);
    e("tokenizer", c.data.tokenizer);
    e("vocab", c.data.vocab);
    e("merges", c.data.merges);
    e("shuffle", c.data.shuffle);
  }
  {
    const BatchSection& b = c.batch;
    Node& m = section(root, "batch");
    Emit e{m};
    e("micro_batch_size", b.micro_batch_size);
    // Note [Batch arithmetic]: a derived field is written as 0 so that it is derived again.
    e("grad_accum_steps", b.grad_accum_steps_derived ? int64_t{0} : b.grad_accum_steps);
    if (b.grad_accum_steps_derived)
      m.find("grad_accum_steps")->set_comment(fmt::format("derived: {}", b.grad_accum_steps));
    e("global_batch_size", b.global_batch_size_derived ? int64_t{0} : b.global_batch_size);
    if (b.global_batch_size_derived)
      m.find("global_batch_size")->set_comment(fmt::format("derived: {}", b.global_batch_size));
    e("seq_len", b.seq_len);
  }
  {
    const OptimizerSection& o = c.optimizer;
    Node& m = section(root, "optimizer");
    Emit e{m};
    e("name", o.name);
    e("lr", o.lr);
    Node betas = Node::sequence({});
    betas.push_back(Node::scalar(fmt::format("{}", o.beta1), {}));
    betas.push_back(Node::scalar(fmt::format("{}", o.beta2), {}));
    m.set("betas", {}, std::move(betas));
    e("eps", o.eps);
    e("weight_decay", o.weight_decay);
    e("momentum", o.momentum);
    e("nesterov", o.nesterov);
    e("grad_clip", o.grad_clip);
  }
  {
    Emit e{section(root, "schedule")};
    e("name", c.schedule.name);
    e("warmup_steps", c.schedule.warmup_steps);
    e("min_lr", c.schedule.min_lr);
  }
  {
    const TrainingSection& t = c.training;
    Emit e{section(root, "training")};
    e("steps", t.steps);
    e("log_every", t.log_every);
    e("eval_every", t.eval_every);
    e("eval_batches", t.eval_batches);
    e("sample_every", t.sample_every);
    e("sample_tokens", t.sample_tokens);
    e("sample_prompt", t.sample_prompt);
    e("temperature", t.temperature);
    e("top_k", t.top_k);
    e("top_p", t.top_p);
    e("checkpoint_every", t.checkpoint_every);
    e("keep_checkpoints", t.keep_checkpoints);
    e("final_checkpoint", t.final_checkpoint);
    e("resume", t.resume);
    e("progress", t.progress);
    e("profile_steps", t.profile_steps);
    e("profile_start", t.profile_start);
  }
  {
    Emit e{section(root, "distributed")};
    e("backend", c.distributed.backend);
    e("timeout_s", c.distributed.timeout_s);
  }
  {
    Node& m = section(root, "parallelism");
    Emit e{m};
    e("tensor_parallel_size", c.parallelism.tensor_parallel_size);
    e("sequence_parallel", c.parallelism.sequence_parallel);
    e("pipeline_parallel_size", c.parallelism.pipeline_parallel_size);
    e("pipeline_schedule", c.parallelism.pipeline_schedule);
    e("virtual_pipeline_stages", c.parallelism.virtual_pipeline_stages);
    Node partition = Node::sequence({});
    for (int64_t n : c.parallelism.pipeline_partition)
      partition.push_back(Node::scalar(fmt::format("{}", n), {}));
    m.set("pipeline_partition", {}, std::move(partition));
  }
  {
    const ZeroSection& z = c.zero;
    Emit e{section(root, "zero_optimization")};
    e("stage", z.stage);
    e("reduce_bucket_size", z.reduce_bucket_size);
    e("allgather_bucket_size", z.allgather_bucket_size);
    e("overlap_comm", z.overlap_comm);
    e("stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size);
    e("stage3_param_persistence_threshold", z.stage3_param_persistence_threshold);
    e("sub_group_size", z.sub_group_size);
  }
  {
    const OffloadOptimizerSection& o = c.zero.offload_optimizer;
    Node& zero = *root.find("zero_optimization");
    Emit e{zero.set("offload_optimizer", {}, Node::map({}))};
    e("device", o.device);
    e("pin_memory", o.pin_memory);
    e("delayed_param_update", o.delayed_param_update);
    e("delayed_param_update_start", o.delayed_param_update_start);
    e("nvme_path", o.nvme_path);
    e("buffer_count", o.buffer_count);
    e("pipeline_read", o.pipeline_read);
    e("pipeline_write", o.pipeline_write);
  }
  {
    Emit e{section(root, "aio")};
    e("block_size", c.aio.block_size);
    e("queue_depth", c.aio.queue_depth);
    e("thread_count", c.aio.thread_count);
    e("single_submit", c.aio.single_submit);
    e("overlap_events", c.aio.overlap_events);
  }
  {
    const OffloadParamSection& p = c.zero.offload_param;
    Node& zero = *root.find("zero_optimization");
    Emit e{zero.set("offload_param", {}, Node::map({}))};
    e("device", p.device);
    e("nvme_path", p.nvme_path);
    e("pin_memory", p.pin_memory);
    e("buffer_count", p.buffer_count);
    e("buffer_size", p.buffer_size);
    e("max_in_cpu", p.max_in_cpu);
  }
  {
    Emit e{section(root, "fp16")};
    e("loss_scale", c.fp16.loss_scale);
    e("initial_scale_power", c.fp16.initial_scale_power);
    e("loss_scale_window", c.fp16.loss_scale_window);
    e("hysteresis", c.fp16.hysteresis);
    e("min_loss_scale", c.fp16.min_loss_scale);
  }
  {
    Emit e{section(root, "activation_checkpointing")};
    e("cpu_checkpointing", c.activation_checkpointing.cpu_checkpointing);
  }
  std::string header = c.source.empty()
                           ? std::string("# Strata train config (resolved)\n")
                           : fmt::format("# Strata train config, resolved from {}\n", c.source);
  return header + config::to_yaml(root);
}

}  // namespace strata::runtime
