// Tokenizer (declared in engine/text/tokenizer.h): loading the tokenizer files, encoding and decoding.
#include "engine/text/tokenizer.h"
#include "engine/text/regular_file.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <spdlog/spdlog.h>
#include <xxhash.h>
#include <nlohmann/json.hpp>

#include "engine/text/tokenizer/tokenizer_bpe.h"
#include "engine/text/tokenizer/tokenizer_impl.h"
#include "engine/text/tokenizer/tokenizer_json.h"
#include "engine/text/utf8.h"

namespace kvchat {

using nlohmann::json;
using namespace tokenization;

namespace {

json read_json_file(const std::string& path) {
  std::string contents, error;
  if (!read_regular_file(path, contents, error)) throw TokenizerError("cannot open '" + path + "': " + error);
  if (contents.empty()) throw TokenizerError(path + ": empty file (0 bytes), expected a JSON object");
  try {
    return json::parse(contents);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1e400
    throw TokenizerError(path + ": invalid JSON: " + e.what());
  }
}

// bos_token / eos_token in tokenizer_config.json: a string, an AddedToken object {content: ...},
// or null.
std::optional<std::string> config_token_text(const json& config, const char* field, const std::string& path) {
  if (!config.contains(field) || config[field].is_null()) return std::nullopt;
  const json& value = config[field];
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string()) {
    return value["content"].get<std::string>();
  }
  throw TokenizerError(path + ": '" + field + "' is neither a string nor an object with 'content'");
}

// transformers' Llama-family fast tokenizers rebuild the post-processor from add_bos_token /
// add_eos_token (defaults true / false) when they are constructed; PreTrainedTokenizerFast
// keeps tokenizer.json's post-processor as it is (Llama 3 adds no BOS that way).
bool config_controls_special_tokens(const std::string& tokenizer_class) {
  static const std::set<std::string> kClasses = {"LlamaTokenizer",         "LlamaTokenizerFast", "CodeLlamaTokenizer",
                                                 "CodeLlamaTokenizerFast", "GemmaTokenizer",     "GemmaTokenizerFast"};
  return kClasses.count(tokenizer_class) > 0;
}

// The normalizer without its Prepend steps, or null when it has none (then nothing differs after the start).
std::unique_ptr<Normalizer> normalizer_without_prepend(const json& normalizer, const std::string& source) {
  const auto is_prepend = [](const json& step) { return step.is_object() && step.value("type", "") == "Prepend"; };
  if (is_prepend(normalizer)) {  // nothing left: an empty sequence, which changes nothing
    return make_normalizer({{"type", "Sequence"}, {"normalizers", json::array()}}, source);
  }
  if (!normalizer.is_object() || normalizer.value("type", "") != "Sequence" || !normalizer.contains("normalizers") ||
      !normalizer["normalizers"].is_array()) {
    return nullptr;
  }
  json steps = json::array();
  for (const json& step : normalizer["normalizers"])
    if (!is_prepend(step)) steps.push_back(step);
  if (steps.size() == normalizer["normalizers"].size()) return nullptr;
  return make_normalizer({{"type", "Sequence"}, {"normalizers", steps}}, source);
}

}  // namespace

// ---------------------------------------------------------------- loading

Tokenizer Tokenizer::from_directory(const std::string& directory) {
  namespace fs = std::filesystem;
  fs::path dir(directory);
  fs::path tokenizer_json = dir / "tokenizer.json";
  if (!fs::exists(tokenizer_json)) throw TokenizerError("no tokenizer.json in '" + directory + "'");
  fs::path config = dir / "tokenizer_config.json";
  return from_files(tokenizer_json.string(), fs::exists(config) ? config.string() : std::string());
}

