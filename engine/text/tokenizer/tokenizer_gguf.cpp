// Tokenizer::from_gguf (declared in engine/text/tokenizer.h): a tokenizer built from a GGUF file's
// tokenizer.ggml.* metadata that tokenizes as llama.cpp does. The GGUF arrays are turned into the
// same pipeline objects a tokenizer.json gives (model, added tokens, normalizer, pre-tokenizer,
// decoder), so only the score-driven SentencePiece model is specific to this path.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "engine/gguf/gguf_file.h"
#include "engine/text/tokenizer.h"
#include "engine/text/tokenizer/tokenizer_bpe.h"
#include "engine/text/tokenizer/tokenizer_impl.h"
#include "engine/text/tokenizer/tokenizer_spm.h"

namespace kvchat {

using nlohmann::json;
using namespace tokenization;

namespace {

constexpr const char* kModelKey = "tokenizer.ggml.model";
constexpr const char* kPreKey = "tokenizer.ggml.pre";
constexpr const char* kTokensKey = "tokenizer.ggml.tokens";
constexpr const char* kTypesKey = "tokenizer.ggml.token_type";
constexpr const char* kScoresKey = "tokenizer.ggml.scores";
constexpr const char* kMergesKey = "tokenizer.ggml.merges";
constexpr const char* kAddSpacePrefixKey = "tokenizer.ggml.add_space_prefix";
constexpr const char* kAddBosKey = "tokenizer.ggml.add_bos_token";
constexpr const char* kAddEosKey = "tokenizer.ggml.add_eos_token";
constexpr const char* kChatTemplateKey = "tokenizer.chat_template";

// tokenizer.ggml.token_type values, as llama.cpp's converters write them.
enum TokenType : std::int64_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6
};

// The pre-tokenizer regexes llama.cpp uses for each tokenizer.ggml.pre value. The contractions are
// spelled '[sS] rather than (?i:'s) as llama.cpp spells them: case-insensitive matching would also
// accept characters that fold to s or k (U+017F, U+212A).
constexpr const char* kLlama3Regex =
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr const char* kQwen2Regex =
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
// Mistral's Tekken (Mistral Nemo, Ministral), as its tokenizer.json writes it: a word is a run of upper-case letters
// then lower-case ones, or the other way round.
constexpr const char* kTekkenRegex =
    R"re([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr const char* kGpt2Regex = R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))re";

struct PreTokenizerKind {
  std::vector<std::string> names;    // tokenizer.ggml.pre values llama.cpp maps to this kind
  std::vector<const char*> regexes;  // applied in turn, each splitting the pieces of the one before
  bool ignore_merges;                // a pre-token that is a whole token is not merged
  bool add_bos;                      // llama.cpp's default when add_bos_token is absent
  bool clean_up_spaces;              // llama.cpp's clean_spaces for decoding
};

const std::vector<PreTokenizerKind>& pre_tokenizer_kinds() {
  static const std::vector<PreTokenizerKind> kinds = {
      {{"default"},
       {R"re([\p{P}\$\+<=>\^~\|]+)re", kGpt2Regex, R"re(\p{N}+)re", "[0-9][0-9][0-9]"},
       false,
       false,
       true},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3"}, {kLlama3Regex}, true, true, true},
      {{"gpt-2", "phi-2"}, {kGpt2Regex}, false, false, true},
      {{"qwen2", "deepseek-r1-qwen"}, {kQwen2Regex}, false, false, false},
      {{"smollm"}, {R"re(\p{N})re", kGpt2Regex}, false, false, false},
      {{"tekken"}, {kTekkenRegex}, true, true, false},
  };
  return kinds;
}

std::string known_pre_names() {
  std::string names;
  for (const auto& kind : pre_tokenizer_kinds())
    for (const std::string& name : kind.names) names += (names.empty() ? "" : ", ") + name;
  return names;
}

// llama.cpp finds the end-of-turn token by its text when the file does not name it; the first of
// these that the vocabulary has wins.
const char* const kEotTexts[] = {"<|eot_id|>",    "<|im_end|>",      "<|end|>", "<end_of_turn>",
                                 "<|endoftext|>", "<|end_of_text|>", "<EOT>",   "_<EOT>"};

struct GgufVocab {
  std::string path;
  std::string model;  // tokenizer.ggml.model
  std::vector<std::string> tokens;
  std::vector<std::int64_t> types;  // kNormal where the file has no token_type array
  std::vector<float> scores;        // empty when the file has none
};

[[noreturn]] void fail(const std::string& path, const std::string& what) { throw TokenizerError(path + ": " + what); }

GgufVocab read_vocab(const GgufFile& file) {
  GgufVocab vocab;
  vocab.path = file.path();
  if (!file.has_metadata(kModelKey))
    fail(vocab.path, std::string("missing ") + kModelKey + " (no tokenizer in this file)");
  vocab.model = std::string(file.get_string(kModelKey));
  if (!file.has_metadata(kTokensKey)) fail(vocab.path, std::string("missing ") + kTokensKey);
  std::vector<std::string_view> tokens = file.get_string_array(kTokensKey);
  if (tokens.empty()) fail(vocab.path, std::string(kTokensKey) + " is empty");
  vocab.tokens.reserve(tokens.size());
  for (std::size_t id = 0; id < tokens.size(); ++id) {
    // llama.cpp renames an empty token rather than refusing the file; an empty key cannot be looked up.
    vocab.tokens.emplace_back(tokens[id].empty() ? "[EMPTY_" + std::to_string(id) + "]" : std::string(tokens[id]));
  }
  const std::size_t n = vocab.tokens.size();
  auto check_length = [&](const char* key, std::size_t length) {
    if (length != n) {
      fail(vocab.path, std::string(key) + " has " + std::to_string(length) + " entries but " + kTokensKey + " has " +
                           std::to_string(n));
    }
  };
  if (file.has_metadata(kTypesKey)) {
    vocab.types = file.get_int_array(kTypesKey);
    check_length(kTypesKey, vocab.types.size());
    for (std::size_t id = 0; id < n; ++id) {
      if (vocab.types[id] < kUndefined || vocab.types[id] > kByte) {
        fail(vocab.path, std::string(kTypesKey) + "[" + std::to_string(id) + "] = " + std::to_string(vocab.types[id]) +
                             " is not a token type (0 to 6)");
      }
    }
  } else {
    vocab.types.assign(n, kNormal);
  }
  if (file.has_metadata(kScoresKey)) {
    vocab.scores = file.get_float_array(kScoresKey);
    check_length(kScoresKey, vocab.scores.size());
  }
  return vocab;
}

// A token id stored under `key`, checked against the vocabulary; nullopt when the key is absent.
std::optional<TokenId> read_id(const GgufFile& file, const std::string& key, std::size_t n_tokens) {
  if (!file.has_metadata(key)) return std::nullopt;
  const std::int64_t id = file.get_int64(key);
  if (id < 0 || static_cast<std::uint64_t>(id) >= n_tokens) {
    fail(file.path(),
         key + " = " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(n_tokens) + " tokens");
  }
  return static_cast<TokenId>(id);
}

bool read_flag(const GgufFile& file, const char* key, bool fallback) {
  return file.has_metadata(key) ? file.get_bool(key) : fallback;
}

const PreTokenizerKind& find_pre_tokenizer(const GgufFile& file) {
  // As llama.cpp: a byte-level vocabulary without the key gets the "default" regexes.
  std::string pre = file.has_metadata(kPreKey) ? std::string(file.get_string(kPreKey)) : "default";
  for (const auto& kind : pre_tokenizer_kinds())
    for (const std::string& name : kind.names)
      if (name == pre) return kind;
  fail(file.path(), std::string("unsupported ") + kPreKey + " '" + pre + "' (supported: " + known_pre_names() + ")");
}

// gpt2: byte-level BPE with ranked merges "left right", exactly a byte-level tokenizer.json.
void build_byte_level(const GgufFile& file, GgufVocab& vocab, Tokenizer::Impl& impl) {
  const PreTokenizerKind& kind = find_pre_tokenizer(file);
  if (!file.has_metadata(kMergesKey)) fail(vocab.path, std::string("missing ") + kMergesKey);
  const std::vector<std::string_view> merge_strings = file.get_string_array(kMergesKey);
  std::vector<std::pair<std::string_view, std::string_view>> merges;
  merges.reserve(merge_strings.size());
  for (std::size_t rank = 0; rank < merge_strings.size(); ++rank) {
    std::string_view merge = merge_strings[rank];
    // The first space after the first character separates the pair, as llama.cpp splits it.
    const std::size_t space = merge.size() > 1 ? merge.find(' ', 1) : std::string_view::npos;
    if (space == std::string_view::npos) {
      fail(vocab.path, std::string(kMergesKey) + "[" + std::to_string(rank) + "] '" + std::string(merge) +
                           "' is not two tokens separated by a space");
    }
    merges.emplace_back(merge.substr(0, space), merge.substr(space + 1));
  }
  BpeOptions options;
  options.ignore_merges = kind.ignore_merges;
  impl.model = std::make_unique<BpeModel>(std::move(vocab.tokens), merges, options, vocab.path, kMergesKey);

  json steps = json::array();
  for (const char* regex : kind.regexes) {
    steps.push_back({{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}});
  }
  steps.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}});
  impl.pre_tokenizer = make_pre_tokenizer({{"type", "Sequence"}, {"pretokenizers", steps}}, vocab.path);
  impl.decoder = make_decoder({{"type", "ByteLevel"}}, vocab.path);
  impl.clean_up_default = kind.clean_up_spaces;
  impl.special_template.prefix.assign(read_flag(file, kAddBosKey, kind.add_bos) ? 1 : 0, -1);
}

