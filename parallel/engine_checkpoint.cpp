// Engine: what checkpoints need — shards of the partitioned states in flat coordinates, their
// inverse for any dp layout, and whole units on demand (Note [ZeRO partitions]).
#include "parallel/engine.h"

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

void Engine::load_shards(const std::function<void(const std::string&, const std::string&, int64_t,
                                                  tensor::Tensor)>& fill) {
  gathering_->release_all();
  gathering_->load_partitions();
  for (Shard& s : held_shards(/*for_loading=*/true)) fill(s.unit, s.key, s.begin, s.data);
  // Mixed precision: the owned low-precision parameters come from the masters. Either way,
  // slices filled one by one (those, or stage 3's whole units) are made whole on every rank.
  if (placement_->has_masters()) placement_->params_from_masters();
  gathering_->store_partitions();  // back to their tier
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
