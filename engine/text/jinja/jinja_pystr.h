#pragma once
// Python str semantics on UTF-8 text: Python indexes, slices, strips and splits by code point and
// treats every Unicode whitespace character as whitespace (str.strip() removes NBSP, U+3000, ...).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvchat::jinja::pystr {

// UTF-8 <-> code points. Invalid bytes decode to U+FFFD (templates only ever see valid UTF-8).
std::u32string decode(std::string_view text);
std::string encode(std::u32string_view code_points);
std::size_t code_point_count(std::string_view text);

// Python's str.isspace() for one code point (also what re's \s matches).
bool is_space(char32_t c);
// Python's str.isprintable() for one code point (repr escapes the others).
bool is_printable(char32_t c);

// str.strip/lstrip/rstrip: `chars` absent = whitespace.
std::string strip(std::string_view text, const std::optional<std::string>& chars, bool left, bool right);
// str.split(sep=None, maxsplit=-1) and str.rsplit.
std::vector<std::string> split(std::string_view text, const std::optional<std::string>& separator,
                               std::int64_t max_split);
std::vector<std::string> rsplit(std::string_view text, const std::optional<std::string>& separator,
                                std::int64_t max_split);
// str.splitlines() (keepends=False): every Python line boundary.
std::vector<std::string> splitlines(std::string_view text);
// str.replace(old, new, count=-1), including Python's rule for an empty `old`.
std::string replace(std::string_view text, std::string_view old_text, std::string_view new_text, std::int64_t count);
// str.find / str.count on code point positions.
std::int64_t find(std::string_view text, std::string_view needle);
std::int64_t count(std::string_view text, std::string_view needle);

// Case mapping (simple Unicode mappings, as towupper/towlower give them).
std::string upper(std::string_view text);
std::string lower(std::string_view text);
std::string capitalize(std::string_view text);  // first upper, rest lower
std::string title(std::string_view text);       // str.title(): upper after any non-letter
bool is_lower(std::string_view text);
bool is_upper(std::string_view text);

}  // namespace kvchat::jinja::pystr
