#pragma once
// Small UTF-8 helpers shared by the tokenizer and the streaming decoder.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvchat::utf8 {

// Length of the UTF-8 sequence starting with `lead` (1..4), or 0 for a byte that cannot start one.
int sequence_length(unsigned char lead);
// True when `text` is entirely valid UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF).
bool is_valid(std::string_view text);
// Replaces each maximal invalid subsequence with U+FFFD (the WHATWG / from_utf8_lossy rule).
std::string replace_invalid(std::string_view text);
// Number of bytes at the end of `text` that form the start of a valid but unfinished sequence
// (0..3): what a streaming decoder must hold back.
std::size_t incomplete_suffix_length(std::string_view text);
// Appends the UTF-8 encoding of `code_point`.
void append_code_point(std::string& out, std::uint32_t code_point);
// Decodes the code point starting at `index` of valid UTF-8 `text` and advances `index` past it.
// A byte that cannot start a sequence is returned as itself (one byte), so this never loops forever.
std::uint32_t next_code_point(std::string_view text, std::size_t& index);

}  // namespace kvchat::utf8
