#include "parallel/zero_memory.h"

#include <fmt/format.h>

#include <cmath>

#include "core/error.h"
#include "models/gpt2/config.h"
#include "models/llama/config.h"

namespace strata::parallel {

namespace {

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

// "12Ψ", "Ψ", "" for zero.
std::string term(int64_t coefficient, bool per_rank) {
  if (coefficient == 0) return "";
  std::string out = coefficient == 1 ? "Ψ" : fmt::format("{}Ψ", coefficient);
  return per_rank ? out + "/Nd" : out;
}

}  // namespace

StatePrecision parse_state_precision(std::string_view name) {
  if (name == "mixed") return StatePrecision::Mixed;
  if (name == "fp32") return StatePrecision::FP32;
  user_error(
      "unknown precision '{}'; use mixed (16-bit params and grads, fp32 master weights) "
      "or fp32",
      name);
}

StateOptimizer parse_state_optimizer(std::string_view name) {
  if (name == "adamw" || name == "adam") return StateOptimizer::AdamW;
  if (name == "sgd") return StateOptimizer::SgdMomentum;
  if (name == "sgd-plain") return StateOptimizer::Sgd;
  user_error("unknown optimizer '{}'; use adamw, sgd (with momentum) or sgd-plain (no momentum)",
             name);
}

std::string to_string(StatePrecision precision) {
  return precision == StatePrecision::Mixed ? "mixed" : "fp32";
}

std::string to_string(StateOptimizer optimizer) {
  switch (optimizer) {
    case StateOptimizer::AdamW:
      return "adamw";
    case StateOptimizer::SgdMomentum:
      return "sgd";
    case StateOptimizer::Sgd:
      return "sgd-plain";
  }
  STRATA_UNREACHABLE();
}

BytesPerParameter bytes_per_parameter(StatePrecision precision, StateOptimizer optimizer) {
  // Note [ZeRO memory model]: an fp32 model's parameters are its master weights; a mixed one
  // keeps an fp32 master copy among the optimizer states.
  const bool mixed = precision == StatePrecision::Mixed;
  BytesPerParameter b;
  b.params = mixed ? 2 : 4;
  b.grads = mixed ? 2 : 4;
  const int64_t moments = optimizer == StateOptimizer::AdamW         ? 8
                          : optimizer == StateOptimizer::SgdMomentum ? 4
                                                                     : 0;
  b.optimizer = moments + (mixed ? 4 : 0);
  return b;
}

std::string optimizer_state_contents(StatePrecision precision, StateOptimizer optimizer) {
  const bool mixed = precision == StatePrecision::Mixed;
  std::string moments = optimizer == StateOptimizer::AdamW         ? "m, v"
                        : optimizer == StateOptimizer::SgdMomentum ? "momentum"
                                                                   : "";
  if (!mixed) return moments.empty() ? "nothing" : "fp32 " + moments;
  return moments.empty() ? "fp32 master weights" : "fp32 master weights, " + moments;
}

void validate(const ZeroMemoryConfig& config) {
  if (config.stage < 0 || config.stage > 3)
    user_error(
        "ZeRO stage {} does not exist; use 0 (plain data parallel), 1 (optimizer states "
        "partitioned), 2 (+ gradients) or 3 (+ parameters)",
        config.stage);
  if (config.dp < 1)
    user_error("data parallel degree {} is not a number of ranks; use 1 or more", config.dp);
}

std::string partitioned_states(int stage) {
  switch (stage) {
    case 0:
      return "nothing (plain data parallel)";
    case 1:
      return "optimizer states";
    case 2:
      return "optimizer states and gradients";
    case 3:
      return "optimizer states, gradients and parameters";
    default:
      user_error("ZeRO stage {} does not exist; use 0, 1, 2 or 3", stage);
  }
}

std::string formula(const ZeroMemoryConfig& config) {
  validate(config);
  const BytesPerParameter b = bytes_per_parameter(config.precision, config.optimizer);
  // Coefficients of Ψ (replicated) and of Ψ/Nd (partitioned).
  int64_t whole = 0, part = 0;
  (config.stage >= 3 ? part : whole) += b.params;
  (config.stage >= 2 ? part : whole) += b.grads;
  (config.stage >= 1 ? part : whole) += b.optimizer;
  const std::string w = term(whole, false), p = term(part, true);
  if (w.empty()) return p.empty() ? "0" : p;
  return p.empty() ? w : w + " + " + p;
}

ModelStateMemory model_state_memory(const ZeroMemoryConfig& config, double num_parameters) {
  validate(config);
  STRATA_USER_CHECK(num_parameters >= 0, "a model cannot have {} parameters", num_parameters);
  const BytesPerParameter b = bytes_per_parameter(config.precision, config.optimizer);
  const double whole = num_parameters;
  const double part = num_parameters / static_cast<double>(config.dp);
  ModelStateMemory m;
  m.params = static_cast<double>(b.params) * (config.stage >= 3 ? part : whole);
  m.grads = static_cast<double>(b.grads) * (config.stage >= 2 ? part : whole);
  m.optimizer = static_cast<double>(b.optimizer) * (config.stage >= 1 ? part : whole);
  return m;
}

int64_t padded_unit_size(int64_t unit_size, int stage, int64_t dp) {
  STRATA_CHECK(unit_size >= 0 && dp >= 1, "unit size {} with dp {}", unit_size, dp);
  // Note [ZeRO padding]: stage 0 keeps the model's own flat buffers.
  return stage == 0 ? unit_size : round_up(unit_size, dp * kPartitionAlign);
}

int64_t padded_num_parameters(const std::vector<UnitSize>& units, int stage, int64_t dp) {
  int64_t total = 0;
  for (const UnitSize& u : units) total += padded_unit_size(u.size, stage, dp);
  return total;
}

ModelStateBytes padded_model_state_bytes(const ZeroMemoryConfig& config,
                                         const std::vector<UnitSize>& units,
                                         int64_t stage3_param_persistence_threshold) {
  validate(config);
  const BytesPerParameter b = bytes_per_parameter(config.precision, config.optimizer);
  ModelStateBytes out;
  for (const UnitSize& u : units) {
    const int64_t whole = padded_unit_size(u.size, config.stage, config.dp);
    const int64_t part = whole / config.dp;  // exact at stages 1-3; unused at stage 0
    const bool persistent = u.size < stage3_param_persistence_threshold;
    out.params += b.params * (config.stage >= 3 && !persistent ? part : whole);
    out.grads += b.grads * (config.stage >= 2 ? part : whole);
    out.optimizer += b.optimizer * (config.stage >= 1 ? part : whole);
  }
  return out;
}

int64_t registry_num_parameters(std::string_view model_name, const models::ModelOptions& options) {
  return models::ModelRegistry::global().shape(model_name, options).num_parameters;
}

std::vector<UnitSize> unit_sizes(const models::CausalLM& model) {
  std::vector<UnitSize> out;
  for (const models::FlatUnit& u : model.flat_units())
    out.push_back({u.name, u.size(), u.num_parameters()});
  return out;
}

namespace {

// Accumulates a unit the way flatten_parameters lays it out (Note [Flat parameters]): each
// parameter starts at a multiple of kPartitionAlign. The order of the parameters changes
// nothing: the unit's size is the sum of each parameter's aligned size.
struct UnitBuilder {
  UnitSize unit;
  explicit UnitBuilder(std::string name) { unit.name = std::move(name); }
  UnitBuilder& add(int64_t numel) {
    unit.size += round_up(numel, kPartitionAlign);
    unit.num_parameters += numel;
    return *this;
  }
};

// models/gpt2: embeddings (wte, wpe), blocks h.i, head (ln_f; the LM head is tied to wte).
// Tensor parallelism (tp > 1): wte, c_attn, c_fc (weights and biases) and the c_proj weights are
// split over tp; wpe, the norms and the c_proj biases are replicated.
std::vector<UnitSize> gpt2_units(const models::gpt2::GPT2Config& c, int64_t tp) {
  const int64_t C = c.n_embd;
  std::vector<UnitSize> out;
  out.push_back(
      UnitBuilder("embeddings").add(c.padded_vocab_size * C / tp).add(c.n_positions * C).unit);
  for (int64_t i = 0; i < c.n_layer; ++i) {
    UnitBuilder b(fmt::format("h.{}", i));
    b.add(C).add(C);                        // ln_1
    b.add(C * 3 * C / tp).add(3 * C / tp);  // attn.c_attn
    b.add(C * C / tp).add(C);               // attn.c_proj
    b.add(C).add(C);                        // ln_2
    b.add(C * 4 * C / tp).add(4 * C / tp);  // mlp.c_fc
    b.add(4 * C * C / tp).add(C);           // mlp.c_proj
    out.push_back(b.unit);
  }
  out.push_back(UnitBuilder("head").add(C).add(C).unit);  // ln_f
  return out;
}

// models/llama: embeddings (embed_tokens), layers.i, head (norm, and lm_head unless tied).
// Tensor parallelism (tp > 1): every matrix is split over tp, the norms are replicated.
std::vector<UnitSize> llama_units(const models::llama::LlamaConfig& c, int64_t tp) {
  const int64_t C = c.hidden_size, F = c.intermediate_size / tp;
  const int64_t q = c.num_attention_heads * c.head_dim() / tp;
  const int64_t kv = c.num_key_value_heads * c.head_dim() / tp;
  std::vector<UnitSize> out;
  out.push_back(UnitBuilder("embeddings").add(c.padded_vocab_size * C / tp).unit);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    UnitBuilder b(fmt::format("layers.{}", i));
    b.add(C).add(C);                                  // input_layernorm, post_attention_layernorm
    b.add(C * q).add(C * kv).add(C * kv).add(q * C);  // q, k, v, o projections
    b.add(C * F).add(C * F).add(F * C);               // gate, up, down
    out.push_back(b.unit);
  }
  UnitBuilder head("head");
  head.add(C);  // norm
  if (!c.tie_word_embeddings) head.add(c.padded_vocab_size * C / tp);
  out.push_back(head.unit);
  return out;
}

}  // namespace

