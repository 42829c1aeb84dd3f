#include "models/gpt2/hf_interop.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "core/atomic_file.h"
#include "core/error.h"
#include "models/gpt2/gpt2.h"
#include "tensor/ops.h"
#include "tensor/safetensors.h"

namespace strata::models {

namespace {

namespace fs = std::filesystem;
using tensor::SafetensorsEntry;
using tensor::SafetensorsReader;
using tensor::Shape;

constexpr std::string_view kPrefix = "transformer.";

// Note [HF GPT-2 layout]: the Conv1D weights, stored [in, out] by HF.
bool is_conv1d_weight(const std::string& name) {
  for (std::string_view suffix :
       {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"})
    if (name.ends_with(suffix)) return true;
  return false;
}

bool is_ignored_buffer(const std::string& name) {
  return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias");
}

// The block index of "h.<k>.…", if the name has one.
std::optional<int64_t> layer_index(const std::string& name) {
  if (!name.starts_with("h.")) return std::nullopt;
  int64_t k = 0;
  const char* begin = name.data() + 2;
  const char* end = name.data() + name.size();
  auto [ptr, ec] = std::from_chars(begin, end, k);
  if (ec != std::errc() || ptr == begin || ptr == end || *ptr != '.') return std::nullopt;
  return k;
}

// Which config key a shape mismatch of `name` most likely comes from.
std::string likely_key(const std::string& name, const Shape& got, const Shape& want) {
  if (name == "wte.weight" && got.ndim() == 2 && want.ndim() == 2)
    return got[0] != want[0] ? "vocab_size" : "n_embd";
  if (name == "wpe.weight" && got.ndim() == 2 && want.ndim() == 2)
    return got[0] != want[0] ? "n_positions" : "n_embd";
  return "n_embd";
}

// What HF stores for Strata parameter `name` of shape `shape` (Note [HF GPT-2 layout]).
Shape hf_shape(const std::string& name, const Shape& shape, int64_t vocab_size) {
  if (is_conv1d_weight(name)) return Shape{shape[1], shape[0]};
  if (name == "wte.weight") return Shape{vocab_size, shape[1]};
  return shape;
}

void require_gpt2(const CausalLM& model, const std::string& path, std::string_view what) {
  if (model.family() != "gpt2")
    user_error("{}: {} works on gpt2-family models only, this model is '{}'", path, what,
               model.family());
}

// Writes `text` to `path` via a temporary file, fsync and rename (DESIGN.md decision 12).
void write_text_atomic(const std::string& path, const std::string& text) {
  write_file_atomically(path, text);  // Note [Atomic files]
}

}  // namespace

void load_hf_gpt2(CausalLM& model, const std::string& path_in) {
  std::string path = path_in;
  if (fs::is_directory(path)) path = (fs::path(path) / "model.safetensors").string();
  require_gpt2(model, path, "load_hf_gpt2");
  SafetensorsReader reader(path);

  // File names -> Strata names; the prefix is optional but a name must not appear both ways.
  std::map<std::string, const SafetensorsEntry*> by_name;
  const SafetensorsEntry* lm_head = nullptr;
  int64_t file_layers = 0;
  for (const SafetensorsEntry& e : reader.entries()) {
    std::string name = e.name;
    if (name.starts_with(kPrefix)) name = name.substr(kPrefix.size());
    if (is_ignored_buffer(name)) continue;
    if (name == "lm_head.weight") {
      lm_head = &e;
      continue;
    }
    if (!by_name.emplace(name, &e).second)
      user_error("{}: tensor '{}' appears both with and without the 'transformer.' prefix", path,
                 name);
    if (auto k = layer_index(name)) file_layers = std::max(file_layers, *k + 1);
  }
  if (!by_name.contains("wte.weight"))
    user_error(
        "{}: not a Hugging Face GPT-2 checkpoint: it has no 'wte.weight' (or "
        "'transformer.wte.weight'){}",
        path,
        reader.entries().empty()
            ? std::string(" and no tensors at all")
            : fmt::format("; its first tensor is '{}'", reader.entries().front().name));

  const int64_t V = model.vocab_size();
  auto* gpt2_model = dynamic_cast<gpt2::GPT2*>(&model);
  const int64_t n_layer = gpt2_model ? gpt2_model->config().n_layer : -1;
  const std::string layer_hint = fmt::format(
      "the file has {} layers, the model n_layer = {}: set n_layer to match", file_layers, n_layer);

  // Validate everything before writing anything.
  struct Copy {
    const SafetensorsEntry* entry;
    autograd::Variable param;
    std::string name;
  };
  std::vector<Copy> copies;
  std::set<std::string> used;
  for (auto& [name, p] : model.named_parameters()) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      if (layer_index(name) && file_layers != n_layer)
        user_error("{}: missing tensor '{}' ({})", path, name, layer_hint);
      user_error("{}: missing tensor '{}' (nor 'transformer.{}')", path, name, name);
    }
    const SafetensorsEntry& e = *it->second;
    const Shape want = hf_shape(name, p.shape(), V);
    if (!(e.shape == want))
      user_error(
          "{}: tensor '{}' has shape {} but this model expects {}{}: the checkpoint was probably "
          "made with a different {}; set it to match the file",
          path, e.name, e.shape.str(), want.str(),
          is_conv1d_weight(name) ? " (HF Conv1D layout [in, out])" : "",
          likely_key(name, e.shape, want));
    if (!is_floating(e.dtype))
      user_error("{}: tensor '{}' is {}; GPT-2 weights must be F32, F16 or BF16", path, e.name,
                 dtype_name(e.dtype));
    copies.push_back({&e, p, name});
    used.insert(name);
  }
  for (auto& [name, e] : by_name)
    if (!used.contains(name)) {
      if (layer_index(name) && file_layers != n_layer)
        user_error("{}: unexpected tensor '{}' ({})", path, e->name, layer_hint);
      user_error("{}: unexpected tensor '{}': this is not a GPT-2 model Strata knows", path,
                 e->name);
    }
  const SafetensorsEntry& wte_entry = *by_name.at("wte.weight");
  if (lm_head != nullptr) {
    // Strata's head is tied to wte (Note [HF GPT-2 layout]); an untied head cannot be loaded.
    if (!(lm_head->shape == wte_entry.shape) || lm_head->dtype != wte_entry.dtype ||
        tensor::max_abs_diff(reader.read(lm_head->name), reader.read(wte_entry.name)) != 0.0)
      user_error(
          "{}: '{}' differs from wte.weight; Strata's GPT-2 ties the LM head to the token "
          "embedding and cannot load an untied head",
          path, lm_head->name);
  }