Tokenizer Tokenizer::from_files(const std::string& tokenizer_json_path, const std::string& tokenizer_config_path) try {
  auto impl = std::make_unique<Impl>();
  impl->source = tokenizer_json_path;
  const std::string& source = tokenizer_json_path;
  json root = read_json_file(tokenizer_json_path);
  if (!root.is_object()) throw TokenizerError(source + ": top level is not a JSON object");
  if (!root.contains("model") || !root["model"].is_object()) throw TokenizerError(source + ": missing 'model'");
  const json& model = root["model"];
  std::string model_type;
  if (model.contains("type")) {
    if (!model["type"].is_string()) throw TokenizerError(source + ": model.type is not a string");
    model_type = model["type"].get<std::string>();
  } else if (model.contains("merges")) {
    model_type = "BPE";  // older files leave the type out; the fields identify the model
  }
  if (model_type != "BPE") {
    throw TokenizerError("unsupported model type '" + model_type + "' in " + source + " (only BPE is implemented)");
  }
  impl->model = std::make_unique<BpeModel>(model, source);
  impl->added = AddedTokens(root.value("added_tokens", json()), source);
  impl->normalizer = make_normalizer(root.value("normalizer", json()), source);
  impl->pre_tokenizer = make_pre_tokenizer(root.value("pre_tokenizer", json()), source);
  impl->decoder = make_decoder(root.value("decoder", json()), source);
  impl->special_template = parse_post_processor(root.value("post_processor", json()), source);

  impl->id_limit = impl->model->id_limit();
  std::size_t token_count = static_cast<std::size_t>(impl->model->id_limit()) + impl->added.all().size();
  for (const AddedToken& token : impl->added.all()) {
    if (token.id >= token_id_limit(token_count))
      throw TokenizerError(source + ": added token '" + token.content +
                           "': " + sparse_id_message(token.id, token_count));
    impl->id_limit = std::max(impl->id_limit, token.id + 1);
  }
  for (const AddedToken& token : impl->added.all()) {
    if (token.normalized && impl->normalizer) {
      spdlog::warn("tokenizer {}: added token '{}' is marked normalized; it is matched in the raw text", source,
                   token.content);
    }
  }

  if (!tokenizer_config_path.empty()) {
    const std::string& path = tokenizer_config_path;
    json config = read_json_file(path);
    if (!config.is_object()) throw TokenizerError(path + ": top level is not a JSON object");
    auto resolve = [&](const char* field) -> std::optional<TokenId> {
      auto text = config_token_text(config, field, path);
      if (!text) return std::nullopt;
      if (auto id = impl->added.id_of(*text)) return id;
      if (auto id = impl->model->token_to_id(*text)) return id;
      throw TokenizerError(path + ": " + field + " '" + *text + "' is not a token of " + source);
    };
    impl->bos = resolve("bos_token");
    impl->eos = resolve("eos_token");
    if (config.contains("clean_up_tokenization_spaces")) {
      if (!config["clean_up_tokenization_spaces"].is_boolean()) {
        throw TokenizerError(path + ": 'clean_up_tokenization_spaces' is not a boolean");
      }
      impl->clean_up_default = config["clean_up_tokenization_spaces"].get<bool>();
    }
    if (config.contains("legacy") && config["legacy"].is_boolean() && !config["legacy"].get<bool>()) {
      impl->normalizer_after_start = normalizer_without_prepend(root.value("normalizer", json()), source);
    }
    std::string tokenizer_class = optional_field(config, "tokenizer_class", std::string(), path);
    if (config_controls_special_tokens(tokenizer_class)) {
      auto flag = [&](const char* field, bool fallback) {
        if (!config.contains(field) || config[field].is_null()) return fallback;
        if (!config[field].is_boolean()) throw TokenizerError(path + ": '" + field + "' is not a boolean");
        return config[field].get<bool>();
      };
      bool add_bos = flag("add_bos_token", true);
      bool add_eos = flag("add_eos_token", false);
      if (add_bos && !impl->bos) throw TokenizerError(path + ": add_bos_token is true but there is no bos_token");
      if (add_eos && !impl->eos) throw TokenizerError(path + ": add_eos_token is true but there is no eos_token");
      impl->special_template = SpecialTokenTemplate{};
      if (add_bos) impl->special_template.prefix.push_back(*impl->bos);
      if (add_eos) impl->special_template.suffix.push_back(*impl->eos);
    }
  }
  for (const auto* ids : {&impl->special_template.prefix, &impl->special_template.suffix}) {
    for (TokenId id : *ids) impl->check_id(id);
  }

  spdlog::info("tokenizer {}: {}, {} added tokens, ids below {}", source, impl->model->describe(),
               impl->added.all().size(), impl->id_limit);
  return Tokenizer(std::move(impl));
} catch (const nlohmann::json::exception& error) {
  // A field of an unexpected type that no check above names: still the file's error, never a crash.
  throw TokenizerError(tokenizer_json_path +
                       " (or its tokenizer_config.json): unexpected JSON content: " + error.what());
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  XXH3_state_t* state = XXH3_createState();
  if (state == nullptr) throw std::bad_alloc();
  XXH3_64bits_reset(state);
  for (TokenId id = 0; id < impl_->id_limit; ++id) {
    const std::string* token = impl_->token_string(id);
    // An id without a token and an empty token differ; so do special and ordinary tokens.
    const char mark = token == nullptr ? 'x' : impl_->is_special(id) ? 's' : 'n';
    const std::uint64_t length = token ? token->size() : 0;
    XXH3_64bits_update(state, &mark, 1);
    XXH3_64bits_update(state, &length, sizeof length);
    if (token) XXH3_64bits_update(state, token->data(), token->size());
  }
  impl_->vocabulary_fingerprint = XXH3_64bits_digest(state);
  XXH3_freeState(state);
}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