std::vector<UnitSize> unit_sizes(std::string_view model_name, const models::ModelOptions& options,
                                 int tp) {
  const models::ModelEntry& entry = models::ModelRegistry::global().get(model_name);
  if (tp < 1) user_error("tensor parallel degree {} must be 1 or more", tp);
  if (tp > 1) {
    const models::ModelShape s = models::ModelRegistry::global().shape(model_name, options);
    const int64_t kv = s.n_kv_head > 0 ? s.n_kv_head : s.n_head;
    const std::pair<const char*, int64_t> split[] = {
        {"attention heads", s.n_head},
        {"key/value heads", kv},
        {"vocabulary rows (padded_vocab_size)", s.padded_vocab_size}};
    for (const auto& [what, n] : split)
      if (n % tp != 0)
        user_error("tensor parallel degree {} does not divide the {} {} of model '{}'", tp, n, what,
                   model_name);
  }
  if (entry.family == "gpt2")
    return gpt2_units(
        models::gpt2::with_overrides(models::gpt2::preset(model_name), options.overrides), tp);
  if (entry.family == "llama") {
    const models::llama::LlamaConfig c =
        models::llama::with_overrides(models::llama::preset(model_name), options.overrides);
    if (c.intermediate_size % tp != 0)
      user_error("tensor parallel degree {} does not divide the intermediate_size {} of model '{}'",
                 tp, c.intermediate_size, model_name);
    return llama_units(c, tp);
  }
  user_error(
      "the unit layout of model family '{}' (model '{}') is not known without building the "
      "model; build it and pass it to parallel::unit_sizes(const CausalLM&), or add the "
      "family to parallel/zero_memory.cpp",
      entry.family, model_name);
}

