#pragma once
// Helpers shared by the CUDA attention tests (cudnn_attention_test.cpp,
// attention_strided_cuda_test.cpp).
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>

#include "tensor/cuda/cudnn_sdpa.h"

namespace strata::tensor::cuda {

// Sets STRATA_ATTENTION (nullptr: unsets it) for one scope.
class ScopedAttentionMode {
 public:
  explicit ScopedAttentionMode(const char* value) {
    if (const char* old = std::getenv("STRATA_ATTENTION")) old_ = old;
    if (value)
      setenv("STRATA_ATTENTION", value, 1);
    else
      unsetenv("STRATA_ATTENTION");
  }
  ~ScopedAttentionMode() {
    if (old_)
      setenv("STRATA_ATTENTION", old_->c_str(), 1);
    else
      unsetenv("STRATA_ATTENTION");
  }
  ScopedAttentionMode(const ScopedAttentionMode&) = delete;
  ScopedAttentionMode& operator=(const ScopedAttentionMode&) = delete;

 private:
  std::optional<std::string> old_;
};

// Whether cuDNN must run this attention call on device 0 with the loaded cuDNN: false when a
// known limit of that release on this GPU applies (Note [cuDNN SDPA limits]); the reason is
// printed, so a run on an older cuDNN says which cases went to the own kernel.
inline bool cudnn_runs_here(int64_t tq, int64_t tk, int64_t d, bool causal, bool backward) {
  const std::string limit = cudnn_sdpa_known_limit(cudnn_loaded_version(), cuda_sm_version(0), tq,
                                                   tk, d, causal, backward);
  if (!limit.empty()) std::cout << "[     NOTE ] own kernel, not cuDNN: " << limit << "\n";
  return limit.empty();
}

}  // namespace strata::tensor::cuda
