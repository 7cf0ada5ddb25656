#include "core/dtype.h"

#include "core/dispatch.h"
#include "core/error.h"

namespace mt {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f64:
      return "f64";
    case DType::f32:
      return "f32";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::f8e4m3:
      return "f8e4m3";
    case DType::f8e5m2:
      return "f8e5m2";
    case DType::i64:
      return "i64";
    case DType::i32:
      return "i32";
    case DType::u8:
      return "u8";
    case DType::boolean:
      return "bool";
  }
  return "?";
}

void check_loadable(const std::string& who, const std::string& name, DType stored, DType expected) {
  if (is_floating(stored) == is_floating(expected)) return;
  throw DTypeError(detail::str_cat(who, ": '", name, "' is stored as ", dtype_name(stored), " but is ",
                                   dtype_name(expected), " here; ", is_floating(expected) ? "an integer" : "a floating",
                                   " tensor cannot be loaded into ",
                                   is_floating(expected) ? "a floating" : "an integer",
                                   " one (floating dtypes convert into each other, integer ones too)"));
}

DType parse_dtype(const std::string& name) {
  for (int i = 0; i < kNumDTypes; ++i) {
    const auto t = static_cast<DType>(i);
    if (name == dtype_name(t)) return t;
  }
  if (name == "float32" || name == "float") return DType::f32;
  if (name == "float16" || name == "half") return DType::f16;
  if (name == "bfloat16") return DType::bf16;
  if (name == "float64" || name == "double") return DType::f64;
  throw DTypeError("parse_dtype: unknown dtype '" + name +
                   "'; expected one of f64 f32 f16 bf16 f8e4m3 f8e5m2 i64 i32 u8 bool");
}

namespace {
// Rank among floating types for promotion (wider wins).
int float_rank(DType t) {
  switch (t) {
    case DType::f8e4m3:
    case DType::f8e5m2:
      return 1;
    case DType::f16:
    case DType::bf16:
      return 2;
    case DType::f32:
      return 3;
    case DType::f64:
      return 4;
    default:
      return 0;
  }
}
int int_rank(DType t) {
  switch (t) {
    case DType::boolean:
      return 1;
    case DType::u8:
      return 2;
    case DType::i32:
      return 3;
    case DType::i64:
      return 4;
    default:
      return 0;
  }
}
}  // namespace

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  const int fa = float_rank(a), fb = float_rank(b);
  if (fa == 0 && fb == 0) return int_rank(a) >= int_rank(b) ? a : b;
  if (fa == 0) return b;
  if (fb == 0) return a;
  if (fa != fb) return fa > fb ? a : b;
  return DType::f32;  // f16 with bf16, e4m3 with e5m2: neither holds the other, f32 holds both
}

namespace detail {
void throw_unsupported_dtype(const char* op, DType dtype) {
  throw DTypeError(str_cat(op, ": unsupported dtype ", dtype_name(dtype)));
}
}  // namespace detail

}  // namespace mt
