#pragma once
// LLaMA (Touvron et al. 2023) and Llama 2, laid out and named like HF's LlamaForCausalLM without
// the "model." prefix: embed_tokens, layers.{i}.{input_layernorm, self_attn.{q,k,v,o}_proj,
// post_attention_layernorm, mlp.{gate,up,down}_proj}, norm, lm_head. No biases anywhere,
// RMSNorm, SwiGLU, rotary embedding (Note [LLaMA rotary convention]: q_proj/k_proj rows are in
// Meta's interleaved order, not HF's), grouped-query attention (Note [Grouped-query attention]),
// no dropout, no position embedding table. Linear weights are [out, in] (Note [Linear layout]),
// as HF stores them. With tie_word_embeddings the head is embed_tokens (logits = x E^T) and
// there is no lm_head parameter.
//
// Note [LLaMA init]
// As HF's LlamaPreTrainedModel: every Linear weight and embed_tokens ~ N(0, initializer_range =
// 0.02), RMSNorm weights 1; no residual scaling. Rows of embed_tokens and lm_head beyond
// vocab_size are 0 (Note [Padded vocabulary]). Draws are keyed by (seed, parameter name)
// (Note [Name-keyed init]).
//
// Tensor parallelism (given a group: Note [Tensor-parallel shards]): embed_tokens is
// vocab-parallel and lm_head column-parallel over the vocabulary (each rank its slice of the
// logits), attention heads (k/v heads too) and SwiGLU hidden units are split, the norms are
// replicated. Under sequence parallelism the residual stream and the norms hold this rank's tokens
// (Note [Sequence-parallel layout]).
//
// Units (Note [Flat parameters]): "embeddings" = embed_tokens, "layers.0" ..
// "layers.{n-1}", "head" = norm + lm_head (norm only when tied). When tied, the projection runs
// as the parameterless module "lm_head" (nn::TiedLinear), a user of "embeddings".
#include <memory>
#include <vector>

#include "models/causal_lm.h"
#include "models/llama/config.h"
#include "models/llama/decoder_layer.h"
#include "models/llama/rms_norm.h"
#include "models/llama/rotary.h"
#include "models/nn/embedding.h"
#include "models/nn/parallel_linear.h"
#include "models/nn/tied_linear.h"
#include "models/nn/vocab_parallel_embedding.h"
#include "models/registry.h"

namespace strata::models::llama {

class Llama : public CausalLM {
 public:
  // Builds, flattens and initialises the model from `seed`; only the layers of `stage` and what
  // goes with them (Note [Pipeline stages]) when given.
  explicit Llama(const LlamaConfig& config, uint64_t seed = 0, const nn::TensorParallel& tp = {},
                 const StageLayers& stage = {});

  const LlamaConfig& config() const { return config_; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t padded_vocab_size() const override { return config_.padded_vocab_size; }
  int64_t max_seq_len() const override { return config_.max_position_embeddings; }
  std::string family() const override { return "llama"; }
  bool supports_kv_cache() const override { return true; }  // Note [KV cache]
  int64_t hidden_size() const override { return config_.hidden_size; }
  bool ties_embeddings() const override { return config_.tie_word_embeddings; }
  Variable forward_stage(const Tensor& ids, const Variable& hidden, int chunk = 0) override;

  void reset_parameters(uint64_t seed) override;
  void finish_unit_init(const FlatUnit& unit) override;
  // Turns decoder-layer recomputation on or off after construction.
  void set_activation_checkpointing(bool on);

  nn::VocabParallelEmbedding& embed_tokens() { return *embed_tokens_; }
  // Layer i of this stage's layers, every chunk's in order (Note [Virtual pipeline stages]).
  DecoderLayer& layer(int64_t i) { return *layers_.at(static_cast<size_t>(i)); }
  RMSNorm& norm() { return *norm_; }
  // Null when tie_word_embeddings.
  nn::ColumnParallelLinear* lm_head() { return lm_head_; }

 protected:
  Variable forward_logits(const Tensor& ids) override;

 private:
  LlamaConfig config_;
  // Declared before the layers that point to it.
  std::unique_ptr<RotaryEmbedding> rope_;
  nn::VocabParallelEmbedding* embed_tokens_ = nullptr;  // null on a stage without the embeddings
  std::vector<DecoderLayer*> layers_;
  RMSNorm* norm_ = nullptr;  // null unless the last stage
  nn::ColumnParallelLinear* lm_head_ = nullptr;
  nn::TiedLinear* tied_head_ = nullptr;  // when tie_word_embeddings
};

// The "llama-tiny", LLaMA 1 and Llama 2 presets (Note [LLaMA presets]).
void register_presets(ModelRegistry& registry);

}  // namespace strata::models::llama
