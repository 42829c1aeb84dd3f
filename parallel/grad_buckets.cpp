#include "parallel/grad_buckets.h"

#include <fmt/format.h>

#include <deque>

#include "offload/copy_stream.h"
#include "offload/memory_stats.h"
#include "optim/grad_clip.h"
#include "tensor/cuda.h"
#include "tensor/host_tensor.h"
#include "tensor/ops.h"

namespace strata::parallel {

namespace {

// Note [Gradients on the NVMe tier]: partitions being written at once, besides the reducing one.
constexpr size_t kTierWritesInFlight = 2;

}  // namespace

struct GradReducer::State {
  struct Bucket {
    BucketPlan plan;
    int64_t pending = 0;  // parameters still to become final in this pass
    bool launched = false;
    tensor::Tensor staging;
    comm::WorkHandle work;
    bool to_host = false;  // its range goes to the host partition once reduced
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
  // Note [Gradients streamed to the host]
  std::unique_ptr<offload::CopyStream> copies;   // when some unit has a host partition
  std::vector<tensor::Tensor> device_partition;  // [unit]: transient, while its buckets reduce
  std::vector<size_t> buckets_in;                // [unit]: buckets copied out in this pass
  std::vector<double> sum_squares;               // [unit]: of the last pass
  std::vector<std::vector<Range>> norm_pieces;   // [unit]: empty for the whole partition
  std::vector<std::vector<double>> piece_sums;   // [unit]: of the last pass, per norm piece
  std::vector<float> last_pass_scales;
  // [unit]: its host (or NVMe) partition holds earlier micro-batches of this step.
  std::vector<bool> accumulated;
  std::vector<bool> in_pass;  // [unit]: the running pass's backward goes through it
  // Note [Gradients on the NVMe tier]
  optim::NvmeAdamW* nvme = nullptr;
  struct TierWrite {
    tensor::Tensor source;  // host bytes the write reads until it completes
    std::vector<offload::IoHandle> io;
  };
  std::deque<TierWrite> tier_writes;

  bool reduces(int u) const { return reducing || setup[u].kind == Reduction::IntoPartition; }
  bool on_host(int u) const { return setup[u].host_partition.defined(); }
  bool on_nvme(int u) const { return setup[u].on_nvme; }
  // Its partition lives off the device: a transient device partition while it reduces.
  bool off_device(int u) const { return on_host(u) || on_nvme(u); }
  void* compute_stream() const { return copies->cuda() ? tensor::cuda_current_stream() : nullptr; }

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
      out = off_device(u) ? device_range(u, r) : s.partition_grad.narrow(0, r.begin, n);
      tensor::Tensor own = b.staging.narrow(0, dp->rank() * n, n);
      tensor::axpy_(1.f, out, own);  // accumulate over micro-batches (Note [Transient gradients])
      b.to_host = off_device(u);
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

  // Note [Gradients streamed to the host]: range r of unit u's transient device partition,
  // holding what the host partition holds there (zeros on the step's first micro-batch).
  tensor::Tensor device_range(int u, Range r) {
    tensor::Tensor& dev = device_partition[u];
    const tensor::Tensor& host = setup[u].host_partition;
    if (!dev.defined()) {
      offload::CategoryScope scope(offload::Category::Comm);
      dev = tensor::Tensor::empty({setup[u].part.shard}, (*units)[u].grads.dtype(),
                                  (*units)[u].grads.device());
      if (accumulated[u] && on_nvme(u)) read_back(u, dev);
    }
    tensor::Tensor out = dev.narrow(0, r.begin, r.size());
    if (!accumulated[u]) {
      out.zero_();
      return out;
    }
    if (on_nvme(u)) return out;  // read back whole above
    const tensor::Tensor from = host.narrow(0, r.begin, r.size());
    copies->wait_for(compute_stream());  // the buffer's memory may have had earlier uses
    copies->to_device(out.data_ptr(), from.data_ptr(), from.nbytes());
    copies->order_before(compute_stream());
    return out;
  }

  // Note [Gradients on the NVMe tier]: what unit u's partition held after the step's earlier
  // micro-batches, into the transient `dev`.
  void read_back(int u, const tensor::Tensor& dev) {
    STRATA_CHECK(nvme != nullptr, "unit {}: gradients on NVMe without a store", u);
    if (dev.device().is_cpu()) {
      nvme->read_grads(static_cast<size_t>(u), dev.data_ptr());
      return;
    }
    const tensor::Tensor host =
        tensor::empty_host(dev.shape(), dev.dtype(), offload::Category::Comm, /*pinned=*/true);
    nvme->read_grads(static_cast<size_t>(u), host.data_ptr());
    copies->wait_for(compute_stream());  // the buffer's memory may have had earlier uses
    copies->to_device(dev.data_ptr(), host.data_ptr(), host.nbytes());
    copies->synchronize();  // `host` goes when this returns
    copies->order_before(compute_stream());
  }

