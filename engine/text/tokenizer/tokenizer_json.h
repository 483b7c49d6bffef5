#pragma once
// Optional settings of tokenizer.json objects. nlohmann's value(key, fallback) throws its own
// type_error when the field holds another type ("special": "yes"); a tokenizer file is untrusted
// input, so a wrong type is a TokenizerError that names the field.
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/text/tokenizer/tokenizer_error.h"

namespace kvchat::tokenization {

// object[key] as T (bool, int or std::string); `fallback` when the key is absent or null.
template <typename T>
T optional_field(const nlohmann::json& object, const char* key, T fallback, const std::string& where) {
  if (!object.is_object()) return fallback;
  const auto found = object.find(key);
  if (found == object.end() || found->is_null()) return fallback;
  const nlohmann::json& value = *found;
  if constexpr (std::is_same_v<T, bool>) {
    if (!value.is_boolean()) throw TokenizerError(where + ": '" + key + "' is not a boolean");
    return value.get<bool>();
  } else if constexpr (std::is_same_v<T, int>) {
    if (!value.is_number_integer() || value.get<long long>() < std::numeric_limits<int>::min() ||
        value.get<long long>() > std::numeric_limits<int>::max())
      throw TokenizerError(where + ": '" + key + "' is not an integer of at most 32 bits");
    return static_cast<int>(value.get<long long>());
  } else {
    static_assert(std::is_same_v<T, std::string>, "optional_field: bool, int or std::string");
    if (!value.is_string()) throw TokenizerError(where + ": '" + key + "' is not a string");
    return value.get<std::string>();
  }
}

}  // namespace kvchat::tokenization
