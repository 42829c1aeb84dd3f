#pragma once
// Helpers shared by the LLaMA tests: the reference files' config, AdamW groups over flat units,
// random token ids.
#include <algorithm>
#include <string>
#include <vector>

#include "core/rng.h"
#include "model_test_util.h"
#include "models/llama/llama.h"
#include "optim/adamw.h"

namespace strata::testing {

// The LLaMA config a reference file was generated with (its __metadata__, HF names).
inline models::llama::LlamaConfig llama_config_from_metadata(const tensor::SafetensorsReader& r) {
  const auto& m = r.metadata();
  models::llama::LlamaConfig c;
  c.vocab_size = std::stoll(m.at("vocab_size"));
  c.padded_vocab_size = std::stoll(m.at("padded_vocab_size"));
  c.max_position_embeddings = std::stoll(m.at("max_position_embeddings"));
  c.hidden_size = std::stoll(m.at("hidden_size"));
  c.intermediate_size = std::stoll(m.at("intermediate_size"));
  c.num_hidden_layers = std::stoll(m.at("num_hidden_layers"));
  c.num_attention_heads = std::stoll(m.at("num_attention_heads"));
  c.num_key_value_heads = std::stoll(m.at("num_key_value_heads"));
  c.rms_norm_eps = std::stof(m.at("rms_norm_eps"));
  c.rope_theta = std::stod(m.at("rope_theta"));
  c.tie_word_embeddings = m.at("tie_word_embeddings") == "true";
  return c;
}

// One AdamW group per unit; matrices decay, vectors do not (as the references' two groups).
inline std::vector<optim::ParamGroup> unit_param_groups(models::CausalLM& model) {
  std::vector<optim::ParamGroup> groups;
  for (models::FlatUnit& u : model.flat_units()) {
    optim::ParamGroup g;
    g.param = u.params;
    g.grad = u.grads;
    for (size_t k = 0; k < u.names.size(); ++k)
      g.segments.push_back({u.names[k], u.offsets[k], u.numels[k], u.shapes[k].ndim() >= 2});
    groups.push_back(std::move(g));
  }
  return groups;
}

// [B, T] i64 ids uniform in [0, vocab), a pure function of `seed`.
inline tensor::Tensor random_token_ids(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  std::vector<float> u(static_cast<size_t>(B * T));
  rng_uniform(u.data(), u.size(), {seed, 1}, 0.f, static_cast<float>(vocab));
  std::vector<int64_t> ids;
  for (float x : u) ids.push_back(std::min<int64_t>(static_cast<int64_t>(x), vocab - 1));
  return tensor::from_ints(ids, {B, T});
}

}  // namespace strata::testing