  // The unit's partition is whole: it goes to NVMe, and its bytes are held until written.
  void write_out(int u) {
    tensor::Tensor source = device_partition[u];
    if (!source.device().is_cpu()) {
      source = tensor::empty_host(source.shape(), source.dtype(), offload::Category::Comm,
                                  /*pinned=*/true);
      copies->wait_for(compute_stream());
      copies->to_host(source.data_ptr(), device_partition[u].data_ptr(), source.nbytes());
      copies->synchronize();
    }
    while (tier_writes.size() >= kTierWritesInFlight) wait_tier_write();
    tier_writes.push_back({source, nvme->write_grads(static_cast<size_t>(u), source.data_ptr())});
  }

  void wait_tier_write() {
    TierWrite w = std::move(tier_writes.front());
    tier_writes.pop_front();
    for (offload::IoHandle& h : w.io) h.wait();
  }

  void wait_tier_writes() {
    while (!tier_writes.empty()) wait_tier_write();
  }

  // The unit's sum of squares over its transient partition, whole or per norm piece.
  void take_sums(int u) {
    const tensor::Tensor& p = device_partition[u];
    if (norm_pieces[u].empty()) {
      sum_squares[u] = optim::grad_sum_of_squares({p});
      return;
    }
    std::vector<tensor::Tensor> pieces;
    for (const Range& r : norm_pieces[u]) pieces.push_back(p.narrow(0, r.begin, r.size()));
    if (p.device().is_cuda()) {  // grad_sum_of_squares's values, one device wait for them all
      piece_sums[u] = tensor::sum_squares_many(pieces);
      return;
    }
    piece_sums[u].clear();
    for (const tensor::Tensor& piece : pieces)
      piece_sums[u].push_back(optim::grad_sum_of_squares({piece}));
  }