  for (Copy& c : copies) {
    Tensor src = reader.read(c.entry->name);
    Tensor dst = c.param.data();  // a view into the flat buffer: copy in place
    if (is_conv1d_weight(c.name)) {
      dst.copy_(src.transpose(0, 1));
    } else if (c.name == "wte.weight" && dst.size(0) > V) {
      dst.narrow(0, 0, V).copy_(src);
      dst.narrow(0, V, dst.size(0) - V).zero_();  // Note [Padded vocabulary]
    } else {
      dst.copy_(src);
    }
  }
}

void export_hf_gpt2(const CausalLM& model, const std::string& out_dir) {
  require_gpt2(model, out_dir, "export_hf_gpt2");
  const auto* g = dynamic_cast<const gpt2::GPT2*>(&model);
  STRATA_CHECK(g != nullptr, "a gpt2-family model that is not gpt2::GPT2");
  const gpt2::GPT2Config& cfg = g->config();

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec || !fs::is_directory(out_dir))
    user_error("{}: cannot create the output directory ({})", out_dir,
               ec ? ec.message() : "exists and is not a directory");

  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [name, p] : model.named_parameters()) {
    Tensor t = p.data();
    if (is_conv1d_weight(name)) t = t.transpose(0, 1);  // Note [HF GPT-2 layout]
    if (name == "wte.weight") t = t.narrow(0, 0, cfg.vocab_size);
    tensors.emplace_back(name, t.to(DType::F32));
  }
  tensor::save_safetensors((fs::path(out_dir) / "model.safetensors").string(), tensors,
                           {{"format", "pt"}, {"exported_by", "strata"}});

  // Shortest decimal that round-trips the float (1e-5f -> 1e-05, not 9.999999747378752e-06).
  auto as_double = [](float f) { return std::stod(fmt::format("{}", f)); };
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
  c["resid_pdrop"] = as_double(cfg.dropout);
  c["embd_pdrop"] = as_double(cfg.dropout);
  c["attn_pdrop"] = 0.0;  // Strata applies no dropout to attention probabilities
  c["layer_norm_epsilon"] = as_double(cfg.layer_norm_epsilon);
  c["initializer_range"] = 0.02;
  c["scale_attn_weights"] = true;
  c["scale_attn_by_inverse_layer_idx"] = false;
  c["reorder_and_upcast_attn"] = false;
  c["use_cache"] = true;
  c["bos_token_id"] = cfg.vocab_size - 1;  // GPT-2's <|endoftext|> is the last token
  c["eos_token_id"] = cfg.vocab_size - 1;
  c["tie_word_embeddings"] = true;
  c["torch_dtype"] = "float32";
  write_text_atomic((fs::path(out_dir) / "config.json").string(), c.dump(2) + "\n");
}

}  // namespace strata::models