ZeroTable1 zero_table1() {
  ZeroTable1 t;
  for (size_t row = 0; row < ZeroTable1::kDpDegrees.size(); ++row)
    for (size_t m = 0; m < ZeroTable1::kModelSizes.size(); ++m)
      for (size_t s = 0; s < ZeroTable1::kStages.size(); ++s) {
        ZeroMemoryConfig config;
        config.stage = ZeroTable1::kStages[s];
        config.dp = ZeroTable1::kDpDegrees[row];
        config.precision = StatePrecision::Mixed;
        config.optimizer = StateOptimizer::AdamW;
        t.gb[row][m][s] = model_state_memory(config, ZeroTable1::kModelSizes[m]).total() / 1e9;
      }
  return t;
}

std::string format_zero_table_gb(double gb) {
  STRATA_CHECK(gb >= 0 && std::isfinite(gb), "memory {} GB", gb);
  // Note [ZeRO Table 1]. The small epsilon keeps a value that is whole or exactly half in
  // decimal (4187.5, 41.25) from falling below it through the binary division by 1e9.
  constexpr double kEps = 1e-9;
  if (gb >= 100) return fmt::format("{}", static_cast<int64_t>(std::floor(gb + kEps)));
  const int decimals = gb >= 10 ? 1 : 2;
  const double scale = decimals == 1 ? 10.0 : 100.0;
  const double rounded = std::floor(gb * scale + 0.5 + kEps) / scale;
  std::string s = fmt::format("{:.{}f}", rounded, decimals);
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}

}  // namespace strata::parallel
