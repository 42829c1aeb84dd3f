#include "models/llama/hf_interop.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "models/llama/llama.h"

namespace strata::models::llama {

namespace {

using tensor::Shape;
using tensor::Tensor;

constexpr std::string_view kPrefix = "model.";

const LlamaConfig& config_of(const CausalLM& model) {
  const auto* l = dynamic_cast<const Llama*>(&model);
  STRATA_CHECK(l != nullptr, "a llama-family model that is not llama::Llama");
  return l->config();
}

// [n * D, C] viewed as [n, a, b, C] with its two middle dims swapped.
Tensor swap_halves(const Tensor& w, int64_t n, int64_t a, int64_t b) {
  STRATA_CHECK(w.ndim() == 2 && w.size(0) == n * a * b, "rotary rows of {} for {} heads",
               w.shape().str(), n);
  const int64_t C = w.size(1);
  return w.reshape({n, a, b, C}).transpose(1, 2).contiguous().reshape({n * a * b, C});
}

class LlamaHfMapping final : public HfMapping {
 public:
  std::string family() const override { return "llama"; }
  std::string display_name() const override { return "LLaMA"; }
  std::string architecture() const override { return "LlamaForCausalLM"; }
  std::string model_type() const override { return "llama"; }
  std::string marker() const override { return "embed_tokens.weight"; }

  std::string hf_name(const std::string& name) const override {
    return name.starts_with("lm_head.") ? name : std::string(kPrefix) + name;
  }

  std::optional<std::string> strata_name(const std::string& hf) const override {
    std::string name = hf.starts_with(kPrefix) ? hf.substr(kPrefix.size()) : hf;
    if (name.ends_with(".self_attn.rotary_emb.inv_freq")) return std::nullopt;
    return name;
  }

  HfTensor hf_tensor(const CausalLM& model, const std::string& name,
                     const Shape& shape) const override {
    const LlamaConfig& cfg = config_of(model);
    HfTensor t;
    t.shape = shape;
    const bool q = name.ends_with(".self_attn.q_proj.weight");
    if (q || name.ends_with(".self_attn.k_proj.weight")) {
      const int64_t n = q ? cfg.num_attention_heads : cfg.num_key_value_heads;
      t.from_hf = [n](const Tensor& w) { return rotary_rows_from_hf(w, n); };
      t.to_hf = [n](const Tensor& w) { return rotary_rows_to_hf(w, n); };
      t.layout = "rows in HF's rotate_half order";
    } else if (name == "embed_tokens.weight" || name == "lm_head.weight") {
      t.shape = Shape{model.vocab_size(), shape[1]};
      t.vocab_rows = true;
    }
    return t;
  }

  std::optional<HfTiedHead> tied_head(const CausalLM& model) const override {
    if (!config_of(model).tie_word_embeddings) return std::nullopt;
    return HfTiedHead{"lm_head.weight", "embed_tokens.weight",
                      "set model.config.tie_word_embeddings: false to load it"};
  }

  std::string missing_hint(const CausalLM&, const std::string& name) const override {
    if (name != "lm_head.weight") return "";
    return "the model's LM head is untied; if the checkpoint ties it to embed_tokens, set "
           "model.config.tie_word_embeddings: true";
  }

  std::string layers_key() const override { return "num_hidden_layers"; }
  std::optional<int64_t> layer_index(const std::string& name) const override {
    return numbered_child(name, "layers.");
  }
  int64_t num_layers(const CausalLM& model) const override {
    return config_of(model).num_hidden_layers;
  }

  std::string likely_key(const std::string& name, const Shape& file,
                         const Shape& model) const override {
    if (file.ndim() != 2 || model.ndim() != 2) return "hidden_size";
    const bool rows = file[0] != model[0], cols = file[1] != model[1];
    if (name == "embed_tokens.weight" || name == "lm_head.weight")
      return rows ? "vocab_size" : "hidden_size";
    if (name.ends_with(".gate_proj.weight") || name.ends_with(".up_proj.weight"))
      return rows && !cols ? "intermediate_size" : "hidden_size";
    if (name.ends_with(".down_proj.weight"))
      return cols && !rows ? "intermediate_size" : "hidden_size";
    if (name.ends_with(".k_proj.weight") || name.ends_with(".v_proj.weight"))
      return rows && !cols ? "num_key_value_heads" : "hidden_size";
    return "hidden_size";
  }

