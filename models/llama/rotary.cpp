#include "models/llama/rotary.h"

#include "core/error.h"
#include "tensor/ops.h"

namespace strata::models::llama {

RotaryEmbedding::RotaryEmbedding(int64_t head_dim, int64_t max_len, double theta)
    : head_dim_(head_dim), max_len_(max_len) {
  auto [cos, sin] = tensor::rotary_tables(max_len, head_dim, theta);
  copies_.push_back({Device::cpu(), cos, sin});
}

std::pair<Tensor, Tensor> RotaryEmbedding::tables(int64_t start, int64_t T, Device device) {
  STRATA_CHECK(start >= 0 && start + T <= max_len_,
               "rotary tables hold {} positions, [{}, {}) requested", max_len_, start, start + T);
  const OnDevice* found = nullptr;
  for (const OnDevice& c : copies_)
    if (c.device == device) found = &c;
  if (!found) {
    copies_.push_back({device, copies_[0].cos.to(device), copies_[0].sin.to(device)});
    found = &copies_.back();
  }
  // Rows [start, start + T) of a row-major table: contiguous views, as tensor::rotary wants them.
  return {found->cos.narrow(0, start, T), found->sin.narrow(0, start, T)};
}

}  // namespace strata::models::llama
