#pragma once
// Element conversions between Strata's dtypes, and a dispatcher from DType to C++ type.
//
// Note [Dtype conversion]
// Float to float goes through f32 with round-to-nearest-even (core/half.h). Float to integer
// truncates toward zero through int64, then narrows the way C++ integer conversions do
// (modulo 2^bits), so 300.7f -> u8 gives 44 and -1.f -> u8 gives 255; NaN and values outside
// int64 have no defined result. Integer to float rounds to nearest (i64 -> bf16 rounds twice:
// to f32, then to bf16). Integer to integer wraps modulo 2^bits.
#include <cstdint>
#include <type_traits>

#include "core/dtype.h"
#include "core/error.h"

namespace strata::tensor::cpu {

template <typename T>
inline constexpr bool kIsFloatLike =
    std::is_same_v<T, float> || std::is_same_v<T, BFloat16> || std::is_same_v<T, Float16>;

template <typename To, typename From>
inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (kIsFloatLike<From>) {
    const float f = static_cast<float>(v);
    if constexpr (kIsFloatLike<To>) {
      return To(f);
    } else if constexpr (std::is_same_v<To, int64_t>) {
      return static_cast<int64_t>(f);
    } else {
      return static_cast<To>(static_cast<int64_t>(f));
    }
  } else if constexpr (std::is_same_v<To, float>) {
    return static_cast<float>(v);
  } else if constexpr (kIsFloatLike<To>) {
    return To(static_cast<float>(v));
  } else {
    return static_cast<To>(v);
  }
}

// A double (fill value, arange element) to T: through f32 for float types, else as
// Note [Dtype conversion] says for floats, via int64.
template <typename T>
inline T from_double(double v) {
  if constexpr (kIsFloatLike<T>) {
    return convert<T>(static_cast<float>(v));
  } else {
    return static_cast<T>(static_cast<int64_t>(v));
  }
}

// Calls f(T{}) with T the C++ type of `dtype`.
template <typename F>
decltype(auto) visit_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::F32:
      return f(float{});
    case DType::BF16:
      return f(BFloat16{});
    case DType::F16:
      return f(Float16{});
    case DType::I32:
      return f(int32_t{});
    case DType::I64:
      return f(int64_t{});
    case DType::U16:
      return f(uint16_t{});
    case DType::U8:
      return f(uint8_t{});
  }
  STRATA_UNREACHABLE("unknown dtype {}", static_cast<int>(dtype));
}

}  // namespace strata::tensor::cpu
