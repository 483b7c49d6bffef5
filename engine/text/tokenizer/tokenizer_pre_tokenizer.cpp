#include "engine/text/tokenizer/tokenizer_pre_tokenizer.h"
#include "engine/text/tokenizer/tokenizer_json.h"

#include <algorithm>
#include <utility>

#include <nlohmann/json.hpp>

#include "engine/text/tokenizer/tokenizer_byte_level.h"
#include "engine/text/tokenizer/tokenizer_component.h"
#include "engine/text/tokenizer/tokenizer_error.h"
#include "engine/text/tokenizer/tokenizer_pattern.h"

namespace kvchat::tokenization {

namespace {

// What becomes of the matched parts when a piece is split (tokenizers' SplitDelimiterBehavior).
enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct Span {
  std::size_t begin, end;
  bool is_match;
};

// Cuts `text` at the spans of `matches` and arranges the parts as `behavior` says; the rules
// mirror tokenizers' NormalizedString::split so that the same pieces come out.
std::vector<std::string> split_by(const std::string& text,
                                  const std::vector<std::pair<std::size_t, std::size_t>>& matches,
                                  SplitBehavior behavior, bool invert) {
  std::vector<Span> spans;
  std::size_t last = 0;
  for (auto [begin, end] : matches) {
    if (begin > last) spans.push_back({last, begin, invert});
    spans.push_back({begin, end, !invert});
    last = end;
  }
  if (last < text.size()) spans.push_back({last, text.size(), invert});

  std::vector<Span> merged;
  switch (behavior) {
    case SplitBehavior::Isolated: merged = spans; break;
    case SplitBehavior::Removed:
      for (const Span& s : spans)
        if (!s.is_match) merged.push_back(s);
      break;
    case SplitBehavior::MergedWithPrevious: {
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !merged.empty()) {
          merged.back().end = s.end;
        } else {
          merged.push_back(s);
        }
        previous_match = s.is_match;
      }
      break;
    }
    case SplitBehavior::MergedWithNext: {
      bool previous_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !merged.empty()) {
          merged.back().begin = it->begin;
        } else {
          merged.push_back(*it);
        }
        previous_match = it->is_match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    }
    case SplitBehavior::Contiguous: {
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.is_match && previous_match && !merged.empty()) {
          merged.back().end = s.end;
        } else {
          merged.push_back(s);
        }
        previous_match = s.is_match;
      }
      break;
    }
  }
  std::vector<std::string> out;
  out.reserve(merged.size());
  for (const Span& s : merged)
    if (s.end > s.begin) out.push_back(text.substr(s.begin, s.end - s.begin));
  return out;
}

void split_all(std::vector<std::string>& pieces, const Pattern& pattern, SplitBehavior behavior, bool invert) {
  std::vector<std::string> out;
  out.reserve(pieces.size() * 4);
  for (const std::string& piece : pieces) {
    for (std::string& part : split_by(piece, pattern.find_all(piece), behavior, invert)) out.push_back(std::move(part));
  }
  pieces = std::move(out);
}

SplitBehavior parse_behavior(const nlohmann::json& config, const std::string& where) {
  std::string name = optional_field(config, "behavior", std::string("Isolated"), where);
  if (name == "Removed") return SplitBehavior::Removed;
  if (name == "Isolated") return SplitBehavior::Isolated;
  if (name == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (name == "Contiguous") return SplitBehavior::Contiguous;
  throw TokenizerError(where + ": unsupported split behavior '" + name + "'");
}

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(Pattern pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<std::string>& pieces, bool) const override {
    split_all(pieces, pattern_, behavior_, invert_);
  }

 private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

// GPT-2's pattern, used by ByteLevel when use_regex is true.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex) : add_prefix_space_(add_prefix_space) {
    if (use_regex) {
      gpt2_ = std::make_unique<Pattern>(nlohmann::json{{"Regex", kGpt2Pattern}}, "ByteLevel pre_tokenizer");
    }
  }
  void pre_tokenize(std::vector<std::string>& pieces, bool) const override {
    if (add_prefix_space_) {
      for (std::string& piece : pieces)
        if (piece.empty() || piece[0] != ' ') piece.insert(0, " ");
    }
    if (gpt2_) split_all(pieces, *gpt2_, SplitBehavior::Isolated, false);
    for (std::string& piece : pieces) piece = bytes_to_byte_level(piece);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Pattern> gpt2_;
};

