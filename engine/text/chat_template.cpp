#include "engine/text/chat_template.h"
#include "engine/text/regular_file.h"

#include <fstream>
#include <sstream>

#include <spdlog/spdlog.h>

#include "engine/text/chat_template_config.h"
#include "engine/text/jinja/jinja_interpreter.h"
#include "engine/text/jinja/jinja_parser.h"
#include "engine/text/jinja/jinja_pystr.h"

namespace kvchat {

// ------------------------------------------------------------------ ChatTemplate

struct ChatTemplate::Impl {
  jinja::Body body;
};

ChatTemplate::ChatTemplate(const std::string& source) : impl_(std::make_unique<Impl>()) {
  impl_->body = jinja::parse_template(source);
}

ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

std::string ChatTemplate::render(const nlohmann::ordered_json& context, const std::string& today) const {
  jinja::Value globals;
  try {
    globals = jinja::Value::from_json(context);
  } catch (const jinja::EvalError& error) {
    throw TemplateError(std::string("template context: ") + error.what());
  }
  return jinja::render(impl_->body, globals, today);
}

// ------------------------------------------------------------------ tokenizer_config.json

namespace {

const char* const kSpecialTokenNames[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                          "pad_token", "cls_token", "mask_token"};

// A special token is a string or an AddedToken object {"content": ...}; null means "not set".
std::optional<std::string> token_text(const nlohmann::ordered_json& token, const std::string& origin,
                                      const std::string& field) {
  if (token.is_null()) return std::nullopt;
  if (token.is_string()) return token.get<std::string>();
  if (token.is_object() && token.contains("content") && token["content"].is_string())
    return token["content"].get<std::string>();
  throw TemplateError(origin + ": " + field + " must be a string or an object with a string \"content\"");
}

}  // namespace

ChatTemplateConfig chat_template_config_from_json(const nlohmann::ordered_json& config, const std::string& origin) {
  if (!config.is_object()) throw TemplateError(origin + ": the tokenizer config is not a JSON object");
  ChatTemplateConfig result;
  if (config.contains("chat_template")) {
    const auto& field = config["chat_template"];
    if (field.is_string()) {
      result.chat_template = field.get<std::string>();
    } else if (field.is_array()) {
      for (std::size_t i = 0; i < field.size(); ++i) {
        const auto& entry = field[i];
        if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
            !entry.contains("template") || !entry["template"].is_string())
          throw TemplateError(origin + ": chat_template[" + std::to_string(i) +
                              "] must be an object with string \"name\" and \"template\"");
        if (entry["name"] == "default") result.chat_template = entry["template"].get<std::string>();
      }
      if (!result.chat_template)
        throw TemplateError(origin + ": chat_template lists several templates but none is named \"default\"");
    } else if (!field.is_null()) {
      throw TemplateError(origin + ": chat_template must be a string or a list of {name, template}");
    }
  }
  for (const char* name : kSpecialTokenNames) {
    if (!config.contains(name)) continue;
    if (auto text = token_text(config[name], origin, name)) result.special_tokens[name] = *text;
  }
  if (config.contains("additional_special_tokens") && !config["additional_special_tokens"].is_null()) {
    const auto& list = config["additional_special_tokens"];
    if (!list.is_array()) throw TemplateError(origin + ": additional_special_tokens must be a list");
    if (!list.empty()) {
      nlohmann::ordered_json tokens = nlohmann::ordered_json::array();
      for (std::size_t i = 0; i < list.size(); ++i) {
        auto text = token_text(list[i], origin, "additional_special_tokens[" + std::to_string(i) + "]");
        if (text) tokens.push_back(*text);
      }
      result.special_tokens["additional_special_tokens"] = tokens;
    }
  }
  return result;
}

ChatTemplateConfig read_chat_template_config(const std::string& tokenizer_config_path) {
  std::string contents, error;
  if (!read_regular_file(tokenizer_config_path, contents, error))
    throw TemplateError(tokenizer_config_path + ": cannot open the tokenizer config: " + error);
  nlohmann::ordered_json config;
  try {
    config = nlohmann::ordered_json::parse(contents);
  } catch (const nlohmann::json::exception& error) {
    throw TemplateError(tokenizer_config_path + ": invalid JSON: " + error.what());
  }
  return chat_template_config_from_json(config, tokenizer_config_path);
}

