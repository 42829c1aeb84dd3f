#include "models/nn/fused_ops.h"

#include <atomic>

namespace strata::models::nn {

namespace {
std::atomic<bool> g_fused{true};
}

bool fused_ops_enabled() {
  return g_fused.load(std::memory_order_relaxed);
}

void set_fused_ops(bool on) {
  g_fused.store(on, std::memory_order_relaxed);
}

}  // namespace strata::models::nn
