#pragma once
// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011).
//
// Note [Deterministic RNG]
// A random value is a pure function of (seed, stream, index): element i of a random tensor drawn
// with key {seed, stream} is the same whatever the thread count, backend, or how many other
// tensors were drawn before it. `stream` is derived from what the draw is for — (step, rank,
// tensor) via `rng_stream` — or taken from a `Generator`, whose whole state is two integers and
// goes into checkpoints. This is what makes a resumed run bitwise identical to an uninterrupted
// one, and lets activation checkpointing replay dropout masks exactly.
#include <array>
#include <cstddef>
#include <cstdint>

namespace strata {

struct RngKey {
  uint64_t seed = 0;
  uint64_t stream = 0;
  bool operator==(const RngKey&) const = default;
};

// One Philox4x32-10 block: four 32-bit outputs for 64-bit `counter` under `key`.
std::array<uint32_t, 4> philox4x32(RngKey key, uint64_t counter);

// Mixes the purpose of a draw into a stream id (splitmix64 chain).
uint64_t rng_stream(uint64_t a, uint64_t b = 0, uint64_t c = 0, uint64_t d = 0);

// Uniform float in [0, 1) from 24 random bits.
inline float u32_to_unit_float(uint32_t x) {
  return static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
}

// out[i] for i in [0, n): element `first + i` of the stream (first lets a shard draw its slice).
void rng_uniform(float* out, size_t n, RngKey key, float lo, float hi, uint64_t first = 0);
void rng_normal(float* out, size_t n, RngKey key, float mean, float stddev, uint64_t first = 0);
// Bernoulli keep-mask for dropout: out[i] = 1 with probability keep_prob.
void rng_bernoulli(uint8_t* out, size_t n, RngKey key, float keep_prob, uint64_t first = 0);

// Hands out a fresh stream per draw. Its state (seed, next) is all that must be saved.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  RngKey next_key() { return {seed_, rng_stream(0x5eed, next_++)}; }
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return next_; }
  void set_state(uint64_t seed, uint64_t offset) {
    seed_ = seed;
    next_ = offset;
  }

 private:
  uint64_t seed_;
  uint64_t next_ = 0;
};

}  // namespace strata
