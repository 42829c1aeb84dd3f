#pragma once
// The typed configuration of the `train` binary, parsed strictly from YAML (docs/config.md).
//
// Note [Train config paths]
// Paths inside a config (data.train, data.val, data.vocab, data.merges, model.init_from, run.dir)
// are used as written: a relative path is relative to the working directory `train` runs in,
// not to the config file (unlike `base:`, which is relative to the including file). Configs in
// configs/ are therefore meant to be run from the repository root. load_train_config does not
// check that these files exist; the data loader, tokenizer and checkpoint code do, naming the key.
//
// Note [Batch arithmetic]
// global_batch_size = micro_batch_size * grad_accum_steps * dp, in sequences, and this is the
// only place that relation is computed. A config gives micro_batch_size and any of
// grad_accum_steps / global_batch_size (0 = derive): neither -> accumulation 1; one -> the other
// is derived (global must then be divisible by micro * dp); both -> they must agree. The derived
// field is flagged, so resolve_batch can be called again for the real dp once the world size is
// known (load_train_config resolves for dp = 1), and to_yaml writes 0 for it (with the derived
// value as a comment): a saved config keeps the user's intent — usually a fixed global batch —
// when it is resumed on a different number of ranks.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/config.h"

namespace strata::runtime {

struct RunConfig {                   // YAML section `run`
  std::string dir = "runs/default";  // output directory (metrics, checkpoints, config.yaml)
  uint64_t seed = 1337;
  std::string device = "cpu";  // cpu | cuda
  // fp32 | bf16 | fp16 | auto; auto (the default) resolves to bf16 on cuda and fp32 on cpu
  // (docs/design.md decision 7) when the config is loaded.
  std::string dtype = "auto";
  int threads = 0;  // 0 = all cores
  // off | on: time cuBLASLt's candidate algorithms per matmul problem and keep the fastest, the
  // choices kept in <dir>/matmul_tuning.rank<R>.tsv (Note [cuBLASLt tuning]); cuda only.
  std::string matmul_tuning = "off";
  // off | on: fp32 matmuls on the GPU round their inputs to TF32 and run on the tensor cores
  // (Note [TF32] in tensor/cuda.h); no effect on bf16/fp16 matmuls; cuda only.
  std::string tf32 = "off";
  // auto | none | bytes ("20GiB", "512MiB", 1073741824): the most host memory this process may
  // hold (Note [Host memory budget] in offload/host_budget.h); auto is what the machine has free
  // (MemAvailable) at start, divided among the ranks of the node.
  std::string host_memory_budget = "auto";
  bool operator==(const RunConfig&) const = default;
};

struct ModelSection {              // `model`
  std::string name = "gpt2-tiny";  // registry name; validated against models::ModelRegistry
  std::map<std::string, std::string> config;  // `model.config:` -> ModelOptions.overrides
  std::string init_from;                      // optional HF checkpoint (models/hf_interop.h)
  bool operator==(const ModelSection&) const = default;
};

struct DataSection {               // `data`
  std::string train;               // glob of train shards (required)
  std::string val;                 // glob of val shards (optional; empty = no eval)
  std::string tokenizer = "byte";  // byte | gpt2
  std::string vocab;               // gpt2: vocab.json path
  std::string merges;              // gpt2: merges.txt path
  bool shuffle = false;            // per-epoch shuffle from run.seed
  bool operator==(const DataSection&) const = default;
};

struct BatchSection {  // `batch`; Note [Batch arithmetic]
  int64_t micro_batch_size =
      8;  // sequences per rank per micro-step (train_micro_batch_size_per_gpu)
  int64_t grad_accum_steps = 0;   // gradient_accumulation_steps; 0 = derive from global_batch_size
  int64_t global_batch_size = 0;  // train_batch_size; 0 = derive (micro*accum*dp)
  int64_t seq_len = 128;
  // Set by resolve_batch: the field was derived rather than given (not YAML keys).
  bool grad_accum_steps_derived = false;
  bool global_batch_size_derived = false;
  bool operator==(const BatchSection&) const = default;
};

struct OptimizerSection {      // `optimizer`
  std::string name = "adamw";  // adamw | sgd
  double lr = 6e-4;
  double beta1 = 0.9, beta2 = 0.95;  // YAML key `betas: [0.9, 0.95]`
  double eps = 1e-8;
  double weight_decay = 0.1;
  double momentum = 0.9;   // sgd
  bool nesterov = false;   // sgd
  double grad_clip = 1.0;  // 0 = off
  bool operator==(const OptimizerSection&) const = default;
};

struct ScheduleSection {        // `schedule`
  std::string name = "cosine";  // cosine | linear | constant (optim/lr_schedule.h)
  int64_t warmup_steps = 0;
  double min_lr = 0.0;
  bool operator==(const ScheduleSection&) const = default;
};

struct TrainingSection {  // `training`
  int64_t steps = 1000;
  int64_t log_every = 1;
  int64_t eval_every = 0;  // 0 = never
  int64_t eval_batches = 10;
  int64_t sample_every = 0;  // 0 = never
  int64_t sample_tokens = 128;
  std::string sample_prompt;      // empty = start from the first token of the val/train data
  double temperature = 0.8;       // 0 = greedy
  int64_t top_k = 40;             // 0 = no top-k cut
  double top_p = 1.0;             // nucleus cut after top-k; 1 = none
  int64_t checkpoint_every = 0;   // 0 = only at the end
  int64_t keep_checkpoints = 3;   // 0 = keep all
  bool final_checkpoint = true;   // false: no checkpoint when the run ends
  std::string resume = "auto";    // auto | never | <checkpoint dir>
  std::string progress = "auto";  // auto | bar | lines
  int64_t profile_steps = 0;      // GPU: time every op over this many steps; 0 = never
  int64_t profile_start = 5;      // the first profiled step (after plans and heuristics are built)
  bool operator==(const TrainingSection&) const = default;
};

struct DistributedSection {      // `distributed`; docs/distributed.md
  std::string backend = "auto";  // auto | self | mpi | nccl (comm/world.h)
  double timeout_s = 300;  // a collective longer than this is a failed rank (Note [Failed ranks])
  bool operator==(const DistributedSection&) const = default;
};

struct ParallelismSection {                // `parallelism`, Megatron's names; docs/config.md
  int64_t tensor_parallel_size = 1;        // tp: ranks that split each layer (tp fastest)
  bool sequence_parallel = false;          // split norms/dropout/residuals over tp (tp > 1 only)
  int64_t pipeline_parallel_size = 1;      // pp: stages of the layer stack (pp slowest)
  std::string pipeline_schedule = "1f1b";  // gpipe | 1f1b | interleaved (pipeline_schedule.h)
  // Chunks per stage of the interleaved schedule (Megatron's virtual_pipeline_model_parallel_size;
  // Note [Virtual pipeline stages] in models/causal_lm.h): > 1 exactly when the schedule is
  // interleaved.
  int64_t virtual_pipeline_stages = 1;
  // Layers per stage, one entry per stage summing to n_layer; empty = balanced by parameter
  // count (Note [Stage balance] in parallel/pipeline_stages.h).
  std::vector<int64_t> pipeline_partition;
  bool operator==(const ParallelismSection&) const = default;
};

// `zero_optimization.offload_optimizer`: ZeRO-Offload (device cpu: optim/host_offload.h) and
// ZeRO-Infinity's optimizer side (device nvme: optim/nvme_adamw.h), DeepSpeed's names;
// docs/config.md. ZeRO stages 1 to 3 with optimizer adamw; device cpu on run.device cuda, device
// nvme on cuda or cpu.
struct OffloadOptimizerSection {
  std::string device = "none";  // none | cpu | nvme
  bool pin_memory = true;       // host buffers (masters or nvme swap buffers) pinned
  std::string nvme_path;        // device nvme: the directory of the swap file
  int64_t buffer_count = 4;     // device nvme: sub-group buffers (Note [Sub-group pipeline])
  bool pipeline_read = true;    // device nvme: read the next sub-groups while one steps
  bool pipeline_write = true;   // device nvme: write sub-groups back while the next steps
  // The paper's one-step delayed parameter update (Note [Delayed parameter update]): after
  // delayed_param_update_start plain updates, each update reaches the GPU one step late.
  bool delayed_param_update = false;
  int64_t delayed_param_update_start = 10;  // plain updates first
  bool enabled() const { return device != "none"; }
  bool operator==(const OffloadOptimizerSection&) const = default;
};

// `zero_optimization.offload_param`: ZeRO-Infinity's parameter offload (parallel/param_tier.h),
// DeepSpeed's names and meanings; docs/config.md, docs/offload.md. Only ZeRO stage 3.
struct OffloadParamSection {
  std::string device = "none";        // none | cpu | nvme
  std::string nvme_path;              // nvme: directory of the swap files
  bool pin_memory = true;             // host copies (cpu) and buffers (nvme) page-locked
  int64_t buffer_count = 5;           // nvme: buffers for reads and write-backs
  int64_t buffer_size = 100'000'000;  // nvme: elements per buffer (>= the largest partition)
  int64_t max_in_cpu = 0;             // nvme: partition elements kept on the host instead
  bool enabled() const { return device != "none"; }
  bool operator==(const OffloadParamSection&) const = default;
};

struct ZeroSection {  // `zero_optimization`, DeepSpeed's names and meanings; docs/zero.md
  int stage = 0;      // 0 = plain data parallel, 1, 2, 3
  int64_t reduce_bucket_size = 500'000'000;          // elements per gradient bucket
  int64_t allgather_bucket_size = 500'000'000;       // elements per allgather of updated parameters
  bool overlap_comm = true;                          // reduce buckets during backward
  int64_t stage3_prefetch_bucket_size = 50'000'000;  // elements prefetched ahead (stage 3)
  int64_t stage3_param_persistence_threshold = 100'000;  // smaller units stay whole (stage 3)
  int64_t sub_group_size = 1'000'000'000;  // elements per offloaded optimizer sub-group (nvme)
  OffloadOptimizerSection offload_optimizer;
  OffloadParamSection offload_param;
  bool operator==(const ZeroSection&) const = default;
};

// `aio`: the NVMe tier's asynchronous I/O (offload/aio_engine.h, Note [AIO engine]), DeepSpeed's
// names and meanings; used by offload_optimizer.device nvme.
struct AioSection {
  int64_t block_size = 1048576;  // bytes per I/O request
  int64_t queue_depth = 8;       // requests in flight per thread
  int64_t thread_count = 1;      // I/O threads, each with its own queue
  bool single_submit = false;    // one syscall per request instead of per batch
  bool overlap_events = true;    // refill the queue as each request completes
  bool operator==(const AioSection&) const = default;
};

struct Fp16Section {      // `fp16`: dynamic loss scaling for run.dtype fp16, DeepSpeed's names
  double loss_scale = 0;  // > 0: static scale; 0: dynamic (optim/loss_scaler.h)
  int initial_scale_power = 16;      // the dynamic scale starts at 2^this
  int64_t loss_scale_window = 1000;  // steps without overflow before the scale doubles
  int hysteresis = 2;                // overflows tolerated before the scale halves
  double min_loss_scale = 1;
  bool operator==(const Fp16Section&) const = default;
};

// `activation_checkpointing`, DeepSpeed's section; which blocks are checkpointed is the model's
// `model.config.activation_checkpointing`.
struct ActivationCheckpointingSection {
  // Note [CPU checkpointing] in autograd/checkpoint.h: the checkpoints in pinned host memory
  // between forward and backward; needs model.config.activation_checkpointing: true. No effect on
  // run.device cpu, where they are in host memory already.
  bool cpu_checkpointing = false;
  bool operator==(const ActivationCheckpointingSection&) const = default;
};

struct TrainConfig {
  RunConfig run;
  ModelSection model;
  DataSection data;
  BatchSection batch;
  OptimizerSection optimizer;
  ScheduleSection schedule;
  TrainingSection training;
  DistributedSection distributed;
  ParallelismSection parallelism;
  ZeroSection zero;
  AioSection aio;
  Fp16Section fp16;
  ActivationCheckpointingSection activation_checkpointing;
  std::string source;  // the top config file path

  // Note [Batch arithmetic]: resolves grad_accum_steps and global_batch_size for `dp`
  // data-parallel ranks; strata::user_error naming the three numbers and the file when they
  // cannot agree.
  void resolve_batch(int dp);

  bool operator==(const TrainConfig&) const = default;
};

// Loads FILE with base: and the --set overrides (core/config.h), parses strictly, validates
// cross-field rules (positive sizes, lr >= 0, betas in [0,1), warmup within steps, tokenizer gpt2
// needs vocab+merges, model name known and model.config accepted by its family, seq_len within
// the model's context, dtype fp16/bf16 only with device cuda, ...), and resolves the batch for
// dp = 1. Every error is a strata::user_error naming the file (and line and key where there is
// one). Paths inside are kept as written (Note [Train config paths]).
TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& sets = {});

// The same from an already loaded tree; `source` names the file in errors.
TrainConfig parse_train_config(const config::Node& root, const std::string& source);

// The fully resolved config as YAML (every key, defaults included) — `train --print-config`, and
// saved as config.yaml in the run directory and in each checkpoint; loading it back gives the
// same config (Note [Batch arithmetic] for the two derived batch fields).
std::string to_yaml(const TrainConfig& config);

}  // namespace strata::runtime
