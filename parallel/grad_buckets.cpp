#include "parallel/grad_buckets.h"

#include <fmt/format.h>

#include <deque>

#include "offload/memory_stats.h"
#include "tensor/ops.h"

namespace strata::parallel {

struct GradReducer::State {
  struct Bucket {
    BucketPlan plan;
    int64_t pending = 0;  // parameters still to become final in this pass
    bool launched = false;
    tensor::Tensor staging;
    comm::WorkHandle work;
  };

  std::vector<models::FlatUnit>* units = nullptr;
  std::vector<UnitReduction> setup;
  comm::Communicator* dp = nullptr;
  std::vector<BucketPlan> plans;
  std::vector<Bucket> buckets;
  std::vector<std::vector<std::vector<int>>> param_buckets;  // [unit][param] -> bucket ids
  std::vector<std::vector<int>> unit_buckets;                // [unit] -> bucket ids
  std::vector<int64_t> unit_pending;                         // parameters not final yet
  std::vector<bool> unit_done;
  bool reducing = false;
  bool synchronous = false;
  int64_t bucket_size = 0;
  std::deque<int> inflight;  // buckets with a staging buffer, in launch order
  int64_t staged = 0;        // elements of their staging buffers
  std::function<void(int)> on_unit_done;
  std::function<void(const std::string&)> trace;

  bool reduces(int u) const { return reducing || setup[u].kind == Reduction::IntoPartition; }

  void ensure_full_grads(int u) {
    if (setup[u].kind != Reduction::IntoPartition) return;
    tensor::Tensor& g = (*units)[u].grads;
    if (!g.storage()->is_released()) return;
    g.storage()->materialize(offload::Category::Comm);
    g.zero_();
  }

  void release_full_grads(int u) {
    if (setup[u].kind != Reduction::IntoPartition) return;
    (*units)[u].grads.storage()->release();
  }

  void launch(int id) {
    Bucket& b = buckets[id];
    // The previous micro-batch's reduction of this bucket (and, in order, those before it).
    while (b.work && !inflight.empty()) pop_inflight();
    wait(b);
    b.launched = true;
    const int u = b.plan.unit;
    models::FlatUnit& unit = (*units)[u];
    const UnitReduction& s = setup[u];
    const Range r = b.plan.per_rank;
    if (trace) trace(fmt::format("reduce {} [{}, {})", unit.name, r.begin, r.end));
    if (s.kind == Reduction::Allreduce) {
      b.work = dp->allreduce(unit.grads.narrow(0, r.begin, r.size()));
      if (synchronous) wait(b);
      return;
    }
    ensure_full_grads(u);
    const int64_t n = r.size();
    const int nd = s.part.dp;
    {
      offload::CategoryScope scope(offload::Category::Comm);
      b.staging = tensor::Tensor::empty({n * nd}, unit.grads.dtype(), unit.grads.device());
    }
    for (int q = 0; q < nd; ++q)
      b.staging.narrow(0, q * n, n).copy_(unit.grads.narrow(0, q * s.part.shard + r.begin, n));
    tensor::Tensor out;
    if (s.kind == Reduction::IntoOwnedSlice) {
      out = unit.grads.narrow(0, dp->rank() * s.part.shard + r.begin, n);
    } else {
      out = s.partition_grad.narrow(0, r.begin, n);
      tensor::Tensor own = b.staging.narrow(0, dp->rank() * n, n);
      tensor::axpy_(1.f, out, own);  // accumulate over micro-batches (Note [Transient gradients])
    }
    b.work = dp->reduce_scatter(b.staging, out);
    if (synchronous) {
      wait(b);
    } else {
      staged += b.staging.numel();
      inflight.push_back(id);
      bound_staging();
    }
  }

  // Staging buffers hold a copy of what they reduce until it is done: free those of finished
  // reductions, and wait for the oldest while more than two buckets' worth are in flight, so the
  // Comm bytes stay about 2 x reduce_bucket_size (plus the unit in backward) instead of growing
  // to the whole model's gradients by the end of backward.
  void bound_staging() {
    while (!inflight.empty()) {
      Bucket& front = buckets[inflight.front()];
      const bool done = !front.work || front.work->done();
      if (!done && staged <= 2 * bucket_size) break;
      pop_inflight();
    }
  }

  void pop_inflight() {
    Bucket& front = buckets[inflight.front()];
    staged -= front.staging.numel();
    wait(front);
    inflight.pop_front();
  }

