#pragma once
// Helpers shared by the model tests: the PyTorch reference files and tensor comparison.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "models/gpt2/gpt2.h"
#include "tensor/safetensors.h"

namespace strata::testing {

inline std::string reference_path(const std::string& file) {
  return std::string(STRATA_SOURCE_DIR) + "/tests/reference/" + file;
}

// The GPT-2 config a reference file was generated with (its __metadata__).
inline models::gpt2::GPT2Config config_from_metadata(const tensor::SafetensorsReader& r) {
  const auto& m = r.metadata();
  models::gpt2::GPT2Config c;
  c.vocab_size = std::stoll(m.at("vocab_size"));
  c.padded_vocab_size = std::stoll(m.at("padded_vocab_size"));
  c.n_positions = std::stoll(m.at("n_positions"));
  c.n_embd = std::stoll(m.at("n_embd"));
  c.n_layer = std::stoll(m.at("n_layer"));
  c.n_head = std::stoll(m.at("n_head"));
  c.layer_norm_epsilon = std::stof(m.at("layer_norm_epsilon"));
  c.dropout = 0.f;
  return c;
}

// Copies the reference weights (prefix "" or e.g. "adamw.") into the model's parameters.
inline void load_weights(models::CausalLM& model, const tensor::SafetensorsReader& r,
                         const std::string& prefix = "") {
  for (auto& [name, p] : model.named_parameters()) {
    tensor::Tensor dst = p.data();
    dst.copy_(r.read(prefix + name));
  }
}

// |a - e| <= atol + rtol |e| elementwise, reporting the worst element on failure.
inline ::testing::AssertionResult all_close(const tensor::Tensor& actual,
                                            const tensor::Tensor& expected, double rtol,
                                            double atol, double* max_abs_out = nullptr) {
  if (!(actual.shape() == expected.shape()))
    return ::testing::AssertionFailure()
           << "shape " << actual.shape().str() << " vs " << expected.shape().str();
  std::vector<float> a = tensor::to_float_vector(actual), e = tensor::to_float_vector(expected);
  double max_abs = 0, worst_excess = 0;
  size_t worst = 0;
  bool ok = true;
  for (size_t i = 0; i < a.size(); ++i) {
    double d = std::fabs(static_cast<double>(a[i]) - e[i]);
    if (std::isnan(d)) d = INFINITY;
    max_abs = std::max(max_abs, d);
    double excess = d - (atol + rtol * std::fabs(static_cast<double>(e[i])));
    if (excess > 0 && (ok || excess > worst_excess)) {
      ok = false;
      worst_excess = excess;
      worst = i;
    }
  }
  if (max_abs_out) *max_abs_out = std::max(*max_abs_out, max_abs);
  if (ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << worst << ": " << a[worst] << " vs "
                                       << e[worst] << " (max abs diff " << max_abs << ")";
}

}  // namespace strata::testing
