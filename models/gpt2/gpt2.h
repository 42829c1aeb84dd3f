#pragma once
// GPT-2 (Radford et al. 2019), laid out and named like HF's GPT2Model without the
// "transformer." prefix: wte, wpe, h.{i}.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc,
// mlp.c_proj}, ln_f; the LM head is tied to wte (logits = x wte^T, no parameter of its own).
// Linear weights are [out, in] (Note [Linear layout]).
//
// Note [GPT-2 init]
// As HF/nanoGPT: Linear and Embedding weights (wte and wpe too) ~ N(0, 0.02), biases 0,
// LayerNorm weight 1 and bias 0, residual projections (attn.c_proj.weight, mlp.c_proj.weight)
// ~ N(0, 0.02 / sqrt(2 n_layer)). wte rows beyond vocab_size are 0 (Note [Padded vocabulary]).
// Draws are keyed by (seed, parameter name) (Note [Name-keyed init]).
//
// Tensor parallelism (given a group: Note [Tensor-parallel shards]): wte is vocab-parallel (the
// tied head then gives each rank its slice of the logits), attention heads and MLP hidden units
// are split (CausalSelfAttention, MLP), wpe and the norms are replicated. Under sequence
// parallelism the residual stream, the norms and dropout hold this rank's tokens (Note
// [Sequence-parallel layout]).
//
// Units (Note [Flat parameters]): "embeddings" = wte + wpe, "h.0" .. "h.{n-1}", "head" = ln_f.
// The tied projection runs as the module `lm_head` (nn::TiedLinear, no parameter of its own),
// listed as a user of "embeddings" so that strategies see that use of wte through its hooks.
#include <vector>

#include "models/causal_lm.h"
#include "models/gpt2/block.h"
#include "models/gpt2/config.h"
#include "models/nn/dropout.h"
#include "models/nn/embedding.h"
#include "models/nn/layer_norm.h"
#include "models/nn/tied_linear.h"
#include "models/nn/vocab_parallel_embedding.h"
#include "models/registry.h"

namespace strata::models::gpt2 {

class GPT2 : public CausalLM {
 public:
  // Builds, flattens and initialises the model from `seed`; only the layers of `stage` and what
  // goes with them (Note [Pipeline stages]) when given.
  explicit GPT2(const GPT2Config& config, uint64_t seed = 0, const nn::TensorParallel& tp = {},
                const StageLayers& stage = {});

  const GPT2Config& config() const { return config_; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t padded_vocab_size() const override { return config_.padded_vocab_size; }
  int64_t max_seq_len() const override { return config_.n_positions; }
  std::string family() const override { return "gpt2"; }
  bool supports_kv_cache() const override { return true; }  // Note [KV cache]
  int64_t hidden_size() const override { return config_.n_embd; }
  bool ties_embeddings() const override { return true; }
  Variable forward_stage(const Tensor& ids, const Variable& hidden, int chunk = 0) override;

  void reset_parameters(uint64_t seed) override;
  void finish_unit_init(const FlatUnit& unit) override;
  // Turns block recomputation on or off after construction.
  void set_activation_checkpointing(bool on);

  nn::VocabParallelEmbedding& wte() { return *wte_; }
  nn::Embedding& wpe() { return *wpe_; }
  // Layer i of this stage's layers, every chunk's in order (Note [Virtual pipeline stages]).
  Block& block(int64_t i) { return *blocks_.at(static_cast<size_t>(i)); }
  nn::LayerNorm& ln_f() { return *ln_f_; }
  nn::TiedLinear& lm_head() { return *lm_head_; }

 protected:
  Variable forward_logits(const Tensor& ids) override;

 private:
  GPT2Config config_;
  nn::VocabParallelEmbedding* wte_ = nullptr;  // null on a middle pipeline stage
  nn::Embedding* wpe_ = nullptr;
  nn::Dropout* drop_;
  std::vector<Block*> blocks_;
  nn::LayerNorm* ln_f_ = nullptr;  // null unless the last stage
  nn::TiedLinear* lm_head_ = nullptr;
};

// The "gpt2-tiny", "gpt2".."gpt2-xl" and "gpt3-*" presets (Note [GPT-2 presets]).
void register_presets(ModelRegistry& registry);

}  // namespace strata::models::gpt2
