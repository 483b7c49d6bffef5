#include "engine/text/tokenizer/tokenizer_normalizer.h"

#include <vector>

#include <nlohmann/json.hpp>

#include "engine/text/tokenizer/tokenizer_component.h"
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

std::unique_ptr<Normalizer> make_prepend_normalizer(const nlohmann::json& config, const std::string& where) {
  return std::make_unique<PrependNormalizer>(string_field(config, "prepend", where));
}

std::unique_ptr<Normalizer> make_replace_normalizer(const nlohmann::json& config, const std::string& where) {
  if (!config.contains("pattern")) throw TokenizerError(where + " Replace has no 'pattern'");
  return std::make_unique<ReplaceNormalizer>(Pattern(config["pattern"], where + " Replace"),
                                             string_field(config, "content", where + " Replace"));
}

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& config, const std::string& source) {
  static const ComponentTable<Normalizer> table{
      "normalizer",
      "normalizers",
      make_sequence<Normalizer, SequenceNormalizer>,
      {{"Prepend", make_prepend_normalizer}, {"Replace", make_replace_normalizer}}};
  return make_component(config, source, table);
}

}  // namespace kvchat::tokenization