// ---------------------------------------------------------------- encoding

void Tokenizer::Impl::encode_segment(std::string_view segment, bool at_text_start, std::vector<TokenId>& out) const {
  std::string normalized(segment);
  const auto& segment_normalizer = !at_text_start && normalizer_after_start ? normalizer_after_start : normalizer;
  if (segment_normalizer) segment_normalizer->normalize(normalized);
  if (normalized.empty()) return;
  std::vector<std::string> pieces;
  pieces.push_back(std::move(normalized));
  if (pre_tokenizer) pre_tokenizer->pre_tokenize(pieces, at_text_start);
  for (const std::string& piece : pieces) model->tokenize(piece, out);
}

std::vector<TokenId> Tokenizer::Impl::encode(std::string_view text,
                                             std::vector<std::pair<std::size_t, std::size_t>> plain_ranges,
                                             bool parse_special, bool add_special_tokens,
                                             const std::vector<Tokenizer::KnownIds>& known) const {
  std::vector<std::pair<std::size_t, std::size_t>> known_ranges;
  for (const Tokenizer::KnownIds& span : known) {
    if (span.begin >= span.end || span.end > text.size() ||
        (!known_ranges.empty() && span.begin < known_ranges.back().second))
      throw TokenizerError("known ids for bytes [" + std::to_string(span.begin) + ", " + std::to_string(span.end) +
                           ") are not a sorted, disjoint, non-empty range of the text of " +
                           std::to_string(text.size()) + " bytes");
    for (TokenId id : span.ids) check_id(id);
    known_ranges.emplace_back(span.begin, span.end);
  }
  // No added token is looked for inside a known stretch either.
  plain_ranges.insert(plain_ranges.end(), known_ranges.begin(), known_ranges.end());
  std::sort(plain_ranges.begin(), plain_ranges.end());
  std::vector<std::pair<std::size_t, std::size_t>> merged;
  for (auto [begin, end] : plain_ranges) {
    if (begin > end || end > text.size()) {
      throw TokenizerError("plain range [" + std::to_string(begin) + ", " + std::to_string(end) +
                           ") does not lie inside the text of " + std::to_string(text.size()) + " bytes");
    }
    if (begin == end) continue;
    if (!merged.empty() && begin <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, end);
    } else {
      merged.emplace_back(begin, end);
    }
  }

  // Invalid UTF-8 becomes U+FFFD. Each stretch between range boundaries is repaired on its own
  // so that the ranges can be carried over to the repaired text.
  std::string repaired;
  if (!utf8::is_valid(text)) {
    std::vector<std::size_t> cuts{0};
    for (const auto* ranges : {&merged, &known_ranges})
      for (auto [begin, end] : *ranges) {
        cuts.push_back(begin);
        cuts.push_back(end);
      }
    cuts.push_back(text.size());
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    std::vector<std::size_t> new_cuts;
    for (std::size_t k = 0; k + 1 < cuts.size(); ++k) {
      new_cuts.push_back(repaired.size());
      repaired += utf8::replace_invalid(text.substr(cuts[k], cuts[k + 1] - cuts[k]));
    }
    new_cuts.push_back(repaired.size());
    auto moved = [&](std::size_t offset) {
      return new_cuts[static_cast<std::size_t>(std::lower_bound(cuts.begin(), cuts.end(), offset) - cuts.begin())];
    };
    for (auto* ranges : {&merged, &known_ranges})
      for (auto& [begin, end] : *ranges) begin = moved(begin), end = moved(end);
    text = repaired;
  }

  // Added tokens, searched only outside the plain ranges.
  std::vector<AddedTokenMatch> matches;
  std::size_t region_begin = 0;
  for (auto [begin, end] : merged) {
    added.find(text, region_begin, begin, parse_special, matches);
    region_begin = end;
  }
  added.find(text, region_begin, text.size(), parse_special, matches);

  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) ids.insert(ids.end(), special_template.prefix.begin(), special_template.prefix.end());
  std::size_t copied = 0;
  std::size_t next_known = 0;
  // The known stretches before `until`, each after the text that precedes it.
  auto emit_known_before = [&](std::size_t until) {
    for (; next_known < known_ranges.size() && known_ranges[next_known].first < until; ++next_known) {
      const auto [begin, end] = known_ranges[next_known];
      if (begin > copied) encode_segment(text.substr(copied, begin - copied), copied == 0, ids);
      ids.insert(ids.end(), known[next_known].ids.begin(), known[next_known].ids.end());
      copied = end;
    }
  };
  for (const AddedTokenMatch& match : matches) {
    emit_known_before(match.begin);
    if (match.begin > copied) encode_segment(text.substr(copied, match.begin - copied), copied == 0, ids);
    ids.push_back(match.id);
    copied = match.end;
  }
  emit_known_before(text.size());
  if (copied < text.size()) encode_segment(text.substr(copied), copied == 0, ids);
  if (add_special_tokens) ids.insert(ids.end(), special_template.suffix.begin(), special_template.suffix.end());
  return ids;
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special_tokens, bool parse_special) const {
  return impl_->encode(text, {}, parse_special, add_special_tokens);
}

