#include "optim/nvme_adamw.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "core/logging.h"
#include "offload/memory_stats.h"
#include "offload/pinned_allocator.h"
#include "tensor/cuda.h"
#include "tensor/host_tensor.h"
#include "tensor/storage.h"

namespace strata::optim {

namespace {

char* bytes_at(const tensor::Tensor& t, int64_t element) {
  return static_cast<char*>(t.data_ptr()) + element * static_cast<int64_t>(dtype_size(t.dtype()));
}

}  // namespace

void NvmeAdamWOptions::validate() const {
  if (nvme_path.empty())
    user_error(
        "zero_optimization.offload_optimizer.nvme_path is empty: set it to a directory on the "
        "NVMe drive that holds the optimizer states");
  if (sub_group_size < 1)
    user_error("zero_optimization.sub_group_size must be >= 1, got {}", sub_group_size);
  if (buffer_count < 1)
    user_error("zero_optimization.offload_optimizer.buffer_count must be >= 1, got {}",
               buffer_count);
  aio.validate();
}

NvmeAdamWSizes nvme_adamw_sizes(const std::vector<int64_t>& slice_numel,
                                const NvmeAdamWOptions& options, DType param_dtype,
                                DType grad_dtype) {
  // Note [Optimizer states on NVMe]: sub-groups of at most sub_group_size, each in one slice.
  NvmeAdamWSizes out;
  const int64_t g = options.sub_group_size;
  for (const int64_t n : slice_numel) {
    if (n / g > 0) out.extents.push_back({n / g, g * 12});
    if (n % g > 0) out.extents.push_back({1, (n % g) * 12});
    const int64_t gs = static_cast<int64_t>(dtype_size(grad_dtype));
    if (options.grads_on_nvme && n / g > 0) out.grad_extents.push_back({n / g, g * gs});
    if (options.grads_on_nvme && n % g > 0) out.grad_extents.push_back({1, (n % g) * gs});
    out.sub_groups += (n + g - 1) / g;
    out.max_sub_group = std::max(out.max_sub_group, std::min(n, g));
  }
  const int64_t max_n = out.max_sub_group;
  out.state_buffer_bytes = ((max_n * 12 + 4095) / 4096) * 4096;
  out.buffer_count = std::min<int64_t>(options.buffer_count, out.sub_groups);
  out.grad_stage_bytes = max_n * static_cast<int64_t>(dtype_size(grad_dtype));
  if (options.grads_on_nvme) out.grad_buffer_count = std::max<int64_t>(1, out.buffer_count);
  if (param_dtype != DType::F32)
    out.model_copy_bytes = max_n * static_cast<int64_t>(dtype_size(param_dtype));
  if (grad_dtype != DType::F32) out.widened_bytes = max_n * 4;
  return out;
}

NvmeAdamW::NvmeAdamW(std::vector<NvmeSlice> slices, const AdamWConfig& config,
                     const NvmeAdamWOptions& options)
    : Optimizer({}, {}),
      slices_(std::move(slices)),
      config_(config),
      options_(options),
      isa_(default_adamw_isa()) {
  options_.validate();
  {
    AdamW check({}, config_);  // the hyper-parameters' range checks
  }
  STRATA_USER_CHECK(!slices_.empty(), "offload_optimizer: nothing to offload (no slices)");
  const Device device = slices_.front().params.device();
  cuda_ = device.is_cuda();
  mixed_ = slices_.front().params.dtype() != DType::F32;
  const bool on_nvme = options_.grads_on_nvme;  // Note [Gradients on NVMe]
  const DType grad_dtype = on_nvme ? options_.grad_dtype : slices_.front().grads.dtype();
  int64_t max_n = 0;
  for (size_t i = 0; i < slices_.size(); ++i) {
    NvmeSlice& s = slices_[i];
    STRATA_CHECK(
        on_nvme ? !s.grads.defined() : is_flat(s.grads) && s.grads.numel() == s.params.numel(),
        "nvme slice {}: grads {} must be {}", i, s.grads.defined() ? s.grads.str() : "undefined",
        on_nvme ? "undefined (they live on NVMe)" : "1-d contiguous and like the params");
    STRATA_CHECK(is_flat(s.params), "nvme slice {}: params {} must be 1-d contiguous", i,
                 s.params.str());
    const tensor::Tensor& g = on_nvme ? s.params : s.grads;
    STRATA_CHECK(s.params.device() == device && g.device() == device,
                 "nvme slice {}: params on {}, grads on {}, expected {}", i,
                 s.params.device().str(), g.device().str(), device.str());
    STRATA_CHECK((s.params.dtype() != DType::F32) == mixed_ && (on_nvme || g.dtype() == grad_dtype),
                 "nvme slice {} is {} / {}, slice 0 {} / {}", i, dtype_name(s.params.dtype()),
                 dtype_name(g.dtype()), dtype_name(slices_.front().params.dtype()),
                 dtype_name(grad_dtype));
    slice_first_.push_back(subs_.size());
    master_due_.push_back(!s.master.defined() && s.params.storage()->is_released());
    if (master_due_.back()) {
      // set_initial_master() brings it
    } else if (!s.master.defined()) {
      STRATA_CHECK(!s.params.storage()->is_released(),
                   "nvme slice {}: the parameters are released, so the masters must be given", i);
      s.master = s.params;
    }
    STRATA_CHECK(master_due_.back() ||
                     (s.master.dtype() == DType::F32 && s.master.numel() == s.params.numel()),
                 "nvme slice {}: masters start from an f32 tensor of {} elements, got {}", i,
                 s.params.numel(), s.master.str());
    const int64_t n = s.params.numel();
    const std::vector<DecayRun> runs = decay_runs(s.segments, n, fmt::format("nvme slice {}", i));
    for (int64_t at = 0; at < n; at += options_.sub_group_size) {
      SubGroup sg;
      sg.slice = i;
      sg.offset = at;
      sg.numel = std::min(options_.sub_group_size, n - at);
      for (const DecayRun& r : runs) {
        const int64_t b = std::max(r.offset, at), e = std::min(r.offset + r.numel, at + sg.numel);
        if (b < e) sg.runs.push_back({b - at, e - b, r.decay});
      }
      max_n = std::max(max_n, sg.numel);
      subs_.push_back(std::move(sg));
    }
  }
  slice_first_.push_back(subs_.size());

  // The store checks nvme_path (exists, writable, O_DIRECT) before the lock is taken in it.
  offload::NvmeConfig nc;
  nc.paths = {options_.nvme_path};
  nc.aio = options_.aio;
  nc.checksum = options_.checksum;
  store_ = std::make_unique<offload::NvmeStore>(nc);
  lock_ = std::make_unique<offload::SwapDirLock>(
      options_.nvme_path, options_.lock_tag.empty() ? "optimizer" : options_.lock_tag);
  if (lock_->stale_files_removed() > 0)
    log::warn("nvme_path {}: removed {} swap files of a run that died without cleaning up",
              options_.nvme_path, lock_->stale_files_removed());
  copies_ = std::make_unique<offload::CopyStream>(cuda_);
  // Every home reserved now: a full disk fails here, not in the middle of a step.
  for (SubGroup& s : subs_)
    s.home = store_->allocate(static_cast<size_t>(s.numel) * 12, offload::Category::Optimizer);
  if (on_nvme)
    for (SubGroup& s : subs_)
      s.grad_home = store_->allocate(static_cast<size_t>(s.numel) * dtype_size(grad_dtype),
                                     offload::Category::Grad);

  std::vector<int64_t> numels;
  for (const NvmeSlice& s : slices_) numels.push_back(s.params.numel());
  const NvmeAdamWSizes sizes =
      nvme_adamw_sizes(numels, options_, slices_.front().params.dtype(), grad_dtype);
  STRATA_CHECK(
      sizes.max_sub_group == max_n && sizes.sub_groups == static_cast<int64_t>(subs_.size()),
      "nvme_adamw_sizes: {} sub-groups of at most {} elements, the slices cut into {} of "
      "at most {}",
      sizes.sub_groups, sizes.max_sub_group, subs_.size(), max_n);
  const int64_t per = sizes.state_buffer_bytes / 4;  // floats per state buffer
  buffer_bytes_ = static_cast<size_t>(sizes.state_buffer_bytes);
  for (int b = 0; b < sizes.buffer_count; ++b)
    bufs_.push_back(
        tensor::empty_host({per}, DType::F32, offload::Category::Optimizer, options_.pin_memory));
  grad_stage_ =
      tensor::empty_host({max_n}, grad_dtype, offload::Category::Grad, options_.pin_memory);
  if (on_nvme) {
    grad_bufs_.push_back(grad_stage_);
    while (static_cast<int64_t>(grad_bufs_.size()) < sizes.grad_buffer_count)
      grad_bufs_.push_back(
          tensor::empty_host({max_n}, grad_dtype, offload::Category::Grad, options_.pin_memory));
  }
  if (mixed_)
    low_precision_ = tensor::empty_host({max_n}, slices_.front().params.dtype(),
                                        offload::Category::Param, options_.pin_memory);

  // The initial states: the masters from the slices, zero moments.
  for (size_t i = 0; i < subs_.size(); ++i) {
    const SubGroup& s = subs_[i];
    if (master_due_[s.slice]) continue;
    float* buf = buffer(0);
    tensor::Tensor(bufs_[0])
        .narrow(0, 0, s.numel)
        .copy_(slices_[s.slice].master.narrow(0, s.offset, s.numel));
    std::memset(buf + s.numel, 0, static_cast<size_t>(s.numel) * 8);
    store_->write(s.home, buf, static_cast<size_t>(s.numel) * 12).wait();
  }
  for (NvmeSlice& s : slices_) s.master = tensor::Tensor();  // not kept: the home holds it
}

void NvmeAdamW::set_initial_master(size_t i, const tensor::Tensor& master) {
  STRATA_CHECK(i < slices_.size() && master_due_[i], "slice {} has its initial master", i);
  STRATA_CHECK(master.dtype() == DType::F32 && master.numel() == slices_[i].params.numel(),
               "nvme slice {}: masters start from an f32 tensor of {} elements, got {}", i,
               slices_[i].params.numel(), master.str());
  float* buf = buffer(0);
  for (const SubGroup& s : subs_) {
    if (s.slice != i) continue;
    tensor::Tensor(bufs_[0]).narrow(0, 0, s.numel).copy_(master.narrow(0, s.offset, s.numel));
    std::memset(buf + s.numel, 0, static_cast<size_t>(s.numel) * 8);
    store_->write(s.home, buf, static_cast<size_t>(s.numel) * 12).wait();
  }
  master_due_[i] = false;
}

NvmeAdamW::~NvmeAdamW() {
  // In-flight I/O reads or writes the buffers: it completes before they go.
  if (store_) store_->engine().drain();
  pending_writes_.clear();
}

float* NvmeAdamW::buffer(size_t i) const {
  return bufs_[i % bufs_.size()].data<float>();
}

tensor::Tensor NvmeAdamW::grad_buffer(size_t i) const {
  return grad_bufs_.empty() ? grad_stage_ : grad_bufs_[i % grad_bufs_.size()];
}

std::pair<size_t, size_t> NvmeAdamW::slice_subs(size_t k) const {
  STRATA_CHECK(k + 1 < slice_first_.size(), "slice {} of {}", k, slices_.size());
  return {slice_first_[k], slice_first_[k + 1]};
}

// Note [Gradients on NVMe]
std::vector<offload::IoHandle> NvmeAdamW::write_grads(size_t k, const void* src) {
  STRATA_CHECK(grads_on_nvme(), "write_grads without grads_on_nvme");
  const auto [first, last] = slice_subs(k);
  const size_t es = dtype_size(options_.grad_dtype);
  std::vector<offload::IoHandle> io;
  for (size_t i = first; i < last; ++i)
    io.push_back(
        store_->write(subs_[i].grad_home,
                      static_cast<const char*>(src) + subs_[i].offset * static_cast<int64_t>(es),
                      static_cast<size_t>(subs_[i].numel) * es));
  return io;
}

void NvmeAdamW::read_grads(size_t k, void* dst) {
  STRATA_CHECK(grads_on_nvme(), "read_grads without grads_on_nvme");
  const auto [first, last] = slice_subs(k);
  const size_t es = dtype_size(options_.grad_dtype);
  std::vector<offload::IoHandle> io;
  for (size_t i = first; i < last; ++i)
    io.push_back(store_->read(subs_[i].grad_home,
                              static_cast<char*>(dst) + subs_[i].offset * static_cast<int64_t>(es),
                              static_cast<size_t>(subs_[i].numel) * es));
  for (offload::IoHandle& h : io) h.wait();
}

void NvmeAdamW::finish_writes() {
  std::vector<offload::IoHandle> writes = std::exchange(pending_writes_, {});
  for (offload::IoHandle& w : writes) w.wait();
}

// Note [Group fence]: slice k is group k; write_params() completes its copies before the fence's
// second call.
void NvmeAdamW::enter_slice(size_t k) {
  if (!has_fence()) return;
  fence(k, true);
  // A load the fence enqueued on the compute stream lands before this slice's copies.
  if (copies_->cuda()) copies_->wait_for(tensor::cuda_current_stream());
}

void NvmeAdamW::write_params(const SubGroup& s, const float* master, const void* low_precision) {
  const tensor::Tensor& dst = slices_[s.slice].params;
  const void* src = mixed_ ? low_precision : master;
  copies_->to_device(bytes_at(dst, s.offset), src,
                     static_cast<size_t>(s.numel) * dtype_size(dst.dtype()));
  copies_->synchronize();  // the staging buffer is reused by the next sub-group
}

// Note [Optimizer states on NVMe], Note [Sub-group pipeline].
void NvmeAdamW::step(double lr) {
  if (!(lr >= 0) || !std::isfinite(lr)) user_error("AdamW: learning rate must be >= 0, got {}", lr);
  STRATA_CHECK(std::find(master_due_.begin(), master_due_.end(), true) == master_due_.end(),
               "NvmeAdamW::step before every slice's initial master was set");
  drop_staged();
  finish_writes();  // the last step's writes land before their sub-groups are read again
  ++step_;
  const AdamWConfig& c = config_;
  const AdamWScalars decay = adamw_scalars(lr, c.beta1, c.beta2, c.eps, c.weight_decay, step_);
  const AdamWScalars no_decay = adamw_scalars(lr, c.beta1, c.beta2, c.eps, 0.0, step_);
  const float scale = grad_scale_;
  grad_scale_ = 1.f;
  // The device gradients are final once the compute stream's backward is.
  if (copies_->cuda()) copies_->wait_for(tensor::cuda_current_stream());

  const size_t S = subs_.size(), B = bufs_.size();
  const size_t depth = !options_.pipeline_read ? 0 : B >= 3 ? B - 2 : B - 1;
  const bool grads_on_nvme = options_.grads_on_nvme;
  const size_t grad_size = dtype_size(grad_stage_.dtype());
  std::vector<offload::IoHandle> reads(S), writes(S), grad_reads(S);
  size_t next_read = 0;
  for (size_t i = 0; i < S; ++i) {
    while (next_read < S && next_read <= i + depth) {
      const size_t j = next_read++;
      if (j >= B) writes[j - B].wait();  // its buffer is free once that write is done
      reads[j] = store_->read(subs_[j].home, buffer(j), static_cast<size_t>(subs_[j].numel) * 12);
      // Note [Gradients on NVMe]: gradient buffer j % B is free: sub-group j - B has stepped.
      if (grads_on_nvme)
        grad_reads[j] = store_->read(subs_[j].grad_home, grad_buffer(j).data_ptr(),
                                     static_cast<size_t>(subs_[j].numel) * grad_size);
    }
    bool waited = false;
    if (!reads[i].poll()) {
      waited = true;
      reads[i].wait();
    }
    if (grads_on_nvme && !grad_reads[i].poll()) {
      waited = true;
      grad_reads[i].wait();
    }
    if (waited) ++read_waits_;
    const SubGroup& s = subs_[i];
    const NvmeSlice& sl = slices_[s.slice];
    const int64_t n = s.numel;
    if (i == 0 || subs_[i - 1].slice != s.slice) enter_slice(s.slice);
    float* master = buffer(i);
    float* m = master + n;
    float* v = master + 2 * n;
    // The gradient, widened as AdamW::step widens it (Note [Mixed precision], engine.h).
    const tensor::Tensor staged = grad_buffer(i);
    if (!grads_on_nvme) {
      copies_->to_host(staged.data_ptr(), bytes_at(sl.grads, s.offset),
                       static_cast<size_t>(n) * grad_size);
      copies_->synchronize();
    }
    const float* grad = nullptr;
    if (staged.dtype() != DType::F32 || scale != 1.f) {
      if (!widened_.defined())
        widened_ =
            tensor::empty_host({grad_stage_.numel()}, DType::F32, offload::Category::Workspace,
                               /*pinned=*/false);
      tensor::Tensor dst = widened_.narrow(0, 0, n);
      dst.copy_(staged.narrow(0, 0, n));
      float* d = dst.data<float>();
      if (scale != 1.f) {
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 16))
        for (int64_t k = 0; k < n; ++k) d[k] = d[k] * scale;
      }
      grad = d;
    } else {
      grad = staged.data<float>();
    }
    auto* lp = mixed_ ? static_cast<char*>(low_precision_.data_ptr()) : nullptr;
    for (const DecayRun& r : s.runs) {
      AdamWBuffers b;
      b.param = master + r.offset;
      b.grad = grad + r.offset;
      b.exp_avg = m + r.offset;
      b.exp_avg_sq = v + r.offset;
      if (lp != nullptr) {
        b.low_precision = lp + r.offset * static_cast<int64_t>(dtype_size(low_precision_.dtype()));
        b.low_precision_dtype = low_precision_.dtype();
      }
      b.numel = r.numel;
      adamw_update(b, r.decay ? decay : no_decay, isa_);
    }
    write_params(s, master, lp);
    if (i + 1 == S || subs_[i + 1].slice != s.slice) fence(s.slice, false);
    writes[i] = store_->write(s.home, master, static_cast<size_t>(n) * 12);
    if (!options_.pipeline_write) writes[i].wait();
  }
  // The writes not waited for above (the last B) complete behind the next forward and backward.
  for (size_t i = S > B ? S - B : 0; i < S; ++i) pending_writes_.push_back(writes[i]);
  if (copies_->cuda()) copies_->order_before(tensor::cuda_current_stream());
}

