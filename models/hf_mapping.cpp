#include "models/hf_mapping.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace strata::models {

namespace {

// The field's value, or nullptr when absent or null (transformers then uses its default).
const nlohmann::json* field(const nlohmann::json& config, const std::string& key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return nullptr;
  return &*it;
}

[[noreturn]] void wrong_type(const std::string& path, const std::string& key,
                             const nlohmann::json& value, std::string_view want) {
  user_error("{}: config.json field '{}' is {}, expected {}", path, key, value.dump(), want);
}

[[noreturn]] void mismatch(const std::string& path, const std::string& key, const std::string& file,
                           const std::string& model, const std::string& model_key, bool present) {
  if (model_key.empty())
    user_error("{}: {} = {}{} but Strata's model always has {}: this checkpoint cannot be loaded",
               path, key, file, present ? "" : " (absent from config.json: transformers' default)",
               model);
  user_error(
      "{}: {} = {}{} but the model has {}: the checkpoint was made for a different model; set "
      "model.config.{}: {} (or choose the preset it was made with)",
      path, key, file, present ? "" : " (absent from config.json: transformers' default)", model,
      model_key, file);
}

}  // namespace

void check_config_int(const nlohmann::json& config, const std::string& path, const std::string& key,
                      int64_t model_value, int64_t hf_default, const std::string& model_key) {
  const nlohmann::json* v = field(config, key);
  int64_t file = hf_default;
  if (v) {
    if (!v->is_number_integer()) wrong_type(path, key, *v, "an integer");
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      wrong_type(path, key, *v, "an integer that fits 64 bits");
    file = v->get<int64_t>();
  }
  if (file != model_value)
    mismatch(path, key, std::to_string(file), std::to_string(model_value), model_key, v != nullptr);
}

void check_config_float(const nlohmann::json& config, const std::string& path,
                        const std::string& key, float model_value, float hf_default,
                        const std::string& model_key) {
  const nlohmann::json* v = field(config, key);
  float file = hf_default;
  if (v) {
    if (!v->is_number()) wrong_type(path, key, *v, "a number");
    const double d = v->get<double>();
    if (!(std::fabs(d) <= std::numeric_limits<float>::max()))
      mismatch(path, key, fmt::format("{}", d), fmt::format("{}", model_value), model_key, true);
    file = static_cast<float>(d);
  }
  if (file != model_value)
    mismatch(path, key, fmt::format("{}", file), fmt::format("{}", model_value), model_key,
             v != nullptr);
}

void check_config_double(const nlohmann::json& config, const std::string& path,
                         const std::string& key, double model_value, double hf_default,
                         const std::string& model_key) {
  const nlohmann::json* v = field(config, key);
  double file = hf_default;
  if (v) {
    if (!v->is_number()) wrong_type(path, key, *v, "a number");
    file = v->get<double>();
  }
  if (file != model_value)
    mismatch(path, key, fmt::format("{}", file), fmt::format("{}", model_value), model_key,
             v != nullptr);
}

void check_config_bool(const nlohmann::json& config, const std::string& path,
                       const std::string& key, bool model_value, bool hf_default,
                       const std::string& model_key) {
  const nlohmann::json* v = field(config, key);
  bool file = hf_default;
  if (v) {
    if (!v->is_boolean()) wrong_type(path, key, *v, "true or false");
    file = v->get<bool>();
  }
  if (file != model_value)
    mismatch(path, key, file ? "true" : "false", model_value ? "true" : "false", model_key,
             v != nullptr);
}

void check_config_string(const nlohmann::json& config, const std::string& path,
                         const std::string& key, std::initializer_list<std::string_view> allowed,
                         std::string_view hf_default, std::string_view what) {
  const nlohmann::json* v = field(config, key);
  std::string file(hf_default);
  if (v) {
    if (!v->is_string()) wrong_type(path, key, *v, "a string");
    file = v->get<std::string>();
  }
  for (std::string_view a : allowed)
    if (file == a) return;
  user_error("{}: config.json field '{}' is \"{}\"{}; {}: this checkpoint cannot be loaded", path,
             key, file, v ? "" : " (absent: transformers' default)", what);
}

std::optional<int64_t> numbered_child(const std::string& name, std::string_view prefix) {
  if (!name.starts_with(prefix)) return std::nullopt;
  int64_t k = 0;
  const char* begin = name.data() + prefix.size();
  const char* end = name.data() + name.size();
  auto [ptr, ec] = std::from_chars(begin, end, k);
  if (ec != std::errc() || ptr == begin || ptr == end || *ptr != '.') return std::nullopt;
  return k;
}

double json_float(float f) {
  return std::stod(fmt::format("{}", f));
}

}  // namespace strata::models
