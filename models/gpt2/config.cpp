#include "models/gpt2/config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <cmath>

#include "core/error.h"
#include "models/config_limits.h"

namespace strata::models::gpt2 {

void GPT2Config::validate() const {
  STRATA_USER_CHECK(vocab_size > 0 && n_positions > 0 && n_embd > 0 && n_layer > 0 && n_head > 0,
                    "GPT-2 config: vocab_size, n_positions, n_embd, n_layer and n_head must be "
                    "positive");
  check_limit("GPT-2", "vocab_size", vocab_size, kMaxVocab);
  check_limit("GPT-2", "padded_vocab_size", padded_vocab_size, kMaxPaddedVocab);
  check_limit("GPT-2", "n_positions", n_positions, kMaxContext);
  check_limit("GPT-2", "n_embd", n_embd, kMaxWidth);
  check_limit("GPT-2", "n_layer", n_layer, kMaxLayers);
  STRATA_USER_CHECK(padded_vocab_size >= vocab_size,
                    "GPT-2 config: padded_vocab_size {} is smaller than vocab_size {}",
                    padded_vocab_size, vocab_size);
  STRATA_USER_CHECK(n_embd % n_head == 0,
                    "GPT-2 config: n_embd {} is not divisible by n_head {}; pick n_head so that "
                    "n_embd / n_head is the head size",
                    n_embd, n_head);
  STRATA_USER_CHECK(dropout >= 0.f && dropout < 1.f, "GPT-2 config: dropout {} must be in [0, 1)",
                    dropout);
  STRATA_USER_CHECK(layer_norm_epsilon > 0.f && std::isfinite(layer_norm_epsilon),
                    "GPT-2 config: layer_norm_epsilon must be positive and finite");
  STRATA_USER_CHECK(tiling >= 1 && tiling <= n_embd,
                    "GPT-2 config: tiling {} must be between 1 (untiled) and n_embd {}", tiling,
                    n_embd);
  STRATA_USER_CHECK(tiling == 1 || !recompute_gelu,
                    "GPT-2 config: recompute_gelu is the fused MLP's, and tiling {} runs the MLP "
                    "unfused; set tiling: 1 or recompute_gelu: false",
                    tiling);
}

int64_t pad_vocab(int64_t vocab_size, int64_t multiple) {
  return round_up_vocab(vocab_size, multiple);
}

namespace {

struct PresetShape {
  const char* name;
  int64_t n_layer, n_embd, n_head, n_positions;
};

// Note [GPT-2 presets].
constexpr PresetShape kPresets[] = {
    {"gpt2", 12, 768, 12, 1024},        {"gpt2-medium", 24, 1024, 16, 1024},
    {"gpt2-large", 36, 1280, 20, 1024}, {"gpt2-xl", 48, 1600, 25, 1024},
    {"gpt3-125m", 12, 768, 12, 2048},   {"gpt3-350m", 24, 1024, 16, 2048},
    {"gpt3-760m", 24, 1536, 16, 2048},  {"gpt3-1.3b", 24, 2048, 16, 2048},
    {"gpt3-2.7b", 32, 2560, 32, 2048},  {"gpt3-6.7b", 32, 4096, 32, 2048},
    {"gpt3-13b", 40, 5120, 40, 2048},   {"gpt3-175b", 96, 12288, 96, 2048},
};

template <typename T>
T parse_number(const std::string& key, const std::string& value) {
  T out{};
  const char* end = value.data() + value.size();
  auto [ptr, ec] = std::from_chars(value.data(), end, out);
  if (ec != std::errc() || ptr != end)
    user_error("GPT-2 config: '{}' must be a number, got '{}'", key, value);
  return out;
}

bool parse_bool(const std::string& key, const std::string& value) {
  if (value == "true" || value == "1" || value == "on" || value == "yes") return true;
  if (value == "false" || value == "0" || value == "off" || value == "no") return false;
  user_error("GPT-2 config: '{}' must be true or false, got '{}'", key, value);
}

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> out{"gpt2-tiny"};
  for (const PresetShape& s : kPresets) out.emplace_back(s.name);
  return out;
}

GPT2Config preset(std::string_view name) {
  GPT2Config c;
  if (name == "gpt2-tiny") {
    c.vocab_size = 256;
    c.padded_vocab_size = 256;
    c.n_positions = 64;
    c.n_embd = 64;
    c.n_layer = 2;
    c.n_head = 4;
    return c;
  }
  for (const PresetShape& s : kPresets)
    if (name == s.name) {
      c.n_layer = s.n_layer;
      c.n_embd = s.n_embd;
      c.n_head = s.n_head;
      c.n_positions = s.n_positions;
      return c;
    }
  user_error("unknown GPT-2 preset '{}'; known: {}", name, fmt::join(preset_names(), ", "));
}

GPT2Config with_overrides(GPT2Config c, const std::map<std::string, std::string>& overrides) {
  bool vocab_changed = false, padded_given = false;
  for (const auto& [key, value] : overrides) {
    if (key == "vocab_size") {
      c.vocab_size = parse_number<int64_t>(key, value);
      vocab_changed = true;
    } else if (key == "padded_vocab_size") {
      c.padded_vocab_size = parse_number<int64_t>(key, value);
      padded_given = true;
    } else if (key == "n_positions" || key == "block_size") {
      c.n_positions = parse_number<int64_t>(key, value);
    } else if (key == "n_embd") {
      c.n_embd = parse_number<int64_t>(key, value);
    } else if (key == "n_layer") {
      c.n_layer = parse_number<int64_t>(key, value);
    } else if (key == "n_head") {
      c.n_head = parse_number<int64_t>(key, value);
    } else if (key == "dropout") {
      c.dropout = parse_number<float>(key, value);
    } else if (key == "layer_norm_epsilon") {
      c.layer_norm_epsilon = parse_number<float>(key, value);
    } else if (key == "activation_checkpointing") {
      c.activation_checkpointing = parse_bool(key, value);
    } else if (key == "recompute_gelu") {
      c.recompute_gelu = parse_bool(key, value);
    } else if (key == "tiling") {
      c.tiling = parse_number<int64_t>(key, value);
    } else {
      user_error(
          "unknown GPT-2 config key '{}'; known keys: vocab_size, padded_vocab_size, n_positions "
          "(or block_size), n_embd, n_layer, n_head, dropout, layer_norm_epsilon, "
          "activation_checkpointing, recompute_gelu, tiling",
          key);
    }
  }
  if (vocab_changed && !padded_given) c.padded_vocab_size = pad_vocab(c.vocab_size);
  c.validate();
  return c;
}

int64_t num_parameters(const GPT2Config& c) {
  const int64_t C = c.n_embd;
  // Per block: ln_1, ln_2 (2C each); c_attn C x 3C + 3C; attn c_proj C x C + C;
  // c_fc C x 4C + 4C; mlp c_proj 4C x C + C.
  const int64_t block = 12 * C * C + 13 * C;
  return c.padded_vocab_size * C + c.n_positions * C + c.n_layer * block + 2 * C;
}

}  // namespace strata::models::gpt2
