#pragma once
// Substring search in time linear in the text, whatever the needle. std::string_view::find compares
// the needle at every position where its first byte occurs, so 'a' * 2^23 searched for
// 'a' * 2^22 ~ 'b' takes ~10^13 steps: one `in` test of a crafted template would hang a render.
// Short needles (where that worst case is a small constant times the text) keep the library's fast
// search; longer ones use Knuth–Morris–Pratt, built once per needle and reused for every occurrence
// (split, replace and count walk the text once).
#include <cstddef>
#include <string_view>
#include <vector>

namespace kvchat::jinja {

class SubstringSearch {
 public:
  explicit SubstringSearch(std::string_view needle);

  // The first occurrence starting at or after `from`; npos if none. The needle must not be empty.
  std::size_t find(std::string_view text, std::size_t from = 0) const;
  // The last occurrence ending at or before `end`; npos if none.
  std::size_t rfind(std::string_view text, std::size_t end) const;

 private:
  std::string_view needle_;
  // KMP failure tables of the needle and of the reversed needle; empty for short needles.
  std::vector<std::size_t> forward_;
  std::vector<std::size_t> backward_;
};

}  // namespace kvchat::jinja
