#pragma once
// tokenizer.json "decoder": ByteLevel, Metaspace, Sequence of Replace / ByteFallback / Fuse / Strip.
// Decoders work on byte strings that may hold partial UTF-8 characters (byte tokens); the caller
// repairs invalid UTF-8 once, at the very end, so a character split over tokens survives.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace kvchat::tokenization {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

// nullptr for a JSON null. `source` names the file in error messages.
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& config, const std::string& source);

// transformers' clean_up_tokenization: " ." -> "." and friends, applied in this exact order.
std::string clean_up_tokenization(std::string_view text);

}  // namespace kvchat::tokenization
