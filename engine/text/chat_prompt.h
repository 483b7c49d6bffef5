#pragma once
// A conversation's prompt ids, as a function of the conversation alone: the same messages (with the
// exact ids of the replies the model wrote) give the same ids whether or not a cache, a snapshot or an
// earlier process is around. No Qt, no torch.
#include <string>
#include <vector>

#include "engine/text/chat_template.h"
#include "engine/text/tokenizer.h"
#include "engine/types.h"

namespace kvchat {

enum class PromptEnd {
  GenerationPrompt,     // the template's opening of the model's next reply
  ContinueLastMessage,  // the text stops right after the last message's content (a reply cut short)
};

struct ChatPrompt {
  std::string text;  // what `ids` stand for
  std::vector<TokenId> ids;
};

// Renders `messages` with the formatter and encodes the text: the template's control tokens become their
// ids; text inside a message never does (typed control-token text included, found by position); a reply
// whose ChatMessage::token_ids were made by this tokenizer (same vocabulary fingerprint) and whose text
// the template wrote unchanged is its exact ids, the text around it encoded as if split there.
// Throws TemplateError, TokenizerError, and std::invalid_argument when the last message to continue is
// not in the rendered text.
// `extra_context` adds variables to the template's (tools: the tool definitions, as transformers passes them).
ChatPrompt encode_chat_prompt(const ChatFormatter& formatter, const Tokenizer& tokenizer,
                              const std::vector<ChatMessage>& messages, PromptEnd end,
                              const nlohmann::ordered_json& extra_context = nlohmann::ordered_json::object());

}  // namespace kvchat
