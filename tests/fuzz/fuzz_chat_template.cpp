// Chat templates: the Jinja parser and renderer with its render budget, through ChatFormatter (the
// path a model's template takes). The input is the template, then after a NUL byte an optional JSON
// object {"messages": [{"role", "content"}...], "add_generation_prompt": bool}. Only the template is
// hostile (it comes with a model); the messages are plain strings as the app passes them. A refusal
// is a TemplateError; anything else escaping is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/text/chat_template.h"
#include "fuzz_input.h"

namespace {

struct Conversation {
  std::vector<kvchat::ChatMessage> messages{
      {"system", "You are helpful."}, {"user", "Hi <s> there"}, {"assistant", " Hello! "}, {"user", "Again?"}};
  bool add_generation_prompt = true;
};

// Takes only strings and a bool from the JSON, as the app builds them; anything else keeps the default.
Conversation conversation_from(const std::string& text) {
  Conversation conversation;
  const auto context = nlohmann::json::parse(text, nullptr, false);
  if (!context.is_object()) return conversation;
  if (auto it = context.find("add_generation_prompt"); it != context.end() && it->is_boolean())
    conversation.add_generation_prompt = it->get<bool>();
  auto messages = context.find("messages");
  if (messages == context.end() || !messages->is_array()) return conversation;
  conversation.messages.clear();
  for (const auto& message : *messages) {
    if (!message.is_object()) continue;
    auto role = message.find("role"), content = message.find("content");
    if (role != message.end() && role->is_string() && content != message.end() && content->is_string())
      conversation.messages.push_back({role->get<std::string>(), content->get<std::string>()});
  }
  return conversation;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto parts = kvchat::fuzz::split_parts(data, size, 2);
  const Conversation conversation = conversation_from(parts.size() > 1 ? parts[1] : "");
  try {
    const auto formatter = kvchat::ChatFormatter::from_template(parts[0], "<s>", "</s>", "fuzz template");
    formatter.render_prompt(conversation.messages, conversation.add_generation_prompt, nlohmann::ordered_json::object(),
                            "2026-07-26");
  } catch (const kvchat::TemplateError&) {
  }
  return 0;
}