std::vector<TokenId> Tokenizer::encode_chat(std::string_view text,
                                            const std::vector<std::pair<size_t, size_t>>& plain_ranges,
                                            bool add_special_tokens) const {
  return impl_->encode(text, plain_ranges, true, add_special_tokens);
}

std::vector<TokenId> Tokenizer::encode_chat(std::string_view text,
                                            const std::vector<std::pair<size_t, size_t>>& plain_ranges,
                                            bool add_special_tokens, const std::vector<KnownIds>& known) const {
  return impl_->encode(text, plain_ranges, true, add_special_tokens, known);
}

std::vector<std::pair<size_t, size_t>> Tokenizer::added_token_ranges(std::string_view text) const {
  std::vector<AddedTokenMatch> matches;
  impl_->added.find(text, 0, text.size(), /*include_special=*/true, matches);
  std::vector<std::pair<size_t, size_t>> ranges;
  ranges.reserve(matches.size());
  for (const AddedTokenMatch& match : matches) ranges.emplace_back(match.begin, match.end);
  return ranges;
}

std::uint64_t Tokenizer::vocabulary_fingerprint() const { return impl_->vocabulary_fingerprint; }

// ---------------------------------------------------------------- decoding

const std::string* Tokenizer::Impl::token_string(TokenId id) const {
  if (const AddedToken* token = added.by_id(id)) return &token->content;
  return model->id_to_token(id);
}

bool Tokenizer::Impl::is_special(TokenId id) const {
  const AddedToken* token = added.by_id(id);
  return token && token->special;
}

