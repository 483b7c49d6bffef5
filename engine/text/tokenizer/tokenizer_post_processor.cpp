#include "engine/text/tokenizer/tokenizer_post_processor.h"

#include <nlohmann/json.hpp>

#include "engine/text/tokenizer/tokenizer_error.h"

namespace kvchat::tokenization {

namespace {

// Appends the template of `config` (a TemplateProcessing) to `result`.
void parse_template(const nlohmann::json& config, const std::string& where, SpecialTokenTemplate& result) {
  if (!config.contains("single")) throw TokenizerError(where + " TemplateProcessing has no 'single'");
  const nlohmann::json& specials =
      config.contains("special_tokens") ? config["special_tokens"] : nlohmann::json::object();
  auto ids_of = [&](const std::string& name) {
    if (!specials.is_object() || !specials.contains(name) || !specials[name].contains("ids") ||
        !specials[name]["ids"].is_array()) {
      throw TokenizerError(where + " TemplateProcessing: special token '" + name + "' is not in special_tokens");
    }
    std::vector<TokenId> ids;
    for (const auto& id : specials[name]["ids"]) {
      if (!id.is_number_integer())
        throw TokenizerError(where + " TemplateProcessing: non-integer id for '" + name + "'");
      ids.push_back(id.get<TokenId>());
    }
    return ids;
  };

  // Items are {"SpecialToken": {"id": ...}} / {"Sequence": {"id": "A"}} objects, or the string
  // shorthand "<s> $A" / "<s>:0 $A:0".
  std::vector<std::pair<bool, std::string>> items;  // (is_sequence, special token name)
  const nlohmann::json& single = config["single"];
  if (single.is_string()) {
    std::string text = single.get<std::string>();
    std::size_t pos = 0;
    while (pos < text.size()) {
      auto end = text.find(' ', pos);
      if (end == std::string::npos) end = text.size();
      std::string piece = text.substr(pos, end - pos);
      pos = end + 1;
      if (piece.empty()) continue;
      if (piece[0] == '$') {
        items.emplace_back(true, "");
      } else {
        auto colon = piece.rfind(':');
        items.emplace_back(false, colon == std::string::npos ? piece : piece.substr(0, colon));
      }
    }
  } else if (single.is_array()) {
    for (const auto& item : single) {
      if (item.contains("Sequence")) {
        items.emplace_back(true, "");
      } else if (item.contains("SpecialToken") && item["SpecialToken"].contains("id") &&
                 item["SpecialToken"]["id"].is_string()) {
        items.emplace_back(false, item["SpecialToken"]["id"].get<std::string>());
      } else {
        throw TokenizerError(where + " TemplateProcessing: unrecognised item " + item.dump());
      }
    }
  } else {
    throw TokenizerError(where + " TemplateProcessing: 'single' is neither a string nor an array");
  }

  bool seen_sequence = false;
  for (const auto& [is_sequence, name] : items) {
    if (is_sequence) {
      if (seen_sequence) throw TokenizerError(where + " TemplateProcessing: 'single' names the sequence twice");
      seen_sequence = true;
      continue;
    }
    auto ids = ids_of(name);
    auto& target = seen_sequence ? result.suffix : result.prefix;
    target.insert(target.end(), ids.begin(), ids.end());
  }
  if (!seen_sequence) throw TokenizerError(where + " TemplateProcessing: 'single' has no $A sequence");
}

void parse_into(const nlohmann::json& config, const std::string& source, SpecialTokenTemplate& result) {
  if (config.is_null()) return;
  const std::string where = source + " post_processor";
  if (!config.is_object() || !config.contains("type") || !config["type"].is_string()) {
    throw TokenizerError(where + " has no 'type'");
  }
  const std::string type = config["type"].get<std::string>();
  if (type == "ByteLevel") return;  // only trims offsets, which this tokenizer does not report
  if (type == "TemplateProcessing") return parse_template(config, where, result);
  if (type == "Sequence") {
    if (!config.contains("processors") || !config["processors"].is_array()) {
      throw TokenizerError(where + " Sequence has no 'processors' array");
    }
    for (const auto& step : config["processors"]) parse_into(step, source, result);
    return;
  }
  throw TokenizerError("unsupported post_processor type '" + type + "' in " + source);
}

}  // namespace

SpecialTokenTemplate parse_post_processor(const nlohmann::json& config, const std::string& source) {
  SpecialTokenTemplate result;
  parse_into(config, source, result);
  return result;
}

}  // namespace kvchat::tokenization
