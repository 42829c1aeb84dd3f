#pragma once
// NvmeAdamW: ZeRO-Infinity's optimizer side (Rajbhandari et al., 2021). AdamW whose fp32 masters
// and both moments live in an NVMe swap file instead of memory; a step streams them through a few
// pinned buffers, one sub-group at a time, so resident optimizer memory is bounded by the buffers,
// not by the model.
//
// Note [Optimizer states on NVMe]
// The owned slices (one per unit, as HostOffload's: Note [Host offload]) are cut into sub-groups
// of at most sub_group_size elements (zero_optimization.sub_group_size), each inside one slice.
// A sub-group's home is one NVMe extent holding [master | exp_avg | exp_avg_sq], 12 bytes per
// element. step(lr), for sub-groups i = 0, 1, ...:
//   - reads sub-group i+1 .. i+d into free buffers (d: read-ahead, Note [Sub-group pipeline]),
//   - waits for sub-group i's read (checksums verified: a damaged block is an error naming the
//     swap file),
//   - copies its gradient range from the device to a staging buffer and widens it to f32 times
//     the gradient scale exactly as AdamW::step does,
//   - runs the AdamW kernel over its decay runs (the same scalars, the same elementwise kernel:
//     AdamW is elementwise, so a sub-group updates as the same elements of the whole would),
//   - copies the updated parameters (the fp32 master, or under mixed precision the kernel's
//     bf16/f16 model copy) into the device's owned slice,
//   - starts writing the sub-group home.
// So the run's bits are AdamW's over the same groups (tests compare them). Resident: buffer_count
// state buffers of 12 x sub_group_size bytes (Category::Optimizer, pinned with pin_memory), one
// gradient staging buffer (Category::Grad), one f32 widening buffer (Category::Workspace) and
// under mixed precision one model-copy buffer (Category::Param), each of sub_group_size elements.
// The extents are reserved when the optimizer is built, so a full disk is an error at start.
//
// Note [Sub-group pipeline]
// Buffer b holds sub-groups b, b + B, b + 2B, ... (B = buffer_count). Reading sub-group j into
// its buffer first waits for the write of j - B. With pipeline_read the reads run d sub-groups
// ahead of the step (d = B - 2 when B >= 3, so the write of i - 1 proceeds while i steps, else
// B - 1); without it each read is issued when its sub-group is due. With pipeline_write the write
// of sub-group i completes in the background; without it the step waits for it.
//
// Note [Staged states]
// The Optimizer interface reads and writes states through state_dict() and master(), which hold
// views of resident buffers elsewhere. Here state_dict() stages the whole state in host memory
// (read from NVMe; Category::Optimizer) and returns views of the staged copies; a load fills
// them and then commit_staged() (through params_from_masters() or load_state_dict()) writes them
// home and rewrites the device parameters. The next step() drops staged copies. Checkpoints do
// not stage: they stream (Note [Streamed states]).
//
// Note [Streamed states]
// A checkpoint of states larger than host memory goes sub-group by sub-group through the state
// buffers: read_states() reads each sub-group home (the next ones ahead, into the other buffers)
// and hands fn views of its master, exp_avg and exp_avg_sq, valid during the call; write_states()
// hands fill such views of a buffer to fill, writes the sub-group home and rewrites its device
// parameters from the master, as commit_staged() does. Neither holds more than the buffers.
//
// Group fence: slice k is group k of Note [Group fence] (optim/optimizer.h). With a fence set,
// step() and commit_staged() call fence(k, true) before the first sub-group of slice k writes the
// device parameters and fence(k, false) once its last sub-group's have been copied, so only the
// slice being written must be resident (ZeRO-Infinity's offloaded partitions). The states'
// reads and writes do not touch the parameters and run ahead and behind as before.
//
// Note [Gradients on NVMe]
// With `grads_on_nvme` the slices carry no gradient tensor: the gradients live in the store as
// well, one extent per sub-group (Category::Grad, grad_dtype, reserved with the states' homes, so
// a full disk is an error at start). Whoever reduces them writes a slice's gradient whole with
// write_grads() (and reads it back with read_grads() to accumulate the next micro-batch), from
// host memory; step() reads sub-group i's gradient into gradient buffer i % buffer_count in the
// same read-ahead as its states (Note [Sub-group pipeline]), so the gradient reads overlap the
// update as the state reads do, and widens and scales it as it widens a copied one. Resident
// gradient bytes are then the buffer_count gradient buffers alone (Category::Grad); without
// grads_on_nvme, the one staging buffer the device gradient is copied into.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "offload/copy_stream.h"
#include "offload/nvme_store.h"
#include "offload/swap_dir_lock.h"
#include "optim/adamw.h"
#include "optim/optimizer.h"

