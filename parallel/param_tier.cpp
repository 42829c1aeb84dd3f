#include "parallel/param_tier.h"

#include <algorithm>

#include "core/error.h"
#include "core/timer.h"
#include "offload/memory_stats.h"
#include "offload/nvme_store.h"
#include "offload/pinned_allocator.h"

namespace strata::parallel {

const char* offload_param_device_name(OffloadParamConfig::Device d) {
  switch (d) {
    case OffloadParamConfig::Device::None:
      return "none";
    case OffloadParamConfig::Device::Cpu:
      return "cpu";
    case OffloadParamConfig::Device::Nvme:
      return "nvme";
  }
  return "?";
}

namespace {

tensor::Tensor host_view(const offload::Block& b, int64_t numel, DType dtype) {
  return tensor::Tensor::from_blob(b.ptr, {numel}, dtype, Device::cpu());
}

}  // namespace

ParamTierLayout param_tier_layout(const OffloadParamConfig& config,
                                  const std::vector<int64_t>& numel, DType dtype) {
  ParamTierLayout out;
  out.nvme.assign(numel.size(), false);
  const bool nvme = config.device == OffloadParamConfig::Device::Nvme;
  // Note [Parameter tier]: max_in_cpu elements stay on the host, the first units that fit.
  int64_t in_cpu_left = config.max_in_cpu;
  for (size_t u = 0; u < numel.size(); ++u) {
    if (numel[u] == 0) continue;
    const int64_t bytes = numel[u] * static_cast<int64_t>(dtype_size(dtype));
    out.nvme[u] = nvme && numel[u] > in_cpu_left;
    if (!out.nvme[u] && nvme) in_cpu_left -= numel[u];
    if (!out.nvme[u]) {
      out.host_bytes += bytes;
      continue;
    }
    out.nvme_extents.push_back(bytes);
    if (bytes > out.buffer_bytes) {
      out.buffer_bytes = bytes;
      out.largest_unit = static_cast<int>(u);
    }
  }
  if (out.largest_unit >= 0) out.buffer_count = config.buffer_count;
  return out;
}

ParamTier::ParamTier(const OffloadParamConfig& config, const std::vector<int64_t>& numel,
                     const std::vector<std::string>& names, DType dtype)
    : dtype_(dtype), homes_(numel.size()), read_ahead_(config.read_ahead) {
  STRATA_CHECK(config.enabled(), "a parameter tier without offload_param.device");
  STRATA_CHECK(names.size() == numel.size(), "{} names for {} units", names.size(), numel.size());
  host_alloc_ = config.pin_memory
                    ? static_cast<offload::Allocator*>(&offload::PinnedAllocator::instance())
                    : &offload::HostAllocator::instance();
  const ParamTierLayout layout = param_tier_layout(config, numel, dtype);
  const int largest_unit = layout.largest_unit;
  for (size_t u = 0; u < numel.size(); ++u) {
    homes_[u].numel = numel[u];
    homes_[u].bytes = static_cast<size_t>(numel[u]) * dtype_size(dtype);
    homes_[u].nvme = layout.nvme[u];
  }
  if (largest_unit >= 0) {
    const int64_t need = homes_[largest_unit].numel;
    if (config.buffer_size < need)
      user_error(
          "zero_optimization.offload_param.buffer_size is {} elements, but the parameter "
          "partition of unit '{}' has {}: a buffer must hold the largest partition; raise "
          "buffer_size to at least {}",
          config.buffer_size, names[largest_unit], need, need);
    if (config.buffer_count < 1)
      user_error("zero_optimization.offload_param.buffer_count must be >= 1, got {}",
                 config.buffer_count);
    offload::NvmeConfig nc;
    nc.paths = {config.nvme_path};
    nc.aio = config.aio;
    store_ = std::make_unique<offload::NvmeStore>(nc);
    buffer_bytes_ = static_cast<size_t>(layout.buffer_bytes);
    buffers_.resize(static_cast<size_t>(layout.buffer_count));
    for (Buffer& b : buffers_)
      b.block = host_alloc_->allocate(buffer_bytes_, offload::Category::Param);
  }
  for (Home& h : homes_) {
    if (h.numel == 0) continue;
    h.block = h.nvme ? store_->allocate(h.bytes, offload::Category::Param)
                     : host_alloc_->allocate(h.bytes, offload::Category::Param);
  }
}

ParamTier::~ParamTier() {
  for (Buffer& b : buffers_) {
    if (b.io.valid()) {
      try {
        b.io.wait();
      } catch (...) {  // an I/O error was raised to the caller already, or nobody waits now
      }
    }
  }
  for (Home& h : homes_) {
    if (h.numel == 0) continue;
    if (h.nvme) {
      store_->deallocate(h.block);
    } else {
      host_alloc_->deallocate(h.block);
    }
  }
  for (Buffer& b : buffers_) host_alloc_->deallocate(b.block);
}

int ParamTier::find(int u, BufState s) const {
  for (size_t i = 0; i < buffers_.size(); ++i)
    if (buffers_[i].unit == u && buffers_[i].state == s) return static_cast<int>(i);
  return -1;
}

void ParamTier::finish_write(Buffer& b) {
  b.io.wait();
  b.io = {};
  b.state = BufState::Free;
  b.unit = -1;
}

void ParamTier::poll_writes() {
  for (Buffer& b : buffers_)
    if (b.state == BufState::Writing && b.io.poll()) {
      b.io = {};
      b.state = BufState::Free;
      b.unit = -1;
    }
}

void ParamTier::drop(int i) {
  Buffer& b = buffers_[i];
  if (b.state == BufState::Reading || b.state == BufState::Writing) b.io.wait();
  b.io = {};
  b.state = BufState::Free;
  b.unit = -1;
  b.ahead = false;
}

int ParamTier::take_buffer() {
  poll_writes();
  for (size_t i = 0; i < buffers_.size(); ++i)
    if (buffers_[i].state == BufState::Free) return static_cast<int>(i);
  // Note [Parameter read-ahead]: read-ahead leaves a buffer for this, so writes hold it.
  for (size_t i = 0; i < buffers_.size(); ++i)
    if (buffers_[i].state == BufState::Writing) {
      finish_write(buffers_[i]);
      return static_cast<int>(i);
    }
  // buffer_count 1 with a read-ahead copy, or read-ahead outrunning: drop one.
  for (size_t i = 0; i < buffers_.size(); ++i)
    if (buffers_[i].ahead) {
      drop(static_cast<int>(i));
      return static_cast<int>(i);
    }
  STRATA_CHECK(false, "no parameter buffer can be freed ({} buffers)", buffers_.size());
  return -1;
}

void ParamTier::start_read(int i, int u, bool ahead) {
  Buffer& b = buffers_[i];
  b.io = store_->read(homes_[u].block, b.block.ptr, homes_[u].bytes);
  b.state = BufState::Reading;
  b.unit = u;
  b.ahead = ahead;
  ++reads_;
}

void ParamTier::load(int u, tensor::Tensor& dst) {
  const Home& h = homes_[u];
  STRATA_CHECK(h.numel > 0 && dst.numel() == h.numel && dst.dtype() == dtype_,
               "loading unit {}'s partition ({} elements) into {}", u, h.numel, dst.str());
  if (!h.nvme) {
    dst.copy_(host_view(h.block, h.numel, dtype_));
    return;
  }
  Stopwatch waited;
  int i = find(u, BufState::Landed);
  if (i < 0) i = find(u, BufState::Reading);
  double* charged = nullptr;
  if (i >= 0) {
    ++ahead_hits_;
    if (buffers_[i].state == BufState::Reading) {
      ++waits_.late;
      charged = &waits_.late_s;
    }
  } else {
    ++waits_.misses;
    charged = &waits_.miss_s;
    const int w = find(u, BufState::Writing);  // the read must not overtake the write
    if (w >= 0) finish_write(buffers_[w]);
    i = take_buffer();
    start_read(i, u, false);
  }
  Buffer& b = buffers_[i];
  if (b.state == BufState::Reading) b.io.wait();
  const double w = waited.seconds();
  wait_s_ += w;
  if (charged != nullptr) *charged += w;
  b.io = {};
  dst.copy_(host_view(b.block, h.numel, dtype_));  // synchronous: the buffer is free after it
  b.state = BufState::Free;
  b.unit = -1;
  b.ahead = false;
}

void ParamTier::store(int u, const tensor::Tensor& src) {
  const Home& h = homes_[u];
  STRATA_CHECK(h.numel > 0 && src.numel() == h.numel && src.dtype() == dtype_,
               "storing {} as unit {}'s partition ({} elements)", src.str(), u, h.numel);
  if (!h.nvme) {
    host_view(h.block, h.numel, dtype_).copy_(src);
    return;
  }
  // A read-ahead copy of this unit holds the bytes before the update: stale now.
  for (int s : {find(u, BufState::Landed), find(u, BufState::Reading)})
    if (s >= 0) drop(s);
  Stopwatch waited;
  const int w = find(u, BufState::Writing);
  if (w >= 0) finish_write(buffers_[w]);  // writes of one unit land in order
  const int i = take_buffer();
  wait_s_ += waited.seconds();
  waits_.store_s += waited.seconds();
  Buffer& b = buffers_[i];
  host_view(b.block, h.numel, dtype_).copy_(src);  // synchronous (a D2H copy waits)
  b.io = store_->write(h.block, b.block.ptr, h.bytes);
  b.state = BufState::Writing;
  b.unit = u;
  b.ahead = false;
}

void ParamTier::read_ahead(const std::vector<int>& order, size_t from) {
  if (!read_ahead_ || buffers_.size() < 2) return;
  poll_writes();
  size_t ahead = 0;
  for (const Buffer& b : buffers_)
    if (b.ahead) ++ahead;
  for (size_t k = from; k < order.size() && ahead + 1 < buffers_.size(); ++k) {
    const int u = order[k];
    if (!holds(u) || !homes_[u].nvme) continue;
    if (find(u, BufState::Reading) >= 0 || find(u, BufState::Landed) >= 0) continue;
    if (find(u, BufState::Writing) >= 0) break;  // would overtake the write: later
    int free = -1;
    for (size_t i = 0; i < buffers_.size(); ++i)
      if (buffers_[i].state == BufState::Free) {
        free = static_cast<int>(i);
        break;
      }
    if (free < 0) break;
    start_read(free, u, true);
    ++ahead;
  }
  // Reads that landed are marked so, without waiting.
  for (Buffer& b : buffers_)
    if (b.state == BufState::Reading && b.io.poll()) b.state = BufState::Landed;
}

void ParamTier::wait_all() {
  for (Buffer& b : buffers_) {
    if (b.state == BufState::Writing) finish_write(b);
    if (b.state == BufState::Reading) {
      b.io.wait();
      b.state = BufState::Landed;
    }
  }
}

int64_t ParamTier::nvme_bytes() const {
  int64_t n = 0;
  for (const Home& h : homes_)
    if (h.nvme) n += static_cast<int64_t>(h.bytes);
  return n;
}

std::vector<std::string> ParamTier::files() const {
  return store_ ? store_->files() : std::vector<std::string>{};
}

}  // namespace strata::parallel
