#pragma once
// Engine: data parallelism with ZeRO stages 0-3 around a model and its optimizer — the one object
// `train`, the benchmarks and the tests step (docs/design.md decisions 4, 5, 6, 9). A composition
// of parts with one job each (Note [Engine parts]); configured with DeepSpeed's zero_optimization
// names and meanings.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "models/causal_lm.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "parallel/gradient_reduction.h"
#include "parallel/host_placement.h"
#include "parallel/micro_batch_schedule.h"
#include "parallel/optimizer_placement.h"
#include "parallel/param_gathering.h"
#include "parallel/partition.h"
#include "parallel/partitioning.h"

namespace strata::parallel {

struct ZeroConfig {                          // DeepSpeed's names and meanings (zero_optimization.*)
  int stage = 0;                             // 0 = plain DP, 1, 2, 3
  int64_t reduce_bucket_size = 500'000'000;  // elements per gradient bucket
  int64_t allgather_bucket_size = 500'000'000;  // elements per allgather of updated params (1/2)
  bool overlap_comm = true;                     // reduce buckets asynchronously during backward
  int64_t stage3_prefetch_bucket_size = 50'000'000;      // elements prefetched ahead (stage 3)
  int64_t stage3_param_persistence_threshold = 100'000;  // units smaller stay whole (stage 3)
  // ZeRO-Offload and ZeRO-Infinity's optimizer side: the optimizer on the host, its states in
  // host memory or on NVMe (HostPlacement); stages 1 to 3.
  OffloadOptimizerConfig offload_optimizer;
  // ZeRO-Infinity: stage 3's parameter partitions on the host or NVMe (parallel/param_tier.h).
  OffloadParamConfig offload_param;