void Tokenizer::Impl::check_id(TokenId id) const {
  if (!token_string(id)) {
    throw TokenizerError("token id " + std::to_string(id) + " is not in the vocabulary of " + source + " (ids below " +
                         std::to_string(id_limit) + ")");
  }
}

std::string Tokenizer::Impl::decode_bytes(const TokenId* ids, std::size_t count, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    const std::string* token = token_string(ids[i]);
    if (!token) check_id(ids[i]);
    if (skip_special_tokens && is_special(ids[i])) continue;
    tokens.push_back(*token);
  }
  std::string out;
  if (decoder) {
    decoder->decode_chain(tokens);
    for (const std::string& token : tokens) out += token;
  } else {
    // No decoder: tokenizers joins the token strings with spaces.
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      if (i) out += ' ';
      out += tokens[i];
    }
  }
  return out;
}

std::string Tokenizer::Impl::decode(const TokenId* ids, std::size_t count, bool skip_special_tokens,
                                    bool clean_up) const {
  std::string text = utf8::replace_invalid(decode_bytes(ids, count, skip_special_tokens));
  return clean_up ? clean_up_tokenization(text) : text;
}

std::string Tokenizer::decode(const std::vector<TokenId>& ids, bool skip_special_tokens,
                              std::optional<bool> clean_up_tokenization_spaces) const {
  return impl_->decode(ids.data(), ids.size(), skip_special_tokens,
                       clean_up_tokenization_spaces.value_or(impl_->clean_up_default));
}

// ---------------------------------------------------------------- vocabulary

int Tokenizer::vocab_size() const { return impl_->id_limit; }

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  if (auto id = impl_->added.id_of(token)) return id;
  return impl_->model->token_to_id(token);
}

std::vector<std::string> Tokenizer::token_bytes() const {
  // Decoders treat a text's first token apart (Strip and Metaspace drop its leading space): each id is
  // decoded after an anchor token, whose own bytes are cut off.
  std::optional<TokenId> anchor;
  std::string anchor_bytes;
  const std::vector<TokenId> letter = encode("a", false);
  if (letter.size() == 1) {
    anchor = letter[0];
    anchor_bytes = impl_->decode_bytes(&letter[0], 1, false);
  }
  std::vector<std::string> bytes(static_cast<std::size_t>(impl_->id_limit));
  for (TokenId id = 0; id < impl_->id_limit; ++id) {
    if (!impl_->token_string(id)) continue;
    if (anchor && !anchor_bytes.empty()) {
      const TokenId pair[2] = {*anchor, id};
      std::string text = impl_->decode_bytes(pair, 2, false);
      if (text.compare(0, anchor_bytes.size(), anchor_bytes) == 0) {
        bytes[static_cast<std::size_t>(id)] = text.substr(anchor_bytes.size());
        continue;
      }
    }
    bytes[static_cast<std::size_t>(id)] = impl_->decode_bytes(&id, 1, false);
  }
  return bytes;
}

std::string Tokenizer::id_to_token(TokenId id) const {
  const std::string* token = impl_->token_string(id);
  return token ? *token : std::string();
}

bool Tokenizer::is_special(TokenId id) const { return impl_->is_special(id); }
std::optional<TokenId> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<TokenId> Tokenizer::eos_id() const { return impl_->eos; }

std::optional<TokenId> Tokenizer::eot_id() const { return impl_->eot; }
std::optional<TokenId> Tokenizer::pad_id() const { return impl_->pad; }
std::optional<TokenId> Tokenizer::unk_id() const { return impl_->unk; }
const std::optional<std::string>& Tokenizer::chat_template() const { return impl_->chat_template; }

bool Tokenizer::add_eos_token() const {
  const auto& suffix = impl_->special_template.suffix;
  return impl_->eos && !suffix.empty() && suffix.back() == *impl_->eos;
}

bool Tokenizer::add_bos_token() const {
  const auto& prefix = impl_->special_template.prefix;
  return impl_->bos && !prefix.empty() && prefix.front() == *impl_->bos;
}

}  // namespace kvchat
