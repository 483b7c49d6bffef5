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

// `text` with control characters spelled out (\n, \t, \r, \xNN), so that a difference in white space can be read.
inline std::string visible(const std::string& text) {
  static const char* const kHex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : text) {
    if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c == '\r')
      out += "\\r";
    else if (c < 0x20 || c == 0x7f)
      out += std::string("\\x") + kHex[c >> 4] + kHex[c & 15];
    else
      out += static_cast<char>(c);
  }
  return out;
}

}  // namespace kvchat::test
