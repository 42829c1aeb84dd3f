// Engine: what checkpoints need — shards of the partitioned states in flat coordinates, their
// inverse for any dp layout, and whole units on demand (Note [ZeRO partitions]).
#include <fmt/format.h>

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

// Every slice this rank holds, as shards. At stage 0 every rank holds everything: all of them
// load it (`for_loading`), rank 0 alone writes it.
std::vector<Engine::Shard> held_shards(Engine& e, models::CausalLM& model,
                                       const ParamGatherer* gatherer, bool for_loading) {
  std::vector<Engine::Shard> out;
  const int r = e.stage() == 0 ? 0 : e.dp().rank();
  if (e.stage() == 0 && !for_loading && e.dp().rank() != 0) return out;
  std::vector<models::FlatUnit>& units = model.flat_units();
  auto add = [&](int u, const std::string& key, const tensor::Tensor& slice) {
    const UnitPartition& p = e.partition(u);
    const Range own = p.owned(r);
    const Range keep = p.owned_unpadded(r);
    if (keep.empty()) return;
    STRATA_CHECK(slice.numel() == own.size(),
                 "state '{}' of unit '{}' has {} elements, the slice {}", key, units[u].name,
                 slice.numel(), own.size());
    out.push_back({units[u].name, key, p.numel, keep.begin,
                   slice.narrow(0, keep.begin - own.begin, keep.size())});
  };
  const optim::OptimizerState state = e.optimizer().state_dict();
  for (const optim::NamedTensor& t : state.tensors) {
    auto [g, key] = parse_state_name(t.name);
    STRATA_CHECK(g >= 0 && g < static_cast<int>(units.size()), "optimizer group {} of {} units", g,
                 units.size());
    add(g, key, t.tensor);
  }
  if (e.mixed_precision()) {
    for (int u = 0; u < static_cast<int>(units.size()); ++u)
      add(u, "master", e.optimizer().groups()[u].param);
  }
  if (e.stage() == 3) {
    for (int u = 0; u < static_cast<int>(units.size()); ++u) {
      const Range own = e.partition(u).owned(r);
      add(u, "param",
          gatherer->managed(u) ? gatherer->partition(u)
                               : units[u].params.narrow(0, own.begin, own.size()));
    }
  }
  return out;
}

}  // namespace

std::vector<Engine::Shard> Engine::shards() {
  return held_shards(*this, model_, gatherer_.get(), /*for_loading=*/false);
}

void Engine::load_shards(const std::function<void(const std::string&, const std::string&, int64_t,
                                                  tensor::Tensor)>& fill) {
  if (gatherer_) gatherer_->release_all();
  for (Shard& s : held_shards(*this, model_, gatherer_.get(), /*for_loading=*/true))
    fill(s.unit, s.key, s.begin, s.data);
  if (mixed_precision()) {
    refresh_params_from_masters();
  } else if (zero_.stage == 3) {
    // Stage 3's whole units were filled slice by slice: make them whole on every rank.
    allgather_updated_params();
  }
}

void Engine::refresh_params_from_masters() {
  for (const optim::ParamGroup& g : optimizer_->groups())
    tensor::Tensor(g.low_precision_copy).copy_(g.param);  // a handle to the same storage
  allgather_updated_params();
}

void Engine::sync_params() {
  if (dp_->size() == 1) return;
  std::vector<models::FlatUnit>& units = model_.flat_units();
  std::vector<comm::WorkHandle> work;
  for (int u = 0; u < static_cast<int>(units.size()); ++u) {
    if (gatherer_ && gatherer_->managed(u)) continue;
    work.push_back(dp_->broadcast(units[u].params, 0));
  }
  for (comm::WorkHandle& w : work) w->wait();
}

void Engine::for_each_gathered_unit(const std::function<void(const models::FlatUnit&)>& fn) {
  std::vector<models::FlatUnit>& units = model_.flat_units();
  for (int u = 0; u < static_cast<int>(units.size()); ++u) {
    if (!gatherer_ || !gatherer_->managed(u)) {
      fn(units[u]);
      continue;
    }
    const bool was_gathered = gatherer_->gathered(u);
    gatherer_->gather(u);
    fn(units[u]);
    if (!was_gathered) gatherer_->release(u);
  }
}

}  // namespace strata::parallel
