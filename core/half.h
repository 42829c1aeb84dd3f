#pragma once
// Scalar bf16 / f16 storage types with round-to-nearest-even conversion from float.
#include <bit>
#include <cstdint>
#include <cstring>

namespace strata {

struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float f) : bits(from_float(f)) {}
  operator float() const { return to_float(bits); }

  static uint16_t from_float(float f) {
    uint32_t u = std::bit_cast<uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
    uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>((u + rounding) >> 16);
  }
  static float to_float(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }
};

struct Float16 {
  uint16_t bits = 0;
  Float16() = default;
  explicit Float16(float f) : bits(from_float(f)) {}
  operator float() const { return to_float(bits); }

  static uint16_t from_float(float f);
  static float to_float(uint16_t h);
};

inline uint16_t Float16::from_float(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
  }
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (absx < 0x38800000u) {  // subnormal or zero in half
    // Add 0.5 (as float) so the FPU does the round-to-nearest-even into the subnormal grid.
    float af = std::bit_cast<float>(absx) + 0.5f;
    return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(af) - 0x3f000000u));
  }
  uint32_t mant_odd = (absx >> 13) & 1u;
  absx += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round
  return static_cast<uint16_t>(sign | (absx >> 13));
}

inline float Float16::to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    float v = static_cast<float>(mant) * (1.0f / 16777216.0f);  // mant * 2^-24
    return std::bit_cast<float>(std::bit_cast<uint32_t>(v) | sign);
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

}  // namespace strata
