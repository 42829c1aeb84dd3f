#include "models/gpt2/gpt2.h"

#include <fmt/format.h>

#include <string>
#include <tuple>

#include "autograd/comm_functions.h"
#include "autograd/functions.h"

namespace strata::models::gpt2 {

GPT2::GPT2(const GPT2Config& config, uint64_t seed, const nn::TensorParallel& tp,
           const StageLayers& stage)
    : config_(config) {
  config_.validate();
  set_tensor_parallel(tp);
  set_stage(stage, config_.n_layer);
  const int64_t C = config_.n_embd;
  // Note [Pipeline stages]: the tied head needs the whole embeddings unit on the last stage too.
  const bool embeddings = is_first_stage() || is_last_stage();
  if (embeddings) {
    wte_ = &add_module<nn::VocabParallelEmbedding>("wte", config_.padded_vocab_size, C, tp);
    wpe_ = &add_module<nn::Embedding>("wpe", config_.n_positions, C);
    wpe_->set_tensor_parallel(tp);
  }
  drop_ = &add_module<nn::Dropout>("drop", config_.dropout);
  auto& h = add_module<nn::Module>("h");
  for (int64_t c = 0; c < num_chunks(); ++c)  // Note [Virtual pipeline stages]
    for (int64_t i = stage_layers().chunk_begin(c); i < stage_layers().chunk_end(c); ++i)
      blocks_.push_back(&h.add_module<Block>(std::to_string(i), config_, tp));
  if (is_last_stage()) {
    ln_f_ = &add_module<nn::LayerNorm>("ln_f", C, config_.layer_norm_epsilon);
    ln_f_->set_tensor_parallel(tp);
    lm_head_ = &add_module<nn::TiedLinear>("lm_head", wte_->weight());
  }

  std::vector<UnitSpec> units;
  if (embeddings) {
    if (is_last_stage())
      units.push_back({"embeddings", {"wte", "wpe"}, {"lm_head"}});
    else
      units.push_back({"embeddings", {"wte", "wpe"}});
  }
  for (int64_t c = 0; c < num_chunks(); ++c)
    for (int64_t i = stage_layers().chunk_begin(c); i < stage_layers().chunk_end(c); ++i) {
      std::string name = "h." + std::to_string(i);
      units.push_back({name, {name}});
    }
  if (is_last_stage()) units.push_back({"head", {"ln_f"}});
  flatten(units);
  initialize(seed);
}

void GPT2::finish_unit_init(const FlatUnit& unit) {
  if (wte_ != nullptr && holds_prefix(unit, "wte")) wte_->zero_rows_from(config_.vocab_size);
}

void GPT2::reset_parameters(uint64_t seed) {
  CausalLM::reset_parameters(seed);  // each layer, keyed by name (Note [GPT-2 init])
  if (wte_ != nullptr) wte_->zero_rows_from(config_.vocab_size);
}

void GPT2::set_activation_checkpointing(bool on) {
  config_.activation_checkpointing = on;
  for (Block* b : blocks_) b->set_activation_checkpointing(on);
}

Variable GPT2::forward_logits(const Tensor& ids) {
  return forward_stage(ids, Variable());
}

Variable GPT2::forward_stage(const Tensor& ids, const Variable& hidden, int chunk) {
  const nn::TensorParallel& tp = tensor_parallel();
  Variable x = hidden;
  if (chunk_is_first(chunk)) {
    const int64_t T = ids.size(1);
    STRATA_USER_CHECK(!tp.sp() || T % tp.size() == 0,
                      "sequence parallelism splits the sequence over tensor_parallel_size {}: a "
                      "sequence of {} tokens does not divide",
                      tp.size(), T);
    // Under a KV cache the tokens sit at positions [start, start + T) (Note [KV cache]).
    const int64_t start = KvCache::active() ? KvCache::active()->start() : 0;
    // [B, T, C] + [T, C]: the position embedding broadcasts over the batch. Under sequence
    // parallelism both are this rank's tokens, [B, T / tp, C] (Note [Sequence-parallel layout]).
    Tensor pos = tp.sp()
                     ? autograd::sequence_positions(ids.size(0), T, start, tp.group, ids.device())
                     : tensor::arange(start + T, DType::I64, ids.device()).narrow(0, start, T);
    x = autograd::add((*wte_)(Variable(ids)), (*wpe_)(Variable(pos)));
    x = (*drop_)(x);
  }
  STRATA_CHECK(x.defined(), "a pipeline stage after the first needs the hidden states");
  // Each block hands on its MLP output un-added; the last is added inside ln_f (Note [Fused ops
  // in models]). Only ln_f's output is used, so its fused op skips the sum's gradient.
  Variable pending;
  const auto [from, to] = chunk_slots(chunk);  // Note [Virtual pipeline stages]
  for (size_t i = from; i < to; ++i)
    std::tie(x, pending) = blocks_[i]->forward_residual(x, pending);
  // Note [Pipeline stages]: the next stage takes the whole residual stream.
  if (!chunk_is_last(chunk)) return pending.defined() ? autograd::add(x, pending) : x;
  // Note [Last-position logits]: under forward_cached(..., last_only) ln_f and the head run the
  // last position only.
  x = positions_for_logits(x);
  if (pending.defined()) pending = positions_for_logits(pending);
  x = pending.defined() ? ln_f_->add_forward(x, pending, /*keep_sum=*/false).second : (*ln_f_)(x);
  // Tied head: [B, T, C] @ wte[Vp, C]^T -> [B, T, Vp] (this rank's [B, T, Vp / tp] under tensor
  // parallelism).
  return tp.enter_columns(x, [&](const Variable& in) { return (*lm_head_)(in); });
}

void register_presets(ModelRegistry& registry) {
  for (const std::string& name : preset_names()) {
    GPT2Config c = preset(name);
    ModelEntry e;
    e.name = name;
    e.family = "gpt2";
    e.description = fmt::format(
        "{} ({:.1f}M parameters: {} layers, width {}, {} heads, context {})",
        name.starts_with("gpt3") ? "GPT-3 shape" : "GPT-2",
        static_cast<double>(num_parameters(c)) / 1e6, c.n_layer, c.n_embd, c.n_head, c.n_positions);
    e.create = [name](const ModelOptions& o) -> std::unique_ptr<CausalLM> {
      return std::make_unique<GPT2>(with_overrides(preset(name), o.overrides), o.seed, o.tp,
                                    o.stage);
    };
    e.shape = [name](const ModelOptions& o) {
      GPT2Config cfg = with_overrides(preset(name), o.overrides);
      ModelShape s;
      s.family = "gpt2";
      s.num_parameters = num_parameters(cfg);
      s.n_layer = cfg.n_layer;
      s.n_embd = cfg.n_embd;
      s.n_head = cfg.n_head;
      s.n_kv_head = cfg.n_head;
      s.max_seq_len = cfg.n_positions;
      s.vocab_size = cfg.vocab_size;
      s.padded_vocab_size = cfg.padded_vocab_size;
      s.embedding_parameters = (cfg.padded_vocab_size + cfg.n_positions) * cfg.n_embd;
      s.layer_parameters =
          (s.num_parameters - s.embedding_parameters - 2 * cfg.n_embd) / cfg.n_layer;
      s.head_parameters = 2 * cfg.n_embd + s.embedding_parameters;  // ln_f, the tied copy
      return s;
    };
    registry.add(std::move(e));
  }
}

}  // namespace strata::models::gpt2