  // strata::user_error naming the zero_optimization key for values out of range.
  void validate() const;
};

// Note [Engine parts]
// The Engine composes parts with one job each, chosen once at construction from the config; no
// method branches on the ZeRO stage:
//   Partitioning        which rank owns which slice of each flat unit: whole units (stage 0) or
//                       dp-partitioned ones (1-3, repadded). parallel/partitioning.h
//   GradientReduction   reduces gradients across dp into what each rank owns: allreduce (0),
//                       into the owned slice of the full buffer (1), into partition buffers
//                       with transient full buffers (2, 3). parallel/gradient_reduction.h
//   ParamGathering      parameters whole where they are used: ZeRO-3's gather/release hooks, the
//                       allgather of updated slices (1-3). parallel/param_gathering.h
//   OptimizerPlacement  the optimizer over the owned slices, fp32 masters, the step's norm,
//                       overflow skip, clip and update; DevicePlacement, or HostPlacement when
//                       zero_optimization.offload_optimizer is on (ZeRO-Offload; Note
//                       [Optimizer placement] in parallel/optimizer_placement.h)
//   MicroBatchSchedule  the order of a step's micro-batch forwards and backwards: plain
//                       accumulation (parallel/micro_batch_schedule.h), or a pipeline stage's
//                       GPipe / 1F1B / interleaved 1F1B (parallel/pipeline_schedule.h,
//                       set_pipeline).
// The Engine keeps the step's protocol (begin_micro_batch / backward / step and their checks)
// and calls the parts in a fixed order. Construction, in order: Partitioning (repad), rank 0's
// parameters broadcast, the placement (masters from the fp32 parameters), the cast to
// param_dtype, GradientReduction (partitions, transient buffers, hooks), ParamGathering (ZeRO-3
// partitions, hooks), the optimizer over the owned slices. Tensor and pipeline parallelism and
// offload add parts, or implementations of one (HostPlacement for ZeRO-Offload, a pipelined
// MicroBatchSchedule), rather than branches.
//
// Note [Offload construction]
// Given units on the host and a GPU `device`, an engine without offload moves them first, as
// models::move_flat_units would. With offload_optimizer the fp32 units stay on the host until
// the placement has taken its masters there and the cast has made them low precision; only then
// do they move, so the GPU never holds the fp32 parameters and gradients (8 bytes per parameter,
// where the bf16 model's are 2 + 2, the gradients released again at stage 2). The rank-0
// broadcast before it goes through the device one unit at a time. A model built deferred never
// has whole units to move, cast or broadcast: Note [Unit-by-unit construction].
//
// Note [Unit-by-unit construction]
// A model whose states exceed host or GPU memory must never exist whole, not even while it is
// built (ZeRO-Infinity's "larger than memory", DeepSpeed's zero.Init). `train` builds it inside a
// DeferredInitScope (Note [Deferred initialisation] in models/nn/module.h) when
// zero_optimization.stage is 3 with offload_param (cpu or nvme), in any param_dtype, on any
// device and at any tensor-parallel size (a tp rank's init_unit draws each tensor by name and keeps
// its shard, Note [Tensor-parallel shards], and reads its slices of model.init_from's tensors,
// hf_shard_reader; a pipeline stage has no ZeRO-3): every unit's flat buffers are released and
// uninitialised. The engine then lays everything out on released buffers — repadding, the cast
// to param_dtype and the move to the device change only their sizes, dtypes and devices, no
// broadcast (the name-keyed init draws the same values on every dp rank), the placement defers its
// masters, the gatherer's partitions start released and the tier reserves their homes, the
// optimizer reserves its NVMe extents — and last, in build_units(), for one unit at a time:
// materialize an fp32 host buffer for it (the unit's own buffer when it is fp32 on the host,
// else a staging buffer its parameter views are bound to meanwhile, models::rebind_unit_params)
// and initialise it (CausalLM::init_unit, the bits of the whole build, which initialises on the
// host too; model.init_from: the unit's tensors (tp > 1: its slices) from the HF files), hand its
// owned slice to the placement as the initial fp32 master, before any cast as Note [Mixed
// precision] takes them (NvmeAdamW writes it home with zero moments; HostOffload copies it into
// its host master; DevicePlacement into its device master, under mixed precision), cast it to
// param_dtype on the host (round to nearest even, the bits cast_flat_units gives on either
// backend) and hand it to the gatherer (copied into the device partition, stored on the tier,
// released), then release the fp32 unit. Units below stage3_param_persistence_threshold stay
// whole, as they would have: their own buffer is materialized and filled. So the peak of
// Category::Param during construction is one fp32 unit plus one partition (and its cast copy)
// plus the tier's buffers in host memory, and one partition on the GPU, not the model; what is
// O(model / dp) is only what training keeps anyway (the gradient partitions, unless they are on
// NVMe; HostOffload's masters and moments with offload_optimizer.device cpu; DevicePlacement's
// fp32 masters and moments without optimizer offload).
//
// Note [Mixed precision]
// With a low-precision `param_dtype` (BF16, FP16) the engine keeps DeepSpeed's and the ZeRO
// paper's layout: the model's flat parameters and gradients are bf16/f16 (2 + 2 bytes per
// parameter), and the optimizer steps fp32 *master* weights plus its fp32 moments (12 bytes,
// Category::Optimizer, partitioned like the moments at stages 1-3). At construction the
// masters are taken from the fp32 parameters (after the rank-0 broadcast), before the model is
// cast (models::cast_flat_units), so they keep the initialisation's full precision. Gradients
// are reduced in their own dtype. step() never rescales low-precision gradients in place:
// 1/dp, 1/loss-scale and the clip coefficient are folded into one f32 factor the optimizer
// applies after widening each gradient (Optimizer::set_grad_scale), and the norm is that of the
// widened gradients times the factor, so an fp16 gradient that only fits scaled is never
// rounded again. The update writes each rank's owned slice of the bf16/f16 parameters (the
// AdamW kernel's model copy), which stages 1/2 then allgather in the parameters' dtype.
// Checkpoints carry the masters as key "master" next to the moments; a checkpoint without
// masters (an fp32 run's) fills them from its parameters, and an fp32 engine resuming a
// mixed-precision checkpoint takes its parameters from the masters
// (runtime/trainer_checkpoints.cpp).
class Engine {
 public:
  using OptimizerFactory = parallel::OptimizerFactory;

