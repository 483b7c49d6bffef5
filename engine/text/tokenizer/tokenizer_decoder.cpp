#include "engine/text/tokenizer/tokenizer_decoder.h"
#include "engine/text/tokenizer/tokenizer_json.h"

#include <nlohmann/json.hpp>

#include "engine/text/tokenizer/tokenizer_byte_level.h"
#include "engine/text/tokenizer/tokenizer_component.h"
#include "engine/text/tokenizer/tokenizer_error.h"
#include "engine/text/tokenizer/tokenizer_pattern.h"

namespace kvchat::tokenization {

namespace {

class ByteLevelDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& token : tokens) append_byte_level_as_bytes(token, bytes);
    tokens.assign(1, std::move(bytes));
  }
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(Pattern pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) token = pattern_.replace_all(token, content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// Parses "<0xNN>"; -1 for anything else.
int byte_token_value(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  int value = 0;
  for (int k = 3; k < 5; ++k) {
    char c = token[k];
    int digit = (c >= '0' && c <= '9')   ? c - '0'
                : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                                         : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

// Consecutive <0xNN> tokens become one token holding those raw bytes. Invalid sequences are
// repaired later with one U+FFFD per maximal invalid subsequence (what TextDecoder and
// from_utf8_lossy do); the Rust ByteFallback would instead emit one U+FFFD per byte token.
class ByteFallbackDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string run;
    bool in_run = false;
    for (std::string& token : tokens) {
      int value = byte_token_value(token);
      if (value >= 0) {
        run.push_back(static_cast<char>(value));
        in_run = true;
        continue;
      }
      if (in_run) {
        out.push_back(std::move(run));
        run.clear();
        in_run = false;
      }
      out.push_back(std::move(token));
    }
    if (in_run) out.push_back(std::move(run));
    tokens = std::move(out);
  }
};

class FuseDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string joined;
    for (const std::string& token : tokens) joined += token;
    tokens.assign(1, std::move(joined));
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, int start, int stop) : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) {
      std::size_t begin = 0, end = token.size();
      for (int k = 0; k < start_ && token.compare(begin, content_.size(), content_) == 0 && begin < end; ++k) {
        begin += content_.size();
      }
      for (int k = 0; k < stop_ && end >= begin + content_.size() &&
                      token.compare(end - content_.size(), content_.size(), content_) == 0;
           ++k) {
        end -= content_.size();
      }
      token = token.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;
  int start_, stop_;
};

// Metaspace: "▁" becomes " "; the first token loses one leading space when a prefix was added
// (as SentencePiece's own decoder does).
class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)),
        strip_first_(strip_first),
        pattern_(nlohmann::json{{"String", replacement_}}, "Metaspace decoder") {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = pattern_.replace_all(tokens[i], " ");
      if (i == 0 && strip_first_ && !tokens[i].empty() && tokens[i][0] == ' ') tokens[i].erase(0, 1);
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;
  Pattern pattern_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& step : steps_) step->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

std::unique_ptr<Decoder> make_replace_decoder(const nlohmann::json& config, const std::string& where) {
  if (!config.contains("pattern") || !config.contains("content") || !config["content"].is_string()) {
    throw TokenizerError(where + " Replace needs 'pattern' and a string 'content'");
  }
  return std::make_unique<ReplaceDecoder>(Pattern(config["pattern"], where + " Replace"),
                                          config["content"].get<std::string>());
}

std::unique_ptr<Decoder> make_strip_decoder(const nlohmann::json& config, const std::string& where) {
  std::string content = optional_field(config, "content", std::string(" "), where + " Strip");
  if (content.empty()) throw TokenizerError(where + " Strip: empty content");
  return std::make_unique<StripDecoder>(content, optional_field(config, "start", 0, where + " Strip"),
                                        optional_field(config, "stop", 0, where + " Strip"));
}

std::unique_ptr<Decoder> make_metaspace_decoder(const nlohmann::json& config, const std::string& where) {
  bool strip_first = optional_field(config, "add_prefix_space", true, where + " Metaspace");
  if (config.contains("prepend_scheme") && config["prepend_scheme"].is_string()) {
    strip_first = config["prepend_scheme"].get<std::string>() != "never";
  }
  return std::make_unique<MetaspaceDecoder>(
      optional_field(config, "replacement", std::string("\xE2\x96\x81"), where + " Metaspace"), strip_first);
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& config, const std::string& source) {
  static const ComponentTable<Decoder> table{"decoder",
                                             "decoders",
                                             make_sequence<Decoder, SequenceDecoder>,
                                             {{"ByteLevel", make_plain<Decoder, ByteLevelDecoder>},
                                              {"ByteFallback", make_plain<Decoder, ByteFallbackDecoder>},
                                              {"Fuse", make_plain<Decoder, FuseDecoder>},
                                              {"Replace", make_replace_decoder},
                                              {"Strip", make_strip_decoder},
                                              {"Metaspace", make_metaspace_decoder}}};
  return make_component(config, source, table);
}

std::string clean_up_tokenization(std::string_view text) {
  static const std::pair<const char*, const char*> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  std::string out(text);
  for (const auto& [from, to] : kRules) {
    std::string_view pattern(from);
    if (out.find(pattern) == std::string::npos) continue;
    std::string next;
    next.reserve(out.size());
    std::size_t copied = 0;
    for (std::size_t at = out.find(pattern); at != std::string::npos; at = out.find(pattern, at + pattern.size())) {
      next.append(out, copied, at - copied);
      next += to;
      copied = at + pattern.size();
    }
    next.append(out, copied, std::string::npos);
    out = std::move(next);
  }
  return out;
}

}  // namespace kvchat::tokenization