// Note [Staged states]
void NvmeAdamW::stage() const {
  if (!staged_.empty()) return;
  auto* self = const_cast<NvmeAdamW*>(this);
  self->finish_writes();
  std::vector<std::vector<tensor::Tensor>> staged;
  {
    offload::CategoryScope scope(offload::Category::Optimizer);
    for (const NvmeSlice& s : slices_) {
      std::vector<tensor::Tensor> three;
      for (int k = 0; k < 3; ++k) three.push_back(tensor::Tensor::empty({s.params.numel()}));
      staged.push_back(std::move(three));
    }
  }
  for (size_t i = 0; i < subs_.size(); ++i) {
    const SubGroup& s = subs_[i];
    float* buf = buffer(0);
    self->store_->read(s.home, buf, static_cast<size_t>(s.numel) * 12).wait();
    for (int k = 0; k < 3; ++k)
      std::memcpy(staged[s.slice][k].data<float>() + s.offset, buf + k * s.numel,
                  static_cast<size_t>(s.numel) * 4);
  }
  staged_ = std::move(staged);
}

void NvmeAdamW::drop_staged() const {
  staged_.clear();
}

OptimizerState NvmeAdamW::state_dict() const {
  stage();
  OptimizerState st;
  st.step = step_;
  for (size_t g = 0; g < staged_.size(); ++g) {
    st.tensors.push_back({fmt::format("group{}.exp_avg", g), staged_[g][1]});
    st.tensors.push_back({fmt::format("group{}.exp_avg_sq", g), staged_[g][2]});
  }
  return st;
}