nlohmann::ordered_json chat_template_context(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                             const nlohmann::ordered_json& special_tokens,
                                             const nlohmann::ordered_json& tools,
                                             const nlohmann::ordered_json& extra_context) {
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  context["messages"] = messages;
  context["add_generation_prompt"] = add_generation_prompt;
  context["tools"] = tools;
  context["documents"] = nullptr;
  for (auto it = special_tokens.begin(); it != special_tokens.end(); ++it) context[it.key()] = it.value();
  if (extra_context.is_object())
    for (auto it = extra_context.begin(); it != extra_context.end(); ++it) context[it.key()] = it.value();
  return context;
}

// ------------------------------------------------------------------ ChatFormatter

ChatFormatter ChatFormatter::from_tokenizer_config(const std::string& tokenizer_config_path) {
  ChatTemplateConfig config = read_chat_template_config(tokenizer_config_path);
  ChatFormatter formatter;
  formatter.special_tokens_ = config.special_tokens;
  if (config.chat_template) {
    try {
      formatter.template_ = std::make_shared<const ChatTemplate>(*config.chat_template);
    } catch (const TemplateError& error) {
      throw TemplateError(tokenizer_config_path + ": chat_template: " + error.what());
    }
    spdlog::debug("chat template loaded from {} ({} bytes)", tokenizer_config_path, config.chat_template->size());
  } else {
    spdlog::info("{} has no chat_template: turns are joined as plain text", tokenizer_config_path);
  }
  return formatter;
}

ChatFormatter ChatFormatter::from_template(const std::string& chat_template, const std::optional<std::string>& bos_token,
                                           const std::optional<std::string>& eos_token, const std::string& origin) {
  ChatFormatter formatter;
  // Tokens that are not set stay out of the context, so the template sees them as undefined.
  if (bos_token) formatter.special_tokens_["bos_token"] = *bos_token;
  if (eos_token) formatter.special_tokens_["eos_token"] = *eos_token;
  try {
    formatter.template_ = std::make_shared<const ChatTemplate>(chat_template);
  } catch (const TemplateError& error) {
    throw TemplateError(origin + ": chat_template: " + error.what());
  }
  return formatter;
}

ChatFormatter ChatFormatter::plain() { return ChatFormatter(); }

bool ChatFormatter::has_template() const { return template_ != nullptr; }

std::string ChatFormatter::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                  const nlohmann::ordered_json& extra_context, const std::string& today) const {
  if (!template_) {
    std::string text;
    for (const ChatMessage& message : messages) text += message.content;
    return text;
  }
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const ChatMessage& message : messages) list.push_back({{"role", message.role}, {"content", message.content}});
  nlohmann::ordered_json tools = extra_context.is_object() && extra_context.contains("tools")
                                     ? extra_context["tools"]
                                     : nlohmann::ordered_json(nullptr);
  return template_->render(chat_template_context(list, add_generation_prompt, special_tokens_, tools, extra_context),
                           today);
}

RenderedPrompt ChatFormatter::render_prompt(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                            const nlohmann::ordered_json& extra_context,
                                            const std::string& today) const {
  RenderedPrompt prompt;
  prompt.text = render(messages, add_generation_prompt, extra_context, today);
  prompt.uses_template = has_template();
  std::size_t search_from = 0;
  for (const ChatMessage& message : messages) {
    // The template may have trimmed the content (Jinja's trim = Python's str.strip()).
    for (const std::string& candidate :
         {message.content, jinja::pystr::strip(message.content, std::nullopt, true, true)}) {
      if (candidate.empty()) break;
      std::size_t at = prompt.text.find(candidate, search_from);
      if (at == std::string::npos) continue;
      prompt.content_ranges.emplace_back(at, at + candidate.size());
      search_from = at + candidate.size();
      break;
    }
  }
  return prompt;
}

}  // namespace kvchat
