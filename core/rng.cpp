#include "core/rng.h"

#include <cmath>

namespace strata {

namespace {
constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
}  // namespace

std::array<uint32_t, 4> philox4x32(RngKey key, uint64_t counter) {
  // Counter: (counter lo, counter hi, stream lo, stream hi); key: the seed's two halves.
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = static_cast<uint32_t>(key.stream), c3 = static_cast<uint32_t>(key.stream >> 32);
  uint32_t k0 = static_cast<uint32_t>(key.seed), k1 = static_cast<uint32_t>(key.seed >> 32);
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kM0, c0, hi0, lo0);
    mulhilo(kM1, c2, hi1, lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += kW0;
    k1 += kW1;
  }
  return {c0, c1, c2, c3};
}

uint64_t rng_stream(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  uint64_t h = splitmix64(a);
  h = splitmix64(h ^ b);
  h = splitmix64(h ^ c);
  return splitmix64(h ^ d);
}

void rng_uniform(float* out, size_t n, RngKey key, float lo, float hi, uint64_t first) {
  const float span = hi - lo;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; ++i) {
    uint64_t idx = first + i;
    auto r = philox4x32(key, idx >> 2);
    out[i] = lo + span * u32_to_unit_float(r[idx & 3]);
  }
}

void rng_normal(float* out, size_t n, RngKey key, float mean, float stddev, uint64_t first) {
  // Element idx uses block idx/2 of the stream: lanes (0,1) or (2,3) -> Box-Muller pair.
#pragma omp parallel for schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; ++i) {
    uint64_t idx = first + i;
    auto r = philox4x32(key, idx >> 2);
    int pair = static_cast<int>((idx >> 1) & 1);
    float u1 = (static_cast<float>(r[2 * pair] >> 8) + 1.0f) * (1.0f / 16777216.0f);  // (0, 1]
    float u2 = u32_to_unit_float(r[2 * pair + 1]);
    float rad = std::sqrt(-2.0f * std::log(u1));
    float theta = 6.283185307179586f * u2;
    float z = (idx & 1) ? rad * std::sin(theta) : rad * std::cos(theta);
    out[i] = mean + stddev * z;
  }
}

void rng_bernoulli(uint8_t* out, size_t n, RngKey key, float keep_prob, uint64_t first) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; ++i) {
    uint64_t idx = first + i;
    auto r = philox4x32(key, idx >> 2);
    out[i] = u32_to_unit_float(r[idx & 3]) < keep_prob ? 1 : 0;
  }
}

}  // namespace strata