const tensor::Tensor& NvmeAdamW::master(size_t i) const {
  stage();
  STRATA_CHECK(i < staged_.size(), "master {} of {} slices", i, staged_.size());
  return staged_[i][0];
}

void NvmeAdamW::load_state_dict(const OptimizerState& state) {
  if (state.step < 0) user_error("{} state has a negative step count ({})", name(), state.step);
  stage();
  std::unordered_map<std::string, const tensor::Tensor*> given;
  for (const NamedTensor& t : state.tensors)
    if (!given.emplace(t.name, &t.tensor).second)
      user_error("{} state lists '{}' twice", name(), t.name);
  std::vector<std::pair<const tensor::Tensor*, tensor::Tensor*>> copies;
  for (size_t g = 0; g < staged_.size(); ++g) {
    for (int k = 1; k <= 2; ++k) {
      const std::string key = fmt::format("group{}.{}", g, k == 1 ? "exp_avg" : "exp_avg_sq");
      auto it = given.find(key);
      if (it == given.end())
        user_error(
            "{} state has no '{}': the checkpoint was written by a different optimizer or "
            "for a different model/partitioning",
            name(), key);
      const tensor::Tensor& src = *it->second;
      if (!src.defined() || src.dtype() != DType::F32 || src.shape() != staged_[g][k].shape())
        user_error(
            "{} state '{}' is {}, expected {}: the checkpoint does not match this "
            "model/partitioning",
            name(), key, src.defined() ? src.str() : "undefined", staged_[g][k].str());
      copies.emplace_back(&src, &staged_[g][k]);
      given.erase(it);
    }
  }
  if (!given.empty())
    user_error("{} state has unexpected entry '{}' ({} groups here)", name(), given.begin()->first,
               staged_.size());
  for (auto [src, dst] : copies)
    if (src->data_ptr() != dst->data_ptr()) dst->copy_(*src);
  step_ = state.step;
  commit_staged();
}

