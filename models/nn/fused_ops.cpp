#include "models/nn/fused_ops.h"

#include <atomic>

#include "core/env.h"
#include "core/error.h"

namespace strata::models::nn {

namespace {

// STRATA_FUSED_OPS: unset, empty or "on" -> true; "off" -> false; anything else is a UserError.
bool from_environment() {
  return env_choice("STRATA_FUSED_OPS",
                    {{"on", "fused residual norms and GPT-2's fused MLP"},
                     {"off", "the unfused compositions, Note [Fused ops in models]"}}) == 0;
}

// Read at the first use, so an invalid value is reported where fused ops are first asked for.
std::atomic<bool>& flag() {
  static std::atomic<bool> fused{from_environment()};
  return fused;
}

}  // namespace

bool fused_ops_enabled() {
  return flag().load(std::memory_order_relaxed);
}

void set_fused_ops(bool on) {
  flag().store(on, std::memory_order_relaxed);
}

}  // namespace strata::models::nn