  // Repads (stages 1-3) and partitions the model's flat units, makes parameters equal on every
  // rank (broadcast from rank 0, as DDP does at construction), builds the optimizer over what
  // this rank owns and installs the hooks. Collective over `dp`. The model must outlive the
  // engine; after a stage 2/3 engine is gone its buffers stay partitioned.
  // `param_dtype`: F32, or BF16/F16 for mixed precision (Note [Mixed precision]).
  // `device`: where the flat units train (default: where they are). Units still on the host move
  // there during construction (Note [Offload construction]).
  Engine(models::CausalLM& model, std::shared_ptr<comm::Communicator> dp, const ZeroConfig& zero,
         OptimizerFactory make_optimizer, DType param_dtype = DType::F32,
         std::optional<Device> device = std::nullopt);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Note [Train step]
  // One optimizer step as every training loop takes it (the trainer, bench_gpt2_cuda, the
  // tests): the schedule runs the A micro-batches (begin_micro_batch(last); the model's loss
  // under LossGradientScope(loss_gradient(w)); backward of the loss scaled by w = 1/A), then
  // every micro-batch's loss is read in one device-to-host copy, after the last backward (Note
  // [Training on the GPU] in runtime/trainer.h), then step(lr, max_norm). Returns this rank's
  // losses; average() gives the global mean.
  TrainStepOutput train_step(const TrainStepInputs& in);

  // Note [Engine step]
  // Per optimizer step, on every rank of `dp`, for each of the A micro-batches:
  //   begin_micro_batch(last); loss = model.loss(...) scaled by 1/A; backward(loss)
  // then step(lr, max_norm). Gradients are reduced across dp in buckets launched from grad-ready
  // hooks while backward runs (Note [Gradient buckets]): stages 0 and 1 only on the last
  // micro-batch (the others accumulate locally), stages 2 and 3 on every one (into the owned
  // partition, which is what lets the full gradients go: Note [Transient gradients]). step():
  //   1. waits for the reductions; divides the owned gradients by dp, so they are those of the
  //      mean loss over the global batch, as in one process (Note [Training step]);
  //   2. the global gradient norm: each rank sums squares over what it owns (fixed chunks,
  //      double, Note [Deterministic norm]), one allreduce of that double (stages 1-3; at stage
  //      0 every rank holds the same reduced gradients), sqrt;
  //   3. a non-finite norm on any rank (the allreduced sum is then non-finite everywhere) skips
  //      the step on every rank — fp16 overflow semantics; with a LossScaler, it decides;
  //   4. clipping (max_norm > 0) scales the owned gradients by clip_grad_norm's coefficient;
  //   5. the optimizer steps the owned partition with `lr` (AdamW's update is elementwise, so a
  //      slice updates exactly as the same elements of the whole would);
  //   6. stages 1 and 2 allgather the updated slices so every rank has whole parameters again
  //      (bucketed by allgather_bucket_size); stage 3 keeps partitions (Note [ZeRO-3 gathering]);
  //   7. gradients are zeroed for the next step.
  // Steps 1-5 are the OptimizerPlacement's, 6 the ParamGathering's, 7 the GradientReduction's.
  // Same seed and same dp give bitwise-identical runs: every reduction has a fixed order.
  void begin_micro_batch(bool last);
  // A backward pass through `units` only (one flag per flat unit), `last` being their last pass
  // of the step (Note [Partial passes] in parallel/grad_buckets.h): the interleaved pipeline
  // schedule's passes, each through one model chunk. Stages 0-2.
  void begin_micro_batch(bool last, const std::vector<bool>& units);
  void backward(const autograd::Variable& loss);  // loss already scaled by 1/grad_accum
  // A pipeline stage's backward (Note [Pipeline in the engine]): from `output`, the stage's
  // hidden states, with `grad` the next stage's gradient for them (already carrying the loss
  // weight and any loss scale), in the same begin_micro_batch protocol.
  void backward(const autograd::Variable& output, const tensor::Tensor& grad);
  // The gradient backward(x) hands x, where x = loss scaled by `weight` (1 / grad_accum, or 1
  // when x is the loss itself) and the loss is the model's: the fp16 loss scale times weight,
  // as the float product the backward makes. For a LossGradientScope around the model's loss
  // (Note [Fused cross-entropy gradient] in autograd/functions_nn.cpp).
  float loss_gradient(float weight) const;
  StepResult step(double lr, double max_norm);

