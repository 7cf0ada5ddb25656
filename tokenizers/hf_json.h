// Reading fields of tokenizer.json with errors that name the file, the object and the field.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "core/json_number.h"
#include "tokenizers/regex.h"

namespace mt::tok {

using nlohmann::json;

inline const json& required_field(const json& object, const char* key, const std::string& where, const char* in) {
  if (!object.is_object()) detail::fail_file(where, in, " is not a JSON object");
  const auto it = object.find(key);
  if (it == object.end()) detail::fail_file(where, in, " has no \"", key, "\" field");
  return *it;
}

// A value as T: integers must be JSON integers in T's range (core/json_number.h).
template <typename T>
T value_as(const json& value, const char* key, const std::string& where, const char* in) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    const auto v = json_integer<T>(value);
    if (!v) detail::fail_file(where, in, ".", key, " is ", value.dump(), ", not an integer in range");
    return *v;
  } else {
    try {
      return value.get<T>();
    } catch (const json::exception& e) {
      detail::fail_file(where, in, ".", key, " has the wrong type: ", e.what());
    }
  }
}

template <typename T>
T field_or(const json& object, const char* key, const T& fallback, const std::string& where, const char* in) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  return value_as<T>(*it, key, where, in);
}

template <typename T>
T required(const json& object, const char* key, const std::string& where, const char* in) {
  return value_as<T>(required_field(object, key, where, in), key, where, in);
}

// A component's "pattern": {"Regex": "..."} or {"String": "..."} (matched literally).
inline std::unique_ptr<Regex> parse_pattern(const json& spec, const std::string& where, const char* in) {
  const json& pattern = required_field(spec, "pattern", where, in);
  if (pattern.contains("Regex")) return std::make_unique<Regex>(required<std::string>(pattern, "Regex", where, in));
  if (pattern.contains("String")) {
    return std::make_unique<Regex>(required<std::string>(pattern, "String", where, in), /*literal=*/true);
  }
  detail::fail_file(where, in, ".pattern has neither \"Regex\" nor \"String\"");
}

inline std::string type_of(const json& object, const std::string& where, const char* in) {
  return required<std::string>(object, "type", where, in);
}

}  // namespace mt::tok
