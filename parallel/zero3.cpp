#include "parallel/zero3.h"

#include <algorithm>

#include "offload/memory_stats.h"

namespace strata::parallel {

ParamGatherer::ParamGatherer(std::vector<models::FlatUnit>& units, std::vector<bool> managed,
                             std::vector<UnitPartition> parts, comm::Communicator& dp,
                             int64_t prefetch_size, std::unique_ptr<ParamTier> tier)
    : units_(&units),
      managed_(std::move(managed)),
      parts_(std::move(parts)),
      dp_(&dp),
      prefetch_size_(prefetch_size),
      partition_(units.size()),
      state_(units.size(), State::Gathered),
      work_(units.size()),
      tier_(std::move(tier)) {
  STRATA_CHECK(managed_.size() == units.size() && parts_.size() == units.size(),
               "gatherer setup for {} units", units.size());
  for (size_t u = 0; u < units.size(); ++u) {
    if (!managed_[u]) continue;
    const UnitPartition& p = parts_[u];
    STRATA_CHECK(units[u].size() == p.padded, "unit '{}' is not padded for its partition",
                 units[u].name);
    const bool deferred = units[u].params.storage()->is_released();
    {
      offload::CategoryScope scope(offload::Category::Param);
      partition_[u] = deferred ? tensor::Tensor::empty_released({p.shard}, units[u].params.dtype(),
                                                                units[u].params.device())
                               : tensor::Tensor::empty({p.shard}, units[u].params.dtype(),
                                                       units[u].params.device());
    }
    if (deferred) {  // set_partition() fills it
      ++deferred_;
      state_[u] = State::Released;
      if (tier_) step_order_.push_back(static_cast<int>(u));
      continue;
    }
    partition_[u].copy_(units[u].params.narrow(0, p.owned(dp.rank()).begin, p.shard));
    units[u].params.storage()->release();
    state_[u] = State::Released;
    if (tier_) {
      STRATA_CHECK(tier_->holds(static_cast<int>(u)), "the tier does not hold unit '{}'",
                   units[u].name);
      tier_->store(static_cast<int>(u), partition_[u]);
      partition_[u].storage()->release();
      step_order_.push_back(static_cast<int>(u));
    }
  }
  if (tier_) tier_->wait_all();
}

void ParamGatherer::set_partition(int u, const tensor::Tensor& owned) {
  STRATA_CHECK(managed_[u] && deferred_ > 0 && partition_[u].storage()->is_released(),
               "set_partition of unit '{}', which has its partition", (*units_)[u].name);
  tensor::Storage& s = *partition_[u].storage();
  s.materialize(offload::Category::Param);
  partition_[u].copy_(owned);
  --deferred_;
  if (!tier_) return;
  STRATA_CHECK(tier_->holds(u), "the tier does not hold unit '{}'", (*units_)[u].name);
  tier_->store(u, partition_[u]);
  s.release();
}

void ParamGatherer::partitions_set() {
  STRATA_CHECK(deferred_ == 0, "{} partitions were never set", deferred_);
  if (tier_) tier_->wait_all();
}

ParamGatherer::~ParamGatherer() {
  for (comm::WorkHandle& w : work_)
    if (w) {
      try {
        w->wait();
      } catch (...) {  // Note [Failed ranks]: nothing more to do here
      }
    }
}

void ParamGatherer::load_partition(int u, bool order) {
  tensor::Storage& s = *partition_[u].storage();
  if (!tier_ || !s.is_released()) return;
  s.materialize(offload::Category::Param);
  tier_->load(u, partition_[u]);
  if (order) tier_->order_before_compute();
}

void ParamGatherer::load_partitions() {
  if (!tier_) return;
  for (int u : step_order_) load_partition(u);
}

void ParamGatherer::store_partitions() {
  if (!tier_) return;
  for (int u : step_order_) {
    tensor::Storage& s = *partition_[u].storage();
    if (s.is_released()) continue;
    tier_->store(u, partition_[u]);
    s.release();
  }
  tier_->wait_all();
}

void ParamGatherer::drop_partitions() {
  if (!tier_) return;
  for (int u : step_order_)
    if (state_[u] == State::Released) partition_[u].storage()->release();
}

void ParamGatherer::with_partition(int u, bool store,
                                   const std::function<void(const tensor::Tensor&)>& fn) {
  tensor::Storage& s = *partition_[u].storage();
  const bool from_tier = tier_ && s.is_released();
  if (from_tier) {
    const auto at = std::find(step_order_.begin(), step_order_.end(), u);
    tier_->read_ahead(step_order_, static_cast<size_t>(at - step_order_.begin()));
    load_partition(u);
  }
  try {
    fn(partition_[u]);
  } catch (...) {
    if (from_tier) s.release();  // the tier still holds what it held
    throw;
  }
  if (tier_ && store) tier_->store(u, partition_[u]);
  if (from_tier) s.release();
}

// Note [Offloaded partitions]: one unit at a time, the next ones read ahead.
void ParamGatherer::step_fence(size_t g, bool before) {
  const int u = static_cast<int>(g);
  if (!tier_ || !managed_[u]) return;
  const size_t at = static_cast<size_t>(std::find(step_order_.begin(), step_order_.end(), u) -
                                        step_order_.begin());
  if (before) {
    read_ahead(step_order_, at);
    load_partition(u);
    return;
  }
  tier_->store(u, partition_[u]);
  partition_[u].storage()->release();
  read_ahead(step_order_, at + 1);  // after the last unit: the next pass's first units
}

// Note [Parameter read-ahead]: the units to come are those of `seq` from `pos` on, then what
// follows it: after a pass, the step when it was the step's last micro-batch (else the next
// pass); after the step, the next pass. A unit gathered now is loaded again only for its use
// after the one it is gathered for.
void ParamGatherer::read_ahead(const std::vector<int>& seq, size_t pos) {
  if (!tier_ || tier_->buffer_count() < 2) return;
  const bool in_step = &seq == &step_order_;
  const std::vector<int>* parts[3] = {&seq, nullptr, nullptr};
  if (recorded_) {
    parts[1] = in_step ? &order_ : (last_pass_ ? &step_order_ : &order_);
    if (!in_step && last_pass_) parts[2] = &order_;
  }
  std::vector<int> next;
  std::vector<bool> in_use(state_.size());  // gathered (or in flight) for its next occurrence
  for (size_t w = 0; w < state_.size(); ++w) in_use[w] = state_[w] != State::Released;
  const size_t want = static_cast<size_t>(tier_->buffer_count());
  for (const std::vector<int>* p : parts) {
    if (p == nullptr) break;
    for (size_t k = (p == parts[0] ? pos : 0); k < p->size() && next.size() < want; ++k) {
      const int w = (*p)[k];
      if (!tier_->on_nvme(w)) continue;
      if (in_use[w]) {  // its partition was loaded for this use; the next one loads it again
        in_use[w] = false;
        continue;
      }
      if (std::find(next.begin(), next.end(), w) == next.end()) next.push_back(w);
    }
  }
  tier_->read_ahead(next, 0);
}

void ParamGatherer::start(int u) {
  STRATA_CHECK(deferred_ == 0, "unit '{}' gathered before every partition was set",
               (*units_)[u].name);
  models::FlatUnit& unit = (*units_)[u];
  load_partition(u);
  if (tier_) tier_->order_before_compute();  // a partition staged ahead arrived before this
  unit.params.storage()->materialize(offload::Category::Comm);
  gathered_bytes_ += static_cast<int64_t>(unit.params.nbytes());
  gathered_peak_ = std::max(gathered_peak_, gathered_bytes_);
  work_[u] = dp_->allgather(partition_[u], unit.params);
  state_[u] = State::InFlight;
  if (tier_ && work_[u]->done()) finish(u);  // Note [Offloaded partitions]: release it now
}

void ParamGatherer::finish(int u) {
  if (state_[u] != State::InFlight) return;
  work_[u]->wait();
  work_[u].reset();
  state_[u] = State::Gathered;
  if (tier_) partition_[u].storage()->release();  // the gathered unit holds its bytes
}

void ParamGatherer::gather(int u) {
  if (!managed_[u]) return;
  if (state_[u] == State::Released) {
    if (trace_) trace_("gather " + (*units_)[u].name);
    start(u);
  }
  finish(u);
}

void ParamGatherer::request(int u) {
  if (!managed_[u]) return;
  if (recording_) order_.push_back(u);
  // Where are we in the recorded order? Normally exactly at the cursor.
  size_t pos = order_.size();
  if (recorded_ && in_pass_)
    for (size_t i = cursor_; i < order_.size(); ++i)
      if (order_[i] == u) {
        pos = i;
        break;
      }
  // Note [Offloaded partitions]: prefetched allgathers that completed give their partitions
  // back, and reads of what follows go out before this one blocks.
  if (tier_) {
    for (size_t w = 0; w < state_.size(); ++w)
      if (state_[w] == State::InFlight && work_[w]->done()) finish(static_cast<int>(w));
    if (pos < order_.size()) read_ahead(order_, pos);  // this unit's read first
  }
  gather(u);
  if (pos == order_.size()) return;
  cursor_ = pos + 1;
  if (prefetch_size_ > 0) prefetch_after(cursor_, u);
}

void ParamGatherer::prefetch_after(size_t pos, int current) {
  // Units ahead that are already gathered or in flight count against the budget too, so the
  // look-ahead stays about stage3_prefetch_bucket_size elements however far the cursor moved.
  int64_t budget = prefetch_size_;
  bool loading = false;
  std::vector<bool> seen(state_.size(), false);
  seen[current] = true;
  for (size_t i = pos; i < order_.size() && budget > 0; ++i) {
    const int w = order_[i];
    if (seen[w]) continue;
    seen[w] = true;
    const int64_t n = parts_[w].padded;
    if (n > budget) break;
    budget -= n;
    if (state_[w] != State::Released) continue;
    // Note [Prefetch and the tier]: at most one unit whose partition comes from the tier.
    if (tier_ && partition_[w].storage()->is_released()) {
      if (loading) break;
      loading = true;
    }
    if (trace_) trace_("prefetch " + (*units_)[w].name);
    ++prefetches_;
    start(w);
  }
  if (tier_ && tier_->async_copies()) stage_after(pos, current);
}

// Note [Tier copies]: the next unit to be loaded after those the prefetch started is copied to
// the device now, and the compute stream is ordered after the copy only when the unit's
// allgather starts (start()), so the copy runs beside the compute enqueued until then.
void ParamGatherer::stage_after(size_t pos, int current) {
  for (size_t i = pos; i < order_.size(); ++i) {
    const int w = order_[i];
    if (w == current || state_[w] != State::Released) continue;
    if (partition_[w].storage()->is_released()) {
      if (trace_) trace_("stage " + (*units_)[w].name);
      load_partition(w, /*order=*/false);
    }
    return;
  }
}

void ParamGatherer::release(int u) {
  if (!managed_[u] || state_[u] == State::Released) return;
  finish(u);
  if (trace_) trace_("release " + (*units_)[u].name);
  models::FlatUnit& unit = (*units_)[u];
  unit.params.storage()->release();
  gathered_bytes_ -= static_cast<int64_t>(unit.params.nbytes());
  state_[u] = State::Released;
}

void ParamGatherer::release_all() {
  for (size_t u = 0; u < state_.size(); ++u) release(static_cast<int>(u));
}

void ParamGatherer::begin_pass(bool record, bool last) {
  in_pass_ = true;
  last_pass_ = last;
  cursor_ = 0;
  if (recorded_) read_ahead(order_, 0);
  if (record && !recorded_) {
    order_.clear();
    recording_ = true;
  }
}

void ParamGatherer::end_pass() {
  in_pass_ = false;
  if (recording_) {
    recording_ = false;
    recorded_ = true;
  }
}

}  // namespace strata::parallel
