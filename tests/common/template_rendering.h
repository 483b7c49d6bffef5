#pragma once
// Rendering a chat template from its source in one call, for the template suites.
#include <string>

#include <nlohmann/json.hpp>

#include "engine/text/chat_template.h"

namespace kvchat::test {

inline std::string render(const std::string& source,
                          const nlohmann::ordered_json& context = nlohmann::ordered_json::object(),
                          const std::string& today = "") {
  return ChatTemplate(source).render(context, today);
}

// The message of the TemplateError that constructing or rendering `source` raises ("" if none).
inline std::string error_of(const std::string& source,
                            const nlohmann::ordered_json& context = nlohmann::ordered_json::object()) {
  try {
    ChatTemplate(source).render(context);
  } catch (const TemplateError& error) {
    return error.what();
  }
  return "";
}

}  // namespace kvchat::test
