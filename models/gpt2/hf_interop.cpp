#include "models/gpt2/hf_interop.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "models/gpt2/gpt2.h"

namespace strata::models::gpt2 {

namespace {

using tensor::Shape;
using tensor::Tensor;

constexpr std::string_view kPrefix = "transformer.";

// Note [HF GPT-2 layout]: the Conv1D weights, stored [in, out] by HF.
bool is_conv1d_weight(const std::string& name) {
  for (std::string_view suffix :
       {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"})
    if (name.ends_with(suffix)) return true;
  return false;
}

const GPT2Config& config_of(const CausalLM& model) {
  const auto* g = dynamic_cast<const GPT2*>(&model);
  STRATA_CHECK(g != nullptr, "a gpt2-family model that is not gpt2::GPT2");
  return g->config();
}

class Gpt2HfMapping final : public HfMapping {
 public:
  std::string family() const override { return "gpt2"; }
  std::string display_name() const override { return "GPT-2"; }
  std::string architecture() const override { return "GPT2LMHeadModel"; }
  std::string model_type() const override { return "gpt2"; }
  std::string marker() const override { return "wte.weight"; }

  std::string hf_name(const std::string& name) const override { return name; }

  std::optional<std::string> strata_name(const std::string& hf) const override {
    std::string name = hf.starts_with(kPrefix) ? hf.substr(kPrefix.size()) : hf;
    if (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias")) return std::nullopt;
    return name;
  }

  HfTensor hf_tensor(const CausalLM& model, const std::string& name,
                     const Shape& shape) const override {
    HfTensor t;
    t.shape = shape;
    if (is_conv1d_weight(name)) {
      t.shape = Shape{shape[1], shape[0]};
      t.from_hf = t.to_hf = [](const Tensor& w) { return w.transpose(0, 1); };
      t.layout = "HF Conv1D layout [in, out]";
    } else if (name == "wte.weight") {
      t.shape = Shape{model.vocab_size(), shape[1]};
      t.vocab_rows = true;
    }
    return t;
  }

  std::optional<HfTiedHead> tied_head(const CausalLM&) const override {
    return HfTiedHead{"lm_head.weight", "wte.weight",
                      "Strata's GPT-2 always ties the LM head to the token embedding"};
  }

  std::string layers_key() const override { return "n_layer"; }
  std::optional<int64_t> layer_index(const std::string& name) const override {
    return numbered_child(name, "h.");
  }
  int64_t num_layers(const CausalLM& model) const override { return config_of(model).n_layer; }
  std::string likely_key(const std::string& name, const Shape& file,
                         const Shape& model) const override {
    if (name == "wte.weight" && file.ndim() == 2 && model.ndim() == 2)
      return file[0] != model[0] ? "vocab_size" : "n_embd";
    if (name == "wpe.weight" && file.ndim() == 2 && model.ndim() == 2)
      return file[0] != model[0] ? "n_positions" : "n_embd";
    return "n_embd";
  }

  nlohmann::ordered_json config_json(const CausalLM& model) const override {
    const GPT2Config& cfg = config_of(model);
    nlohmann::ordered_json c;
    c["model_type"] = "gpt2";
    c["architectures"] = {"GPT2LMHeadModel"};
    c["vocab_size"] = cfg.vocab_size;
    c["n_positions"] = cfg.n_positions;
    c["n_ctx"] = cfg.n_positions;
    c["n_embd"] = cfg.n_embd;
    c["n_layer"] = cfg.n_layer;
    c["n_head"] = cfg.n_head;
    c["n_inner"] = nullptr;  // 4 * n_embd
    c["activation_function"] = "gelu_new";
    c["resid_pdrop"] = json_float(cfg.dropout);
    c["embd_pdrop"] = json_float(cfg.dropout);
    c["attn_pdrop"] = 0.0;  // Strata applies no dropout to attention probabilities
    c["layer_norm_epsilon"] = json_float(cfg.layer_norm_epsilon);
    c["initializer_range"] = 0.02;
    c["scale_attn_weights"] = true;
    c["scale_attn_by_inverse_layer_idx"] = false;
    c["reorder_and_upcast_attn"] = false;
    c["use_cache"] = true;
    c["bos_token_id"] = cfg.vocab_size - 1;  // GPT-2's <|endoftext|> is the last token
    c["eos_token_id"] = cfg.vocab_size - 1;
    c["tie_word_embeddings"] = true;
    c["torch_dtype"] = "float32";
    return c;
  }

  // Defaults are transformers' GPT2Config's (and PretrainedConfig's tie_word_embeddings).
  void check_config_json(const CausalLM& model, const nlohmann::json& c,
                         const std::string& path) const override {
    const GPT2Config& cfg = config_of(model);
    check_config_int(c, path, "n_embd", cfg.n_embd, 768, "n_embd");
    check_config_int(c, path, "n_layer", cfg.n_layer, 12, "n_layer");
    check_config_int(c, path, "n_head", cfg.n_head, 12, "n_head");
    check_config_int(c, path, "n_positions", cfg.n_positions, 1024, "n_positions");
    check_config_int(c, path, "vocab_size", cfg.vocab_size, 50257, "vocab_size");
    check_config_int(c, path, "n_inner", 4 * cfg.n_embd, 4 * cfg.n_embd, "");
    check_config_float(c, path, "layer_norm_epsilon", cfg.layer_norm_epsilon, 1e-5f,
                       "layer_norm_epsilon");
    check_config_string(c, path, "activation_function", {"gelu_new", "gelu_pytorch_tanh"},
                        "gelu_new", "Strata's GPT-2 uses the tanh GELU (gelu_new)");
    check_config_bool(c, path, "tie_word_embeddings", true, true, "");
    check_config_bool(c, path, "scale_attn_weights", true, true, "");
    check_config_bool(c, path, "scale_attn_by_inverse_layer_idx", false, false, "");
  }
};

}  // namespace

const HfMapping& hf_mapping() {
  static const Gpt2HfMapping mapping;
  return mapping;
}

}  // namespace strata::models::gpt2
