#pragma once
// Internals of Tokenizer shared by tokenizer.cpp and streaming_decoder.cpp (not a public header).
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/text/tokenizer.h"
#include "engine/text/tokenizer/tokenizer_added_tokens.h"
#include "engine/text/tokenizer/tokenizer_decoder.h"
#include "engine/text/tokenizer/tokenizer_model.h"
#include "engine/text/tokenizer/tokenizer_normalizer.h"
#include "engine/text/tokenizer/tokenizer_post_processor.h"
#include "engine/text/tokenizer/tokenizer_pre_tokenizer.h"

namespace kvchat {

struct Tokenizer::Impl {
  std::string source;  // tokenizer.json path, for messages
  std::unique_ptr<tokenization::Model> model;
  tokenization::AddedTokens added;
  std::unique_ptr<tokenization::Normalizer> normalizer;
  // For a stretch that does not start the text, when it differs: a Llama tokenizer with "legacy": false prepends
  // its "▁" at the start of the text only, not again after each added token (transformers' rule).
  std::unique_ptr<tokenization::Normalizer> normalizer_after_start;
  std::unique_ptr<tokenization::PreTokenizer> pre_tokenizer;
  std::unique_ptr<tokenization::Decoder> decoder;
  tokenization::SpecialTokenTemplate special_template;
  std::optional<TokenId> bos;
  std::optional<TokenId> eos;
  std::optional<TokenId> eot;  // GGUF files only (tokenizer.json has no such notion)
  std::optional<TokenId> pad;
  std::optional<TokenId> unk;
  std::optional<std::string> chat_template;  // GGUF tokenizer.chat_template
  bool clean_up_default = false;
  TokenId id_limit = 0;
  std::uint64_t vocabulary_fingerprint = 0;  // computed once the vocabulary is complete

  // Added tokens are recognised everywhere except inside `plain_ranges` (sorted, disjoint byte
  // ranges of `text`); with parse_special false only non-special added tokens are.
  // `known` stretches (sorted, disjoint) are emitted as their ids, like added tokens.
  std::vector<TokenId> encode(std::string_view text, std::vector<std::pair<std::size_t, std::size_t>> plain_ranges,
                              bool parse_special, bool add_special_tokens,
                              const std::vector<Tokenizer::KnownIds>& known = {}) const;
  // Normalizer + pre-tokenizer + model over one stretch of text between added tokens.
  void encode_segment(std::string_view segment, bool at_text_start, std::vector<TokenId>& out) const;

  // The decoder's output as bytes, before invalid UTF-8 is repaired. Throws for unknown ids.
  std::string decode_bytes(const TokenId* ids, std::size_t count, bool skip_special_tokens) const;
  std::string decode(const TokenId* ids, std::size_t count, bool skip_special_tokens, bool clean_up) const;

  const std::string* token_string(TokenId id) const;
  bool is_special(TokenId id) const;
  void check_id(TokenId id) const;  // TokenizerError when the id has no token
};

}  // namespace kvchat
