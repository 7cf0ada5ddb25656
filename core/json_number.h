// Reading integers out of JSON without undefined behaviour: nlohmann's get<int64_t>() of a
// float value, or of an integer beyond the target type, converts with a plain cast (undefined
// for 1e30 into a long). json_integer accepts only JSON integers that fit T.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>

namespace mt {

// The value as T, or nullopt when it is not a JSON integer within T's range.
template <typename T, typename Json>
std::optional<T> json_integer(const Json& value) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  if (!value.is_number_integer()) return std::nullopt;
  if (value.is_number_unsigned()) {
    const auto v = value.template get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<T>::max())) return std::nullopt;
    return static_cast<T>(v);
  }
  const auto v = value.template get<int64_t>();
  if constexpr (std::is_unsigned_v<T>) {
    if (v < 0 || static_cast<uint64_t>(v) > static_cast<uint64_t>(std::numeric_limits<T>::max())) return std::nullopt;
  } else {
    if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
        v > static_cast<int64_t>(std::numeric_limits<T>::max())) {
      return std::nullopt;
    }
  }
  return static_cast<T>(v);
}

}  // namespace mt
