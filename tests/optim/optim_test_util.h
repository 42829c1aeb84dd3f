#pragma once
// Helpers shared by the optim tests: deterministic host data and flat parameter groups.
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "optim/optimizer.h"
#include "tensor/tensor.h"

namespace strata::optim::testing {

inline std::vector<float> random_floats(int64_t n, uint32_t seed, float stddev = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// A fresh F32 tensor holding `values` (no backend needed: Tensor::empty + memcpy).
inline tensor::Tensor make_tensor(const std::vector<float>& values) {
  tensor::Tensor t = tensor::Tensor::empty({static_cast<int64_t>(values.size())}, DType::F32);
  if (!values.empty()) std::memcpy(t.data<float>(), values.data(), values.size() * sizeof(float));
  return t;
}

inline std::vector<float> to_vector(const tensor::Tensor& t) {
  const float* p = t.data<float>();
  return std::vector<float>(p, p + t.numel());
}

inline void set_values(const tensor::Tensor& t, const std::vector<float>& values) {
  std::memcpy(t.data<float>(), values.data(), values.size() * sizeof(float));
}

// A group over `param` with one decaying segment covering all of it.
inline ParamGroup make_group(const std::vector<float>& param, const std::vector<float>& grad) {
  ParamGroup g;
  g.param = make_tensor(param);
  g.grad = make_tensor(grad);
  g.segments.push_back({"all", 0, static_cast<int64_t>(param.size()), true});
  return g;
}

// Distance in units in the last place between two floats of the same sign (0 when equal bits).
inline int64_t ulp_distance(float a, float b) {
  auto key = [](float x) {
    int32_t i = std::bit_cast<int32_t>(x);
    return i < 0 ? int64_t{INT32_MIN} - i : int64_t{i};
  };
  return std::llabs(key(a) - key(b));
}

}  // namespace strata::optim::testing