  optim::Optimizer& optimizer() { return placement_->optimizer(); }
  // Lands an update the placement still runs (ZeRO-Offload's delayed update) on every rank's
  // parameters: before a checkpoint, or at the end of training. Collective.
  void finish_pending_update();
  const ZeroConfig& config() const { return zero_; }
  comm::Communicator& dp() { return *dp_; }
  int stage() const { return zero_.stage; }
  // F32, or the low-precision dtype of the model's parameters (Note [Mixed precision]).
  DType param_dtype() const { return param_dtype_; }
  bool mixed_precision() const { return param_dtype_ != DType::F32; }
  // Optional fp16 loss scaling (DeepSpeed semantics): backward multiplies the loss by the scale,
  // step divides the gradients by it and lets the scaler decide on overflow. Not owned.
  void set_loss_scaler(optim::LossScaler* scaler) { scaler_ = scaler; }

  // Note [Pipeline in the engine]
  // Under pipeline parallelism the engine's model is one stage (Note [Pipeline stages] in
  // models/causal_lm.h) and `dp` the data-parallel group of that stage; DP and ZeRO-1/2 work
  // over it unchanged. set_pipeline swaps in a pipelined schedule (parallel/pipeline_schedule.h)
  // and what the step adds across stages: after the dp reductions, the owned gradients of
  // `tied_units` are summed over `tied` (the first and last stage, same dp rank: Megatron's
  // embedding group), then the norm sums over `pp`, counting a tied unit on the first stage
  // only (Note [Norm across stages]). ZeRO-3 is refused: its gathering records the gather order
  // from a step's first micro-batch and releases units around each micro-batch's forward and
  // backward, which a pipeline schedule interleaves.
  struct PipelineSync {
    std::shared_ptr<comm::Communicator> pp;    // this rank's pipeline (one rank per stage)
    std::shared_ptr<comm::Communicator> tied;  // first and last stage; null: nothing tied here
    std::vector<int> tied_units;               // unit indices summed over `tied`
    bool count_tied_in_norm = true;            // false on the last stage
  };
  void set_pipeline(std::unique_ptr<MicroBatchSchedule> schedule, PipelineSync sync);

  // The mean of a scalar over dp ranks (for logging the global loss), deterministic.
  double average(double x);

  // docs/design.md decision 5: this rank's model-state bytes, measured (MemoryStats current bytes
  // of the model's tier in Param / Grad / Optimizer) — not computed from a formula.
  struct ModelStateBytes {
    int64_t params = 0, grads = 0, optimizer = 0;
  };
  ModelStateBytes model_state_bytes() const;
  // Stage 3: peak bytes of gathered (whole) unit parameters since the last reset.
  int64_t gathered_param_peak_bytes() const { return gathering_->gathered_peak_bytes(); }
  void reset_gathered_peak() { gathering_->reset_gathered_peak(); }

  // ---- checkpoints (Note [ZeRO partitions]: flat coordinates [0, unit_numel)) ----
  struct Shard {
    std::string unit;
    std::string key;
    int64_t unit_numel;
    int64_t begin;
    tensor::Tensor data;
  };
  // What this rank must write: its slices of the optimizer states (keys: the optimizer's state
  // names; "master" under mixed precision) and, at stage 3, of the parameters (key "param"). Stage
  // 0: rank 0 returns the whole units, the others nothing. Views of live buffers: write them before
  // the next step.
  // offload_param: the parameter shards are the partitions, loaded from their tier; call
  // checkpoint_written() once they are written to let them go before the next step.
  std::vector<Shard> shards();
  void checkpoint_written() { gathering_->drop_partitions(); }