void NvmeAdamW::commit_staged() {
  rewrite(nullptr);
}

// Note [Streamed states]
void NvmeAdamW::read_states(const SubGroupFn& fn) {
  read_sub_groups(0, subs_.size(), fn);
}

void NvmeAdamW::read_slice_states(size_t slice, const SubGroupFn& fn) {
  STRATA_CHECK(slice < slices_.size(), "slice {} of {}", slice, slices_.size());
  size_t lo = 0;
  while (lo < subs_.size() && subs_[lo].slice < slice) ++lo;
  size_t hi = lo;
  while (hi < subs_.size() && subs_[hi].slice == slice) ++hi;
  read_sub_groups(lo, hi, fn);
}

void NvmeAdamW::read_sub_groups(size_t lo, size_t hi, const SubGroupFn& fn) {
  finish_writes();
  const size_t S = hi, B = bufs_.size();
  std::vector<offload::IoHandle> reads(S);
  size_t next = lo;
  try {
    for (size_t i = lo; i < S; ++i) {
      // Sub-group i's buffer is free again once fn returned for i - B.
      for (; next < S && next < i + B; ++next)
        reads[next] = store_->read(subs_[next].home, buffer(next),
                                   static_cast<size_t>(subs_[next].numel) * 12);
      reads[i].wait();
      const SubGroup& s = subs_[i];
      const tensor::Tensor& buf = bufs_[i % B];
      fn(s.slice, s.offset, buf.narrow(0, 0, s.numel), buf.narrow(0, s.numel, s.numel),
         buf.narrow(0, 2 * s.numel, s.numel));
    }
  } catch (...) {
    for (size_t j = lo; j < next; ++j) try {
        reads[j].wait();
      } catch (...) {  // the first error is the one raised
      }
    throw;
  }
}

