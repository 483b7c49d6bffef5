#include "engine/text/chat_template.h"
#include "engine/text/regular_file.h"

#include <algorithm>
#include <ctime>
#include <fstream>
#include <limits>
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
        if (entry["name"] == "tool_use") result.tool_use_template = entry["template"].get<std::string>();
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
      formatter.template_source_ = *config.chat_template;
      if (config.tool_use_template) {
        formatter.tool_use_template_ = std::make_shared<const ChatTemplate>(*config.tool_use_template);
        formatter.template_source_ = *config.tool_use_template;
      }
    } catch (const TemplateError& error) {
      throw TemplateError(tokenizer_config_path + ": chat_template: " + error.what());
    }
    spdlog::debug("chat template loaded from {} ({} bytes)", tokenizer_config_path, config.chat_template->size());
  } else {
    spdlog::info("{} has no chat_template: turns are joined as plain text", tokenizer_config_path);
  }
  return formatter;
}

ChatFormatter ChatFormatter::from_template(const std::string& chat_template,
                                           const std::optional<std::string>& bos_token,
                                           const std::optional<std::string>& eos_token, const std::string& origin) {
  ChatFormatter formatter;
  // Tokens that are not set stay out of the context, so the template sees them as undefined.
  if (bos_token) formatter.special_tokens_["bos_token"] = *bos_token;
  if (eos_token) formatter.special_tokens_["eos_token"] = *eos_token;
  try {
    formatter.template_ = std::make_shared<const ChatTemplate>(chat_template);
    formatter.template_source_ = chat_template;
  } catch (const TemplateError& error) {
    throw TemplateError(origin + ": chat_template: " + error.what());
  }
  return formatter;
}

ChatFormatter ChatFormatter::plain() { return ChatFormatter(); }

namespace {

// A message as the template sees it: role and content, and the tool-use fields where they are set. A call's
// arguments arrive as JSON text (OpenAI's form) and go to the template as an object when `object_arguments`, as
// transformers' callers pass them to the templates that write them with `| tojson`.
nlohmann::ordered_json message_context(const ChatMessage& message, bool object_arguments) {
  nlohmann::ordered_json object = {{"role", message.role}, {"content", message.content}};
  if (!message.tool_calls.empty()) {
    nlohmann::ordered_json calls = nlohmann::ordered_json::parse(message.tool_calls, nullptr, false);
    if (calls.is_array()) {
      for (auto& call : calls) {
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) continue;
        auto& function = call["function"];
        if (object_arguments && function.contains("arguments") && function["arguments"].is_string()) {
          auto arguments = nlohmann::ordered_json::parse(function["arguments"].get<std::string>(), nullptr, false);
          if (!arguments.is_discarded()) function["arguments"] = std::move(arguments);
        }
      }
      object["tool_calls"] = std::move(calls);
    }
  }
  if (!message.tool_call_id.empty()) object["tool_call_id"] = message.tool_call_id;
  if (!message.name.empty()) object["name"] = message.name;
  return object;
}

}  // namespace

bool ChatFormatter::has_template() const { return template_ != nullptr; }

std::string ChatFormatter::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                  const nlohmann::ordered_json& extra_context, const std::string& today) const {
  if (!template_) {
    std::string text;
    for (const ChatMessage& message : messages) text += message.content;
    return text;
  }
  nlohmann::ordered_json tools = extra_context.is_object() && extra_context.contains("tools")
                                     ? extra_context["tools"]
                                     : nlohmann::ordered_json(nullptr);
  const auto render_with = [&](bool object_arguments) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const ChatMessage& message : messages) list.push_back(message_context(message, object_arguments));
    // transformers: the "tool_use" template of a list when tools are given, else "default".
    const bool tool_use = tool_use_template_ && !tools.is_null();
    return (tool_use ? tool_use_template_ : template_)
        ->render(chat_template_context(list, add_generation_prompt, special_tokens_, tools, extra_context), today);
  };
  // Most tool-use templates write a call's arguments with `| tojson` and want an object; some (functionary,
  // firefunction) join them as text and fail on an object: those get the arguments as the JSON text they came as.
  const bool has_calls = std::any_of(messages.begin(), messages.end(),
                                     [](const ChatMessage& message) { return !message.tool_calls.empty(); });
  if (!has_calls) return render_with(true);
  try {
    return render_with(true);
  } catch (const TemplateError&) {
    return render_with(false);
  }
}

