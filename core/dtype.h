#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/half.h"

namespace strata {

enum class DType : uint8_t { F32, BF16, F16, I32, I64, U16, U8 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::BF16:
      return 2;
    case DType::F16:
      return 2;
    case DType::I32:
      return 4;
    case DType::I64:
      return 8;
    case DType::U16:
      return 2;
    case DType::U8:
      return 1;
  }
  return 0;
}

constexpr bool is_floating(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F16;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "f16";
    case DType::I32:
      return "i32";
    case DType::I64:
      return "i64";
    case DType::U16:
      return "u16";
    case DType::U8:
      return "u8";
  }
  return "?";
}

// Parses "f32"/"float32"/"fp32", "bf16", "f16"/"fp16", ...; throws UserError on unknown names.
DType parse_dtype(std::string_view name);

template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::F32;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::BF16;
};
template <>
struct DTypeOf<Float16> {
  static constexpr DType value = DType::F16;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::I32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::I64;
};
template <>
struct DTypeOf<uint16_t> {
  static constexpr DType value = DType::U16;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::U8;
};

}  // namespace strata