namespace strata::optim {

struct NvmeSlice {        // as OffloadSlice (optim/host_offload.h)
  tensor::Tensor params;  // F32, BF16 or F16 on the device: step() rewrites it
  // Same numel, F32, BF16 or F16 on the device; undefined with grads_on_nvme.
  tensor::Tensor grads;
  tensor::Tensor master;  // F32 initial values (any device); undefined: params (then F32)
  std::vector<Segment> segments;
};

struct NvmeAdamWOptions {  // zero_optimization.offload_optimizer with device: nvme
  std::string nvme_path;
  std::string lock_tag;  // Note [Swap directory lock]; empty: "optimizer"
  int64_t sub_group_size = 1'000'000'000;
  int buffer_count = 4;
  bool pin_memory = true;
  bool pipeline_read = true;
  bool pipeline_write = true;
  offload::AioConfig aio;
  // Checksums of every block (Note [Checksums and alignment]); tests may turn them off.
  bool checksum = true;
  // Note [Gradients on NVMe]: the gradients' home is the store (NvmeSlice::grads undefined).
  bool grads_on_nvme = false;
  DType grad_dtype = DType::F32;  // with grads_on_nvme
  // Raises a UserError naming the bad key.
  void validate() const;
};

// What an NvmeAdamW over slices of `slice_numel` elements allocates: the constructor allocates
// exactly this, and the start's plans count it (runtime/host_memory_plan.h,
// runtime/nvme_space_plan.h). Host bytes are per buffer; `extents` are the sub-groups' NVMe homes.
struct NvmeAdamWSizes {
  int64_t max_sub_group = 0;       // elements of the largest sub-group
  int64_t state_buffer_bytes = 0;  // 12 x max_sub_group, rounded up to 4 KiB
  int64_t buffer_count = 0;        // min(buffer_count, sub-groups)
  int64_t grad_stage_bytes = 0;    // one gradient buffer (the gradients' dtype)
  int64_t grad_buffer_count = 1;   // grads_on_nvme: one per state buffer (at least 1), else 1
  int64_t model_copy_bytes = 0;    // under mixed precision: the model-copy buffer, else 0
  int64_t widened_bytes = 0;       // the f32 widening buffer when the gradients are not f32
  int64_t sub_groups = 0;
  struct Extents {  // `count` sub-groups whose homes have `bytes` each
    int64_t count = 0;
    int64_t bytes = 0;
  };
  // Per slice: its full sub-groups, then its last partial one; 12 bytes per element (master,
  // exp_avg, exp_avg_sq), and with grads_on_nvme the gradients' homes of the same sub-groups.
  std::vector<Extents> extents;
  std::vector<Extents> grad_extents;
  int64_t host_bytes() const {
    return state_buffer_bytes * buffer_count + grad_stage_bytes * grad_buffer_count +
           model_copy_bytes + widened_bytes;
  }
};
// `grad_dtype`: the gradients' (options.grad_dtype with options.grads_on_nvme).
NvmeAdamWSizes nvme_adamw_sizes(const std::vector<int64_t>& slice_numel,
                                const NvmeAdamWOptions& options, DType param_dtype,
                                DType grad_dtype);

class NvmeAdamW final : public Optimizer {
 public:
  NvmeAdamW(std::vector<NvmeSlice> slices, const AdamWConfig& config,
            const NvmeAdamWOptions& options);
  ~NvmeAdamW() override;

  // Note [Optimizer states on NVMe]; the gradients are read from the slices' device gradients.
  void step(double lr) override;
  std::string_view name() const override { return "AdamW"; }

  // Note [Staged states]: "group<i>.exp_avg" / "group<i>.exp_avg_sq", views of staged copies.
  OptimizerState state_dict() const override;
  // Copies into the staged states and commits them (then only the step count when `state` is
  // this optimizer's own staged views).
  void load_state_dict(const OptimizerState& state) override;
  // The staged fp32 master of slice i (Note [Staged states]).
  const tensor::Tensor& master(size_t i) const;
  // Writes staged states home, rewrites the device parameters from the masters (rounded under
  // mixed precision) and drops the staged copies. Without staged states: rewrites the device
  // parameters from the masters on NVMe.
  void commit_staged();

