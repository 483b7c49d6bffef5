// StreamingDecoder (declared in tokenizer.h): detokenizes a reply token by token without breaking a character.
#include <spdlog/spdlog.h>

#include "engine/text/tokenizer.h"
#include "engine/text/tokenizer/tokenizer_impl.h"
#include "engine/text/utf8.h"

namespace kvchat {

namespace {

constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";

// A text that ends in U+FFFD is held back for a few tokens, because a byte-fallback character may
// still be completing; a run of genuinely invalid bytes must not grow the window without bound.
constexpr std::size_t kMaxHeldTokens = 32;

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Largest cut of `text` where clean_up_tokenization can be applied to both sides separately:
// every rule starts with a space and spans at most a few bytes, so a cut with no space among the
// four bytes before it is never inside a match.
std::size_t clean_up_safe_cut(const std::string& text) {
  std::size_t cut = text.size();
  while (cut > 0) {
    std::size_t window_begin = cut >= 4 ? cut - 4 : 0;
    std::size_t space = text.rfind(' ', cut - 1);
    if (space == std::string::npos || space < window_begin) return cut;
    cut = space;
  }
  return 0;
}

}  // namespace

StreamingDecoder::StreamingDecoder(const Tokenizer& tokenizer, bool skip_special_tokens,
                                   std::optional<bool> clean_up_tokenization_spaces)
    : tokenizer_(&tokenizer),
      skip_special_(skip_special_tokens),
      clean_up_(clean_up_tokenization_spaces.value_or(tokenizer.impl_->clean_up_default)) {}

std::string StreamingDecoder::push(TokenId id) {
  const Tokenizer::Impl& impl = *tokenizer_->impl_;
  impl.check_id(id);
  if (skip_special_ && impl.is_special(id)) return "";
  ids_.push_back(id);
  return clean(advance(false), false);
}

std::string StreamingDecoder::finish() { return clean(advance(true), true); }

void StreamingDecoder::reset() {
  ids_.clear();
  read_offset_ = 0;
  pending_clean_up_.clear();
}

std::string StreamingDecoder::advance(bool flush) {
  const Tokenizer::Impl& impl = *tokenizer_->impl_;
  if (ids_.size() == read_offset_) return "";
  // Both decodes start at the same id, so anything the decoder does to the start of its input
  // (Strip, Metaspace) affects them alike and cancels out in the difference.
  std::string prefix_bytes = impl.decode_bytes(ids_.data(), read_offset_, false);
  std::string full_bytes = impl.decode_bytes(ids_.data(), ids_.size(), false);
  if (!flush && utf8::incomplete_suffix_length(full_bytes) > 0) return "";
  std::string prefix = utf8::replace_invalid(prefix_bytes);
  std::string full = utf8::replace_invalid(full_bytes);
  if (!flush && ends_with(full, kReplacementCharacter) && ids_.size() - read_offset_ < kMaxHeldTokens) return "";
  if (full.size() < prefix.size() || full.compare(0, prefix.size(), prefix) != 0) {
    // Cannot happen with the supported decoders; keep the ids and let a later call catch up.
    spdlog::warn("streaming decoder: window text does not extend its prefix; holding {} ids", ids_.size());
    return "";
  }
  std::string out = full.substr(prefix.size());
  if (out.empty() && !flush) return "";
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(read_offset_));
  read_offset_ = ids_.size();
  return out;
}

std::string StreamingDecoder::clean(std::string text, bool flush) {
  if (!clean_up_) return text;
  pending_clean_up_ += text;
  std::size_t cut = flush ? pending_clean_up_.size() : clean_up_safe_cut(pending_clean_up_);
  std::string out = tokenization::clean_up_tokenization(std::string_view(pending_clean_up_).substr(0, cut));
  pending_clean_up_.erase(0, cut);
  return out;
}

}  // namespace kvchat