  // Note [Streamed shards]
  // A checkpoint of a run whose states live on NVMe (or whose partitions live on a tier) cannot
  // take views of them all at once: it would bring the whole state into host memory. So a save
  // asks shard_layout() what this rank writes (shards() without their data) and has
  // stream_shards() hand it the data in pieces: the optimizer states on NVMe one sub-group at a
  // time through the optimizer's state buffers (Note [Streamed states] in optim/nvme_adamw.h),
  // offloaded parameter partitions one unit at a time, resident states as whole views. A load
  // (load_shards) fills the same pieces and writes each back before the next: a sub-group goes
  // home to NVMe, a partition to its tier. Host memory during either: the buffers the run has
  // anyway plus one partition, not the model.
  struct ShardInfo {
    std::string unit;
    std::string key;
    int64_t unit_numel = 0;
    int64_t begin = 0;  // flat coordinates, as Shard
    int64_t numel = 0;
    DType dtype = DType::F32;
    int unit_index = 0;
    int64_t slice_offset = 0;  // where `begin` is in the owned slice
  };
  // The keys of the non-parameter states this rank holds for its units (the optimizer's state
  // names, and "master" with masters), reading nothing; the same on every rank.
  std::vector<std::string> state_keys();
  // What shards() would return (for_loading: what load_shards fills), without reading anything.
  std::vector<ShardInfo> shard_layout(bool for_loading = false);
  // emit(i, piece): the next piece.numel() elements of shard_layout()[i], each shard's pieces in
  // order, shards interleaved; a piece is valid during the call only. `params`: the "param"
  // shards, else the others. `unit` >= 0: that unit's shards alone (on NVMe, its sub-groups
  // alone are read), for a save that goes unit by unit (Note [Tensor-parallel checkpoints] in
  // runtime/tp_checkpoint.h).
  void stream_shards(bool params,
                     const std::function<void(size_t shard, const tensor::Tensor& piece)>& emit,
                     int unit = -1);
  // For each shard this rank holds in the current layout (stage 0: every rank, whole units),
  // fill(unit, key, begin, dst) must fill dst from [begin, begin + dst.numel()) of the saved
  // flat coordinates; dst is the whole shard, or a piece of it (Note [Streamed shards]). Stage 3
  // parameters included. Collective at stage 3.
  void load_shards(const std::function<void(const std::string& unit, const std::string& key,
                                            int64_t begin, tensor::Tensor dst)>& fill);
  // Stages 0-2, after loading whole parameters into the model on every rank: broadcasts rank
  // 0's so ranks cannot drift. Stage 3: whole units that stay whole (persistence) likewise;
  // partitioned units come from load_shards. Collective.
  void sync_params();
  // Runs fn with every unit's parameters whole, one unit at a time (stage 3 gathers and
  // releases each). Collective at stage 3.
  void for_each_gathered_unit(const std::function<void(const models::FlatUnit&)>& fn) {
    gathering_->for_each_gathered_unit(fn);
  }

  // ---- introspection (tests, logs) ----
  const UnitPartition& partition(int unit) const { return partitioning_->unit(unit); }
  // Stage 3: the order of gathers recorded in the first micro-batch, as unit indices.
  const std::vector<int>& gather_order() const { return gathering_->gather_order(); }
  int64_t prefetches() const { return gathering_->prefetches(); }
  // offload_param: the partitions' tier (its read statistics, its wait time); null without.
  const ParamTier* param_tier() const { return gathering_->tier(); }
  // Whether the reduced gradients live on NVMe (Note [Gradients on the NVMe tier] in
  // parallel/grad_buckets.h).
  bool grads_on_nvme() const;
  // Receives "reduce <unit> [a, b)", "gather/prefetch/release <unit>", "allgather <unit> ...".
  void set_trace(std::function<void(const std::string&)> fn);

 private:
  void run_backward(const std::function<void()>& fn);
  // Note [Unit-by-unit construction]: the last step of construction for a deferred model.
  void build_units();
  // Every slice this rank holds, as shards; `for_loading`: also whole units on ranks > 0.
  std::vector<Shard> held_shards(bool for_loading);
  // Every (unit, key, slice numel, dtype) this rank holds, in file order, reading nothing.
  void for_each_held_slice(
      bool for_loading,
      const std::function<void(int unit, const std::string& key, int64_t numel, DType)>& fn);

  models::CausalLM& model_;
  std::shared_ptr<comm::Communicator> dp_;
  ZeroConfig zero_;
  DType param_dtype_ = DType::F32;
  Device device_;  // where the units train
  // The parts (Note [Engine parts]), in construction order; each later one may refer to the
  // earlier ones, so they go in reverse.
  std::unique_ptr<Partitioning> partitioning_;
  std::unique_ptr<OptimizerPlacement> placement_;
  std::unique_ptr<GradientReduction> reduction_;
  std::unique_ptr<ParamGathering> gathering_;
  std::unique_ptr<MicroBatchSchedule> schedule_;
  PipelineSync pipeline_;
  optim::LossScaler* scaler_ = nullptr;
  bool in_backward_ = false;
  bool in_micro_batch_ = false;
  bool last_micro_batch_ = false;
  // No backward since the last step (or construction): the gradient buffers hold zeros
  // (Note [Weight gradients into their buffer] in autograd/grad_sink.h).
  bool grads_zero_ = true;
};

}  // namespace strata::parallel
