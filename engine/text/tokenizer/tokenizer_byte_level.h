#pragma once
// The GPT-2 byte <-> unicode map used by ByteLevel pre-tokenizers and decoders: every byte gets a
// printable character (printable Latin-1 bytes map to themselves, the rest to U+0100 upwards),
// so a byte string becomes a text that BPE vocabularies can store ("Ġ" is the space byte).
#include <string>
#include <string_view>

namespace kvchat::tokenization {

// UTF-8 of the character that stands for each byte.
std::string bytes_to_byte_level(std::string_view bytes);
// Inverse map; characters that are not in the map (added tokens such as "<|eot_id|>" contain only
// mapped ASCII, but a hand-made vocabulary need not) are appended as their own UTF-8 bytes.
void append_byte_level_as_bytes(std::string_view text, std::string& out);

}  // namespace kvchat::tokenization
