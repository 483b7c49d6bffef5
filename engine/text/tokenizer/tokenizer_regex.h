#pragma once
// PCRE2 (UTF + UCP, JIT when available) standing in for the Rust regex dialects that
// tokenizer.json patterns are written for (Oniguruma in `tokenizers`, fancy-regex in tiktoken).
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvchat::tokenization {

class Regex {
 public:
  // Throws TokenizerError naming the pattern and PCRE2's message when it does not compile.
  explicit Regex(const std::string& pattern);

  // Non-overlapping matches [begin, end) from left to right (empty matches are skipped).
  // `text` must be valid UTF-8: the caller sanitises it once, so PCRE2 need not re-check it
  // on every call (that re-check would make scanning a long text quadratic).
  std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view text) const;

 private:
  struct Compiled;
  std::shared_ptr<const Compiled> compiled_;
};

// Rewrites `\s` / `\S` to the Unicode White_Space set that Rust's regex uses. PCRE2's own `\s`
// under UCP also contains U+180E (MONGOLIAN VOWEL SEPARATOR), which stopped being white space
// in Unicode 6.3, so the pattern is made explicit instead of relying on either library's table.
std::string translate_pattern(const std::string& pattern);

}  // namespace kvchat::tokenization