  // Note [Streamed states]: (slice, offset in the slice, master, exp_avg, exp_avg_sq), each
  // sub-group once, in slice and offset order.
  using SubGroupFn =
      std::function<void(size_t slice, int64_t offset, const tensor::Tensor& master,
                         const tensor::Tensor& exp_avg, const tensor::Tensor& exp_avg_sq)>;
  void read_states(const SubGroupFn& fn);
  // read_states for slice `slice`'s sub-groups alone (a checkpoint that goes unit by unit).
  void read_slice_states(size_t slice, const SubGroupFn& fn);
  void write_states(const SubGroupFn& fill);

  size_t slices() const { return slices_.size(); }
  size_t sub_groups() const { return subs_.size(); }
  // Bytes of one state buffer (12 x the largest sub-group, rounded to 4 KiB).
  size_t buffer_bytes() const { return buffer_bytes_; }
  int buffer_count() const { return static_cast<int>(bufs_.size()); }
  const AdamWConfig& config() const { return config_; }
  offload::NvmeStore& store() { return *store_; }
  // Reads that the step had to wait for (not hidden behind the previous sub-group's update).
  int64_t read_waits() const { return read_waits_; }
  // A slice built with released params and no master (Note [Unit-by-unit construction] in
  // parallel/engine.h) gets its initial master here, before the first step: written home with
  // zero moments.
  void set_initial_master(size_t i, const tensor::Tensor& master);
  // Waits for the last step's writes (they complete in the background; raises their error).
  void finish_writes();

  // Note [Gradients on NVMe] (grads_on_nvme only). write_grads starts writing slice k's gradient,
  // params(k).numel() elements of grad_dtype at `src` in host memory, which must stay unchanged
  // until every returned handle completed; read_grads reads it back into `dst` and waits. A failed
  // transfer raises a UserError naming the swap file.
  bool grads_on_nvme() const { return options_.grads_on_nvme; }
  std::vector<offload::IoHandle> write_grads(size_t k, const void* src);
  void read_grads(size_t k, void* dst);
  // Bytes of one gradient buffer (grads_on_nvme: buffer_count of them; else one staging buffer).
  size_t grad_buffer_bytes() const { return static_cast<size_t>(grad_stage_.nbytes()); }

 private:
  struct SubGroup {
    size_t slice = 0;
    int64_t offset = 0;  // in the slice
    int64_t numel = 0;
    offload::Block home;
    offload::Block grad_home;    // Note [Gradients on NVMe]
    std::vector<DecayRun> runs;  // offsets relative to the sub-group
  };
  // read_states over sub-groups [lo, hi).
  void read_sub_groups(size_t lo, size_t hi, const SubGroupFn& fn);
  float* buffer(size_t i) const;  // the state buffer of sub-group i
  // Sub-group i's gradient: gradient buffer i % B with grads_on_nvme, else the staging buffer.
  tensor::Tensor grad_buffer(size_t i) const;
  // The sub-groups [first, last) of slice k.
  std::pair<size_t, size_t> slice_subs(size_t k) const;
  void enter_slice(size_t k);  // fence(k, true), then the copies wait for what it enqueued
  void write_params(const SubGroup& s, const float* master, const void* low_precision);
  void stage() const;
  void drop_staged() const;
  // commit_staged() (fill null), or write_states(*fill).
  void rewrite(const SubGroupFn* fill);

  std::vector<NvmeSlice> slices_;
  AdamWConfig config_;
  NvmeAdamWOptions options_;
  Isa isa_;
  bool mixed_ = false;
  bool cuda_ = false;
  std::unique_ptr<offload::SwapDirLock> lock_;
  std::unique_ptr<offload::NvmeStore> store_;
  std::unique_ptr<offload::CopyStream> copies_;
  std::vector<SubGroup> subs_;
  size_t buffer_bytes_ = 0;
  std::vector<tensor::Tensor> bufs_;       // state buffers (f32, 3 x the largest sub-group each)
  tensor::Tensor grad_stage_;              // the device gradient dtype
  std::vector<tensor::Tensor> grad_bufs_;  // grads_on_nvme: B buffers, grad_stage_ is the first
  std::vector<size_t> slice_first_;        // [slice]: its first sub-group; [slices]: S
  tensor::Tensor widened_;                 // f32
  tensor::Tensor low_precision_;           // the model copy, under mixed precision
  int64_t read_waits_ = 0;
  std::vector<bool> master_due_;  // per slice: set_initial_master() has yet to write it
  std::vector<offload::IoHandle> pending_writes_;
  // Note [Staged states]: per slice, master / exp_avg / exp_avg_sq.
  mutable std::vector<std::vector<tensor::Tensor>> staged_;
};

}  // namespace strata::optim
