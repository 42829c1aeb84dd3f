#include "models/nn/init.h"

#include <vector>

#include "tensor/tensor.h"

namespace strata::models::nn::init {

uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

RngKey key_for(uint64_t seed, std::string_view name) {
  return {seed, rng_stream(fnv1a64(name))};
}

void normal_(const autograd::Variable& p, uint64_t seed, float mean, float stddev) {
  const tensor::Tensor& data = p.data();
  // Drawn on the host so the values do not depend on the device's generator implementation.
  std::vector<float> host(static_cast<size_t>(data.numel()));
  rng_normal(host.data(), host.size(), key_for(seed, p.name()), mean, stddev);
  tensor::Tensor src = tensor::Tensor::from_blob(host.data(), data.shape(), DType::F32);
  tensor::Tensor dst = data;
  dst.copy_(src);
}

void fill_(const autograd::Variable& p, float value) {
  tensor::Tensor dst = p.data();
  dst.fill_(value);
}

}  // namespace strata::models::nn::init
