#include "parallel/param_gathering.h"

#include <fmt/format.h>

#include "offload/memory_stats.h"

namespace strata::parallel {

ParamGathering::ParamGathering(models::CausalLM& model, const Partitioning& parts,
                               comm::Communicator& dp, const ParamGatheringOptions& options)
    : units_(model.flat_units()), parts_(parts), dp_(dp), options_(options) {
  if (!options_.partition_params) return;
  STRATA_CHECK(parts_.partitioned(), "ZeRO-3 gathering needs partitioned units");
  std::vector<bool> managed(units_.size());
  for (size_t u = 0; u < units_.size(); ++u)
    managed[u] = parts_.unit(static_cast<int>(u)).numel >= options_.persistence_threshold;
  std::unique_ptr<ParamTier> tier;
  if (options_.offload_param.enabled()) {
    std::vector<int64_t> numel(units_.size(), 0);
    std::vector<std::string> names;
    for (size_t u = 0; u < units_.size(); ++u) {
      if (managed[u]) numel[u] = parts_.unit(static_cast<int>(u)).shard;
      names.push_back(units_[u].name);
    }
    tier = std::make_unique<ParamTier>(options_.offload_param, numel, names,
                                       units_.front().params.dtype());
  }
  gatherer_ = std::make_unique<ParamGatherer>(units_, std::move(managed), parts_.units(), dp_,
                                              options_.prefetch_size, std::move(tier));
  install_hooks(model);
}

ParamGathering::~ParamGathering() = default;

// Note [ZeRO-3 gathering]: hooks on every module that uses a managed unit.
void ParamGathering::install_hooks(models::CausalLM& model) {
  using models::nn::Module;
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
    if (!gatherer_->managed(u)) continue;
    for (Module* m : unit_modules(model, units_[u])) {
      hooks_.add(*m, m->register_forward_pre_hook(
                         [this, u](Module&, const auto&) { gatherer_->request(u); }));
      // A recompute (activation checkpointing) runs forward inside backward: keep the unit.
      hooks_.add(*m, m->register_forward_hook([this, u](Module&, const auto&, const auto&) {
        if (!in_backward_) gatherer_->release(u);
      }));
      hooks_.add(*m, m->register_backward_hook([this, u](Module&) { gatherer_->release(u); }));
      hooks_.add(*m, m->register_backward_pre_hook([this, u](Module&) { gatherer_->request(u); }));
    }
  }
}

tensor::Tensor ParamGathering::owned_params(int u) const {
  if (managed(u)) return gatherer_->partition(u);
  const Range own = parts_.owned(u);
  return units_[u].params.narrow(0, own.begin, own.size());
}

void ParamGathering::with_owned_params(int u, bool store,
                                       const std::function<void(const tensor::Tensor&)>& fn) {
  if (managed(u)) {
    gatherer_->with_partition(u, store, fn);
  } else {
    fn(owned_params(u));
  }
}

void ParamGathering::begin_pass(bool last) {
  if (gatherer_) gatherer_->begin_pass(/*record=*/true, last);
}

void ParamGathering::end_pass() {
  if (gatherer_) gatherer_->end_pass();
}

void ParamGathering::release_all() {
  if (gatherer_) gatherer_->release_all();
}

// Every rank updated its slice; make the units whole again. In place when a bucket is a whole
// slice (input = chunk rank() of the output), else through a staging buffer, at most two buckets
// in flight.
void ParamGathering::allgather_updated() {
  const int nd = dp_.size();
  if (!parts_.partitioned() || nd == 1) return;
  struct Pending {
    int unit;
    Range per_rank;
    tensor::Tensor staging;
    comm::WorkHandle work;
  };
  std::vector<Pending> pending;
  auto complete = [&](Pending& p) {
    p.work->wait();
    if (!p.staging.defined()) return;
    const int64_t n = p.per_rank.size();
    for (int q = 0; q < nd; ++q)
      units_[p.unit]
          .params.narrow(0, q * parts_.unit(p.unit).shard + p.per_rank.begin, n)
          .copy_(p.staging.narrow(0, q * n, n));
  };
  const int64_t per_rank_max = std::max<int64_t>(1, options_.allgather_bucket_size / nd);
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
    if (managed(u)) continue;
    const UnitPartition& p = parts_.unit(u);
    const Range own = parts_.owned(u);
    for (Range c : split_range(p.shard, per_rank_max)) {
      if (trace_) trace_(fmt::format("allgather {} [{}, {})", units_[u].name, c.begin, c.end));
      Pending next{u, c, {}, {}};
      tensor::Tensor input = units_[u].params.narrow(0, own.begin + c.begin, c.size());
      if (c.size() == p.shard) {
        next.work = dp_.allgather(input, units_[u].params);
      } else {
        offload::CategoryScope scope(offload::Category::Comm);
        next.staging = tensor::Tensor::empty({c.size() * nd}, input.dtype(), input.device());
        next.work = dp_.allgather(input, next.staging);
      }
      pending.push_back(std::move(next));
      if (pending.size() > 2) {
        complete(pending.front());
        pending.erase(pending.begin());
      }
    }
  }
  for (Pending& p : pending) complete(p);
}

void ParamGathering::for_each_gathered_unit(
    const std::function<void(const models::FlatUnit&)>& fn) {
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
    if (!managed(u)) {
      fn(units_[u]);
      continue;
    }
    const bool was_gathered = gatherer_->gathered(u);
    gatherer_->gather(u);
    fn(units_[u]);
    if (!was_gathered) gatherer_->release(u);
  }
}

int64_t ParamGathering::gathered_peak_bytes() const {
  return gatherer_ ? gatherer_->gathered_peak_bytes() : 0;
}

void ParamGathering::reset_gathered_peak() {
  if (gatherer_) gatherer_->reset_gathered_peak();
}

const std::vector<int>& ParamGathering::gather_order() const {
  static const std::vector<int> kNone;
  return gatherer_ ? gatherer_->order() : kNone;
}

int64_t ParamGathering::prefetches() const {
  return gatherer_ ? gatherer_->prefetches() : 0;
}

void ParamGathering::set_trace(std::function<void(const std::string&)> fn) {
  trace_ = fn;
  if (gatherer_) gatherer_->set_trace(std::move(fn));
}

}  // namespace strata::parallel
