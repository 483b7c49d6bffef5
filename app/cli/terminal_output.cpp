#include "app/cli/terminal_output.h"

#include <unistd.h>

#include <cstdint>

#include "engine/text/utf8.h"

namespace kvchat::cli {

// Named, not anonymous: the command files are compiled in batches (unity build).
namespace terminal_escapes {

void append_escape(std::string& out, const char* format, unsigned value) {
  char escaped[8];
  std::snprintf(escaped, sizeof escaped, format, value);
  out += escaped;
}

// Appends `text` escaped; bytes that do not form a valid sequence are escaped one by one.
void escape_into(std::string& out, std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte < 0x80) {
      if ((byte < 0x20 && byte != '\n' && byte != '\t') || byte == 0x7F)
        append_escape(out, "\\x%02x", byte);
      else
        out += static_cast<char>(byte);
      ++i;
      continue;
    }
    const int length = utf8::sequence_length(byte);
    if (length == 0 || i + static_cast<std::size_t>(length) > text.size() ||
        !utf8::is_valid(text.substr(i, static_cast<std::size_t>(length)))) {
      append_escape(out, "\\x%02x", byte);
      ++i;
      continue;
    }
    std::size_t next = i;
    const std::uint32_t code_point = utf8::next_code_point(text, next);
    if (code_point >= 0x80 && code_point <= 0x9F)  // C1 controls: CSI (U+009B) and OSC (U+009D) among them
      append_escape(out, "\\x%02x", code_point);
    else
      out.append(text.substr(i, next - i));
    i = next;
  }
}

}  // namespace terminal_escapes

bool is_terminal(std::FILE* stream) { return ::isatty(::fileno(stream)) == 1; }

std::string escaped_for_terminal(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  terminal_escapes::escape_into(out, text);
  return out;
}

std::string TerminalText::feed(std::string_view piece) {
  if (!escape_) return std::string(piece);
  held_.append(piece);
  const std::size_t ready = held_.size() - utf8::incomplete_suffix_length(held_);
  std::string out;
  terminal_escapes::escape_into(out, std::string_view(held_).substr(0, ready));
  held_.erase(0, ready);
  return out;
}

std::string TerminalText::finish() {
  std::string out = escaped_for_terminal(held_);
  held_.clear();
  return out;
}

bool write_for_terminal(std::FILE* stream, std::string_view text) {
  if (!is_terminal(stream)) return std::fwrite(text.data(), 1, text.size(), stream) == text.size();
  const std::string escaped = escaped_for_terminal(text);
  return std::fwrite(escaped.data(), 1, escaped.size(), stream) == escaped.size();
}

}  // namespace kvchat::cli
