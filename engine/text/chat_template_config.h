#pragma once
// What tokenizer_config.json says about chat formatting, and the variables a chat template is
// rendered with, assembled exactly as transformers' apply_chat_template assembles them.
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace kvchat {

struct ChatTemplateConfig {
  std::optional<std::string> chat_template;  // absent: the model has no template
  // The list's "tool_use" template, which transformers renders instead when tools are given.
  std::optional<std::string> tool_use_template;
  // bos_token, eos_token, unk_token, sep_token, pad_token, cls_token, mask_token (strings; tokens
  // that are null or absent are left out, so the template sees them as undefined) and
  // additional_special_tokens (a list of strings).
  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object();
};

// Reads `chat_template` (a string, or a list of {name, template} of which "default" is used, and "tool_use" when
// tools are given) and
// the special tokens (strings or {"content": ...} objects). Throws TemplateError naming the file
// when it cannot be read, is not valid JSON, or has a chat_template of the wrong shape.
ChatTemplateConfig read_chat_template_config(const std::string& tokenizer_config_path);
// The same from an already parsed tokenizer_config object; `origin` names it in errors.
ChatTemplateConfig chat_template_config_from_json(const nlohmann::ordered_json& config, const std::string& origin);

// The template's global variables: messages, add_generation_prompt, tools (null unless given),
// documents (null), the special tokens, then every key of extra_context on top.
nlohmann::ordered_json chat_template_context(
    const nlohmann::ordered_json& messages, bool add_generation_prompt, const nlohmann::ordered_json& special_tokens,
    const nlohmann::ordered_json& tools = nullptr,
    const nlohmann::ordered_json& extra_context = nlohmann::ordered_json::object());

}  // namespace kvchat
