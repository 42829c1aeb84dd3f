#include "core/dtype.h"

#include "core/error.h"

namespace strata {

DType parse_dtype(std::string_view n) {
  if (n == "f32" || n == "fp32" || n == "float32" || n == "float") return DType::F32;
  if (n == "bf16" || n == "bfloat16") return DType::BF16;
  if (n == "f16" || n == "fp16" || n == "float16" || n == "half") return DType::F16;
  if (n == "i32" || n == "int32") return DType::I32;
  if (n == "i64" || n == "int64") return DType::I64;
  if (n == "u16" || n == "uint16") return DType::U16;
  if (n == "u8" || n == "uint8") return DType::U8;
  user_error("unknown dtype '{}': expected one of f32, bf16, f16, i32, i64, u16, u8", n);
}

}  // namespace strata