enum class PrependScheme { Always, First, Never };

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)),
        scheme_(scheme),
        split_(split),
        pattern_(nlohmann::json{{"String", replacement_}}, "Metaspace pre_tokenizer") {}
  void pre_tokenize(std::vector<std::string>& pieces, bool at_text_start) const override {
    static const Pattern space(nlohmann::json{{"String", " "}}, "Metaspace pre_tokenizer");
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      std::string& piece = pieces[i];
      piece = space.replace_all(piece, replacement_);
      bool prepend = scheme_ == PrependScheme::Always || (scheme_ == PrependScheme::First && i == 0 && at_text_start);
      if (prepend && piece.compare(0, replacement_.size(), replacement_) != 0) piece.insert(0, replacement_);
    }
    if (split_) split_all(pieces, pattern_, SplitBehavior::MergedWithNext, false);
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
  Pattern pattern_;
};

// Digits: ASCII digits become their own pieces, one per digit or one per run of digits.
class DigitsPreTokenizer : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(bool individual_digits) : individual_digits_(individual_digits) {}
  void pre_tokenize(std::vector<std::string>& pieces, bool) const override {
    std::vector<std::string> out;
    for (const std::string& piece : pieces) {
      std::vector<std::pair<std::size_t, std::size_t>> digits;
      for (std::size_t i = 0; i < piece.size(); ++i)
        if (piece[i] >= '0' && piece[i] <= '9') digits.emplace_back(i, i + 1);
      auto behavior = individual_digits_ ? SplitBehavior::Isolated : SplitBehavior::Contiguous;
      for (std::string& part : split_by(piece, digits, behavior, false)) out.push_back(std::move(part));
    }
    pieces = std::move(out);
  }

 private:
  bool individual_digits_;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void pre_tokenize(std::vector<std::string>& pieces, bool at_text_start) const override {
    for (const auto& step : steps_) step->pre_tokenize(pieces, at_text_start);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

std::unique_ptr<PreTokenizer> make_split_pre_tokenizer(const nlohmann::json& config, const std::string& where) {
  if (!config.contains("pattern")) throw TokenizerError(where + " Split has no 'pattern'");
  return std::make_unique<SplitPreTokenizer>(Pattern(config["pattern"], where + " Split"),
                                             parse_behavior(config, where + " Split"),
                                             optional_field(config, "invert", false, where + " Split"));
}

std::unique_ptr<PreTokenizer> make_byte_level_pre_tokenizer(const nlohmann::json& config, const std::string& where) {
  return std::make_unique<ByteLevelPreTokenizer>(optional_field(config, "add_prefix_space", true, where + " ByteLevel"),
                                                 optional_field(config, "use_regex", true, where + " ByteLevel"));
}

std::unique_ptr<PreTokenizer> make_digits_pre_tokenizer(const nlohmann::json& config, const std::string& where) {
  return std::make_unique<DigitsPreTokenizer>(optional_field(config, "individual_digits", false, where + " Digits"));
}

std::unique_ptr<PreTokenizer> make_metaspace_pre_tokenizer(const nlohmann::json& config, const std::string& where) {
  std::string replacement = optional_field(config, "replacement", std::string("\xE2\x96\x81"), where + " Metaspace");
  PrependScheme scheme = optional_field(config, "add_prefix_space", true, where + " Metaspace") ? PrependScheme::Always
                                                                                                : PrependScheme::Never;
  if (config.contains("prepend_scheme") && config["prepend_scheme"].is_string()) {
    std::string name = config["prepend_scheme"].get<std::string>();
    if (name == "always")
      scheme = PrependScheme::Always;
    else if (name == "first")
      scheme = PrependScheme::First;
    else if (name == "never")
      scheme = PrependScheme::Never;
    else
      throw TokenizerError(where + " Metaspace: unsupported prepend_scheme '" + name + "'");
  }
  if (replacement.empty()) throw TokenizerError(where + " Metaspace: empty replacement");
  return std::make_unique<MetaspacePreTokenizer>(replacement, scheme,
                                                 optional_field(config, "split", true, where + " Metaspace"));
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& config, const std::string& source) {
  static const ComponentTable<PreTokenizer> table{"pre_tokenizer",
                                                  "pretokenizers",
                                                  make_sequence<PreTokenizer, SequencePreTokenizer>,
                                                  {{"Split", make_split_pre_tokenizer},
                                                   {"ByteLevel", make_byte_level_pre_tokenizer},
                                                   {"Digits", make_digits_pre_tokenizer},
                                                   {"Metaspace", make_metaspace_pre_tokenizer}}};
  return make_component(config, source, table);
}

}  // namespace kvchat::tokenization