namespace {

// Markers no template writes: characters of Unicode's private use area. In the positional render each
// message's content is kContentOpen + its index + kContentClose; while the real render runs, each piece of
// control-token text a message holds is kTypedOpen + its index + kTypedClose.
constexpr std::string_view kContentOpen = "\xEE\x80\x80";   // U+E000
constexpr std::string_view kContentClose = "\xEE\x80\x81";  // U+E001
constexpr std::string_view kTypedOpen = "\xEE\x80\x82";     // U+E002
constexpr std::string_view kTypedClose = "\xEE\x80\x83";    // U+E003

std::string marker(std::string_view open, std::size_t index, std::string_view close) {
  return std::string(open) + std::to_string(index) + std::string(close);
}

// The index of the marker `open digits close` at `at` (below `limit`), with `end` set past it.
std::optional<std::size_t> read_marker(std::string_view text, std::size_t at, std::string_view open,
                                       std::string_view close, std::size_t limit, std::size_t& end) {
  if (text.compare(at, open.size(), open) != 0) return std::nullopt;
  std::size_t pos = at + open.size(), index = 0, digits = 0;
  for (; pos < text.size() && text[pos] >= '0' && text[pos] <= '9' && digits < 9; ++pos, ++digits)
    index = index * 10 + static_cast<std::size_t>(text[pos] - '0');
  if (digits == 0 || index >= limit || text.compare(pos, close.size(), close) != 0) return std::nullopt;
  end = pos + close.size();
  return index;
}

// The next content marker at or after `from`: its position (npos when none) and index, `end` past it.
std::size_t next_content_marker(std::string_view text, std::size_t from, std::size_t messages, std::size_t& index,
                                std::size_t& end) {
  for (std::size_t at = text.find(kContentOpen, from); at != std::string_view::npos;
       at = text.find(kContentOpen, at + 1))
    if (std::optional<std::size_t> found = read_marker(text, at, kContentOpen, kContentClose, messages, end)) {
      index = *found;
      return at;
    }
  return std::string_view::npos;
}

// The control-token text typed in messages, swapped out while the template runs: a template must neither
// see it as its own tokens nor branch on it, and the tokenizer must read it as plain text afterwards.
class TypedControlText {
 public:
  // `content` with each control-token piece, and each marker character (so that no typed text reads as a
  // marker), replaced by a marker.
  std::string escape(const std::string& content, const ControlTextFinder& find_control_text) {
    std::vector<std::pair<std::size_t, std::size_t>> ranges = find_control_text(content);
    for (std::size_t at = content.find("\xEE\x80"); at != std::string::npos; at = content.find("\xEE\x80", at + 1))
      if (at + 2 < content.size() && static_cast<unsigned char>(content[at + 2]) <= 0x83)
        ranges.emplace_back(at, at + 3);
    if (ranges.empty()) return content;
    std::sort(ranges.begin(), ranges.end());
    std::string escaped;
    std::size_t copied = 0;
    for (auto [begin, end] : ranges) {
      begin = std::max(begin, copied);
      if (end <= begin) continue;
      escaped.append(content, copied, begin - copied);
      escaped += marker(kTypedOpen, pieces_.size(), kTypedClose);
      pieces_.push_back(content.substr(begin, end - begin));
      copied = end;
    }
    return escaped + content.substr(copied);
  }

  // `rendered` with every marker replaced by its text again; `pieces` receives where those texts now are,
  // and map() turns an offset of `rendered` (outside markers) into one of the restored text.
  std::string restore(const std::string& rendered, std::vector<std::pair<std::size_t, std::size_t>>& pieces) {
    shifts_.clear();
    if (pieces_.empty()) return rendered;
    std::string text;
    std::size_t copied = 0;
    for (std::size_t at = rendered.find(kTypedOpen); at != std::string::npos; at = rendered.find(kTypedOpen, copied)) {
      std::size_t end = 0;
      const std::optional<std::size_t> index = read_marker(rendered, at, kTypedOpen, kTypedClose, pieces_.size(), end);
      if (!index)
        throw TemplateError(
            "the chat template cut apart control-token text typed in a message, so the prompt "
            "cannot be told apart from the template's own tokens");
      text.append(rendered, copied, at - copied);
      pieces.emplace_back(text.size(), text.size() + pieces_[*index].size());
      text += pieces_[*index];
      copied = end;
      shifts_.emplace_back(end, text.size());
    }
    return text + rendered.substr(copied);
  }

  std::size_t map(std::size_t offset) const {
    auto after = std::upper_bound(shifts_.begin(), shifts_.end(),
                                  std::make_pair(offset, std::numeric_limits<std::size_t>::max()));
    if (after == shifts_.begin()) return offset;
    --after;
    return offset - after->first + after->second;
  }

