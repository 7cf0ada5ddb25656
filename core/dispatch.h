// One place that turns a runtime DType into a C++ element type.
//
//   dispatch_floating(t.dtype(), "layer_norm", [&](auto tag) {
//     using T = typename decltype(tag)::type;   // double, float, Half or BFloat16
//     ...
//   });
//
// A dtype outside the set throws DTypeError("layer_norm: unsupported dtype f8e4m3").
// Ops never write their own switch over dtypes.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "core/dtype.h"
#include "core/error.h"
#include "core/float_types.h"

namespace mt {

template <typename T>
struct TypeTag {
  using type = T;
};

// The C++ storage type of each DType, and back.
template <DType D>
struct StorageType;
template <>
struct StorageType<DType::f64> {
  using type = double;
};
template <>
struct StorageType<DType::f32> {
  using type = float;
};
template <>
struct StorageType<DType::f16> {
  using type = Half;
};
template <>
struct StorageType<DType::bf16> {
  using type = BFloat16;
};
template <>
struct StorageType<DType::f8e4m3> {
  using type = Float8E4M3;
};
template <>
struct StorageType<DType::f8e5m2> {
  using type = Float8E5M2;
};
template <>
struct StorageType<DType::i64> {
  using type = int64_t;
};
template <>
struct StorageType<DType::i32> {
  using type = int32_t;
};
template <>
struct StorageType<DType::u8> {
  using type = uint8_t;
};
template <>
struct StorageType<DType::boolean> {
  using type = bool;
};

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<Half>() {
  return DType::f16;
}
template <>
constexpr DType dtype_of<BFloat16>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<Float8E4M3>() {
  return DType::f8e4m3;
}
template <>
constexpr DType dtype_of<Float8E5M2>() {
  return DType::f8e5m2;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::u8;
}
template <>
constexpr DType dtype_of<bool>() {
  return DType::boolean;
}

// The type arithmetic happens in: double for f64, float for everything narrower.
template <typename T>
struct AccType {
  using type = float;
};
template <>
struct AccType<double> {
  using type = double;
};
template <>
struct AccType<int64_t> {
  using type = int64_t;
};
template <>
struct AccType<int32_t> {
  using type = int64_t;
};
template <typename T>
using acc_t = typename AccType<T>::type;

namespace detail {
[[noreturn]] void throw_unsupported_dtype(const char* op, DType dtype);

template <DType... Allowed, typename F>
decltype(auto) dispatch_among(DType dtype, const char* op, F&& f) {
  using R = decltype(f(TypeTag<float>{}));
  if constexpr (std::is_void_v<R>) {
    bool done = ((dtype == Allowed ? (f(TypeTag<typename StorageType<Allowed>::type>{}), true) : false) || ...);
    if (!done) throw_unsupported_dtype(op, dtype);
  } else {
    R result{};
    bool done =
        ((dtype == Allowed ? (result = f(TypeTag<typename StorageType<Allowed>::type>{}), true) : false) || ...);
    if (!done) throw_unsupported_dtype(op, dtype);
    return result;
  }
}
}  // namespace detail

// f64, f32, f16, bf16: what every compute op supports.
template <typename F>
decltype(auto) dispatch_floating(DType dtype, const char* op, F&& f) {
  return detail::dispatch_among<DType::f64, DType::f32, DType::f16, DType::bf16>(dtype, op, std::forward<F>(f));
}

// Every dtype (copies, casts, fills, printing).
template <typename F>
decltype(auto) dispatch_all(DType dtype, const char* op, F&& f) {
  return detail::dispatch_among<DType::f64, DType::f32, DType::f16, DType::bf16, DType::f8e4m3, DType::f8e5m2,
                                DType::i64, DType::i32, DType::u8, DType::boolean>(dtype, op, std::forward<F>(f));
}

// Index types (embedding ids, class targets).
template <typename F>
decltype(auto) dispatch_index(DType dtype, const char* op, F&& f) {
  return detail::dispatch_among<DType::i64, DType::i32>(dtype, op, std::forward<F>(f));
}

// Reads element type T as a double / writes a double as T (host and device).
template <typename T>
MT_HOST_DEVICE inline double to_double(T v) {
  return static_cast<double>(static_cast<float>(v));
}
template <>
MT_HOST_DEVICE inline double to_double<double>(double v) {
  return v;
}
template <>
MT_HOST_DEVICE inline double to_double<int64_t>(int64_t v) {
  return static_cast<double>(v);
}
template <>
MT_HOST_DEVICE inline double to_double<int32_t>(int32_t v) {
  return static_cast<double>(v);
}
template <>
MT_HOST_DEVICE inline double to_double<uint8_t>(uint8_t v) {
  return static_cast<double>(v);
}
template <>
MT_HOST_DEVICE inline double to_double<bool>(bool v) {
  return v ? 1.0 : 0.0;
}

// Converts between any two element types. Narrow floats go through f32;
// f64 -> narrow goes f64 -> f32 -> narrow (Note [Conversion rule]).
template <typename To, typename From>
MT_HOST_DEVICE inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, bool>) {
    return to_double(v) != 0.0;
  } else if constexpr (std::is_same_v<To, double> || std::is_integral_v<To>) {
    return static_cast<To>(to_double(v));
  } else {  // f32 or a narrow float: through f32
    return To(static_cast<float>(v));
  }
}

}  // namespace mt
