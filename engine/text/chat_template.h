#pragma once
// Chat templates: a Jinja2 subset interpreter, enough for the templates real Hugging Face models
// ship (Llama 3/3.1, Qwen3, Gemma 3, DeepSeek-V3, ChatML, Zephyr), rendering exactly as
// transformers does (trim_blocks, lstrip_blocks, loopcontrols). No Qt, no torch.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/text/jinja/jinja_error.h"  // TemplateError
#include "engine/types.h"

namespace kvchat {

class ChatTemplate {
 public:
  // Throws TemplateError on a syntax error or an unsupported construct.
  explicit ChatTemplate(const std::string& source);
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  ~ChatTemplate();

  // Renders with `context` as the global variables (messages, add_generation_prompt, bos_token, ...).
  // `today` ("YYYY-MM-DD") fixes strftime_now; empty = the current local date.
  std::string render(const nlohmann::ordered_json& context, const std::string& today = "") const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// A rendered prompt and where the messages' contents sit in it, so that the tokenizer never turns text a
// person typed into control tokens (Tokenizer::encode_chat) and a reply's exact ids can stand for its text.
struct RenderedPrompt {
  // One place where a message's content was rendered. Found by position: the template is rendered once
  // more with a marker in place of each content, and the two renders are walked side by side; a content
  // the template changed beyond trimming it has none (and neither has anything after it).
  struct Content {
    std::size_t message = 0;         // index into the messages
    std::size_t begin = 0, end = 0;  // bytes [begin, end) of text
    bool whole = true;               // false: the template trimmed the content's white space
  };
  std::string text;
  std::vector<Content> contents;
  // Byte ranges [first, second) in which no control token may be read: every located content, and every
  // piece of control-token text typed in any message (kept from the template while it rendered).
  std::vector<std::pair<size_t, size_t>> content_ranges;
  bool uses_template = false;  // false: plain concatenation, encode with add_special_tokens = true
};

// The byte ranges of a text that a tokenizer would read as control (added) tokens: Tokenizer::added_token_ranges.
using ControlTextFinder = std::function<std::vector<std::pair<size_t, size_t>>(std::string_view)>;

// What a model directory's tokenizer_config.json says about chat formatting.
class ChatFormatter {
 public:
  // Reads tokenizer_config.json (chat_template as a string, or a list of {name, template} where
  // "default" is used; bos_token/eos_token/... as strings or {content} objects).
  static ChatFormatter from_tokenizer_config(const std::string& tokenizer_config_path);
  // From a template string and the BOS/EOS token texts it may refer to (a GGUF file's
  // tokenizer.chat_template with its bos/eos tokens). `origin` names it in errors.
  static ChatFormatter from_template(const std::string& chat_template, const std::optional<std::string>& bos_token,
                                     const std::optional<std::string>& eos_token,
                                     const std::string& origin = "chat template");
  // A model without a template (stories260K): turns are joined as plain text.
  static ChatFormatter plain();

  bool has_template() const;
  // The Jinja source of the template that renders tools (the "tool_use" one of a list, else the only one; "" without
  // a template): what tells which tool-call format the model writes.
  const std::string& template_source() const { return template_source_; }
  // The full prompt text for `messages`; with a template the text contains control tokens that must
  // be encoded with parse_special = true. Without a template: the turns' contents concatenated.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& extra_context = nlohmann::ordered_json::object(),
                     const std::string& today = "") const;
  // render() plus where each message's content sits in the text, by position. With `control_text`, every
  // piece of control-token text inside a message is swapped for an inert marker while the template runs
  // and put back afterwards, so it can neither be taken for the template's own tokens nor change what the
  // template does; those pieces are content ranges too. Throws TemplateError when the template cut such
  // a marker apart.
  RenderedPrompt render_prompt(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                               const nlohmann::ordered_json& extra_context = nlohmann::ordered_json::object(),
                               const std::string& today = "", const ControlTextFinder& control_text = {}) const;

 private:
  std::shared_ptr<const ChatTemplate> template_;
  std::shared_ptr<const ChatTemplate> tool_use_template_;  // null: template_ renders tools too
  std::string template_source_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();  // bos_token, eos_token, ...
};

}  // namespace kvchat