// llama: SentencePiece pieces merged by score. Every stretch of text between special tokens gets
// a leading space (llama.cpp's add_space_prefix) and its spaces become "▁".
void build_sentencepiece(const GgufFile& file, GgufVocab& vocab, std::optional<TokenId> unk, Tokenizer::Impl& impl) {
  if (vocab.scores.empty())
    fail(vocab.path, std::string("missing ") + kScoresKey + " (needed by a 'llama' vocabulary)");
  std::vector<bool> can_produce(vocab.tokens.size());
  for (std::size_t id = 0; id < vocab.tokens.size(); ++id) {
    can_produce[id] = vocab.types[id] != kControl && vocab.types[id] != kUnknown;
  }
  impl.model =
      std::make_unique<SpmModel>(std::move(vocab.tokens), std::move(vocab.scores), can_produce, unk, vocab.path);

  const std::string space_mark = "\xE2\x96\x81";  // ▁
  const bool add_space_prefix = read_flag(file, kAddSpacePrefixKey, true);
  json steps = json::array();
  if (add_space_prefix) steps.push_back({{"type", "Prepend"}, {"prepend", space_mark}});
  steps.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", space_mark}});
  impl.normalizer = make_normalizer({{"type", "Sequence"}, {"normalizers", steps}}, vocab.path);

  json decoders = json::array({{{"type", "Replace"}, {"pattern", {{"String", space_mark}}}, {"content", " "}},
                               {{"type", "ByteFallback"}},
                               {{"type", "Fuse"}}});
  if (add_space_prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  impl.decoder = make_decoder({{"type", "Sequence"}, {"decoders", decoders}}, vocab.path);
  impl.clean_up_default = false;
  impl.special_template.prefix.assign(read_flag(file, kAddBosKey, true) ? 1 : 0, -1);
}

// Control and unknown tokens are special (recognised in text only with parse_special); user-defined
// tokens are matched in any text before the model runs, as llama.cpp and tokenizer.json's
// non-special added tokens are.
// llama.cpp sets one attribute by the model's name: in a file whose general.name says Phi-3 ("phi-3" or "phi3", any
// case), white space after an added token belongs to it (RSTRIP), but for <unk>, <s> and <|endoftext|>.
bool strips_after_added_tokens(const GgufFile& file) {
  if (!file.has_metadata("general.name")) return false;
  std::string name(file.get_string("general.name"));
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  return name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos;
}

json added_tokens_of(const std::vector<std::int64_t>& types, const std::vector<std::string>& tokens,
                     std::optional<TokenId> eot, bool rstrip) {
  json added = json::array();
  for (std::size_t id = 0; id < types.size(); ++id) {
    const bool special = types[id] == kControl || types[id] == kUnknown || (eot && *eot == static_cast<TokenId>(id));
    if (!special && types[id] != kUserDefined) continue;
    const std::string& content = tokens[id];
    const bool strips = rstrip && content != "<unk>" && content != "<s>" && content != "<|endoftext|>";
    added.push_back(
        {{"id", id}, {"content", content}, {"special", special}, {"normalized", false}, {"rstrip", strips}});
  }
  return added;
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const GgufFile& file) {
  GgufVocab vocab = read_vocab(file);
  const std::size_t n = vocab.tokens.size();
  auto impl = std::make_unique<Impl>();
  impl->source = vocab.path;

  const bool sentencepiece = vocab.model == "llama";
  if (!sentencepiece && vocab.model != "gpt2") {
    fail(vocab.path, std::string("unsupported ") + kModelKey + " '" + vocab.model + "' (supported: gpt2, llama)");
  }
  // llama.cpp's defaults for a SentencePiece vocabulary that does not name these tokens.
  auto default_id = [&](TokenId id) {
    return sentencepiece && static_cast<std::size_t>(id) < n ? std::optional<TokenId>(id) : std::nullopt;
  };
  impl->bos = read_id(file, "tokenizer.ggml.bos_token_id", n);
  if (!impl->bos) impl->bos = default_id(1);
  impl->eos = read_id(file, "tokenizer.ggml.eos_token_id", n);
  if (!impl->eos) impl->eos = default_id(2);
  impl->unk = read_id(file, "tokenizer.ggml.unknown_token_id", n);
  if (!impl->unk) impl->unk = default_id(0);
  impl->pad = read_id(file, "tokenizer.ggml.padding_token_id", n);
  impl->eot = read_id(file, "tokenizer.ggml.eot_token_id", n);
  for (const char* text : kEotTexts) {
    if (impl->eot) break;
    for (std::size_t id = 0; id < n && !impl->eot; ++id)
      if (vocab.tokens[id] == text) impl->eot = static_cast<TokenId>(id);
  }
  impl->added =
      AddedTokens(added_tokens_of(vocab.types, vocab.tokens, impl->eot, strips_after_added_tokens(file)), vocab.path);

  if (sentencepiece) {
    build_sentencepiece(file, vocab, impl->unk, *impl);
  } else {
    build_byte_level(file, vocab, *impl);
  }
  impl->id_limit = impl->model->id_limit();

  // The builders leave a placeholder where BOS goes; now that the flag is known, check the id.
  if (!impl->special_template.prefix.empty()) {
    if (!impl->bos) fail(vocab.path, std::string(kAddBosKey) + " is true but there is no tokenizer.ggml.bos_token_id");
    impl->special_template.prefix.assign(1, *impl->bos);
  }
  if (read_flag(file, kAddEosKey, false)) {
    if (!impl->eos) fail(vocab.path, std::string(kAddEosKey) + " is true but there is no tokenizer.ggml.eos_token_id");
    impl->special_template.suffix.assign(1, *impl->eos);
  }
  if (file.has_metadata(kChatTemplateKey)) impl->chat_template = std::string(file.get_string(kChatTemplateKey));

  spdlog::info("tokenizer {}: GGUF {}, {} special/added tokens, {}", vocab.path, impl->model->describe(),
               impl->added.all().size(), impl->chat_template ? "with a chat template" : "no chat template");
  return Tokenizer(std::move(impl));
}

}  // namespace kvchat
