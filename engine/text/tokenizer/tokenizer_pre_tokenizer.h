#pragma once
// tokenizer.json "pre_tokenizer": Sequence, Split, ByteLevel, Metaspace, Digits. Anything else is a
// TokenizerError naming it.
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace kvchat::tokenization {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits/rewrites the pieces of one normalized segment in place. `at_text_start` is true when
  // pieces[0] begins at byte 0 of the original text (Metaspace's prepend_scheme "first").
  virtual void pre_tokenize(std::vector<std::string>& pieces, bool at_text_start) const = 0;
};

// nullptr for a JSON null. `source` names the file in error messages.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& config, const std::string& source);

}  // namespace kvchat::tokenization
