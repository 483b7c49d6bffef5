// tokenizer.json (+ tokenizer_config.json): load, encode, decode, stream. The input is tokenizer.json,
// then after a NUL byte tokenizer_config.json (absent when there is no separator; empty = none), then
// after another the text to encode. Refusals are TokenizerError (TemplateError for the config's chat
// template); anything else escaping is a bug.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/text/chat_template.h"
#include "engine/text/tokenizer.h"
#include "fuzz_input.h"

namespace {

// User text is not what is hostile here; a bounded length keeps every run short.
constexpr std::size_t kMaxTextBytes = 1024;

void encode_and_decode(const kvchat::Tokenizer& tokenizer, const std::string& text) {
  const std::vector<kvchat::TokenId> plain = tokenizer.encode(text, true, false);
  const std::vector<kvchat::TokenId> special = tokenizer.encode(text, false, true);
  const std::vector<kvchat::TokenId> chat = tokenizer.encode_chat(text, {{text.size() / 4, text.size() / 2}}, true);
  for (const auto* ids : {&plain, &special, &chat}) {
    tokenizer.decode(*ids, false);
    tokenizer.decode(*ids, true, true);
  }
  // Ids a model may sample: its vocabulary can be larger than the tokenizer's (padded embeddings), so
  // decoding an id past the tokenizer's is a TokenizerError, never a crash.
  std::vector<kvchat::TokenId> sampled;
  const int limit = tokenizer.vocab_size() + 8;
  for (std::size_t i = 0; i + 1 < text.size() && limit > 0; i += 2)
    sampled.push_back(static_cast<kvchat::TokenId>((std::uint8_t(text[i]) | std::uint8_t(text[i + 1]) << 8) % limit));
  for (kvchat::TokenId id : sampled) {
    tokenizer.id_to_token(id);
    tokenizer.is_special(id);
  }
  kvchat::StreamingDecoder stream(tokenizer);
  try {
    for (kvchat::TokenId id : sampled) stream.push(id);
    stream.finish();
  } catch (const kvchat::TokenizerError&) {
  }
  try {
    tokenizer.decode(sampled);
  } catch (const kvchat::TokenizerError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto parts = kvchat::fuzz::split_parts(data, size, 3);
  const auto& folder = kvchat::fuzz::scratch();
  const std::string tokenizer_path = folder.write("tokenizer.json", parts[0]);
  const std::string config_path =
      parts.size() > 1 && !parts[1].empty() ? folder.write("tokenizer_config.json", parts[1]) : "";
  std::string text = parts.size() > 2 ? parts[2] : "Hello world! <s> 12345 \xC3\xA9t\xC3\xA9\n\t  ";
  text.resize(std::min(text.size(), kMaxTextBytes));
  try {
    const kvchat::Tokenizer tokenizer = kvchat::Tokenizer::from_files(tokenizer_path, config_path);
    encode_and_decode(tokenizer, text);
  } catch (const kvchat::TokenizerError&) {
  }
  if (!config_path.empty()) {
    // The same tokenizer_config.json also carries the chat template and its special tokens.
    try {
      const auto formatter = kvchat::ChatFormatter::from_tokenizer_config(config_path);
      formatter.render_prompt({{"system", "Be brief."}, {"user", text}, {"assistant", "Hi."}, {"user", "Again"}}, true,
                              nlohmann::ordered_json::object(), "2026-07-26");
    } catch (const kvchat::TemplateError&) {
    }
  }
  return 0;
}
