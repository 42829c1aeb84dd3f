#include "parallel/param_tier.h"

#include <algorithm>

#include "core/error.h"
#include "core/timer.h"
#include "offload/memory_stats.h"
#include "offload/nvme_store.h"
#include "offload/pinned_allocator.h"
#include "tensor/cuda.h"

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
  // A pinned buffer of at least one huge page is rounded up to whole ones, so that the pinned
  // pool maps it on huge pages (Note [Pinned buffers on huge pages]): reads into it take a
  // fraction of the CPU that 4 KiB pages take, and this CPU is the compute's.
  constexpr int64_t kHuge = static_cast<int64_t>(offload::PinnedAllocator::kHugePage);
  if (config.pin_memory && out.buffer_bytes >= kHuge)
    out.buffer_bytes = (out.buffer_bytes + kHuge - 1) / kHuge * kHuge;
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
  if (copies_) {
    try {
      copies_->synchronize();  // nothing may still read a buffer or home that goes now
    } catch (...) {            // a device error was raised to the caller already
    }
  }
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

int ParamTier::find_any(int u) const {
  for (size_t i = 0; i < buffers_.size(); ++i)
    if (buffers_[i].unit == u && buffers_[i].state != BufState::Free) return static_cast<int>(i);
  return -1;
}

// Note [Parameter read-ahead]: a finished write leaves the buffer holding the unit's home bytes.
void ParamTier::finish_write(Buffer& b) {
  b.io.wait();
  b.io = {};
  b.state = BufState::Landed;
  b.ahead = false;
}

