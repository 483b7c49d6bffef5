#pragma once
// Hugging Face tokenizer.json tokenizers (no Qt, no torch).
// Two BPE families: byte-level (Llama 3 / GPT-2) and SentencePiece-style with byte fallback
// (Llama 2 / Mistral / TinyLlama / stories260K). Anything a file uses that is not implemented
// is a TokenizerError naming it.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/text/tokenizer/tokenizer_error.h"  // TokenizerError
#include "engine/types.h"

namespace kvchat {

class GgufFile;

class Tokenizer {
 public:
  // Reads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json.
  static Tokenizer from_directory(const std::string& directory);
  // tokenizer_config_path may be empty.
  static Tokenizer from_files(const std::string& tokenizer_json_path, const std::string& tokenizer_config_path);
  // From a GGUF file's tokenizer.ggml.* metadata, tokenizing exactly as llama.cpp does:
  // tokenizer.ggml.model "gpt2" (byte-level BPE; tokenizer.ggml.pre llama-bpe/llama3, qwen2,
  // gpt-2, smollm, tekken, default) or "llama" (SentencePiece pieces merged by score, byte fallback).
  // Control/unknown tokens are special; user-defined tokens are matched in any text. Throws
  // TokenizerError naming the key for missing, inconsistent or unsupported metadata.
  static Tokenizer from_gguf(const GgufFile& file);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // add_special_tokens: apply the post-processor (BOS/EOS as the file and add_bos_token say).
  // parse_special: added/special tokens written in the text become their ids. User text must be
  // encoded with parse_special = false so it can never turn into control tokens.
  // Invalid UTF-8 in `text` is replaced by U+FFFD before encoding (never a crash).
  std::vector<TokenId> encode(std::string_view text, bool add_special_tokens = true, bool parse_special = false) const;

  // The chat path: like encode(text, add_special_tokens, parse_special = true), except that special
  // tokens are NOT recognised inside the byte ranges [first, second) of `plain_ranges` (text a user
  // typed, located by ChatFormatter). Outside them the ids equal HF's encode of the whole text.
  std::vector<TokenId> encode_chat(std::string_view text, const std::vector<std::pair<size_t, size_t>>& plain_ranges,
                                   bool add_special_tokens = false) const;

  // A stretch of text whose ids are known exactly (a reply the model wrote: re-encoding its text would
  // not give back the ids it sampled).
  struct KnownIds {
    std::size_t begin = 0, end = 0;  // bytes [begin, end) of the text
    std::vector<TokenId> ids;
  };
  // encode_chat, with each `known` stretch (sorted, disjoint, outside `plain_ranges`) given as its ids:
  // the text around it is split there as at an added token, and no added token is recognised inside it.
  std::vector<TokenId> encode_chat(std::string_view text, const std::vector<std::pair<size_t, size_t>>& plain_ranges,
                                   bool add_special_tokens, const std::vector<KnownIds>& known) const;

  // The byte ranges of `text` that encode(text, false, parse_special = true) would turn into added
  // tokens (special or not), left to right: what a chat prompt must keep apart from typed text.
  std::vector<std::pair<size_t, size_t>> added_token_ranges(std::string_view text) const;

  // A hash of the vocabulary (every id's token string and whether it is special): ids kept with a
  // text are only reused under a tokenizer with the same fingerprint.
  std::uint64_t vocabulary_fingerprint() const;

  // clean_up_tokenization_spaces: nullopt = the tokenizer_config.json default.
  std::string decode(const std::vector<TokenId>& ids, bool skip_special_tokens = false,
                     std::optional<bool> clean_up_tokenization_spaces = std::nullopt) const;

  int vocab_size() const;  // including added tokens
  std::optional<TokenId> token_to_id(std::string_view token) const;
  // What each id adds to a text in its middle, as bytes (a byte-fallback piece is its one byte, a byte-level
  // token may hold part of a character); "" for ids without a token. Special tokens give their text.
  std::vector<std::string> token_bytes() const;
  std::string id_to_token(TokenId id) const;  // vocabulary string ("Ġhello", "<0x0A>"); "" if unknown
  bool is_special(TokenId id) const;
  std::optional<TokenId> bos_id() const;  // from tokenizer_config.json bos_token, else none
  std::optional<TokenId> eos_id() const;  // from tokenizer_config.json eos_token, else none
  bool add_bos_token() const;             // whether encode(add_special_tokens=true) prepends BOS
  bool add_eos_token() const;             // whether encode(add_special_tokens=true) appends EOS
  // GGUF files only (none from tokenizer.json): end of turn (tokenizer.ggml.eot_token_id, else found
  // by its text as llama.cpp does: <|eot_id|>, <|im_end|>, ...), padding, unknown.
  std::optional<TokenId> eot_id() const;
  std::optional<TokenId> pad_id() const;
  std::optional<TokenId> unk_id() const;
  // A GGUF file's tokenizer.chat_template (for ChatFormatter::from_template); none from tokenizer.json,
  // whose template lives in tokenizer_config.json.
  const std::optional<std::string>& chat_template() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend class StreamingDecoder;
};

// Token-by-token detokenization for streaming a reply: never emits a broken UTF-8 character
// (incomplete bytes are held back), and the concatenation of everything returned by push() and
// finish() equals tokenizer.decode(all ids pushed) with the same skip_special_tokens and
// clean_up_tokenization_spaces settings. Leading-space stripping (the Strip decoder) applies once,
// at the start of the stream. Each push decodes only a short window of recent ids (the "prefix
// offset / read offset" technique), so the cost per token does not grow with the reply.
class StreamingDecoder {
 public:
  // clean_up_tokenization_spaces: nullopt = the tokenizer_config.json default, as in decode().
  explicit StreamingDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = true,
                            std::optional<bool> clean_up_tokenization_spaces = std::nullopt);
  std::string push(TokenId id);  // text that became complete with this token (may be "")
  std::string finish();          // whatever is still held back (invalid bytes become U+FFFD)
  void reset();

 private:
  std::string advance(bool flush);
  std::string clean(std::string text, bool flush);

  const Tokenizer* tokenizer_;
  bool skip_special_;
  bool clean_up_ = false;
  std::vector<TokenId> ids_;  // the window: ids_[0, read_offset_) were already emitted
  std::size_t read_offset_ = 0;
  std::string pending_clean_up_;  // emitted text held back until the clean-up rules can decide
};

}  // namespace kvchat
