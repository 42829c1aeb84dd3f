#include "models/llama/config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <cmath>

#include "core/error.h"
#include "models/config_limits.h"

namespace strata::models::llama {

void LlamaConfig::validate() const {
  STRATA_USER_CHECK(vocab_size > 0 && max_position_embeddings > 0 && hidden_size > 0 &&
                        intermediate_size > 0 && num_hidden_layers > 0 && num_attention_heads > 0 &&
                        num_key_value_heads > 0,
                    "LLaMA config: vocab_size, max_position_embeddings, hidden_size, "
                    "intermediate_size, num_hidden_layers, num_attention_heads and "
                    "num_key_value_heads must be positive");
  check_limit("LLaMA", "vocab_size", vocab_size, kMaxVocab);
  check_limit("LLaMA", "padded_vocab_size", padded_vocab_size, kMaxPaddedVocab);
  check_limit("LLaMA", "max_position_embeddings", max_position_embeddings, kMaxContext);
  check_limit("LLaMA", "hidden_size", hidden_size, kMaxWidth);
  check_limit("LLaMA", "intermediate_size", intermediate_size, kMaxFfnWidth);
  check_limit("LLaMA", "num_hidden_layers", num_hidden_layers, kMaxLayers);
  STRATA_USER_CHECK(padded_vocab_size >= vocab_size,
                    "LLaMA config: padded_vocab_size {} is smaller than vocab_size {}",
                    padded_vocab_size, vocab_size);
  STRATA_USER_CHECK(hidden_size % num_attention_heads == 0,
                    "LLaMA config: hidden_size {} is not divisible by num_attention_heads {}; pick "
                    "the heads so that hidden_size / num_attention_heads is the head size",
                    hidden_size, num_attention_heads);
  STRATA_USER_CHECK(num_attention_heads % num_key_value_heads == 0,
                    "LLaMA config: num_key_value_heads {} must divide num_attention_heads {} "
                    "(each k/v head serves a group of query heads)",
                    num_key_value_heads, num_attention_heads);
  STRATA_USER_CHECK(head_dim() % 2 == 0,
                    "LLaMA config: the head size {} (hidden_size / num_attention_heads) must be "
                    "even for rotary embeddings",
                    head_dim());
  STRATA_USER_CHECK(rms_norm_eps > 0.f && std::isfinite(rms_norm_eps),
                    "LLaMA config: rms_norm_eps must be positive and finite");
  STRATA_USER_CHECK(rope_theta > 0.0 && std::isfinite(rope_theta),
                    "LLaMA config: rope_theta must be positive and finite");
  STRATA_USER_CHECK(initializer_range >= 0.f && std::isfinite(initializer_range),
                    "LLaMA config: initializer_range must be >= 0 and finite");
}

namespace {

struct PresetShape {
  const char* name;
  int64_t layers, hidden, heads, kv_heads, ffn, context;
  float eps;
};

// Note [LLaMA presets].
constexpr PresetShape kPresets[] = {
    {"llama-7b", 32, 4096, 32, 32, 11008, 2048, 1e-6f},
    {"llama-13b", 40, 5120, 40, 40, 13824, 2048, 1e-6f},
    {"llama-33b", 60, 6656, 52, 52, 17920, 2048, 1e-6f},
    {"llama-65b", 80, 8192, 64, 64, 22016, 2048, 1e-6f},
    {"llama2-7b", 32, 4096, 32, 32, 11008, 4096, 1e-5f},
    {"llama2-13b", 40, 5120, 40, 40, 13824, 4096, 1e-5f},
    {"llama2-70b", 80, 8192, 64, 8, 28672, 4096, 1e-5f},
};

template <typename T>
T parse_number(const std::string& key, const std::string& value) {
  T out{};
  const char* end = value.data() + value.size();
  auto [ptr, ec] = std::from_chars(value.data(), end, out);
  if (ec != std::errc() || ptr != end)
    user_error("LLaMA config: '{}' must be a number, got '{}'", key, value);
  return out;
}

bool parse_bool(const std::string& key, const std::string& value) {
  if (value == "true" || value == "1" || value == "on" || value == "yes") return true;
  if (value == "false" || value == "0" || value == "off" || value == "no") return false;
  user_error("LLaMA config: '{}' must be true or false, got '{}'", key, value);
}

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> out{"llama-tiny"};
  for (const PresetShape& s : kPresets) out.emplace_back(s.name);
  return out;
}

LlamaConfig preset(std::string_view name) {
  LlamaConfig c;
  if (name == "llama-tiny") {
    c.vocab_size = 256;
    c.padded_vocab_size = 256;
    c.max_position_embeddings = 64;
    c.hidden_size = 64;
    c.intermediate_size = 176;  // ~8/3 * 64, a multiple of 16
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    return c;
  }
  for (const PresetShape& s : kPresets)
    if (name == s.name) {
      c.num_hidden_layers = s.layers;
      c.hidden_size = s.hidden;
      c.num_attention_heads = s.heads;
      c.num_key_value_heads = s.kv_heads;
      c.intermediate_size = s.ffn;
      c.max_position_embeddings = s.context;
      c.rms_norm_eps = s.eps;
      return c;
    }
  user_error("unknown LLaMA preset '{}'; known: {}", name, fmt::join(preset_names(), ", "));
}

LlamaConfig with_overrides(LlamaConfig c, const std::map<std::string, std::string>& overrides) {
  bool vocab_changed = false, padded_given = false;
  for (const auto& [key, value] : overrides) {
    if (key == "vocab_size") {
      c.vocab_size = parse_number<int64_t>(key, value);
      vocab_changed = true;
    } else if (key == "padded_vocab_size") {
      c.padded_vocab_size = parse_number<int64_t>(key, value);
      padded_given = true;
    } else if (key == "max_position_embeddings" || key == "block_size") {
      c.max_position_embeddings = parse_number<int64_t>(key, value);
    } else if (key == "hidden_size" || key == "n_embd") {
      c.hidden_size = parse_number<int64_t>(key, value);
    } else if (key == "intermediate_size") {
      c.intermediate_size = parse_number<int64_t>(key, value);
    } else if (key == "num_hidden_layers" || key == "n_layer") {
      c.num_hidden_layers = parse_number<int64_t>(key, value);
    } else if (key == "num_attention_heads" || key == "n_head") {
      c.num_attention_heads = parse_number<int64_t>(key, value);
    } else if (key == "num_key_value_heads" || key == "n_kv_head") {
      c.num_key_value_heads = parse_number<int64_t>(key, value);
    } else if (key == "rms_norm_eps") {
      c.rms_norm_eps = parse_number<float>(key, value);
    } else if (key == "rope_theta") {
      c.rope_theta = parse_number<double>(key, value);
    } else if (key == "tie_word_embeddings") {
      c.tie_word_embeddings = parse_bool(key, value);
    } else if (key == "initializer_range") {
      c.initializer_range = parse_number<float>(key, value);
    } else if (key == "activation_checkpointing") {
      c.activation_checkpointing = parse_bool(key, value);
    } else if (key == "recompute_swiglu") {
      c.recompute_swiglu = parse_bool(key, value);
    } else {
      user_error(
          "unknown LLaMA config key '{}'; known keys: vocab_size, padded_vocab_size, "
          "max_position_embeddings (or block_size), hidden_size (or n_embd), intermediate_size, "
          "num_hidden_layers (or n_layer), num_attention_heads (or n_head), num_key_value_heads "
          "(or n_kv_head), rms_norm_eps, rope_theta, tie_word_embeddings, initializer_range, "
          "activation_checkpointing, recompute_swiglu",
          key);
    }
  }
  if (vocab_changed && !padded_given) c.padded_vocab_size = round_up_vocab(c.vocab_size, 64);
  c.validate();
  return c;
}

int64_t num_parameters(const LlamaConfig& c) {
  const int64_t C = c.hidden_size, F = c.intermediate_size;
  const int64_t kv = c.num_key_value_heads * c.head_dim();
  const int64_t layer = 2 * C * C + 2 * C * kv + 3 * C * F + 2 * C;
  const int64_t embeddings = c.padded_vocab_size * C;
  return embeddings + (c.tie_word_embeddings ? 0 : embeddings) + c.num_hidden_layers * layer + C;
}

}  // namespace strata::models::llama
