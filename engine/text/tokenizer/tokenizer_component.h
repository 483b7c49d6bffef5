#pragma once
// Building one tokenizer.json component (normalizer, pre_tokenizer, decoder) from its JSON: the
// three share the same shape ({"type": ..., ...}, a Sequence of steps, an error for unknown types).
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/text/tokenizer/tokenizer_error.h"

namespace kvchat::tokenization {

template <typename T>
struct ComponentTable {
  // Builds one type of component; `where` ("<file> decoder") prefixes its error messages.
  using Factory = std::unique_ptr<T> (*)(const nlohmann::json& config, const std::string& where);

  const char* kind;            // "decoder": the tokenizer.json field, as messages name it
  const char* sequence_steps;  // "decoders": the array a Sequence holds
  std::unique_ptr<T> (*make_sequence)(std::vector<std::unique_ptr<T>> steps);
  std::unordered_map<std::string_view, Factory> types;
};

// Factories for ComponentTable: a component without settings, and a Sequence of steps.
template <typename T, typename Made>
std::unique_ptr<T> make_plain(const nlohmann::json&, const std::string&) {
  return std::make_unique<Made>();
}
template <typename T, typename Sequence>
std::unique_ptr<T> make_sequence(std::vector<std::unique_ptr<T>> steps) {
  return std::make_unique<Sequence>(std::move(steps));
}

// nullptr for a JSON null. `source` names the file in error messages.
template <typename T>
std::unique_ptr<T> make_component(const nlohmann::json& config, const std::string& source,
                                  const ComponentTable<T>& table) {
  if (config.is_null()) return nullptr;
  const std::string where = source + " " + table.kind;
  if (!config.is_object() || !config.contains("type") || !config["type"].is_string()) {
    throw TokenizerError(where + " has no 'type'");
  }
  const std::string type = config["type"].get<std::string>();
  if (type == "Sequence") {
    if (!config.contains(table.sequence_steps) || !config[table.sequence_steps].is_array()) {
      throw TokenizerError(where + " Sequence has no '" + table.sequence_steps + "' array");
    }
    std::vector<std::unique_ptr<T>> steps;
    for (const auto& step : config[table.sequence_steps]) {
      if (auto made = make_component(step, source, table)) steps.push_back(std::move(made));
    }
    return table.make_sequence(std::move(steps));
  }
  auto factory = table.types.find(type);
  if (factory == table.types.end()) {
    throw TokenizerError("unsupported " + std::string(table.kind) + " type '" + type + "' in " + source);
  }
  return factory->second(config, where);
}

}  // namespace kvchat::tokenization
