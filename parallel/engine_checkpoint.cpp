// Engine: what checkpoints need — shards of the partitioned states in flat coordinates, their
// inverse for any dp layout, and whole units on demand (Note [ZeRO partitions]).
#include "parallel/engine.h"

#include <algorithm>
#include <map>
#include <set>

#include "optim/nvme_adamw.h"

namespace strata::parallel {

namespace {

// "group<g>.<key>" (Note [Optimizer state]) -> (g, key).
std::pair<int, std::string> parse_state_name(const std::string& name) {
  const size_t dot = name.find('.');
  STRATA_CHECK(name.rfind("group", 0) == 0 && dot != std::string::npos,
               "optimizer state name '{}' is not group<i>.<name>", name);
  return {std::stoi(name.substr(5, dot - 5)), name.substr(dot + 1)};
}

}  // namespace

// With whole units every rank holds everything: all of them load it (`for_loading`), rank 0
// alone writes it (Partitioning::writes_shards).
std::vector<Engine::Shard> Engine::held_shards(bool for_loading) {
  std::vector<Shard> out;
  if (!for_loading && !partitioning_->writes_shards()) return out;
  std::vector<models::FlatUnit>& units = model_.flat_units();
  auto add = [&](int u, const std::string& key, const tensor::Tensor& slice) {
    const Range own = partitioning_->owned(u);
    const Range keep = partitioning_->owned_unpadded(u);
    if (keep.empty()) return;
    STRATA_CHECK(slice.numel() == own.size(),
                 "state '{}' of unit '{}' has {} elements, the slice {}", key, units[u].name,
                 slice.numel(), own.size());
    out.push_back({units[u].name, key, partitioning_->unit(u).numel, keep.begin,
                   slice.narrow(0, keep.begin - own.begin, keep.size())});
  };
  const optim::OptimizerState state = optimizer().state_dict();
  for (const optim::NamedTensor& t : state.tensors) {
    auto [g, key] = parse_state_name(t.name);
    STRATA_CHECK(g >= 0 && g < static_cast<int>(units.size()), "optimizer group {} of {} units", g,
                 units.size());
    add(g, key, t.tensor);
  }
  if (placement_->has_masters()) {
    for (int u = 0; u < static_cast<int>(units.size()); ++u)
      add(u, "master", placement_->master(u));
  }
  if (gathering_->params_partitioned()) {
    for (int u = 0; u < static_cast<int>(units.size()); ++u)
      add(u, "param", gathering_->owned_params(u));
  }
  return out;
}

std::vector<Engine::Shard> Engine::shards() {
  // Offloaded partitions (Note [Offloaded partitions]) stay resident until checkpoint_written()
  // or their unit's next gather.
  gathering_->load_partitions();
  return held_shards(/*for_loading=*/false);
}

void Engine::for_each_held_slice(
    bool for_loading, const std::function<void(int, const std::string&, int64_t, DType)>& fn) {
  if (!for_loading && !partitioning_->writes_shards()) return;
  std::vector<models::FlatUnit>& units = model_.flat_units();
  const int n_units = static_cast<int>(units.size());
  if (optim::NvmeAdamW* nv = placement_->nvme()) {
    // The names NvmeAdamW::state_dict() gives, without staging the states.
    STRATA_CHECK(nv->slices() == units.size(), "{} NVMe slices for {} units", nv->slices(),
                 units.size());
    for (int g = 0; g < n_units; ++g) {
      fn(g, "exp_avg", partitioning_->owned(g).size(), DType::F32);
      fn(g, "exp_avg_sq", partitioning_->owned(g).size(), DType::F32);
    }
  } else {
    for (const optim::NamedTensor& t : optimizer().state_dict().tensors) {
      auto [g, key] = parse_state_name(t.name);
      STRATA_CHECK(g >= 0 && g < n_units, "optimizer group {} of {} units", g, n_units);
      fn(g, key, t.tensor.numel(), t.tensor.dtype());
    }
  }
  if (placement_->has_masters())
    for (int u = 0; u < n_units; ++u) fn(u, "master", partitioning_->owned(u).size(), DType::F32);
  if (gathering_->params_partitioned())
    for (int u = 0; u < n_units; ++u)
      fn(u, "param", partitioning_->owned(u).size(), units[u].params.dtype());
}

std::vector<std::string> Engine::state_keys() {
  std::set<std::string> keys;
  for_each_held_slice(/*for_loading=*/true, [&](int, const std::string& key, int64_t, DType) {
    if (key != "param") keys.insert(key);
  });
  return {keys.begin(), keys.end()};
}

std::vector<Engine::ShardInfo> Engine::shard_layout(bool for_loading) {
  std::vector<ShardInfo> out;
  std::vector<models::FlatUnit>& units = model_.flat_units();
  for_each_held_slice(for_loading, [&](int u, const std::string& key, int64_t numel, DType dtype) {
    const Range own = partitioning_->owned(u);
    const Range keep = partitioning_->owned_unpadded(u);
    if (keep.empty()) return;
    STRATA_CHECK(numel == own.size(), "state '{}' of unit '{}' has {} elements, the slice {}", key,
                 units[u].name, numel, own.size());
    out.push_back({units[u].name, key, partitioning_->unit(u).numel, keep.begin, keep.size(), dtype,
                   u, keep.begin - own.begin});
  });
  return out;
}

// Note [Streamed shards]
void Engine::stream_shards(bool params,
                           const std::function<void(size_t, const tensor::Tensor&)>& emit,
                           int unit) {
  const std::vector<ShardInfo> layout = shard_layout();
  std::map<std::pair<int, std::string>, size_t> index;
  for (size_t i = 0; i < layout.size(); ++i)
    if ((layout[i].key == "param") == params && (unit < 0 || layout[i].unit_index == unit))
      index[{layout[i].unit_index, layout[i].key}] = i;
  if (index.empty()) return;
  // `piece` holds elements [offset, offset + numel) of unit u's owned slice of `key`.
  auto slice_piece = [&](int u, const std::string& key, int64_t offset,
                         const tensor::Tensor& piece) {
    auto it = index.find({u, key});
    if (it == index.end()) return;  // all padding
    const ShardInfo& s = layout[it->second];
    const int64_t lo = std::max(offset, s.slice_offset);
    const int64_t hi = std::min(offset + piece.numel(), s.slice_offset + s.numel);
    if (lo < hi) emit(it->second, piece.narrow(0, lo - offset, hi - lo));
  };
  const int n_units = static_cast<int>(model_.flat_units().size());
  if (params) {
    for (int u = 0; u < n_units; ++u)
      if (index.contains({u, "param"}))
        gathering_->with_owned_params(
            u, /*store=*/false, [&](const tensor::Tensor& p) { slice_piece(u, "param", 0, p); });
    return;
  }
  if (optim::NvmeAdamW* nv = placement_->nvme()) {
    const optim::NvmeAdamW::SubGroupFn fn =
        [&](size_t g, int64_t offset, const tensor::Tensor& master, const tensor::Tensor& exp_avg,
            const tensor::Tensor& exp_avg_sq) {
          const int u = static_cast<int>(g);
          slice_piece(u, "exp_avg", offset, exp_avg);
          slice_piece(u, "exp_avg_sq", offset, exp_avg_sq);
          slice_piece(u, "master", offset, master);
        };
    if (unit >= 0) {
      nv->read_slice_states(static_cast<size_t>(unit), fn);
    } else {
      nv->read_states(fn);
    }
    return;
  }
  for (const optim::NamedTensor& t : optimizer().state_dict().tensors) {
    auto [g, key] = parse_state_name(t.name);
    slice_piece(g, key, 0, t.tensor);
  }
  if (placement_->has_masters())
    for (int u = 0; u < n_units; ++u) slice_piece(u, "master", 0, placement_->master(u));
}

void Engine::load_shards(const std::function<void(const std::string&, const std::string&, int64_t,
                                                  tensor::Tensor)>& fill) {
  gathering_->release_all();
  // Note [Streamed shards]: parameter partitions one unit at a time, back to their tier.
  for (const ShardInfo& s : shard_layout(/*for_loading=*/true))
    if (s.key == "param")
      gathering_->with_owned_params(s.unit_index, /*store=*/true, [&](const tensor::Tensor& p) {
        fill(s.unit, s.key, s.begin, p.narrow(0, s.slice_offset, s.numel));
      });
  if (optim::NvmeAdamW* nv = placement_->nvme()) {
    // Sub-group by sub-group into a state buffer, home, and the parameters from the masters.
    // Elements past a unit's extent are padding and fill as zeros.
    std::vector<models::FlatUnit>& units = model_.flat_units();
    nv->write_states([&](size_t g, int64_t offset, const tensor::Tensor& master,
                         const tensor::Tensor& exp_avg, const tensor::Tensor& exp_avg_sq) {
      const int64_t at = partitioning_->owned(static_cast<int>(g)).begin + offset;
      fill(units[g].name, "master", at, master);
      fill(units[g].name, "exp_avg", at, exp_avg);
      fill(units[g].name, "exp_avg_sq", at, exp_avg_sq);
    });
  } else {
    // Resident states: views of the whole slices.
    std::map<std::pair<int, std::string>, ShardInfo> wanted;
    for (const ShardInfo& s : shard_layout(/*for_loading=*/true))
      if (s.key != "param") wanted[{s.unit_index, s.key}] = s;
    auto fill_slice = [&](int u, const std::string& key, const tensor::Tensor& slice) {
      auto it = wanted.find({u, key});
      if (it == wanted.end()) return;  // all padding
      const ShardInfo& s = it->second;
      fill(s.unit, s.key, s.begin, slice.narrow(0, s.slice_offset, s.numel));
    };
    for (const optim::NamedTensor& t : optimizer().state_dict().tensors) {
      auto [g, key] = parse_state_name(t.name);
      fill_slice(g, key, t.tensor);
    }
    if (placement_->has_masters())
      for (int u = 0; u < static_cast<int>(model_.flat_units().size()); ++u)
        fill_slice(u, "master", placement_->master(u));
    // Mixed precision: the owned low-precision parameters come from the masters.
    if (placement_->has_masters()) placement_->params_from_masters();
  }
  gathering_->store_partitions();  // any still resident, back to their tier
  // Slices filled one by one (those, or stage 3's whole units) are made whole on every rank.
  if (placement_->has_masters() || gathering_->params_partitioned())
    gathering_->allgather_updated();
}

void Engine::sync_params() {
  if (dp_->size() == 1) return;
  std::vector<models::FlatUnit>& units = model_.flat_units();
  std::vector<comm::WorkHandle> work;
  for (int u = 0; u < static_cast<int>(units.size()); ++u) {
    if (gathering_ && gathering_->managed(u)) continue;  // partitioned: from load_shards
    tensor::Tensor& params = units[u].params;
    if (params.device() != device_) {
      // Note [Offload construction]: host units, a device communicator; one unit at a time.
      tensor::Tensor on_device = params.to(device_);
      dp_->broadcast(on_device, 0)->wait();
      params.copy_(on_device);
      continue;
    }
    work.push_back(dp_->broadcast(params, 0));
  }
  for (comm::WorkHandle& w : work) w->wait();
}

}  // namespace strata::parallel
