#pragma once
// For the constrained-decoding tests: a JSON schema validator written from the specification's keywords
// (independent of the grammar compiler and matcher it checks), and seeded random schemas with instances
// valid against them.
#include <cmath>
#include <cstdint>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

namespace kvchat::test {

using ordered_json = nlohmann::ordered_json;

// "" when `value` is valid against `schema` (the subset the constraint takes), else why not, with a path.
inline std::string schema_violation(const ordered_json& schema, const ordered_json& value, const ordered_json& root,
                                    const std::string& path = "") {
  if (schema.is_boolean()) return schema.get<bool>() ? "" : path + ": schema false";
  if (schema.contains("$ref")) {
    const std::string ref = schema["$ref"];
    if (ref == "#") return schema_violation(root, value, root, path);
    for (const std::string prefix : {"#/$defs/", "#/definitions/"})
      if (ref.rfind(prefix, 0) == 0)
        return schema_violation(root[prefix.substr(2, prefix.size() - 3)][ref.substr(prefix.size())], value, root,
                                path);
    return path + ": unresolved $ref " + ref;
  }
  if (schema.contains("anyOf")) {
    for (const auto& branch : schema["anyOf"])
      if (schema_violation(branch, value, root, path).empty()) return "";
    return path + ": no anyOf branch matches";
  }
  if (schema.contains("const") && value != schema["const"]) return path + ": not the const";
  if (schema.contains("enum")) {
    bool found = false;
    for (const auto& option : schema["enum"]) found = found || option == value;
    if (!found) return path + ": not in enum";
  }
  if (schema.contains("type")) {
    const auto matches = [&](const std::string& type) {
      if (type == "object") return value.is_object();
      if (type == "array") return value.is_array();
      if (type == "string") return value.is_string();
      if (type == "integer")
        return value.is_number_integer() ||
               (value.is_number_float() && std::floor(value.get<double>()) == value.get<double>());
      if (type == "number") return value.is_number();
      if (type == "boolean") return value.is_boolean();
      if (type == "null") return value.is_null();
      return false;
    };
    bool any = false;
    if (schema["type"].is_string()) any = matches(schema["type"]);
    for (const auto& type : schema["type"].is_array() ? schema["type"] : ordered_json::array())
      any = any || matches(type);
    if (!any) return path + ": wrong type";
  }
  if (value.is_object()) {
    const ordered_json properties = schema.value("properties", ordered_json::object());
    for (const auto& name : schema.value("required", ordered_json::array()))
      if (!value.contains(name.get<std::string>())) return path + ": missing required " + name.get<std::string>();
    for (auto it = value.begin(); it != value.end(); ++it) {
      if (properties.contains(it.key())) {
        std::string inner = schema_violation(properties[it.key()], it.value(), root, path + "/" + it.key());
        if (!inner.empty()) return inner;
      } else if (schema.contains("additionalProperties")) {
        std::string inner = schema_violation(schema["additionalProperties"], it.value(), root, path + "/" + it.key());
        if (!inner.empty()) return inner;
      }
    }
  }
  if (value.is_array()) {
    if (schema.contains("minItems") && value.size() < schema["minItems"].get<std::size_t>())
      return path + ": too few items";
    if (schema.contains("maxItems") && value.size() > schema["maxItems"].get<std::size_t>())
      return path + ": too many items";
    if (schema.contains("items"))
      for (std::size_t i = 0; i < value.size(); ++i) {
        std::string inner = schema_violation(schema["items"], value[i], root, path + "/" + std::to_string(i));
        if (!inner.empty()) return inner;
      }
  }
  if (value.is_string()) {
    std::size_t code_points = 0;
    for (unsigned char c : value.get<std::string>()) code_points += (c & 0xC0) != 0x80;
    if (schema.contains("minLength") && code_points < schema["minLength"].get<std::size_t>())
      return path + ": too short";
    if (schema.contains("maxLength") && code_points > schema["maxLength"].get<std::size_t>())
      return path + ": too long";
  }
  if (value.is_number()) {
    const double number = value.get<double>();
    if (schema.contains("minimum") && number < schema["minimum"].get<double>()) return path + ": below minimum";
    if (schema.contains("maximum") && number > schema["maximum"].get<double>()) return path + ": above maximum";
    if (schema.contains("exclusiveMinimum") && number <= schema["exclusiveMinimum"].get<double>())
      return path + ": not above exclusiveMinimum";
    if (schema.contains("exclusiveMaximum") && number >= schema["exclusiveMaximum"].get<double>())
      return path + ": not below exclusiveMaximum";
  }
  return "";
}

inline std::string schema_violation(const ordered_json& schema, const ordered_json& value) {
  return schema_violation(schema, value, schema);
}

// A random schema: nested objects and arrays, enums, required and optional properties, bounded strings,
// numbers and integers, nullable values (anyOf). `depth` bounds nesting.
inline ordered_json random_schema(std::mt19937& random, int depth = 3) {
  const auto pick = [&](int n) { return static_cast<int>(random() % static_cast<unsigned>(n)); };
  const int kind = depth <= 0 ? 2 + pick(4) : pick(8);  // at the bottom: strings, enums, numbers, booleans
  switch (kind) {
    case 0:
    case 1: {
      ordered_json schema = {{"type", "object"}, {"properties", ordered_json::object()}};
      ordered_json required = ordered_json::array();
      const int count = 1 + pick(4);
      static const char* names[] = {"name", "id", "tags", "value", "kind", "note", "score", "items", "when", "ok"};
      for (int i = 0; i < count; ++i) {
        const std::string name = std::string(names[pick(10)]) + std::to_string(i);
        schema["properties"][name] = random_schema(random, depth - 1);
        if (pick(3) != 0) required.push_back(name);
      }
      schema["required"] = required;
      schema["additionalProperties"] = false;
      return schema;
    }
    case 2: {
      ordered_json schema = {{"type", "string"}};
      if (pick(2)) schema["maxLength"] = 3 + pick(20);
      if (pick(3) == 0) schema["minLength"] = 1 + pick(3);
      return schema;
    }
    case 3: return {{"type", "string"}, {"enum", ordered_json::array({"red", "green", "blue", "dark \"blue\""})}};
    case 4: {
      ordered_json schema = {{"type", pick(2) ? "integer" : "number"}};
      if (pick(2)) schema["minimum"] = pick(2) ? 0 : -5;
      if (pick(2)) schema["maximum"] = 100 + pick(1000);
      return schema;
    }
    case 5: return {{"type", "boolean"}};
    case 6: return {{"anyOf", ordered_json::array({random_schema(random, depth - 1), {{"type", "null"}}})}};
    default: {
      ordered_json schema = {{"type", "array"}, {"items", random_schema(random, depth - 1)}};
      if (pick(2)) schema["maxItems"] = 1 + pick(4);
      if (pick(3) == 0) schema["minItems"] = 1;
      return schema;
    }
  }
}

}  // namespace kvchat::test
