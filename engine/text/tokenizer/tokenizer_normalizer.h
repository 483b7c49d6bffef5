#pragma once
// tokenizer.json "normalizer": Sequence, Prepend, Replace. Anything else is a TokenizerError.
#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace kvchat::tokenization {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Normalizes one segment of text (the text between added tokens).
  virtual void normalize(std::string& text) const = 0;
};

// nullptr for a JSON null. `source` names the file in error messages.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& config, const std::string& source);

}  // namespace kvchat::tokenization
