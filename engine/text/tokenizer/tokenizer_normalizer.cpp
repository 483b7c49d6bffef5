#include "engine/text/tokenizer/tokenizer_normalizer.h"

#include <vector>

#include <unicode/normalizer2.h>
#include <unicode/unistr.h>
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

// NFC, NFD, NFKC, NFKD (Qwen's tokenizers normalize to NFC): ICU's normalizers over the text's UTF-8, which
// encode() has already made valid.
class UnicodeFormNormalizer : public Normalizer {
 public:
  UnicodeFormNormalizer(const icu::Normalizer2& form, std::string name) : form_(form), name_(std::move(name)) {}
  void normalize(std::string& text) const override {
    bool ascii = true;
    for (unsigned char byte : text) ascii = ascii && byte < 0x80;
    if (ascii) return;  // every form leaves ASCII as it is
    UErrorCode status = U_ZERO_ERROR;
    const icu::UnicodeString normalized = form_.normalize(icu::UnicodeString::fromUTF8(text), status);
    if (U_FAILURE(status)) throw TokenizerError(name_ + " normalization failed: " + u_errorName(status));
    text.clear();
    normalized.toUTF8String(text);
  }

 private:
  const icu::Normalizer2& form_;  // ICU's, alive for the process
  std::string name_;
};

template <const icu::Normalizer2* (*kInstance)(UErrorCode&)>
std::unique_ptr<Normalizer> make_unicode_form_normalizer(const nlohmann::json& config, const std::string& where) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* form = kInstance(status);
  const std::string name = config.value("type", std::string());
  if (U_FAILURE(status) || form == nullptr) {
    throw TokenizerError(where + ": the " + name + " normalizer is not available: " + u_errorName(status));
  }
  return std::make_unique<UnicodeFormNormalizer>(*form, name);
}

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
      {{"Prepend", make_prepend_normalizer},
       {"Replace", make_replace_normalizer},
       {"NFC", make_unicode_form_normalizer<&icu::Normalizer2::getNFCInstance>},
       {"NFD", make_unicode_form_normalizer<&icu::Normalizer2::getNFDInstance>},
       {"NFKC", make_unicode_form_normalizer<&icu::Normalizer2::getNFKCInstance>},
       {"NFKD", make_unicode_form_normalizer<&icu::Normalizer2::getNFKDInstance>}}};
  return make_component(config, source, table);
}

}  // namespace kvchat::tokenization
