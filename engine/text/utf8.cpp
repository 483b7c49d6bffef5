#include "engine/text/utf8.h"

namespace kvchat::utf8 {

int sequence_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

namespace {
// Valid range of the second byte for a given lead byte (Unicode Table 3-7); later bytes are 80..BF.
bool second_byte_ok(unsigned char lead, unsigned char second) {
  if (lead == 0xE0) return second >= 0xA0 && second <= 0xBF;
  if (lead == 0xED) return second >= 0x80 && second <= 0x9F;
  if (lead == 0xF0) return second >= 0x90 && second <= 0xBF;
  if (lead == 0xF4) return second >= 0x80 && second <= 0x8F;
  return second >= 0x80 && second <= 0xBF;
}

// Length of the valid prefix of a maximal subpart starting at i: returns the full sequence length
// when complete and valid, else -(number of bytes that belong to the invalid maximal subpart).
int scan(std::string_view text, std::size_t i) {
  unsigned char lead = static_cast<unsigned char>(text[i]);
  int length = sequence_length(lead);
  if (length == 0) return -1;
  if (length == 1) return 1;
  for (int k = 1; k < length; ++k) {
    if (i + k >= text.size()) return -k;
    unsigned char byte = static_cast<unsigned char>(text[i + k]);
    bool ok = (k == 1) ? second_byte_ok(lead, byte) : (byte >= 0x80 && byte <= 0xBF);
    if (!ok) return -k;
  }
  return length;
}
}  // namespace

bool is_valid(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    int n = scan(text, i);
    if (n < 0) return false;
    i += static_cast<std::size_t>(n);
  }
  return true;
}

std::string replace_invalid(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    int n = scan(text, i);
    if (n > 0) {
      out.append(text.substr(i, static_cast<std::size_t>(n)));
      i += static_cast<std::size_t>(n);
    } else {
      out.append("\xEF\xBF\xBD");
      i += static_cast<std::size_t>(-n);
    }
  }
  return out;
}

std::size_t incomplete_suffix_length(std::string_view text) {
  // Look back at most 3 bytes for a lead byte whose sequence runs past the end but is valid so far.
  for (std::size_t back = 1; back <= 3 && back <= text.size(); ++back) {
    std::size_t i = text.size() - back;
    unsigned char byte = static_cast<unsigned char>(text[i]);
    if (byte >= 0x80 && byte <= 0xBF) continue;  // continuation byte: keep looking for the lead
    int length = sequence_length(byte);
    if (length <= static_cast<int>(back)) return 0;  // complete (or invalid): nothing to hold back
    int n = scan(text, i);
    return (n < 0 && static_cast<std::size_t>(-n) == back) ? back : 0;
  }
  return 0;
}

void append_code_point(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::uint32_t next_code_point(std::string_view text, std::size_t& index) {
  unsigned char lead = static_cast<unsigned char>(text[index]);
  int length = sequence_length(lead);
  if (length <= 1 || index + static_cast<std::size_t>(length) > text.size()) {
    ++index;
    return lead;
  }
  std::uint32_t cp = lead & (0xFF >> (length + 1));
  for (int k = 1; k < length; ++k) cp = (cp << 6) | (static_cast<unsigned char>(text[index + k]) & 0x3F);
  index += static_cast<std::size_t>(length);
  return cp;
}

}  // namespace kvchat::utf8
