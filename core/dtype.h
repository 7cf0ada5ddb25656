// Element types. A DType names how one element is stored; arithmetic on the
// narrow floating types (f16, bf16, f8*) always happens in f32 registers.
//
// f8e4m3 is the "fn" variant (OCP FP8 E4M3): max 448, no infinities, NaN is
// S.1111.111. f8e5m2 is IEEE-like: max 57344, has infinities.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mt {

enum class DType : uint8_t { f64, f32, f16, bf16, f8e4m3, f8e5m2, i64, i32, u8, boolean };

constexpr int kNumDTypes = 10;

// Bytes per element.
constexpr size_t element_size(DType t) {
  switch (t) {
    case DType::f64:
    case DType::i64:
      return 8;
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::f16:
    case DType::bf16:
      return 2;
    case DType::f8e4m3:
    case DType::f8e5m2:
    case DType::u8:
    case DType::boolean:
      return 1;
  }
  return 0;
}

constexpr bool is_floating(DType t) {
  return t == DType::f64 || t == DType::f32 || t == DType::f16 || t == DType::bf16 || t == DType::f8e4m3 ||
         t == DType::f8e5m2;
}

// The types ops compute with and produce (f8 is a storage format: GEMM inputs, casts).
constexpr bool is_compute_floating(DType t) {
  return t == DType::f64 || t == DType::f32 || t == DType::f16 || t == DType::bf16;
}

// The 16-bit floating types autocast computes in (f32 accumulates them).
constexpr bool is_half(DType t) { return t == DType::f16 || t == DType::bf16; }

constexpr bool is_integral(DType t) {
  return t == DType::i64 || t == DType::i32 || t == DType::u8 || t == DType::boolean;
}

// "f32", "bf16", ... as used in every error message.
const char* dtype_name(DType t);
DType parse_dtype(const std::string& name);  // throws DTypeError for an unknown name

// The one rule of every loader (model, optimizer state, adapter, training checkpoint) for a tensor
// stored as `stored` that fills a tensor of dtype `expected`: floating converts to floating (rounded
// to nearest even, as Tensor::copy_ does) and integer to integer; an integer tensor for a floating
// one, or the reverse, throws DTypeError naming `who`, the tensor, and both dtypes.
void check_loadable(const std::string& who, const std::string& name, DType stored, DType expected);

// Type promotion for mixed-dtype binary ops: the wider floating type wins; floating beats integral.
DType promote_types(DType a, DType b);

}  // namespace mt
