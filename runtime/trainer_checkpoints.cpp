// The Trainer's checkpoints: writing one (Note [Distributed checkpoints] in runtime/checkpoint.h)
// and resuming from one, whole or tensor/pipeline-parallel.
#include "runtime/trainer.h"

#include <fmt/format.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "models/registry.h"
#include "runtime/checkpoint.h"
#include "runtime/tp_checkpoint.h"

namespace strata::runtime {

void Trainer::save(const char* why) {
  if (last_saved_step_ == step_) return;
  // ZeRO-Offload's delayed update: the checkpoint holds every update taken so far.
  engine_->finish_pending_update();
  TrainerState st;
  st.step = step_;
  st.samples_consumed = samples_consumed_;
  st.rng_seed = generator_.seed();
  st.rng_offset = generator_.offset();
  if (scaler_) {
    const optim::LossScalerState& ls = scaler_->state();
    st.loss_scale = ls.scale;
    st.loss_scale_iteration = ls.iteration;
    st.loss_scale_last_overflow = ls.last_overflow_iteration;
    st.loss_scale_hysteresis_left = ls.hysteresis_left;
  }
  st.model_name = config_.model.name;
  Stopwatch watch;
  if (tp_size_ > 1 || pp_size_ > 1) {
    // Note [Tensor-parallel checkpoints]: whole tensors, any layout resumes.
    const TpCheckpointContext ctx{*model_, *engine_, *world_comm_,
                                  [this] { return make_whole_model(); }, pp_.get()};
    last_checkpoint_ = save_tp_checkpoint(ctx, config_.run.dir, st, config_yaml_,
                                          config_.training.keep_checkpoints);
    last_saved_step_ = step_;
    console_->event(
        fmt::format("checkpoint ({}): {} [{:.2f} s]", why, last_checkpoint_, watch.seconds()));
    return;
  }
  // Note [Distributed checkpoints]: whole parameters come from rank 0's model unless ZeRO-3
  // partitions them; plain DP replicates the optimizer state, so rank 0 alone writes it.
  CheckpointParts parts;
  parts.model = model_.get();
  const bool partitioned_params = engine_->config().stage >= 3;
  parts.write_model = rank_ == 0 && !partitioned_params;
  parts.optimizer_name = std::string(engine_->optimizer().name());
  parts.optimizer_step = engine_->optimizer().step_count();
  // Note [Streamed shards]: the files are written as the engine reads its states, a sub-group
  // or a unit at a time.
  if (rank_ == 0 || engine_->config().stage >= 1) {
    if (partitioned_params) parts.param_stream = engine_shard_stream(*engine_, /*params=*/true);
    parts.optimizer_stream = engine_shard_stream(*engine_, /*params=*/false);
  }
  last_checkpoint_ = save_checkpoint(config_.run.dir, parts, st, config_yaml_,
                                     config_.training.keep_checkpoints, *dp_, device_);
  parts = {};
  last_saved_step_ = step_;
  console_->event(
      fmt::format("checkpoint ({}): {} [{:.2f} s]", why, last_checkpoint_, watch.seconds()));
}

std::unique_ptr<models::CausalLM> Trainer::make_whole_model() const {
  return models::ModelRegistry::global().create(config_.model.name, whole_options_);
}

void Trainer::resume(const std::string& dir) {
  const TrainConfig& c = config_;
  // Note [Tensor-parallel checkpoints]: a tensor- or pipeline-parallel run reads its slices (its
  // stage's) of the whole tensors through the layout of the tp = 1, pp = 1 model, built deferred
  // (Note [Deferred initialisation]): the layout alone, no parameter memory.
  std::unique_ptr<models::CausalLM> whole;
  if (tp_size_ > 1 || pp_size_ > 1) {
    models::nn::DeferredInitScope layout_only;
    whole = make_whole_model();
  }
  OpenedCheckpoint ck = open_checkpoint(dir, whole ? *whole : *model_);
  std::optional<TpCheckpointReader> reader;
  if (whole) reader.emplace(*model_, *whole, *ck.index);
  if (ck.state.model_name != c.model.name) {
    user_error("checkpoint {} was written for model '{}' but the config asks for '{}'", dir,
               ck.state.model_name, c.model.name);
  }
  optim::Optimizer& opt = engine_->optimizer();
  if (ck.optimizer_name.empty())
    user_error(
        "checkpoint {} holds no optimizer state (optimizer*.safetensors); it cannot be "
        "resumed, only used through model.init_from after `convert --to-hf`",
        dir);
  if (ck.optimizer_name != opt.name())
    user_error(
        "checkpoint {} holds the state of optimizer '{}', this run uses '{}'; set "
        "optimizer.name to match or start a new run.dir",
        dir, ck.optimizer_name, opt.name());
  // Note [Mixed precision] (parallel/engine.h): parameters and masters are one thing at two
  // precisions; take the fp32 masters when the checkpoint has them, else its parameters.
  auto source_key = [&](const std::string& unit, const std::string& key, int64_t begin,
                        int64_t numel) {
    if (key != "param" && key != "master") return key;
    if (whole) {  // the whole unit of the same name
      for (const models::FlatUnit& wu : whole->flat_units())
        if (wu.name == unit) {
          begin = 0;
          numel = unit_extent(wu);
        }
    }
    return ck.index->covers(unit, "master", begin, numel) ? std::string("master")
                                                          : std::string("param");
  };
  auto read = [&](const std::string& unit, const std::string& key, int64_t begin,
                  tensor::Tensor dst) {
    const std::string src = source_key(unit, key, begin, dst.numel());
    if (reader)
      reader->fill(unit, key, src, begin, dst);
    else
      ck.index->fill(unit, src, begin, dst);
  };
  // Validate coverage of everything this rank will load before touching anything.
  // Note [Streamed shards]: by their place and size, nothing read.
  std::vector<parallel::Engine::ShardInfo> needed;  // in the checkpoint's (whole) coordinates
  for (const parallel::Engine::ShardInfo& sh : engine_->shard_layout()) {
    if (!whole) {
      needed.push_back(sh);
      continue;
    }
    for (const models::FlatUnit& wu : whole->flat_units())
      if (wu.name == sh.unit) needed.push_back({sh.unit, sh.key, wu.size(), 0, unit_extent(wu)});
  }
  for (const parallel::Engine::ShardInfo& sh : needed)
    if (!ck.index->covers(sh.unit, source_key(sh.unit, sh.key, sh.begin, sh.numel), sh.begin,
                          sh.numel))
      user_error(
          "checkpoint {}: has no '{}' state for elements [{}, {}) of unit '{}'; it was "
          "written by a different optimizer or model, or some of its files are missing",
          dir, sh.key, sh.begin, sh.begin + sh.numel, sh.unit);
  if (engine_->config().stage < 3) {
    for (const models::FlatUnit& u : model_->flat_units()) read(u.name, "param", 0, u.params);
    engine_->sync_params();
  }
  engine_->load_shards(read);
  if (scaler_ && ck.state.loss_scale > 0) {
    optim::LossScalerState ls;
    ls.scale = ck.state.loss_scale;
    ls.iteration = ck.state.loss_scale_iteration;
    ls.last_overflow_iteration = ck.state.loss_scale_last_overflow;
    ls.hysteresis_left = ck.state.loss_scale_hysteresis_left;
    scaler_->load_state(ls);
  }
  opt.set_step_count(ck.optimizer_step);  // the states were filled in place
  step_ = ck.state.step;
  samples_consumed_ = ck.state.samples_consumed;
  generator_.set_state(ck.state.rng_seed, ck.state.rng_offset);
  last_saved_step_ = step_;
  last_checkpoint_ = dir;
}

}  // namespace strata::runtime
