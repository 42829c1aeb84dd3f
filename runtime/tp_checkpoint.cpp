#include "runtime/tp_checkpoint.h"

#include <fmt/format.h>

#include <exception>
#include <functional>
#include <map>
#include <set>
#include <vector>

#include "comm/self_communicator.h"
#include "core/error.h"
#include "runtime/checkpoint_shards.h"
#include "tensor/ops.h"

namespace strata::runtime {

namespace {

using tensor::Tensor;

// The inverse of nn::shard_of: `gathered` holds every rank's slice (local shape), rank order.
Tensor unshard(const Tensor& gathered, const models::nn::ShardSpec& spec, const tensor::Shape& full,
               int size) {
  const tensor::Shape local = models::nn::shard_shape(full, spec, size);
  const int64_t ln = local.numel();
  Tensor out = Tensor::empty(full, gathered.dtype());
  const int64_t block = full[spec.dim] / spec.blocks, piece = block / size;
  for (int r = 0; r < size; ++r) {
    const Tensor part = gathered.narrow(0, r * ln, ln).view(local);
    for (int64_t b = 0; b < spec.blocks; ++b) {
      Tensor dst = out.narrow(spec.dim, b * block + r * piece, piece);
      dst.copy_(part.narrow(spec.dim, b * piece, piece));
    }
  }
  return out;
}

// The state keys every rank holds for every unit, in one order on every rank, reading nothing
// (Note [Streamed shards]); "param" at stage 3, where the parameters are partitioned.
std::vector<std::string> state_keys(parallel::Engine& engine) {
  std::set<std::string> keys;
  for (const std::string& k : engine.state_keys())
    if (k != "master") keys.insert(k);
  if (engine.mixed_precision()) keys.insert("master");
  if (engine.stage() == 3) keys.insert("param");
  return {keys.begin(), keys.end()};
}

// Called on the stage lead with each parameter's whole tensor (host) of state `key`.
using PutWhole =
    std::function<void(const std::string& key, const std::string& name, const Tensor& value)>;

// Note [Tensor-parallel checkpoints], one unit: local unit u's states `keys` made whole over dp
// (this rank's slices, streamed, into a zeroed buffer; one sum all-reduce), then each parameter
// put together over the tp group of dp rank 0 and handed to `put` on the stage lead. `params`:
// the keys are {"param"}. Collective over the unit's stage (its dp and tp groups). Host memory:
// one local unit per key and one parameter's whole tensor.
void gather_unit(const TpCheckpointContext& ctx, int u, const std::vector<std::string>& keys,
                 bool params, const std::vector<parallel::Engine::ShardInfo>& layout,
                 const PutWhole& put) {
  models::CausalLM& model = ctx.model;
  parallel::Engine& engine = ctx.engine;
  const models::nn::TensorParallel& tp = model.tensor_parallel();
  const models::FlatUnit& unit = model.flat_units()[u];
  // The dp and tp collectives run where the units live (NCCL takes device buffers); the stage
  // lead copies each whole tensor to the host as it lays it out.
  const Device device = unit.params.device();
  comm::Communicator& dp = engine.dp();
  const int64_t numel = engine.partition(u).numel;
  std::map<std::string, Tensor> bufs;
  if (params && engine.stage() < 3) {
    bufs["param"] = unit.params.narrow(0, 0, numel);  // whole on every rank
  } else {
    for (const std::string& key : keys)
      bufs[key] = tensor::zeros({numel}, key == "param" ? unit.params.dtype() : DType::F32, device);
    std::vector<int64_t> at(layout.size(), 0);
    engine.stream_shards(
        params,
        [&](size_t i, const Tensor& piece) {
          const parallel::Engine::ShardInfo& sh = layout[i];
          auto it = bufs.find(sh.key);
          if (it != bufs.end()) {
            Tensor dst = it->second.narrow(0, sh.begin + at[i], piece.numel());
            dst.copy_(piece);
          }
          at[i] += piece.numel();
        },
        u);
    if (dp.size() > 1)
      for (auto& [key, buf] : bufs) dp.allreduce(buf, comm::ReduceOp::Sum)->wait();
  }
  if (dp.rank() != 0) return;
  const bool stage_lead = tp.rank() == 0;
  for (const auto& [key, buf] : bufs) {
    for (size_t i = 0; i < unit.names.size(); ++i) {
      const std::string& name = unit.names[i];
      const Tensor mine = buf.narrow(0, unit.offsets[i], unit.numels[i]).contiguous();
      auto it = model.shard_specs().find(name);
      if (it == model.shard_specs().end()) {
        if (stage_lead) put(key, name, mine.to(Device::cpu()));
        continue;
      }
      Tensor all = Tensor::empty({mine.numel() * tp.size()}, mine.dtype(), device);
      tp.group->allgather(mine, all)->wait();
      if (stage_lead) put(key, name, all.to(Device::cpu()));
    }
  }
}

}  // namespace

std::string save_tp_checkpoint(const TpCheckpointContext& ctx, const std::string& run_dir,
                               const TrainerState& state, const std::string& config_yaml,
                               int64_t keep) {
  models::CausalLM& model = ctx.model;
  parallel::Engine& engine = ctx.engine;
  const models::nn::TensorParallel& tp = model.tensor_parallel();
  std::vector<models::FlatUnit>& units = model.flat_units();
  const Device device = units.front().params.device();
  comm::Communicator& dp = engine.dp();
  const std::vector<std::string> keys = state_keys(engine);
  std::vector<std::string> state_names;  // the optimizer file's keys
  for (const std::string& key : keys)
    if (key != "param") state_names.push_back(key);
  const std::vector<parallel::Engine::ShardInfo> layout = engine.shard_layout();

  const bool lead = ctx.world.rank() == 0;
  comm::Communicator* pp = ctx.pp != nullptr && ctx.pp->size() > 1 ? ctx.pp : nullptr;
  const bool stage_lead = dp.rank() == 0 && tp.rank() == 0;
  STRATA_CHECK(!lead || stage_lead, "global rank 0 is dp rank {}, tp rank {}", dp.rank(),
               tp.rank());
  // The units this stage writes: the last stage's copy of a tied embedding is the first stage's
  // (Note [Pipeline stages]). The same on every rank of the stage.
  std::vector<int> written;
  std::map<std::string, int> local_unit;  // name -> u, of the written units
  for (int u = 0; u < static_cast<int>(units.size()); ++u) {
    if (pp != nullptr && !model.is_first_stage() && units[u].name == "embeddings") continue;
    written.push_back(u);
    local_unit[units[u].name] = u;
  }
  // The whole model's layout only: built deferred, its storage released (Note [Deferred
  // initialisation]), so it costs no parameter memory.
  std::unique_ptr<models::CausalLM> whole;
  struct Place {
    int64_t offset = 0;
    tensor::Shape shape;
  };
  std::map<std::string, Place> place;  // name -> where in its whole unit
  if (stage_lead) {
    {
      models::nn::DeferredInitScope layout_only;
      whole = ctx.make_whole();
    }
    for (const models::FlatUnit& wu : whole->flat_units())
      for (size_t i = 0; i < wu.names.size(); ++i)
        place[wu.names[i]] = {wu.offsets[i], wu.shapes[i]};
  }
  // The whole tensor `value` of parameter `name` (gathered: every tp rank's slice in rank order).
  auto whole_value = [&](const std::string& name, const Tensor& value) {
    auto it = model.shard_specs().find(name);
    if (it == model.shard_specs().end()) return value;
    return unshard(value, it->second, place.at(name).shape, tp.size());
  };
  // Pipeline parallelism: the stage leads (one pp group) sum a whole unit's buffer onto rank 0,
  // exact since the stages hold disjoint tensors. An nccl group moves device memory only: there
  // the host buffer goes through a device copy.
  auto sum_over_stages = [&](Tensor host) {
    if (pp == nullptr) return;
    if (pp->backend() != "nccl") {
      pp->allreduce(host, comm::ReduceOp::Sum)->wait();
      return;
    }
    Tensor staged = host.to(device);
    pp->allreduce(staged, comm::ReduceOp::Sum)->wait();
    host.copy_(staged);
  };

  // One pass over the whole model's units in its order: the stage holding whole unit w makes
  // `pass_keys` of it whole (gather_unit: the parameters when `params`), the stage leads sum each
  // whole unit's buffer over the stages onto rank 0 (zeros where a stage holds none), and `out`
  // takes it there before the next unit, so no rank holds more than one whole unit per key.
  // Every rank goes through the same units whether rank 0's writer takes them or failed (`out`
  // null): the collectives match; the writer's first error is raised at the end.
  using Out = std::function<void(size_t w, const std::string& key, const Tensor& buf)>;
  auto unit_pass = [&](bool params, const std::vector<std::string>& pass_keys, const Out* out) {
    if (!stage_lead) {
      for (int u : written)
        gather_unit(ctx, u, pass_keys, params, layout,
                    [](const std::string&, const std::string&, const Tensor&) {});
      return;
    }
    std::exception_ptr failed;
    int last = -1;  // the stage's other ranks go through `written` in order: so must this one
    const std::vector<models::FlatUnit>& wunits = whole->flat_units();
    for (size_t w = 0; w < wunits.size(); ++w) {
      const models::FlatUnit& wu = wunits[w];
      std::map<std::string, Tensor> bufs;  // key -> the whole unit's values, fp32
      for (const std::string& key : pass_keys) bufs[key] = tensor::zeros({wu.size()});
      auto it = local_unit.find(wu.name);
      if (it != local_unit.end()) {
        STRATA_CHECK(it->second > last, "unit '{}' is out of the whole model's order", wu.name);
        last = it->second;
        gather_unit(ctx, it->second, pass_keys, params, layout,
                    [&](const std::string& key, const std::string& name, const Tensor& value) {
                      Tensor dst = bufs.at(key).narrow(0, place.at(name).offset, value.numel());
                      dst.copy_(whole_value(name, value).reshape({-1}).to(DType::F32));
                    });
      } else {
        STRATA_CHECK(pp != nullptr, "unit '{}' of the whole model is not on this rank", wu.name);
      }
      for (auto& [key, buf] : bufs) {
        sum_over_stages(buf);
        if (out == nullptr || failed) continue;
        try {
          (*out)(w, key, buf);
        } catch (...) {
          failed = std::current_exception();
        }
      }
    }
    if (failed) std::rethrow_exception(failed);
  };

  // 1. The parameters, a whole unit at a time, into model.safetensors as they come (Note
  // [Streamed safetensors]): its i-th tensor is the whole model's i-th parameter.
  bool params_done = false;
  auto param_pass = [&](const FlatShardStream::Emit* emit) {
    params_done = true;
    if (emit == nullptr) {
      unit_pass(true, {"param"}, nullptr);
      return;
    }
    std::vector<size_t> first;  // whole unit w's first parameter in the file
    size_t n = 0;
    for (const models::FlatUnit& wu : whole->flat_units()) {
      first.push_back(n);
      n += wu.names.size();
    }
    const Out out = [&](size_t w, const std::string&, const Tensor& buf) {
      const models::FlatUnit& wu = whole->flat_units()[w];
      for (size_t i = 0; i < wu.names.size(); ++i)
        (*emit)(first[w] + i, buf.narrow(0, wu.offsets[i], wu.numels[i]));
    };
    unit_pass(true, {"param"}, &out);
  };

  // 2. The optimizer states the same way (Note [Streamed shards]), into the optimizer file.
  std::map<std::pair<std::string, std::string>, size_t> shard_of;  // (unit, key) -> stream index
  FlatShardStream stream;
  if (lead) {
    std::map<std::pair<std::string, std::string>, int64_t> sizes;  // the file's order
    for (const models::FlatUnit& wu : whole->flat_units())
      for (const std::string& key : state_names) sizes[{wu.name, key}] = wu.size();
    for (const auto& [uk, n] : sizes) {
      shard_of[uk] = stream.shards.size();
      stream.shards.push_back({uk.first, uk.second, 0, n, DType::F32});
    }
  }
  bool states_done = false;
  auto state_pass = [&](const FlatShardStream::Emit* emit) {
    states_done = true;
    if (emit == nullptr) {
      unit_pass(false, state_names, nullptr);
      return;
    }
    const Out out = [&](size_t w, const std::string& key, const Tensor& buf) {
      (*emit)(shard_of.at({whole->flat_units()[w].name, key}), buf);
    };
    unit_pass(false, state_names, &out);
  };

  // 3. Rank 0 writes it as one process would (the model file first, then the optimizer's); the
  // others go through the same passes; the world agrees on the outcome.
  std::string dir;
  std::string error;
  if (lead) {
    try {
      CheckpointParts parts;
      parts.model = whole.get();
      parts.write_model = true;
      parts.model_stream = [&](const FlatShardStream::Emit& emit) { param_pass(&emit); };
      parts.optimizer_name = std::string(engine.optimizer().name());
      parts.optimizer_step = engine.optimizer().step_count();
      stream.produce = [&](const FlatShardStream::Emit& emit) { state_pass(&emit); };
      parts.optimizer_stream = stream;
      comm::SelfCommunicator self;
      dir = save_checkpoint(run_dir, parts, state, config_yaml, keep, self);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (!params_done) param_pass(nullptr);
  if (!states_done) state_pass(nullptr);
  Tensor ok = tensor::from_ints({error.empty() ? 1 : 0}, {1}, DType::I32).to(device);
  ctx.world.allreduce(ok, comm::ReduceOp::Min)->wait();
  if (tensor::to_int_vector(ok.to(Device::cpu()))[0] == 0) {
    if (lead) user_error("{}", error);
    user_error("the tensor-parallel checkpoint of step {} failed on rank 0 (its error says why)",
               state.step);
  }
  return lead ? dir : fmt::format("{}/checkpoints/step_{:08d}", run_dir, state.step);
}

TpCheckpointReader::TpCheckpointReader(const models::CausalLM& local, const models::CausalLM& whole,
                                       const FlatShardIndex& index)
    : local_(local), index_(index) {
  for (const models::FlatUnit& wu : whole.flat_units())
    for (size_t i = 0; i < wu.names.size(); ++i)
      whole_places_[wu.names[i]] = {wu.name, wu.offsets[i], wu.shapes[i]};
}

void TpCheckpointReader::fill(const std::string& unit, const std::string& key,
                              const std::string& source_key, int64_t begin, tensor::Tensor dst) {
  // A load goes unit by unit (Note [Streamed shards]): the cache holds one unit's states.
  if (unit != cached_unit_) {
    unit_cache_.clear();
    cached_unit_ = unit;
  }
  Tensor& buf = unit_cache_[key];
  if (!buf.defined()) {
    const models::nn::TensorParallel& tp = local_.tensor_parallel();
    const models::FlatUnit* u = nullptr;
    for (const models::FlatUnit& lu : local_.flat_units())
      if (lu.name == unit) u = &lu;
    STRATA_CHECK(u != nullptr, "no unit '{}'", unit);
    buf = tensor::zeros({u->size()});
    for (size_t i = 0; i < u->names.size(); ++i) {
      const Place& p = whole_places_.at(u->names[i]);
      auto it = local_.shard_specs().find(u->names[i]);
      read_slice(index_, p.unit, source_key, p.offset, p.shape,
                 it == local_.shard_specs().end() ? models::nn::ShardSpec{} : it->second, tp.rank(),
                 tp.size(), buf.narrow(0, u->offsets[i], u->numels[i]));
    }
  }
  dst.copy_(buf.narrow(0, begin, dst.numel()).to(dst.dtype()));
}

void read_slice(const FlatShardIndex& index, const std::string& unit, const std::string& key,
                int64_t offset, const tensor::Shape& full, const models::nn::ShardSpec& spec,
                int rank, int size, Tensor dst, int64_t chunk) {
  models::nn::read_shard(
      full, spec, rank, size,
      [&](int64_t begin, Tensor part) { index.fill(unit, key, offset + begin, part); }, dst, chunk);
}

}  // namespace strata::runtime