 private:
  std::vector<std::string> pieces_;
  std::vector<std::pair<std::size_t, std::size_t>> shifts_;  // (offset past a marker, restored offset there)
};

// Walks the positional render (a marker for each content) and the real one side by side: between markers
// both hold the same template text, and at a marker the real render holds the content, whole or trimmed,
// followed by the next stretch of template text. Stops where they disagree (a template that changes a
// content otherwise, or branches on it): contents past that point get no position.
void align_contents(std::string_view positional, std::string_view rendered, const std::vector<ChatMessage>& messages,
                    std::vector<RenderedPrompt::Content>& contents) {
  std::size_t p = 0, r = 0, index = 0, marker_end = 0;
  std::size_t at = next_content_marker(positional, 0, messages.size(), index, marker_end);
  if (rendered.compare(0, at == std::string_view::npos ? positional.size() : at, positional, 0, at) != 0) return;
  r = at == std::string_view::npos ? positional.size() : at;
  while (at != std::string_view::npos) {
    const std::size_t message = index;
    p = marker_end;
    at = next_content_marker(positional, p, messages.size(), index, marker_end);
    const std::string_view following =
        positional.substr(p, (at == std::string_view::npos ? positional.size() : at) - p);
    const std::string& content = messages[message].content;
    const std::string trimmed = jinja::pystr::strip(content, std::nullopt, true, true);
    bool found = false;
    for (const std::string* candidate : {&content, &trimmed}) {
      const std::size_t end = r + candidate->size();
      if (rendered.compare(r, candidate->size(), *candidate) != 0 ||
          rendered.compare(end, following.size(), following) != 0 ||
          (at == std::string_view::npos && end + following.size() != rendered.size()))
        continue;
      contents.push_back({message, r, end, candidate->size() == content.size()});
      r = end + following.size();
      found = true;
      break;
    }
    if (!found) return;
  }
}

std::string local_date() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char text[16];
  std::strftime(text, sizeof text, "%Y-%m-%d", &local);
  return text;
}

}  // namespace

RenderedPrompt ChatFormatter::render_prompt(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                            const nlohmann::ordered_json& extra_context, const std::string& today,
                                            const ControlTextFinder& control_text) const {
  RenderedPrompt prompt;
  prompt.uses_template = has_template();
  if (!template_) {
    // Plain concatenation: every byte is some message's text.
    for (std::size_t i = 0; i < messages.size(); ++i) {
      const std::size_t begin = prompt.text.size();
      prompt.text += messages[i].content;
      prompt.contents.push_back({i, begin, prompt.text.size(), true});
      prompt.content_ranges.emplace_back(begin, prompt.text.size());
    }
    return prompt;
  }
  const std::string date = today.empty() ? local_date() : today;  // both renders see the same day

  TypedControlText typed;
  std::vector<ChatMessage> escaped = messages;
  nlohmann::ordered_json context = extra_context;
  if (control_text) {
    for (ChatMessage& message : escaped) {
      message.content = typed.escape(message.content, control_text);
      // Tool calls and results, and the tool definitions, are the client's text too.
      message.tool_calls = typed.escape(message.tool_calls, control_text);
      message.tool_call_id = typed.escape(message.tool_call_id, control_text);
      message.name = typed.escape(message.name, control_text);
    }
    if (context.is_object() && context.contains("tools"))
      context["tools"] = nlohmann::ordered_json::parse(typed.escape(context["tools"].dump(), control_text));
  }
  const std::string rendered = render(escaped, add_generation_prompt, context, date);

  std::vector<ChatMessage> marked = escaped;
  for (std::size_t i = 0; i < marked.size(); ++i) marked[i].content = marker(kContentOpen, i, kContentClose);
  std::vector<RenderedPrompt::Content> contents;
  try {
    align_contents(render(marked, add_generation_prompt, context, date), rendered, escaped, contents);
  } catch (const std::exception& error) {
    // A template that inspects the contents may refuse markers: then no content has a position.
    spdlog::debug("chat template: no content positions ({})", error.what());
  }

  prompt.text = typed.restore(rendered, prompt.content_ranges);
  for (RenderedPrompt::Content& content : contents) {
    content.begin = typed.map(content.begin);
    content.end = typed.map(content.end);
    prompt.content_ranges.emplace_back(content.begin, content.end);
  }
  prompt.contents = std::move(contents);
  std::sort(prompt.content_ranges.begin(), prompt.content_ranges.end());
  return prompt;
}

}  // namespace kvchat
