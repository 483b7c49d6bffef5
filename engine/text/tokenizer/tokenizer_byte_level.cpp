#include "engine/text/tokenizer/tokenizer_byte_level.h"

#include <array>
#include <cstdint>

#include "engine/text/utf8.h"

namespace kvchat::tokenization {

namespace {

struct ByteLevelTables {
  std::array<std::string, 256> byte_to_text;
  std::array<int, 512> code_point_to_byte{};  // every mapped code point is below U+0144
  ByteLevelTables() {
    code_point_to_byte.fill(-1);
    auto keeps_itself = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int next_free = 0;
    for (int b = 0; b < 256; ++b) {
      std::uint32_t cp = keeps_itself(b) ? static_cast<std::uint32_t>(b) : 256u + next_free++;
      utf8::append_code_point(byte_to_text[b], cp);
      code_point_to_byte[cp] = b;
    }
  }
};

const ByteLevelTables& tables() {
  static const ByteLevelTables instance;
  return instance;
}

}  // namespace

std::string bytes_to_byte_level(std::string_view bytes) {
  const auto& map = tables().byte_to_text;
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += map[b];
  return out;
}

void append_byte_level_as_bytes(std::string_view text, std::string& out) {
  const auto& map = tables().code_point_to_byte;
  for (std::size_t i = 0; i < text.size();) {
    std::size_t start = i;
    std::uint32_t cp = utf8::next_code_point(text, i);
    if (cp < map.size() && map[cp] >= 0) {
      out.push_back(static_cast<char>(map[cp]));
    } else {
      out.append(text.substr(start, i - start));
    }
  }
}

}  // namespace kvchat::tokenization
