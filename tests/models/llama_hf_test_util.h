#pragma once
// Helpers shared by the Hugging Face LLaMA tests (llama_hf_interop_test.cpp,
// llama_hf_files_test.cpp): the test's own statement of the q/k row permutation, small models
// with weights away from LLaMA's init, and a fixture whose load-error check also asserts that a
// refused load left the model untouched.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "core/error.h"
#include "core/rng.h"
#include "models/hf_interop.h"
#include "models/registry.h"
#include "tensor/ops.h"
#include "tensor/safetensors.h"
#include "tests/models/hf_test_util.h"

namespace strata::models::hf_test {

namespace fs = std::filesystem;
using tensor::Tensor;

using Tensors = std::vector<std::pair<std::string, Tensor>>;

// Note [HF LLaMA layout], written out independently of the library: Strata's q/k row r (head h,
// feature 2i + j) is HF's row h*D + j*D/2 + i.
inline int64_t hf_row(int64_t r, int64_t D) {
  const int64_t h = r / D, f = r % D, i = f / 2, j = f % 2;
  return h * D + j * (D / 2) + i;
}

inline Tensor strata_rows_to_hf_by_hand(const Tensor& w, int64_t D) {
  const int64_t rows = w.size(0), cols = w.size(1);
  std::vector<float> in = tensor::to_float_vector(w), out(in.size());
  for (int64_t r = 0; r < rows; ++r)
    std::copy_n(in.begin() + r * cols, cols, out.begin() + hf_row(r, D) * cols);
  return tensor::from_vector(out, w.shape());
}

inline std::map<std::string, std::string> small(bool tied, int64_t kv_heads) {
  return {{"vocab_size", "61"},  // padded to 64
          {"max_position_embeddings", "32"},
          {"hidden_size", "32"},
          {"intermediate_size", "48"},
          {"num_hidden_layers", "2"},
          {"num_attention_heads", "4"},
          {"num_key_value_heads", std::to_string(kv_heads)},
          {"tie_word_embeddings", tied ? "true" : "false"}};
}

// A llama-tiny variant with weights well away from LLaMA's init, so every term shows in the
// logits; padding rows zero (Note [Padded vocabulary]).
inline std::unique_ptr<CausalLM> make_model(std::map<std::string, std::string> overrides,
                                            uint64_t seed = 11) {
  ModelOptions o;
  o.seed = seed;
  o.overrides = std::move(overrides);
  auto m = ModelRegistry::global().create("llama-tiny", o);
  uint64_t k = 0;
  for (auto& [name, p] : m->named_parameters()) {
    Tensor d = p.data();
    const bool norm = name.find("norm") != std::string::npos;
    d.copy_(tensor::randn(d.shape(), RngKey{seed, ++k}, norm ? 1.f : 0.f, norm ? 0.1f : 0.2f));
    if (d.size(0) == m->padded_vocab_size() && d.ndim() == 2)
      d.narrow(0, m->vocab_size(), d.size(0) - m->vocab_size()).zero_();
  }
  return m;
}

inline Tensor logits_of(CausalLM& m, const Tensor& ids) {
  autograd::NoGradGuard no_grad;
  m.eval();
  return m.forward(ids).data();
}

// The fixture of both test files: a scratch directory per test and the load-error check.
class LlamaHfTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("strata_llama_hf_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Tensors of a safetensors file, in file order.
  static Tensors read_all(const std::string& path) {
    tensor::SafetensorsReader r(path);
    Tensors ts;
    for (const auto& e : r.entries()) ts.emplace_back(e.name, r.read(e.name));
    return ts;
  }
  std::string write(const std::string& name, const Tensors& ts) {
    const std::string path = (dir_ / name).string();
    tensor::save_safetensors(path, ts, {{"format", "pt"}});
    return path;
  }

  fs::path dir_;
};

}  // namespace strata::models::hf_test
