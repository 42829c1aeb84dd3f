#include "runtime/trainer.h"

#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <system_error>

#include "autograd/checkpoint.h"
#include "comm/process_groups.h"
#include "comm/world.h"
#include "core/atomic_file.h"
#include "core/cpu_features.h"
#include "core/error.h"
#include "core/logging.h"
#include "models/hf_interop.h"
#include "models/nn/tensor_parallel.h"
#include "models/registry.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/pipeline_stages.h"
#include "parallel/zero_memory.h"
#include "runtime/checkpoint.h"
#include "runtime/device_peaks.h"
#include "runtime/host_memory_plan.h"
#include "runtime/offload_plan.h"
#include "tensor/cuda.h"

namespace strata::runtime {

namespace fs = std::filesystem;

namespace {

// The optimizer the config names, over the parameter groups the engine hands it (whole units in
// one process or plain DP; the owned slices under ZeRO).
std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c,
                                                 std::vector<optim::ParamGroup> groups) {
  const auto& o = c.optimizer;
  if (o.name == "adamw") {
    optim::AdamWConfig ac;
    ac.lr = o.lr;
    ac.beta1 = o.beta1;
    ac.beta2 = o.beta2;
    ac.eps = o.eps;
    ac.weight_decay = o.weight_decay;
    return std::make_unique<optim::AdamW>(std::move(groups), ac);
  }
  optim::SgdConfig sc;
  sc.lr = o.lr;
  sc.momentum = o.momentum;
  sc.nesterov = o.nesterov;
  sc.weight_decay = o.weight_decay;
  return std::make_unique<optim::Sgd>(std::move(groups), sc);
}

DType param_dtype(const std::string& dtype) {
  return dtype == "bf16" ? DType::BF16 : dtype == "fp16" ? DType::F16 : DType::F32;
}

// `rank`: the global rank, which names this process's NVMe swap lock (Note [Swap directory lock]).
parallel::ZeroConfig zero_config(const TrainConfig& c, int rank) {
  const ZeroSection& z = c.zero;
  parallel::ZeroConfig out;
  out.stage = z.stage;
  out.reduce_bucket_size = z.reduce_bucket_size;
  out.allgather_bucket_size = z.allgather_bucket_size;
  out.overlap_comm = z.overlap_comm;
  out.stage3_prefetch_bucket_size = z.stage3_prefetch_bucket_size;
  out.stage3_param_persistence_threshold = z.stage3_param_persistence_threshold;
  const OffloadOptimizerSection& o = z.offload_optimizer;
  out.offload_optimizer.enabled = o.device == "cpu" || o.device == "nvme";
  out.offload_optimizer.nvme = o.device == "nvme";
  optim::NvmeAdamWOptions& nv = out.offload_optimizer.nvme_options;
  nv.nvme_path = o.nvme_path;
  nv.lock_tag = fmt::format("optimizer-rank{}", rank);
  nv.sub_group_size = z.sub_group_size;
  nv.buffer_count = static_cast<int>(o.buffer_count);
  nv.pipeline_read = o.pipeline_read;
  nv.pipeline_write = o.pipeline_write;
  nv.aio.block_size = static_cast<size_t>(c.aio.block_size);
  nv.aio.queue_depth = static_cast<int>(c.aio.queue_depth);
  nv.aio.intra_op_parallelism = static_cast<int>(c.aio.thread_count);
  nv.aio.single_submit = c.aio.single_submit;
  nv.aio.overlap_events = c.aio.overlap_events;
  out.offload_optimizer.pin_memory = o.pin_memory;
  out.offload_optimizer.delayed_param_update = o.delayed_param_update;
  out.offload_optimizer.delayed_param_update_start = o.delayed_param_update_start;
  const OffloadParamSection& p = z.offload_param;
  using ParamDevice = parallel::OffloadParamConfig::Device;
  out.offload_param.device = p.device == "cpu"    ? ParamDevice::Cpu
                             : p.device == "nvme" ? ParamDevice::Nvme
                                                  : ParamDevice::None;
  out.offload_param.nvme_path = p.nvme_path;
  out.offload_param.pin_memory = p.pin_memory;
  out.offload_param.buffer_count = p.buffer_count;
  out.offload_param.buffer_size = p.buffer_size;
  out.offload_param.max_in_cpu = p.max_in_cpu;
  out.offload_param.aio = nv.aio;  // the aio section serves every swap file
  return out;
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

double training_flops_per_token(const models::ModelShape& s, int64_t seq_len) {
  // Position embeddings are a lookup, not a matmul; everything else (the tied head included) is.
  double n_matmul = static_cast<double>(s.num_parameters) -
                    static_cast<double>(s.family == "gpt2" ? s.max_seq_len * s.n_embd : 0);
  return 6.0 * n_matmul + 12.0 * static_cast<double>(s.n_layer * seq_len * s.n_embd);
}

double estimated_peak_flops(const std::string& device) {
  if (device != "cpu") return 0.0;  // GPUs: device_peaks (Note [GPU peaks])
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
  TrainConfig& c = config_;
  // 0. The world (Note [Distributed training]): ranks on one machine share its cores.
  const comm::LaunchInfo launch = comm::detect_launch();
  if (c.run.threads > 0) {
    omp_set_num_threads(c.run.threads);
  } else if (launch.local_size > 1) {
    const int cores = static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
    omp_set_num_threads(std::max(1, cores / launch.local_size));
  }
  if (c.run.device == "cuda") {
    // Note [Training on the GPU]: one process per GPU, the local rank's (modulo the visible
    // devices: with backend mpi ranks may share a GPU; nccl refuses that, and init_world says so
    // first). init_cuda fails with a clear message when the build has no CUDA backend or no
    // device is visible.
    const int count = tensor::cuda_device_count();
    const int index = count > 0 ? launch.local_rank % count : 0;
    with_config_context(c, "run.device", [&] { tensor::init_cuda(index); });
    device_ = Device::cuda(index);
  }
  // A GPU process started alone is a world of one on the self communicator (Note [Distributed
  // training]); `auto` would pick a one-rank nccl world, which adds nothing but NCCL's startup.
  const std::string backend =
      device_.is_cuda() && c.distributed.backend == "auto" && launch.launcher == "none"
          ? std::string("self")
          : c.distributed.backend;
  auto world = with_config_context(c, "distributed", [&] {
    return comm::init_world(
        backend, device_,
        std::chrono::milliseconds(static_cast<int64_t>(c.distributed.timeout_s * 1000.0)));
  });
  // Note [Process group order]: tp fastest; parallelism.tensor_parallel_size above the world or
  // not dividing it is a user error naming the sizes.
  const comm::ProcessGroups groups = with_config_context(c, "parallelism", [&] {
    const int tp = static_cast<int>(c.parallelism.tensor_parallel_size);
    const int pp = static_cast<int>(c.parallelism.pipeline_parallel_size);
    if (pp > 1) parallel::check_pipeline_layout(world->size(), tp, pp);
    return comm::make_process_groups(world, tp, pp);
  });
  world_comm_ = world;
  dp_ = groups.dp;
  rank_ = dp_->rank();
  world_ = dp_->size();
  tp_rank_ = groups.tp_rank;
  tp_size_ = groups.tp_size;
  pp_ = groups.pp;
  pp_rank_ = groups.pp_rank;
  pp_size_ = groups.pp_size;
  lead_ = rank_ == 0 && tp_rank_ == 0 && pp_rank_ == 0;
  if (tp_size_ > 1 || pp_size_ > 1)
    log::logger().info("rank {} of {}: {}tp rank {} of {}, dp rank {} of {}", world->rank(),
                       world->size(),
                       pp_size_ > 1 ? fmt::format("stage {} of {}, ", pp_rank_, pp_size_) : "",
                       tp_rank_, tp_size_, rank_, world_);
  c.resolve_batch(world_);
  // Note [Interleaved schedule]: the micro-batches go through each chunk in groups of pp.
  const int64_t virtual_stages = c.parallelism.virtual_pipeline_stages;
  if (virtual_stages > 1 && c.batch.grad_accum_steps % pp_size_ != 0)
    user_error(
        "{}: batch.grad_accum_steps is {} but the interleaved pipeline schedule "
        "(parallelism.virtual_pipeline_stages {}) runs the micro-batches in groups of "
        "pipeline_parallel_size {}: make it a multiple of {} (global_batch_size = "
        "micro_batch_size x grad_accum_steps x dp)",
        c.source, c.batch.grad_accum_steps, virtual_stages, pp_size_, pp_size_);
  config_yaml_ = to_yaml(c);

  // 1. Everything that can fail on bad input, before the run directory is touched.
  const auto& registry = models::ModelRegistry::global();
  models::ModelOptions mopts;
  mopts.seed = c.run.seed;
  mopts.overrides = c.model.config;
  whole_options_ = mopts;
  if (tp_size_ > 1) mopts.tp = {groups.tp, c.parallelism.sequence_parallel};
  // The shape comes without building the model, so the checks against it (context, tokenizer,
  // data) answer before a large model's seconds of initialisation.
  models::ModelShape shape =
      with_config_context(c, "model", [&] { return registry.shape(c.model.name, mopts); });
  if (c.batch.seq_len > shape.max_seq_len) {
    user_error(
        "{}: batch.seq_len {} is longer than the model's context ({} positions); lower "
        "batch.seq_len or raise model.config.n_positions",
        c.source, c.batch.seq_len, shape.max_seq_len);
  }
  // Note [CPU checkpointing]: on the GPU only; a CPU run's checkpoints are in host memory.
  cpu_checkpointing_ = std::make_unique<autograd::CpuCheckpointingScope>(
      c.activation_checkpointing.cpu_checkpointing && device_.is_cuda());
  if (c.activation_checkpointing.cpu_checkpointing && !device_.is_cuda())
    log::logger().info(
        "activation_checkpointing.cpu_checkpointing has no effect with run.device cpu: the "
        "checkpoints are in host memory already");
  tokenizer_ = data::make_tokenizer(c.data.tokenizer, c.data.vocab, c.data.merges);
  if (tokenizer_->vocab_size() > shape.vocab_size) {
    user_error(
        "{}: data.tokenizer '{}' has {} tokens but model '{}' has vocab_size {}; set "
        "model.config.vocab_size to at least {}",
        c.source, tokenizer_->name(), tokenizer_->vocab_size(), c.model.name, shape.vocab_size,
        tokenizer_->vocab_size());
  }
  data::DataLoaderOptions dopts;
  dopts.pattern = c.data.train;
  dopts.config_key = "data.train";
  dopts.config_file = c.source;
  dopts.seq_len = c.batch.seq_len;
  dopts.vocab_size = shape.vocab_size;
  dopts.shuffle = c.data.shuffle;
  dopts.seed = c.run.seed;
  train_data_ = std::make_unique<data::DataLoader>(dopts);
  if (!c.data.val.empty()) {
    dopts.pattern = c.data.val;
    dopts.config_key = "data.val";
    dopts.shuffle = false;
    val_data_ = std::make_unique<data::DataLoader>(dopts);
  }

  // Note [Stage balance]: this rank builds its stage's layers only (Note [Pipeline stages]).
  const int64_t n_layer = shape.n_layer;
  partition_ = with_config_context(c, "parallelism", [&] {
    const int pp = static_cast<int>(c.parallelism.pipeline_parallel_size);
    return c.parallelism.pipeline_partition.empty()
               ? parallel::balance_stages(shape, pp)
               : parallel::explicit_stages(c.parallelism.pipeline_partition, n_layer, pp);
  });
  if (pp_size_ > 1)
    mopts.stage = virtual_stages > 1
                      ? parallel::interleaved_stage(n_layer, pp_size_,
                                                    static_cast<int>(virtual_stages), pp_rank_)
                      : partition_.stage(pp_rank_);
  // Note [Host memory budget], Note [Host memory plan]: after the data's checks, before the
  // model and its states are allocated.
  host_budget_ = start_host_budget(c, shape, whole_options_, world_, tp_size_, launch.local_size);
  // Note [Unit-by-unit construction] (parallel/engine.h): ZeRO-3 with offloaded parameters
  // never holds the model whole, in host memory or on the GPU, in any precision, at any tp, from
  // the seed or from model.init_from; the engine initialises it (or loads init_from into it)
  // unit by unit into its partitions, a tensor-parallel rank reading its slices of the unit's
  // tensors only (models::hf_shard_reader, below).
  const bool deferred = c.zero.stage == 3 && c.zero.offload_param.enabled() && pp_size_ == 1;
  // Note [NVMe space plan]: the swap files' bytes against their disks' free space.
  check_nvme_space_at_start(c, whole_options_, world_, tp_size_, launch.local_size);
  model_ = with_config_context(c, "model", [&] {
    std::optional<models::nn::DeferredInitScope> scope;
    if (deferred) scope.emplace();
    return registry.create(c.model.name, mopts);
  });
  STRATA_CHECK(
      model_->max_seq_len() == shape.max_seq_len && model_->vocab_size() == shape.vocab_size,
      "model '{}' built with context {} and vocabulary {}; its shape said {} and {}", c.model.name,
      model_->max_seq_len(), model_->vocab_size(), shape.max_seq_len, shape.vocab_size);
  if (!c.model.init_from.empty()) {
    if (pp_size_ > 1 || tp_size_ > 1) {
      // A stage's parameters are the whole model's of the same names (Note [Pipeline stages]),
      // a tensor-parallel rank's their slices (Note [Tensor-parallel shards]): the HF file is
      // validated against the whole model's layout (built deferred: no parameter memory, Note
      // [Deferred initialisation]), and each rank reads its slices of its own parameters, one
      // at a time (models::hf_shard_reader): unit by unit as the engine builds them when
      // deferred, else into the built model now.
      std::shared_ptr<models::CausalLM> whole;
      {
        models::nn::DeferredInitScope layout_only;
        whole = make_whole_model();
      }
      // The reader keeps the layout it validated (`whole`) until the engine drops the source.
      std::function<void(const models::FlatUnit&)> read_unit =
          [whole, read = models::hf_shard_reader(*whole, c.model.init_from),
           model = model_.get()](const models::FlatUnit& u) {
            const models::nn::TensorParallel& tp = model->tensor_parallel();
            for (size_t i = 0; i < u.names.size(); ++i) {
              auto spec = model->shard_specs().find(u.names[i]);
              tensor::Tensor slice = tensor::Tensor::empty({u.numels[i]});
              read(u.names[i],
                   spec == model->shard_specs().end() ? models::nn::ShardSpec{} : spec->second,
                   tp.rank(), tp.size(), slice);
              tensor::Tensor dst = u.params.narrow(0, u.offsets[i], u.numels[i]);
              dst.copy_(slice);
            }
          };
      if (deferred) {
        model_->set_unit_source(std::move(read_unit));
      } else {
        for (const models::FlatUnit& u : model_->flat_units()) read_unit(u);
      }
    } else if (deferred) {
      // Validated now, written unit by unit as the engine builds them.
      model_->set_unit_source(models::hf_unit_loader(*model_, c.model.init_from));
    } else {
      models::load_hf(*model_, c.model.init_from);
    }
  }
  // Note [Training on the GPU]: the zoo builds (and init_from loads) on the host; the flat units
  // move before the Engine takes views of them, or, with ZeRO-Offload, inside the Engine once it
  // has the fp32 masters on the host (Note [Offload construction] in parallel/engine.h).
  if (!c.zero.offload_optimizer.enabled()) models::move_flat_units(model_->flat_units(), device_);

  unit_sizes_ = parallel::unit_sizes(*model_);  // before the engine pads them (Note [ZeRO padding])
  engine_ = with_config_context(c, "zero_optimization", [&] {
    return std::make_unique<parallel::Engine>(
        *model_, dp_, zero_config(c, world_comm_->rank()),
        [&c](std::vector<optim::ParamGroup> groups) {
          return make_optimizer(c, std::move(groups));
        },
        param_dtype(c.run.dtype), device_);
  });
  // Note [Pipeline in the engine]: the stage's GPipe / 1F1B / interleaved schedule.
  if (pp_size_ > 1)
    pipeline_ = &parallel::install_pipeline(
        *engine_, *model_, pp_, parallel::parse_pipeline_schedule(c.parallelism.pipeline_schedule));
  if (c.run.dtype == "fp16") {
    // Note [Dynamic loss scaling], DeepSpeed's fp16 section.
    optim::LossScalerConfig lc;
    lc.loss_scale = c.fp16.loss_scale;
    lc.initial_scale_power = c.fp16.initial_scale_power;
    lc.loss_scale_window = c.fp16.loss_scale_window;
    lc.hysteresis = c.fp16.hysteresis;
    lc.min_loss_scale = c.fp16.min_loss_scale;
    scaler_ =
        with_config_context(c, "fp16", [&] { return std::make_unique<optim::LossScaler>(lc); });
    engine_->set_loss_scaler(scaler_.get());
  }
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
  if (!resume_from.empty()) resume(resume_from);

  // 3. The run directory: rank 0 makes it, then every rank checks it can write there (they all
  // write checkpoint files into it).
  if (lead_) {
    ensure_writable_dir(c.run.dir);
    write_file_atomically(c.run.dir + "/config.yaml", config_yaml_);
    metrics_ = std::make_unique<MetricsFile>(c.run.dir + "/metrics.jsonl", step_);
  }
  world_comm_->barrier();
  if (!lead_) ensure_writable_dir(c.run.dir);
  if (device_.is_cuda()) {
    // Note [cuBLASLt tuning]: the choices in a file per rank inside run.dir, so a resume (or a
    // rerun in the same run.dir) takes the same algorithms and reproduces the bits. The config
    // decides, not STRATA_MATMUL_TUNE.
    tensor::set_cuda_matmul_tuning(c.run.matmul_tuning == "on",
                                   fmt::format("{}/matmul_tuning.rank{}.tsv", c.run.dir, rank_));
    // Note [TF32]: the config decides for fp32 matmuls, this run's and its samples'.
    tensor::set_cuda_tf32(c.run.tf32 == "on");
  }
  console_ =
      std::make_unique<ConsoleReporter>(lead_ ? c.training.progress : "off", c.training.steps);

  flops_per_token_ = training_flops_per_token(shape, c.batch.seq_len);
  std::string peak_note;
  if (device_.is_cuda()) {
    // Note [GPU peaks]: the datasheet's dense peak for this run's dtype, else an estimate.
    const DevicePeaks peaks = device_peaks(tensor::cuda_device_facts(device_.index));
    const bool tf32 = c.run.tf32 == "on" && param_dtype(c.run.dtype) == DType::F32;
    peak_flops_ = peaks.tflops_for(param_dtype(c.run.dtype), tf32) * 1e12;
    peak_rates_ = {peak_flops_ / 1e12, peaks.memory_gbps};
    peak_note = peak_flops_ > 0
                    ? fmt::format(" | MFU against {:.1f} TFLOP/s {} ({})", peak_flops_ / 1e12,
                                  tf32 ? "tf32" : c.run.dtype, peaks.source)
                    : fmt::format(" | no MFU: this GPU's peak is {}", peaks.source);
  } else {
    peak_flops_ = estimated_peak_flops(c.run.device);
  }
  console_->event(
      fmt::format(
          "strata train: model {} ({:.2f}M parameters) | {} | {} | global batch {} x {} tokens "
          "(micro {} x accum {} x dp {}) | {} train samples{}",
          c.model.name, static_cast<double>(shape.num_parameters) / 1e6, c.run.device,
          world_comm_->size() == 1 ? std::string("1 process")
          : tp_size_ > 1 || pp_size_ > 1
              ? fmt::format("{} ranks ({}): {}tp {}{} x dp {}, ZeRO stage {}", world_comm_->size(),
                            world_comm_->backend(),
                            pp_size_ > 1 ? fmt::format("pp {} ({}) x ", pp_size_,
                                                       c.parallelism.pipeline_schedule)
                                         : std::string(),
                            tp_size_, c.parallelism.sequence_parallel ? " (sequence parallel)" : "",
                            world_, c.zero.stage)
              : fmt::format("{} ranks ({}), ZeRO stage {}", world_, dp_->backend(), c.zero.stage),
          c.batch.global_batch_size, c.batch.seq_len, c.batch.micro_batch_size,
          c.batch.grad_accum_steps, world_, train_data_->num_samples(),
          resume_from.empty() ? std::string()
                              : fmt::format(" | resumed from {} at step {}", resume_from, step_)) +
      peak_note);
  if (pp_size_ > 1) {
    const int v = static_cast<int>(virtual_stages);  // Note [Interleaved schedule]
    console_->event(fmt::format(
        "pipeline: {} stages{}, {} schedule, {} micro-batches per step, bubble formula (p - 1) / "
        "({}m + p - 1) = {:.3f}; {}",
        pp_size_, v > 1 ? fmt::format(" x {} chunks", v) : "", c.parallelism.pipeline_schedule,
        c.batch.grad_accum_steps, v > 1 ? "v " : "",
        parallel::pipeline_bubble_formula(pp_size_, c.batch.grad_accum_steps, v),
        v > 1 ? parallel::describe_interleaved(shape, pp_size_, v) : partition_.describe(shape)));
  }
}

Trainer::~Trainer() = default;

}  // namespace strata::runtime
