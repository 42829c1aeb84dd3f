#include "models/llama/llama.h"

#include <fmt/format.h>

#include <string>
#include <tuple>

#include "autograd/functions.h"

namespace strata::models::llama {

Llama::Llama(const LlamaConfig& config, uint64_t seed, const nn::TensorParallel& tp,
             const StageLayers& stage)
    : config_(config) {
  config_.validate();
  set_tensor_parallel(tp);
  set_stage(stage, config_.num_hidden_layers);
  const int64_t C = config_.hidden_size;
  rope_ = std::make_unique<RotaryEmbedding>(config_.head_dim(), config_.max_position_embeddings,
                                            config_.rope_theta);
  // Note [Pipeline stages]: a tied head needs the embeddings unit on the last stage too.
  const bool embeddings = is_first_stage() || (is_last_stage() && config_.tie_word_embeddings);
  if (embeddings) {
    embed_tokens_ =
        &add_module<nn::VocabParallelEmbedding>("embed_tokens", config_.padded_vocab_size, C, tp);
    embed_tokens_->set_init_std(config_.initializer_range);
  }
  auto& layers = add_module<nn::Module>("layers");
  for (int64_t c = 0; c < num_chunks(); ++c)  // Note [Virtual pipeline stages]
    for (int64_t i = stage_layers().chunk_begin(c); i < stage_layers().chunk_end(c); ++i)
      layers_.push_back(&layers.add_module<DecoderLayer>(std::to_string(i), config_, *rope_, tp));
  if (is_last_stage()) {
    norm_ = &add_module<RMSNorm>("norm", C, config_.rms_norm_eps);
    norm_->set_tensor_parallel(tp);
    if (!config_.tie_word_embeddings) {
      lm_head_ = &add_module<nn::ColumnParallelLinear>("lm_head", C, config_.padded_vocab_size,
                                                       /*bias=*/false, tp);
      lm_head_->set_init_std(config_.initializer_range);
    } else {
      tied_head_ = &add_module<nn::TiedLinear>("lm_head", embed_tokens_->weight());
    }
  }

  std::vector<UnitSpec> units;
  if (tied_head_)
    units.push_back({"embeddings", {"embed_tokens"}, {"lm_head"}});
  else if (embeddings)
    units.push_back({"embeddings", {"embed_tokens"}});
  for (int64_t c = 0; c < num_chunks(); ++c)
    for (int64_t i = stage_layers().chunk_begin(c); i < stage_layers().chunk_end(c); ++i) {
      std::string name = "layers." + std::to_string(i);
      units.push_back({name, {name}});
    }
  if (lm_head_)
    units.push_back({"head", {"norm", "lm_head"}});
  else if (norm_)
    units.push_back({"head", {"norm"}});
  flatten(units);
  initialize(seed);
}

void Llama::finish_unit_init(const FlatUnit& unit) {
  if (embed_tokens_ && holds_prefix(unit, "embed_tokens"))
    embed_tokens_->zero_rows_from(config_.vocab_size);
  if (lm_head_ && holds_prefix(unit, "lm_head")) lm_head_->zero_rows_from(config_.vocab_size);
}

void Llama::reset_parameters(uint64_t seed) {
  CausalLM::reset_parameters(seed);  // each layer, keyed by name (Note [LLaMA init])
  if (embed_tokens_) embed_tokens_->zero_rows_from(config_.vocab_size);
  if (lm_head_) lm_head_->zero_rows_from(config_.vocab_size);
}

void Llama::set_activation_checkpointing(bool on) {
  config_.activation_checkpointing = on;
  for (DecoderLayer* l : layers_) l->set_activation_checkpointing(on);
}

Variable Llama::forward_logits(const Tensor& ids) {
  return forward_stage(ids, Variable());
}

Variable Llama::forward_stage(const Tensor& ids, const Variable& hidden, int chunk) {
  const nn::TensorParallel& tp = tensor_parallel();
  Variable x = hidden;
  if (chunk_is_first(chunk)) {
    STRATA_USER_CHECK(!tp.sp() || ids.size(1) % tp.size() == 0,
                      "sequence parallelism splits the sequence over tensor_parallel_size {}: a "
                      "sequence of {} tokens does not divide",
                      tp.size(), ids.size(1));
    x = (*embed_tokens_)(Variable(ids));
  }
  STRATA_CHECK(x.defined(), "a pipeline stage after the first needs the hidden states");
  // Each layer hands on its MLP output un-added; the last is added inside `norm` (Note [Fused
  // ops in models]). Only the norm's output is used, so its fused op skips the sum's gradient.
  Variable pending;
  const auto [from, to] = chunk_slots(chunk);  // Note [Virtual pipeline stages]
  for (size_t i = from; i < to; ++i)
    std::tie(x, pending) = layers_[i]->forward_residual(x, pending);
  // Note [Pipeline stages]: the next stage takes the whole residual stream.
  if (!chunk_is_last(chunk)) return pending.defined() ? autograd::add(x, pending) : x;
  // Note [Last-position logits]: under forward_cached(..., last_only) the norm and the head run
  // the last position only.
  x = positions_for_logits(x);
  if (pending.defined()) pending = positions_for_logits(pending);
  x = pending.defined() ? norm_->add_forward(x, pending, /*keep_sum=*/false).second : (*norm_)(x);
  // This rank's [B, T, Vp / tp] slice of the logits under tensor parallelism; a tied head is
  // [B, T, C] @ embed_tokens[Vp, C]^T -> [B, T, Vp].
  return tp.enter_columns(
      x, [&](const Variable& in) { return lm_head_ ? (*lm_head_)(in) : (*tied_head_)(in); });
}

void register_presets(ModelRegistry& registry) {
  for (const std::string& name : preset_names()) {
    LlamaConfig c = preset(name);
    ModelEntry e;
    e.name = name;
    e.family = "llama";
    const char* kind = name == "llama-tiny"         ? "LLaMA-style tiny model for tests"
                       : name.starts_with("llama2") ? "Llama 2 shape"
                                                    : "LLaMA 1 shape";
    e.description = fmt::format(
        "{} ({:.1f}M parameters: {} layers, width {}, {} heads ({} k/v), SwiGLU {}, context {})",
        kind, static_cast<double>(num_parameters(c)) / 1e6, c.num_hidden_layers, c.hidden_size,
        c.num_attention_heads, c.num_key_value_heads, c.intermediate_size,
        c.max_position_embeddings);
    e.create = [name](const ModelOptions& o) -> std::unique_ptr<CausalLM> {
      return std::make_unique<Llama>(with_overrides(preset(name), o.overrides), o.seed, o.tp,
                                     o.stage);
    };
    e.shape = [name](const ModelOptions& o) {
      LlamaConfig cfg = with_overrides(preset(name), o.overrides);
      ModelShape s;
      s.family = "llama";
      s.num_parameters = num_parameters(cfg);
      s.n_layer = cfg.num_hidden_layers;
      s.n_embd = cfg.hidden_size;
      s.n_head = cfg.num_attention_heads;
      s.n_kv_head = cfg.num_key_value_heads;
      s.max_seq_len = cfg.max_position_embeddings;
      s.vocab_size = cfg.vocab_size;
      s.padded_vocab_size = cfg.padded_vocab_size;
      s.embedding_parameters = cfg.padded_vocab_size * cfg.hidden_size;
      // The final norm and the head, or the tied copy of the embeddings.
      s.head_parameters = cfg.hidden_size + s.embedding_parameters;
      s.layer_parameters = (s.num_parameters - s.embedding_parameters - s.head_parameters +
                            (cfg.tie_word_embeddings ? s.embedding_parameters : 0)) /
                           cfg.num_hidden_layers;
      return s;
    };
    registry.add(std::move(e));
  }
}

}  // namespace strata::models::llama