  // The bucket's reduction is in: its range goes to the host; the unit's last bucket takes the
  // sum of squares (last pass) and drops the transient partition. NVMe partitions go whole, from
  // the unit's last bucket (Note [Gradients on the NVMe tier]).
  void copy_out(Bucket& b) {
    b.to_host = false;
    const int u = b.plan.unit;
    const Range r = b.plan.per_rank;
    tensor::Tensor out = device_partition[u].narrow(0, r.begin, r.size());
    if (reducing)
      for (float f : last_pass_scales) optim::scale_grads({out}, f);
    if (on_nvme(u)) {
      if (++buckets_in[u] < unit_buckets[u].size()) return;
      if (reducing) take_sums(u);
      write_out(u);
      if (copies->cuda()) copies->order_before(compute_stream());
      device_partition[u] = tensor::Tensor();
      return;
    }
    const tensor::Tensor to = setup[u].host_partition.narrow(0, r.begin, r.size());
    copies->wait_for(compute_stream());
    copies->to_host(to.data_ptr(), out.data_ptr(), to.nbytes());
    if (++buckets_in[u] < unit_buckets[u].size()) return;
    if (reducing) take_sums(u);
    copies->order_before(compute_stream());
    device_partition[u] = tensor::Tensor();
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

  void wait(Bucket& b) {
    if (!b.work) return;
    b.work->wait();
    b.work.reset();
    b.staging = {};
    if (b.to_host) copy_out(b);
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
    STRATA_CHECK(in_pass[u], "unit '{}' got a gradient in a backward pass declared without it",
                 (*units)[u].name);
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
  s.accumulated.assign(units.size(), false);
  s.in_pass.assign(units.size(), true);
  s.device_partition.resize(units.size());
  s.buckets_in.assign(units.size(), 0);
  s.sum_squares.assign(units.size(), 0.0);
  s.norm_pieces.resize(units.size());
  s.piece_sums.resize(units.size());
  for (size_t u = 0; u < units.size(); ++u) {
    if (s.on_nvme(static_cast<int>(u))) {
      STRATA_CHECK(s.setup[u].kind == Reduction::IntoPartition && !s.on_host(static_cast<int>(u)) &&
                       !s.setup[u].partition_grad.defined(),
                   "unit '{}': an NVMe partition is an IntoPartition unit's only partition",
                   units[u].name);
      if (!s.copies)
        s.copies = std::make_unique<offload::CopyStream>(units[u].grads.device().is_cuda());
      continue;
    }
    if (!s.on_host(static_cast<int>(u))) continue;
    const tensor::Tensor& h = s.setup[u].host_partition;
    STRATA_CHECK(s.setup[u].kind == Reduction::IntoPartition && h.device().is_cpu() &&
                     h.ndim() == 1 && h.is_contiguous() && h.numel() == s.setup[u].part.shard &&
                     h.dtype() == units[u].grads.dtype(),
                 "unit '{}': a host partition must be a contiguous [{}] {} CPU tensor of an "
                 "IntoPartition unit, got {}",
                 units[u].name, s.setup[u].part.shard, dtype_name(units[u].grads.dtype()), h.str());
    if (!s.copies)
      s.copies = std::make_unique<offload::CopyStream>(units[u].grads.device().is_cuda());
  }
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
  // NVMe writes read their sources until they complete; their errors were or will not be seen.
  while (!state_->tier_writes.empty()) {
    try {
      state_->wait_tier_write();
    } catch (...) {
    }
  }
}

void GradReducer::begin_pass(bool reduce, const std::vector<bool>* units) {
  State& s = *state_;
  STRATA_CHECK(units == nullptr || units->size() == s.units->size(), "a pass over {} units of {}",
               units ? units->size() : 0, s.units->size());
  // Note [Gradients streamed to the host]: the previous pass's ranges are on their way to the
  // host, each copied out with that pass's scales and counted in that pass's units.
  if (s.copies) {
    while (!s.inflight.empty()) s.pop_inflight();
    for (State::Bucket& b : s.buckets) s.wait(b);
    s.staged = 0;
    s.wait_tier_writes();  // this pass reads them back (Note [Gradients on the NVMe tier])
  }
  s.reducing = reduce;
  for (State::Bucket& b : s.buckets) {
    b.pending = static_cast<int64_t>(b.plan.params.size());
    b.launched = false;
  }
  for (size_t u = 0; u < s.units->size(); ++u) {
    s.unit_pending[u] = static_cast<int64_t>((*s.units)[u].variables.size());
    // Note [Partial passes]: a unit outside the pass neither reduces nor launches at end_pass.
    s.in_pass[u] = units == nullptr || (*units)[u];
    s.unit_done[u] = !s.in_pass[u] || !s.reduces(static_cast<int>(u));
    s.buckets_in[u] = 0;
  }
}

void GradReducer::end_pass() {
  State& s = *state_;
  for (size_t u = 0; u < s.units->size(); ++u) s.finish_unit(static_cast<int>(u));
  // Every IntoPartition bucket of the pass's units was launched: their next micro-batch adds to
  // what this one left.
  for (size_t u = 0; u < s.units->size(); ++u)
    if (s.in_pass[u]) s.accumulated[u] = true;
}

void GradReducer::ensure_full_grads(int unit) {
  state_->ensure_full_grads(unit);
}

void GradReducer::wait_all() {
  State& s = *state_;
  // In launch order, so host ranges are copied out as they would be one by one.
  while (!s.inflight.empty()) s.pop_inflight();
  for (State::Bucket& b : s.buckets) s.wait(b);
  s.staged = 0;
  if (s.copies) s.copies->synchronize();
  s.wait_tier_writes();  // the step reads them (Note [Gradients on the NVMe tier])
}

void GradReducer::set_last_pass_scales(std::vector<float> scales) {
  state_->last_pass_scales = std::move(scales);
}

void GradReducer::restart_accumulation() {
  state_->accumulated.assign(state_->accumulated.size(), false);
}

void GradReducer::set_nvme(optim::NvmeAdamW* nvme) {
  STRATA_CHECK(nvme == nullptr || nvme->grads_on_nvme(), "the NVMe optimizer keeps no gradients");
  state_->nvme = nvme;
}

double GradReducer::unit_sum_of_squares(int unit) const {
  STRATA_CHECK(state_->off_device(unit), "unit {} has no host or NVMe partition", unit);
  return state_->sum_squares[static_cast<size_t>(unit)];
}

void GradReducer::set_norm_pieces(int unit, std::vector<Range> pieces) {
  STRATA_CHECK(state_->off_device(unit), "unit {} has no host or NVMe partition", unit);
  const int64_t shard = state_->setup[static_cast<size_t>(unit)].part.shard;
  for (const Range& r : pieces)
    STRATA_CHECK(r.begin >= 0 && r.begin <= r.end && r.end <= shard,
                 "norm piece [{}, {}) of unit {} outside its partition of {}", r.begin, r.end, unit,
                 shard);
  state_->norm_pieces[static_cast<size_t>(unit)] = std::move(pieces);
}

const std::vector<double>& GradReducer::piece_sums_of_squares(int unit) const {
  STRATA_CHECK(state_->off_device(unit) && !state_->norm_pieces[static_cast<size_t>(unit)].empty(),
               "unit {} has no norm pieces", unit);
  return state_->piece_sums[static_cast<size_t>(unit)];
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
