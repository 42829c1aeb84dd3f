#include "offload/gpu_allocator.h"

#include <algorithm>

#include "core/error.h"

namespace strata::offload {

struct GpuCachingAllocator::BlockInfo {
  char* ptr = nullptr;
  size_t size = 0;       // rounded, what the block spans
  size_t requested = 0;  // what the caller asked for (charged to MemoryStats)
  Category category = Category::Workspace;
  StreamHandle stream = nullptr;
  bool small = false;
  bool allocated = false;
  BlockInfo* prev = nullptr;  // neighbours inside the same raw segment
  BlockInfo* next = nullptr;
  std::vector<StreamHandle> other_streams;  // record_stream()
};

bool GpuCachingAllocator::BySizeThenAddress::operator()(const BlockInfo* a,
                                                        const BlockInfo* b) const {
  return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
}

GpuCachingAllocator::GpuCachingAllocator(std::unique_ptr<DeviceMemoryApi> api, MemoryStats* stats)
    : api_(std::move(api)), stats_(stats) {
  STRATA_CHECK(api_ != nullptr, "GpuCachingAllocator needs a DeviceMemoryApi");
}

GpuCachingAllocator::~GpuCachingAllocator() {
  // Live blocks may still be referenced by tensors that outlive us (process exit); only what is
  // cached is returned.
  try {
    release_cache();
  } catch (...) {
  }
}

size_t GpuCachingAllocator::round_size(size_t bytes) {
  if (bytes == 0) return kRound;
  return (bytes + kRound - 1) / kRound * kRound;
}

size_t GpuCachingAllocator::segment_size(size_t rounded) {
  if (rounded <= kSmallRequest) return kSmallSegment;
  if (rounded <= kMediumRequest) return kMediumSegment;
  return (rounded + kLargeGranule - 1) / kLargeGranule * kLargeGranule;
}

Block GpuCachingAllocator::allocate(size_t bytes, Category category, StreamHandle stream) {
  const size_t rounded = round_size(bytes);
  const bool small = rounded <= kSmallRequest;
  std::lock_guard<std::mutex> lock(mu_);
  process_events();
  BlockInfo* b = take_free(small, stream, rounded);
  if (b != nullptr) {
    ++counters_.cache_hits;
  } else {
    b = new_segment(small, stream, rounded, category);
  }
  split(b, rounded);
  b->allocated = true;
  b->requested = bytes;
  b->category = category;
  live_[b->ptr] = b;
  allocated_ += b->size;
  if (poison_) api_->fill(b->ptr, b->size, kPoisonByte, stream);
  stats_->on_alloc(Tier::Gpu, category, static_cast<int64_t>(bytes));
  return {b->ptr, bytes, category};
}

GpuCachingAllocator::BlockInfo* GpuCachingAllocator::take_free(bool small, StreamHandle stream,
                                                               size_t rounded) {
  auto pool = free_.find({small, stream});
  if (pool == free_.end()) return nullptr;
  BlockInfo key;
  key.size = rounded;
  key.ptr = nullptr;
  auto it = pool->second.lower_bound(&key);
  if (it == pool->second.end()) return nullptr;
  BlockInfo* b = *it;
  pool->second.erase(it);
  return b;
}

GpuCachingAllocator::BlockInfo* GpuCachingAllocator::new_segment(bool small, StreamHandle stream,
                                                                 size_t rounded,
                                                                 Category category) {
  const size_t seg = segment_size(rounded);
  void* p = api_->raw_malloc(seg);
  if (p == nullptr) {
    // Note [GPU caching allocator]: give back what is cached, then try once more.
    ++counters_.oom_retries;
    api_->synchronize_device();
    process_events();
    release_free_segments();
    p = api_->raw_malloc(seg);
  }
  if (p == nullptr) {
    user_error(
        "out of GPU memory allocating {:.1f} MiB for {} (in use {:.1f} MiB, reserved {:.1f} MiB "
        "after releasing the cache); lower micro_batch_size or seq_len, enable activation "
        "checkpointing, or use a ZeRO stage / offload that keeps less on the GPU",
        static_cast<double>(rounded) / 1048576.0, category_name(category),
        static_cast<double>(allocated_) / 1048576.0, static_cast<double>(reserved_) / 1048576.0);
  }
  ++counters_.raw_mallocs;
  reserved_ += seg;
  BlockInfo* b;
  if (!spare_infos_.empty()) {
    b = spare_infos_.back();
    spare_infos_.pop_back();
    *b = BlockInfo{};
  } else {
    storage_.push_back(std::make_unique<BlockInfo>());
    b = storage_.back().get();
  }
  b->ptr = static_cast<char*>(p);
  b->size = seg;
  b->stream = stream;
  b->small = small;
  return b;
}

void GpuCachingAllocator::split(BlockInfo* b, size_t rounded) {
  const size_t rest = b->size - rounded;
  const bool worth = b->small ? rest >= kRound : rest > kSmallRequest;
  if (!worth) return;
  BlockInfo* r;
  if (!spare_infos_.empty()) {
    r = spare_infos_.back();
    spare_infos_.pop_back();
    *r = BlockInfo{};
  } else {
    storage_.push_back(std::make_unique<BlockInfo>());
    r = storage_.back().get();
  }
  r->ptr = b->ptr + rounded;
  r->size = rest;
  r->stream = b->stream;
  r->small = b->small;
  r->prev = b;
  r->next = b->next;
  if (b->next) b->next->prev = r;
  b->next = r;
  b->size = rounded;
  free_[{r->small, r->stream}].insert(r);
}

void GpuCachingAllocator::deallocate(const Block& block) {
  if (block.ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(block.ptr);
  STRATA_CHECK(it != live_.end(), "GPU free of {} which this allocator did not hand out",
               block.ptr);
  BlockInfo* b = it->second;
  live_.erase(it);
  stats_->on_free(Tier::Gpu, b->category, static_cast<int64_t>(b->requested));
  allocated_ -= b->size;
  b->allocated = false;
  if (!b->other_streams.empty()) {
    Pending p{b, {}};
    for (StreamHandle s : b->other_streams) p.events.push_back(api_->record_event(s));
    b->other_streams.clear();
    pending_.push_back(std::move(p));
    return;
  }
  free_block(b);
}

void GpuCachingAllocator::free_block(BlockInfo* b) {
  FreeSet& pool = free_[{b->small, b->stream}];
  auto absorb = [&](BlockInfo* keep, BlockInfo* gone) {  // gone lies right after keep
    keep->size += gone->size;
    keep->next = gone->next;
    if (gone->next) gone->next->prev = keep;
    spare_infos_.push_back(gone);
  };
  if (b->next && !b->next->allocated && !is_pending(b->next)) {
    pool.erase(b->next);
    absorb(b, b->next);
  }
  if (b->prev && !b->prev->allocated && !is_pending(b->prev)) {
    BlockInfo* p = b->prev;
    pool.erase(p);
    absorb(p, b);
    b = p;
  }
  pool.insert(b);
}

bool GpuCachingAllocator::is_pending(const BlockInfo* b) const {
  for (const Pending& p : pending_)
    if (p.block == b) return true;
  return false;
}

void GpuCachingAllocator::process_events() {
  for (size_t i = 0; i < pending_.size();) {
    Pending& p = pending_[i];
    bool done = true;
    for (EventHandle e : p.events) done = done && api_->event_completed(e);
    if (!done) {
      ++i;
      continue;
    }
    for (EventHandle e : p.events) api_->destroy_event(e);
    BlockInfo* b = p.block;
    pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    free_block(b);
  }
}

void GpuCachingAllocator::release_free_segments() {
  for (auto& [key, pool] : free_) {
    for (auto it = pool.begin(); it != pool.end();) {
      BlockInfo* b = *it;
      if (b->prev == nullptr && b->next == nullptr) {
        api_->raw_free(b->ptr);
        ++counters_.raw_frees;
        reserved_ -= b->size;
        spare_infos_.push_back(b);
        it = pool.erase(it);
      } else {
        ++it;
      }
    }
  }
}

void GpuCachingAllocator::record_stream(void* ptr, StreamHandle stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  STRATA_CHECK(it != live_.end(), "record_stream on {} which is not a live GPU block", ptr);
  BlockInfo* b = it->second;
  if (stream == b->stream) return;
  if (std::find(b->other_streams.begin(), b->other_streams.end(), stream) == b->other_streams.end())
    b->other_streams.push_back(stream);
}

void GpuCachingAllocator::release_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!pending_.empty()) api_->synchronize_device();
  process_events();
  release_free_segments();
}

size_t GpuCachingAllocator::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reserved_;
}

size_t GpuCachingAllocator::allocated_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocated_;
}

GpuAllocatorCounters GpuCachingAllocator::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

}  // namespace strata::offload
