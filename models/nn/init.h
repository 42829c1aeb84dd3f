#pragma once
// Parameter initialisers keyed by name.
//
// Note [Name-keyed init]
// A parameter's initial values are a pure function of (seed, its full dotted name): the draw
// uses RngKey{seed, rng_stream(fnv1a64(name))} (Note [Deterministic RNG]). Adding a layer,
// building modules in another order or on another thread count, or building only a shard of
// the model (ZeRO-3, PP stages) leaves every other parameter's values unchanged.
#include <cstdint>
#include <string_view>

#include "autograd/variable.h"
#include "core/rng.h"

namespace strata::models::nn::init {

// FNV-1a, 64-bit: stable across compilers and runs (std::hash is not).
uint64_t fnv1a64(std::string_view s);
RngKey key_for(uint64_t seed, std::string_view name);

// In place, on the parameter's data (any device), keyed by p.name().
void normal_(const autograd::Variable& p, uint64_t seed, float mean, float stddev);
void fill_(const autograd::Variable& p, float value);

}  // namespace strata::models::nn::init
