#include "engine/text/jinja/jinja_substring.h"

namespace kvchat::jinja {
namespace {

// Needles up to this length use std::string_view's search: at most this many byte comparisons per
// text position.
constexpr std::size_t kShortNeedle = 64;

// failure[i]: the length of the longest proper border (prefix that is also a suffix) of the first
// i + 1 bytes of the needle, reading it through `at` (forward or reversed).
template <typename At>
std::vector<std::size_t> failure_table(std::size_t length, At at) {
  std::vector<std::size_t> failure(length, 0);
  std::size_t border = 0;
  for (std::size_t i = 1; i < length; ++i) {
    while (border > 0 && at(i) != at(border)) border = failure[border - 1];
    if (at(i) == at(border)) ++border;
    failure[i] = border;
  }
  return failure;
}

// The first i in [0, count) where the needle read through `needle_at` ends a match in the text read
// through `text_at`; returns the index of the match's last byte, or npos.
template <typename TextAt, typename NeedleAt>
std::size_t kmp_scan(std::size_t count, TextAt text_at, std::size_t needle_length, NeedleAt needle_at,
                     const std::vector<std::size_t>& failure) {
  std::size_t matched = 0;
  for (std::size_t i = 0; i < count; ++i) {
    while (matched > 0 && text_at(i) != needle_at(matched)) matched = failure[matched - 1];
    if (text_at(i) == needle_at(matched)) ++matched;
    if (matched == needle_length) return i;
  }
  return std::string_view::npos;
}

}  // namespace

SubstringSearch::SubstringSearch(std::string_view needle) : needle_(needle) {
  if (needle_.size() <= kShortNeedle) return;
  const std::size_t n = needle_.size();
  forward_ = failure_table(n, [&](std::size_t i) { return needle_[i]; });
  backward_ = failure_table(n, [&](std::size_t i) { return needle_[n - 1 - i]; });
}

std::size_t SubstringSearch::find(std::string_view text, std::size_t from) const {
  if (forward_.empty()) return text.find(needle_, from);
  if (from >= text.size()) return std::string_view::npos;
  std::string_view rest = text.substr(from);
  std::size_t last = kmp_scan(
      rest.size(), [&](std::size_t i) { return rest[i]; }, needle_.size(), [&](std::size_t i) { return needle_[i]; },
      forward_);
  return last == std::string_view::npos ? last : from + last + 1 - needle_.size();
}

std::size_t SubstringSearch::rfind(std::string_view text, std::size_t end) const {
  if (end > text.size()) end = text.size();
  if (end < needle_.size()) return std::string_view::npos;
  if (backward_.empty()) return text.rfind(needle_, end - needle_.size());
  // Scan the text backwards from `end` for the reversed needle.
  const std::size_t n = needle_.size();
  std::size_t last = kmp_scan(
      end, [&](std::size_t i) { return text[end - 1 - i]; }, n, [&](std::size_t i) { return needle_[n - 1 - i]; },
      backward_);
  return last == std::string_view::npos ? last : end - 1 - last;
}

}  // namespace kvchat::jinja
