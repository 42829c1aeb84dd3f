#pragma once
// GPT-2 configuration and presets.
//
// Note [GPT-2 presets]
// "gpt2" .. "gpt2-xl" are the four released GPT-2 models (HF config.json values; context 1024).
// "gpt3-*" are the GPT-3 paper's shapes (Brown et al. 2020, table 2.1: n_layer, d_model,
// n_heads, context 2048) on the GPT-2 architecture: dense attention only (GPT-3's alternating
// locally banded sparse layers are not modelled), which changes no parameter count. Two rows
// of the table are not self-consistent; we use the shapes other implementations use:
// 1.3B has n_heads 24 with d_head 128 but d_model 2048 -> 16 heads of 128;
// 13B has d_model 5140 -> 5120 (40 heads of 128).
// The "gpt2-tiny" preset is for tests and CPU smoke runs.
// All GPT-2/3 presets have vocab 50257 padded to 50304 (Note [Padded vocabulary]).
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace strata::models::gpt2 {

struct GPT2Config {
  int64_t vocab_size = 50257;
  int64_t padded_vocab_size = 50304;  // >= vocab_size; rows/columns of wte beyond vocab_size
  int64_t n_positions = 1024;         // block size: the longest sequence
  int64_t n_embd = 768;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  float dropout = 0.f;  // embeddings, attention output and MLP output (not attention probs)
  float layer_norm_epsilon = 1e-5f;
  bool activation_checkpointing = false;  // recompute each block in backward
  // MLP keeps only the GELU input; backward recomputes its output (Note [GELU recompute] in
  // autograd/functions_fused.cpp). Fused ops only (the default).
  bool recompute_gelu = false;
  // Memory-centric tiling (Note [Tiled linear] in autograd/functions.h): each block's four
  // linears run as this many tiles in sequence, their working buffers a tile's; the MLP then runs
  // as its unfused ops (the fused node is one GEMM pair). 1 = untiled. Same bits in f32.
  int64_t tiling = 1;

  // strata::user_error on an inconsistent config (e.g. n_embd not divisible by n_head).
  void validate() const;
};

// vocab rounded up to a multiple of `multiple` (50257 -> 50304 for 64).
int64_t pad_vocab(int64_t vocab_size, int64_t multiple = 64);

// Note [GPT-2 presets]. strata::user_error for unknown names.
GPT2Config preset(std::string_view name);
std::vector<std::string> preset_names();

// Applies key=value overrides (keys are the field names; "block_size" is an alias of
// n_positions). Changing vocab_size without padded_vocab_size re-pads it to a multiple of 64.
// Unknown keys and malformed values are strata::user_errors naming the key.
GPT2Config with_overrides(GPT2Config config, const std::map<std::string, std::string>& overrides);

// Exactly the number of elements GPT2 allocates for `config`, computed without allocating:
// wte (padded_vocab x n_embd, tied with the head) + wpe + n_layer blocks (12 C^2 + 13 C each) +
// ln_f. gpt2 with padded_vocab_size = vocab_size = 50257 gives 124,439,808.
int64_t num_parameters(const GPT2Config& config);

}  // namespace strata::models::gpt2