  static void wait(Bucket& b) {
    if (!b.work) return;
    b.work->wait();
    b.work.reset();
    b.staging = {};
  }

  void finish_unit(int u) {
    if (unit_done[u]) return;
    unit_done[u] = true;
    // Buckets over padding alone have no parameter to wait for.
    for (int id : unit_buckets[u])
      if (!buckets[id].launched) launch(id);
    release_full_grads(u);
    if (on_unit_done) on_unit_done(u);
  }

  void on_grad_ready(int u, int k) {
    if (!reduces(u) || unit_done[u]) return;
    for (int id : param_buckets[u][k])
      if (--buckets[id].pending == 0) launch(id);
    if (--unit_pending[u] == 0) finish_unit(u);
  }
};

GradReducer::GradReducer(std::vector<models::FlatUnit>& units, std::vector<UnitReduction> setup,
                         comm::Communicator& dp, int64_t bucket_size)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  STRATA_CHECK(setup.size() == units.size(), "{} reductions for {} units", setup.size(),
               units.size());
  s.units = &units;
  s.setup = std::move(setup);
  s.dp = &dp;
  s.bucket_size = bucket_size;
  s.param_buckets.resize(units.size());
  s.unit_buckets.resize(units.size());
  s.unit_pending.assign(units.size(), 0);
  s.unit_done.assign(units.size(), true);
  for (size_t u = 0; u < units.size(); ++u) {
    const int ui = static_cast<int>(u);
    std::vector<BucketPlan> plans =
        s.setup[u].kind == Reduction::Allreduce
            ? plan_allreduce_buckets(units[u], ui, bucket_size)
            : plan_reduce_scatter_buckets(units[u], ui, s.setup[u].part, bucket_size);
    s.param_buckets[u].resize(units[u].variables.size());
    for (BucketPlan& p : plans) {
      const int id = static_cast<int>(s.buckets.size());
      for (int k : p.params) s.param_buckets[u][k].push_back(id);
      s.unit_buckets[u].push_back(id);
      s.plans.push_back(p);
      State::Bucket b;
      b.plan = std::move(p);
      s.buckets.push_back(std::move(b));
    }
  }
  std::weak_ptr<State> weak = state_;
  for (size_t u = 0; u < units.size(); ++u)
    for (size_t k = 0; k < units[u].variables.size(); ++k)
      units[u].variables[k].add_grad_ready_hook(
          [weak, u = static_cast<int>(u), k = static_cast<int>(k)](autograd::Variable&) {
            if (auto st = weak.lock()) st->on_grad_ready(u, k);
          });
}

GradReducer::~GradReducer() {
  // Outstanding collectives write into buffers the caller may free next.
  for (State::Bucket& b : state_->buckets)
    if (b.work) {
      try {
        b.work->wait();
      } catch (...) {  // a failed rank: nothing more to do here (Note [Failed ranks])
      }
    }
}

void GradReducer::begin_pass(bool reduce) {
  State& s = *state_;
  s.reducing = reduce;
  for (State::Bucket& b : s.buckets) {
    b.pending = static_cast<int64_t>(b.plan.params.size());
    b.launched = false;
  }
  for (size_t u = 0; u < s.units->size(); ++u) {
    s.unit_pending[u] = static_cast<int64_t>((*s.units)[u].variables.size());
    s.unit_done[u] = !s.reduces(static_cast<int>(u));
  }
}

void GradReducer::end_pass() {
  State& s = *state_;
  for (size_t u = 0; u < s.units->size(); ++u) s.finish_unit(static_cast<int>(u));
}

void GradReducer::ensure_full_grads(int unit) {
  state_->ensure_full_grads(unit);
}

void GradReducer::wait_all() {
  for (State::Bucket& b : state_->buckets) State::wait(b);
  state_->inflight.clear();
  state_->staged = 0;
}

void GradReducer::set_synchronous(bool on) {
  state_->synchronous = on;
}

void GradReducer::set_on_unit_done(std::function<void(int)> fn) {
  state_->on_unit_done = std::move(fn);
}

void GradReducer::set_trace(std::function<void(const std::string&)> fn) {
  state_->trace = std::move(fn);
}

const std::vector<BucketPlan>& GradReducer::plans() const {
  return state_->plans;
}

}  // namespace strata::parallel
