#include "models/gpt2/mlp.h"

#include <cmath>

#include "autograd/functions.h"

namespace strata::models::gpt2 {

MLP::MLP(const GPT2Config& config) {
  c_fc_ = &add_module<nn::Linear>("c_fc", config.n_embd, 4 * config.n_embd);
  c_proj_ = &add_module<nn::Linear>("c_proj", 4 * config.n_embd, config.n_embd);
  // Residual projection: see CausalSelfAttention.
  c_proj_->set_init_std(0.02f / std::sqrt(2.f * static_cast<float>(config.n_layer)));
  dropout_ = &add_module<nn::Dropout>("dropout", config.dropout);
}

Variable MLP::forward(const Variable& x) {
  return (*dropout_)((*c_proj_)(autograd::gelu((*c_fc_)(x))));
}

}  // namespace strata::models::gpt2
