#include "engine/text/tokenizer/tokenizer_normalizer.h"

#include <vector>

#include <nlohmann/json.hpp>

#include "engine/text/tokenizer/tokenizer_error.h"
#include "engine/text/tokenizer/tokenizer_pattern.h"

namespace kvchat::tokenization {

namespace {

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    // An empty segment stays empty: "" encodes to no tokens (only BOS when it is added).
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(std::string& text) const override { text = pattern_.replace_all(text, content_); }

 private:
  Pattern pattern_;
  std::string content_;
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  void normalize(std::string& text) const override {
    for (const auto& step : steps_) step->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

std::string string_field(const nlohmann::json& config, const char* field, const std::string& where) {
  if (!config.contains(field) || !config[field].is_string()) {
    throw TokenizerError(where + ": missing string field '" + field + "'");
  }
  return config[field].get<std::string>();
}

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& config, const std::string& source) {
  if (config.is_null()) return nullptr;
  const std::string where = source + " normalizer";
  if (!config.is_object() || !config.contains("type") || !config["type"].is_string()) {
    throw TokenizerError(where + " has no 'type'");
  }
  const std::string type = config["type"].get<std::string>();
  if (type == "Sequence") {
    if (!config.contains("normalizers") || !config["normalizers"].is_array()) {
      throw TokenizerError(where + " Sequence has no 'normalizers' array");
    }
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const auto& step : config["normalizers"]) {
      if (auto made = make_normalizer(step, source)) steps.push_back(std::move(made));
    }
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(string_field(config, "prepend", where));
  if (type == "Replace") {
    if (!config.contains("pattern")) throw TokenizerError(where + " Replace has no 'pattern'");
    return std::make_unique<ReplaceNormalizer>(Pattern(config["pattern"], where + " Replace"),
                                               string_field(config, "content", where + " Replace"));
  }
  throw TokenizerError("unsupported normalizer type '" + type + "' in " + source);
}

}  // namespace kvchat::tokenization