  nlohmann::ordered_json config_json(const CausalLM& model) const override {
    const LlamaConfig& cfg = config_of(model);
    nlohmann::ordered_json c;
    c["architectures"] = {"LlamaForCausalLM"};
    c["model_type"] = "llama";
    c["vocab_size"] = cfg.vocab_size;
    c["hidden_size"] = cfg.hidden_size;
    c["intermediate_size"] = cfg.intermediate_size;
    c["num_hidden_layers"] = cfg.num_hidden_layers;
    c["num_attention_heads"] = cfg.num_attention_heads;
    c["num_key_value_heads"] = cfg.num_key_value_heads;
    c["head_dim"] = cfg.head_dim();
    c["hidden_act"] = "silu";
    c["max_position_embeddings"] = cfg.max_position_embeddings;
    c["initializer_range"] = json_float(cfg.initializer_range);
    c["rms_norm_eps"] = json_float(cfg.rms_norm_eps);
    c["rope_theta"] = cfg.rope_theta;
    c["rope_scaling"] = nullptr;
    c["attention_bias"] = false;
    c["attention_dropout"] = 0.0;
    c["mlp_bias"] = false;
    c["pretraining_tp"] = 1;
    c["use_cache"] = true;
    c["tie_word_embeddings"] = cfg.tie_word_embeddings;
    c["torch_dtype"] = "float32";
    return c;
  }

  // Defaults are transformers' LlamaConfig's.
  void check_config_json(const CausalLM& model, const nlohmann::json& c,
                         const std::string& path) const override {
    const LlamaConfig& cfg = config_of(model);
    check_config_int(c, path, "hidden_size", cfg.hidden_size, 4096, "hidden_size");
    check_config_int(c, path, "intermediate_size", cfg.intermediate_size, 11008,
                     "intermediate_size");
    check_config_int(c, path, "num_hidden_layers", cfg.num_hidden_layers, 32, "num_hidden_layers");
    check_config_int(c, path, "num_attention_heads", cfg.num_attention_heads, 32,
                     "num_attention_heads");
    // Absent, it is num_attention_heads (checked equal above).
    check_config_int(c, path, "num_key_value_heads", cfg.num_key_value_heads,
                     cfg.num_attention_heads, "num_key_value_heads");
    check_config_int(c, path, "head_dim", cfg.head_dim(), cfg.head_dim(), "");
    check_config_int(c, path, "vocab_size", cfg.vocab_size, 32000, "vocab_size");
    check_config_float(c, path, "rms_norm_eps", cfg.rms_norm_eps, 1e-6f, "rms_norm_eps");
    check_config_double(c, path, "rope_theta", cfg.rope_theta, 10000.0, "rope_theta");
    check_config_bool(c, path, "tie_word_embeddings", cfg.tie_word_embeddings, false,
                      "tie_word_embeddings");
    check_config_string(c, path, "hidden_act", {"silu"}, "silu",
                        "Strata's LLaMA MLP is SwiGLU with silu");
    check_config_bool(c, path, "attention_bias", false, false, "");
    check_config_bool(c, path, "mlp_bias", false, false, "");
    auto scaling = c.find("rope_scaling");
    if (scaling != c.end() && !scaling->is_null())
      user_error(
          "{}: rope_scaling is {}; Strata's LLaMA has no rotary scaling, so this "
          "checkpoint cannot be loaded",
          path, scaling->dump());
  }
};

}  // namespace

Tensor rotary_rows_from_hf(const Tensor& w, int64_t n_heads) {
  // HF's rows of a head are [2][D/2] (j, i); Strata's [D/2][2] (i, j).
  const int64_t D = w.size(0) / n_heads;
  return swap_halves(w, n_heads, 2, D / 2);
}

Tensor rotary_rows_to_hf(const Tensor& w, int64_t n_heads) {
  const int64_t D = w.size(0) / n_heads;
  return swap_halves(w, n_heads, D / 2, 2);
}

const HfMapping& hf_mapping() {
  static const LlamaHfMapping mapping;
  return mapping;
}

}  // namespace strata::models::llama