void ParamTier::poll() {
  for (Buffer& b : buffers_) {
    if ((b.state == BufState::Writing || b.state == BufState::Reading) && b.io.poll()) {
      if (b.state == BufState::Writing) b.ahead = false;
      b.io = {};
      b.state = BufState::Landed;
    }
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

int ParamTier::free_or_spare() const {
  for (size_t i = 0; i < buffers_.size(); ++i)
    if (buffers_[i].state == BufState::Free) return static_cast<int>(i);
  for (size_t i = 0; i < buffers_.size(); ++i)
    if (buffers_[i].state == BufState::Landed && !buffers_[i].ahead) return static_cast<int>(i);
  return -1;
}

int ParamTier::take_buffer() {
  poll();
  int i = free_or_spare();
  if (i < 0) {
    // Note [Parameter read-ahead]: read-ahead leaves a buffer for this, so writes hold it.
    for (size_t k = 0; k < buffers_.size() && i < 0; ++k)
      if (buffers_[k].state == BufState::Writing) i = static_cast<int>(k);
  }
  // Then a read ahead that left the window, and last a copy in the window (buffer_count 1, or
  // every other buffer written to): dropping it costs a read again, never a wrong byte.
  for (size_t k = 0; k < buffers_.size() && i < 0; ++k)
    if (!buffers_[k].ahead) i = static_cast<int>(k);
  if (i < 0 && !buffers_.empty()) i = 0;
  STRATA_CHECK(i >= 0, "no parameter buffer can be freed ({} buffers)", buffers_.size());
  drop(i);
  return i;
}

offload::CopyStream& ParamTier::copies(const Device& device) {
  if (!copies_) copies_ = std::make_unique<offload::CopyStream>(device.is_cuda());
  STRATA_CHECK(copies_->cuda() == device.is_cuda(), "a parameter tier serves one device, not {}",
               device.str());
  return *copies_;
}

// Note [Tier copies]: the copy stream waits for the compute stream first, since dst may be
// memory the compute stream used until now (the caching allocator hands it on in stream order).
void ParamTier::to_device(tensor::Tensor& dst, const void* host, size_t bytes) {
  STRATA_CHECK(dst.is_contiguous(), "loading a partition into {}", dst.str());
  offload::CopyStream& c = copies(dst.device());
  if (c.cuda()) c.wait_for(tensor::cuda_current_stream());
  c.to_device(dst.data_ptr(), host, bytes);
}

// The device bytes are the result of the compute stream's work (the update): the copy waits for
// it; the host waits for the copy, since its caller writes the bytes or releases src next.
void ParamTier::to_host(void* host, const tensor::Tensor& src, size_t bytes) {
  STRATA_CHECK(src.is_contiguous(), "storing a partition from {}", src.str());
  offload::CopyStream& c = copies(src.device());
  if (c.cuda()) c.wait_for(tensor::cuda_current_stream());
  c.to_host(host, src.data_ptr(), bytes);
  c.synchronize();
}

void ParamTier::order_before_compute() {
  if (async_copies()) copies_->order_before(tensor::cuda_current_stream());
}

void ParamTier::start_read(int i, int u, bool ahead) {
  Buffer& b = buffers_[i];
  b.copied.wait();  // a copy to the device still reads the buffer
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
    to_device(dst, h.block.ptr, h.bytes);  // a store of the home is ordered after it
    return;
  }
  Stopwatch waited;
  poll();
  int i = find_any(u);
  double* charged = nullptr;
  if (i >= 0) {
    ++ahead_hits_;
    if (buffers_[i].state != BufState::Landed) {
      ++waits_.late;
      charged = &waits_.late_s;
    }
  } else {
    ++waits_.misses;
    charged = &waits_.miss_s;
    i = take_buffer();
    start_read(i, u, false);
  }
  Buffer& b = buffers_[i];
  // A read in flight lands; a write in flight (the read would overtake it) completes, and its
  // buffer holds the bytes.
  if (b.state == BufState::Reading || b.state == BufState::Writing) b.io.wait();
  b.io = {};
  b.state = BufState::Landed;
  b.ahead = false;
  const double w = waited.seconds();
  wait_s_ += w;
  if (charged != nullptr) *charged += w;
  to_device(dst, b.block.ptr, h.bytes);  // the buffer keeps its copy
  b.copied.record(*copies_);
}

void ParamTier::store(int u, const tensor::Tensor& src) {
  const Home& h = homes_[u];
  STRATA_CHECK(h.numel > 0 && src.numel() == h.numel && src.dtype() == dtype_,
               "storing {} as unit {}'s partition ({} elements)", src.str(), u, h.numel);
  if (!h.nvme) {
    to_host(h.block.ptr, src, h.bytes);
    return;
  }
  Stopwatch waited;
  // A copy of this unit (read ahead, or kept from a load) holds the bytes before the update:
  // stale now. Its buffer takes the write; a write of the unit in flight completes first, so
  // writes of one unit land in order.
  int i = find_any(u);
  if (i >= 0) {
    drop(i);
  } else {
    i = take_buffer();
  }
  const double w = waited.seconds();
  wait_s_ += w;
  waits_.store_s += w;
  Buffer& b = buffers_[i];
  b.copied.wait();
  to_host(b.block.ptr, src, h.bytes);
  b.io = store_->write(h.block, b.block.ptr, h.bytes);
  b.state = BufState::Writing;
  b.unit = u;
  b.ahead = false;
}

void ParamTier::read_ahead(const std::vector<int>& order, size_t from) {
  if (!read_ahead_ || buffers_.size() < 2) return;
  poll();
  // The window: the next buffer_count - 1 distinct units on NVMe. Copies of units outside it
  // become spare (the first a demand load or a read takes); one buffer is always spare or
  // writing, for a demand load or a write-back.
  std::vector<int> window;
  for (size_t k = from; k < order.size() && window.size() + 1 < buffers_.size(); ++k) {
    const int u = order[k];
    if (!holds(u) || !homes_[u].nvme) continue;
    if (std::find(window.begin(), window.end(), u) != window.end()) continue;
    window.push_back(u);
  }
  for (Buffer& b : buffers_)
    if (b.state == BufState::Landed || b.state == BufState::Reading)
      b.ahead = std::find(window.begin(), window.end(), b.unit) != window.end();
  for (const int u : window) {
    if (find_any(u) >= 0) continue;  // read or landed; a write in flight lands as its copy
    const int i = free_or_spare();
    if (i < 0) break;
    drop(i);
    start_read(i, u, true);
  }
}

void ParamTier::wait_all() {
  for (Buffer& b : buffers_) {
    if (b.state == BufState::Writing) finish_write(b);
    if (b.state == BufState::Reading) {
      b.io.wait();
      b.io = {};
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