void NvmeAdamW::write_states(const SubGroupFn& fill) {
  drop_staged();
  rewrite(&fill);
}

void NvmeAdamW::rewrite(const SubGroupFn* fill) {
  finish_writes();
  if (copies_->cuda()) copies_->wait_for(tensor::cuda_current_stream());
  for (size_t i = 0; i < subs_.size(); ++i) {
    const SubGroup& s = subs_[i];
    float* buf = buffer(0);
    const size_t bytes = static_cast<size_t>(s.numel) * 12;
    if (fill != nullptr) {
      const tensor::Tensor& b = bufs_[0];
      (*fill)(s.slice, s.offset, b.narrow(0, 0, s.numel), b.narrow(0, s.numel, s.numel),
              b.narrow(0, 2 * s.numel, s.numel));
      store_->write(s.home, buf, bytes).wait();
    } else if (staged_.empty()) {
      store_->read(s.home, buf, bytes).wait();
    } else {
      for (int k = 0; k < 3; ++k)
        std::memcpy(buf + k * s.numel, staged_[s.slice][k].data<float>() + s.offset,
                    static_cast<size_t>(s.numel) * 4);
      store_->write(s.home, buf, bytes).wait();
    }
    if (mixed_)  // rounded as HostOffload::params_from_masters rounds
      tensor::Tensor(low_precision_)
          .narrow(0, 0, s.numel)
          .copy_(tensor::Tensor(bufs_[0]).narrow(0, 0, s.numel));
    if (i == 0 || subs_[i - 1].slice != s.slice) enter_slice(s.slice);
    write_params(s, buf, mixed_ ? low_precision_.data_ptr() : nullptr);
    if (i + 1 == subs_.size() || subs_[i + 1].slice != s.slice) fence(s.slice, false);
  }
  if (copies_->cuda()) copies_->order_before(tensor::cuda_current_stream());
  drop_staged();
}

}  // namespace strata::optim
