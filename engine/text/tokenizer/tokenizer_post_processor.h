#pragma once
// tokenizer.json "post_processor" for single sequences: TemplateProcessing (BOS/EOS around $A),
// ByteLevel (adds nothing), Sequence of those. Anything else is a TokenizerError.
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engine/types.h"

namespace kvchat::tokenization {

// The ids that add_special_tokens puts before and after a single sequence.
struct SpecialTokenTemplate {
  std::vector<TokenId> prefix;
  std::vector<TokenId> suffix;
};

// Reads the post-processor; a JSON null gives an empty template. `source` names the file.
SpecialTokenTemplate parse_post_processor(const nlohmann::json& config, const std::string& source);

}  // namespace kvchat::tokenization
