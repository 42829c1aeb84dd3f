#include "runtime/tp_checkpoint.h"

#include <fmt/format.h>

#include <set>
#include <vector>

#include "comm/self_communicator.h"
#include "core/error.h"
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

// The state keys every rank holds for every unit, in one order on every rank.
std::vector<std::string> state_keys(parallel::Engine& engine) {
  std::set<std::string> keys;
  for (const optim::NamedTensor& t : engine.optimizer().state_dict().tensors) {
    const size_t dot = t.name.find('.');
    STRATA_CHECK(dot != std::string::npos, "optimizer state name '{}'", t.name);
    keys.insert(t.name.substr(dot + 1));
  }
  if (engine.mixed_precision()) keys.insert("master");
  if (engine.stage() == 3) keys.insert("param");
  return {keys.begin(), keys.end()};
}

}  // namespace

std::string save_tp_checkpoint(const TpCheckpointContext& ctx, const std::string& run_dir,
                               const TrainerState& state, const std::string& config_yaml,
                               int64_t keep) {
  models::CausalLM& model = ctx.model;
  parallel::Engine& engine = ctx.engine;
  const models::nn::TensorParallel& tp = model.tensor_parallel();
  std::vector<models::FlatUnit>& units = model.flat_units();
  // The dp and tp collectives run where the units live (NCCL takes device buffers); the stage lead
  // copies each whole tensor to the host as it lays it out.
  const Device device = units.front().params.device();
  comm::Communicator& dp = engine.dp();

  // 1. This rank's units whole over dp, per state key (parameters too unless ZeRO-3 holds them).
  const std::vector<std::string> keys = state_keys(engine);
  const std::vector<parallel::Engine::Shard> shards = engine.shards();
  struct Local {
    int unit;
    std::string key;
    Tensor data;  // [unit numel before dp padding]
  };
  std::vector<Local> local;
  for (int u = 0; u < static_cast<int>(units.size()); ++u) {
    const int64_t numel = engine.partition(u).numel;
    for (const std::string& key : keys) {
      Tensor buf;
      for (const parallel::Engine::Shard& s : shards) {
        if (s.unit != units[u].name || s.key != key) continue;
        if (!buf.defined()) buf = tensor::zeros({numel}, s.data.dtype(), device);
        Tensor dst = buf.narrow(0, s.begin, s.data.numel());
        dst.copy_(s.data);
      }
      if (!buf.defined())
        buf = tensor::zeros({numel}, key == "param" ? units[u].params.dtype() : DType::F32, device);
      if (dp.size() > 1) dp.allreduce(buf, comm::ReduceOp::Sum)->wait();
      local.push_back({u, key, buf});
    }
    if (engine.stage() < 3) local.push_back({u, "param", units[u].params.narrow(0, 0, numel)});
  }

  // 2. The tp group of dp rank 0 puts the sharded parameters together; the stage lead (global
  // rank 0 without pipeline parallelism) lays them out in the whole model.
  const bool lead = ctx.world.rank() == 0;
  comm::Communicator* pp = ctx.pp != nullptr && ctx.pp->size() > 1 ? ctx.pp : nullptr;
  const bool stage_lead = dp.rank() == 0 && tp.rank() == 0;
  STRATA_CHECK(!lead || stage_lead, "global rank 0 is dp rank {}, tp rank {}", dp.rank(),
               tp.rank());
  std::unique_ptr<models::CausalLM> whole;
  std::map<std::pair<std::string, std::string>, Tensor> whole_states;  // (unit, key)
  std::map<std::string, std::pair<std::string, int64_t>> place;  // name -> (whole unit, offset)
  if (stage_lead) {
    whole = ctx.make_whole();
    for (const models::FlatUnit& wu : whole->flat_units()) {
      for (size_t i = 0; i < wu.names.size(); ++i) place[wu.names[i]] = {wu.name, wu.offsets[i]};
      // Under pipeline parallelism what this stage does not hold must add nothing to the sum.
      if (pp != nullptr) {
        Tensor params = wu.params;
        params.zero_();
      }
    }
  }
  if (dp.rank() == 0) {
    for (const Local& l : local) {
      const models::FlatUnit& unit = units[l.unit];
      // The last stage's copy of a tied embedding is the first stage's (Note [Pipeline stages]).
      if (pp != nullptr && !model.is_first_stage() && unit.name == "embeddings") continue;
      for (size_t i = 0; i < unit.names.size(); ++i) {
        const std::string& name = unit.names[i];
        const Tensor mine = l.data.narrow(0, unit.offsets[i], unit.numels[i]).contiguous();
        Tensor value;
        auto it = model.shard_specs().find(name);
        if (it != model.shard_specs().end()) {
          Tensor all = Tensor::empty({mine.numel() * tp.size()}, mine.dtype(), device);
          tp.group->allgather(mine, all)->wait();
          if (!stage_lead) continue;
          const tensor::Shape full = whole->parameter(name).data().shape();
          value = unshard(all.to(Device::cpu()), it->second, full, tp.size());
        } else {
          if (!stage_lead) continue;
          value = mine.to(Device::cpu());
        }
        if (l.key == "param") {
          Tensor dst = whole->parameter(name).data();
          dst.copy_(value.view(dst.shape()).to(dst.dtype()));
          continue;
        }
        const auto& [wunit, woff] = place.at(name);
        Tensor& buf = whole_states[{wunit, l.key}];
        if (!buf.defined()) {
          for (const models::FlatUnit& wu : whole->flat_units())
            if (wu.name == wunit) buf = tensor::zeros({wu.size()}, value.dtype());
        }
        Tensor dst = buf.narrow(0, woff, value.numel());
        dst.copy_(value.reshape({-1}));
      }
    }
  }

  // 2b. Pipeline parallelism: the stage leads (one pp group) sum their whole models' units onto
  // rank 0, parameters and every state key, unit by unit.
  if (pp != nullptr && stage_lead) {
    std::vector<std::string> state_names;
    for (const std::string& key : keys)
      if (key != "param") state_names.push_back(key);
    // The whole model is in host memory, and an nccl group moves device memory only: there each
    // buffer goes through a device copy of its own, one at a time, so the device never holds
    // more than one whole unit's buffer beside the run.
    auto sum = [&](Tensor host) {
      if (pp->backend() != "nccl") {
        pp->allreduce(host, comm::ReduceOp::Sum)->wait();
        return;
      }
      Tensor staged = host.to(device);
      pp->allreduce(staged, comm::ReduceOp::Sum)->wait();
      host.copy_(staged);
    };
    for (models::FlatUnit& wu : whole->flat_units()) {
      sum(wu.params);
      for (const std::string& key : state_names) {
        Tensor& buf = whole_states[{wu.name, key}];
        if (!buf.defined()) buf = tensor::zeros({wu.size()}, DType::F32);
        sum(buf);
      }
    }
  }

  // 3. Rank 0 writes it as one process would; the world agrees on the outcome.
  std::string dir;
  std::string error;
  if (lead) {
    try {
      CheckpointParts parts;
      parts.model = whole.get();
      parts.write_model = true;
      parts.optimizer_name = std::string(engine.optimizer().name());
      parts.optimizer_step = engine.optimizer().step_count();
      for (auto& [uk, buf] : whole_states)
        parts.optimizer_shards.push_back({uk.first, uk.second, 0, buf});
      comm::SelfCommunicator self;
      dir = save_checkpoint(run_dir, parts, state, config_yaml, keep, self);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
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
  Tensor& buf = unit_cache_[unit + "/" + key];
  if (!buf.defined()) {
    const models::nn::TensorParallel& tp = local_.tensor_parallel();
    const models::FlatUnit* u = nullptr;
    for (const models::FlatUnit& lu : local_.flat_units())
      if (lu.name == unit) u = &lu;
    STRATA_CHECK(u != nullptr, "no unit '{}'", unit);
    buf = tensor::zeros({u->size()});
    for (size_t i = 0; i < u->names.size(); ++i) {
      const Place& p = whole_places_.at(u->names[i]);
      Tensor w = Tensor::empty({p.shape.numel()});
      index_.fill(p.unit, source_key, p.offset, w);
      auto it = local_.shard_specs().find(u->names[i]);
      const Tensor piece =
          it == local_.shard_specs().end()
              ? w
              : models::nn::shard_of(w.view(p.shape), it->second, tp.rank(), tp.size());
      Tensor d = buf.narrow(0, u->offsets[i], u->numels[i]);
      d.copy_(piece.reshape({-1}));
    }
  }
  dst.copy_(buf.narrow(0, begin, dst.numel()).to(dst.dtype()));
}

}  // namespace strata::runtime
