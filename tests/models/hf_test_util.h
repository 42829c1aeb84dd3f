#pragma once
// What the Hugging Face interop tests share (hf_interop_test.cpp, the llama_hf_* tests): a model's
// bytes, and the check that a refused load names the file and leaves the model untouched.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "models/causal_lm.h"
#include "models/hf_interop.h"

namespace strata::models::hf_test {

// Every flat buffer's bytes, padding included.
inline std::vector<std::vector<char>> snapshot(const CausalLM& m) {
  std::vector<std::vector<char>> out;
  for (const FlatUnit& u : m.flat_units()) {
    const char* p = static_cast<const char*>(u.params.data_ptr());
    out.emplace_back(p, p + u.params.nbytes());
  }
  return out;
}

// Expects load_hf to raise a UserError mentioning `path` and each of `needles`, and the model to
// be exactly as before.
inline void expect_load_error(CausalLM& m, const std::string& path,
                              const std::vector<std::string>& needles) {
  const auto before = snapshot(m);
  try {
    load_hf(m, path);
    ADD_FAILURE() << "expected a UserError loading " << path;
  } catch (const UserError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << msg;
  }
  EXPECT_TRUE(snapshot(m) == before) << "a failed load must not touch the model";
}

}  // namespace strata::models::hf_test
