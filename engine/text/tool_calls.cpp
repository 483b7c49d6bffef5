#include "engine/text/tool_calls.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

namespace kvchat {
// A named namespace: the library is compiled in unity batches, where anonymous ones of several files merge.
namespace tool_call_parsing {
namespace {

// Ordered: the arguments keep the model's key order when dumped again.
using Json = nlohmann::ordered_json;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralOpen = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kMistralCallId = "[CALL_ID]";
constexpr std::string_view kFunctionOpen = "<function=";
constexpr std::string_view kFunctionClose = "</function>";
// With its bracket: "functools" alone is a Python module that replies about code mention.
constexpr std::string_view kFunctoolsOpen = "functools[";

constexpr std::size_t npos = std::string_view::npos;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::size_t skip_space(std::string_view text, std::size_t pos) {
  while (pos < text.size() && is_space(text[pos])) ++pos;
  return pos;
}

std::string_view trim_end(std::string_view text) {
  std::size_t end = text.size();
  while (end > 0 && is_space(text[end - 1])) --end;
  return text.substr(0, end);
}

std::string_view trim(std::string_view text) {
  const std::size_t begin = skip_space(text, 0);
  return trim_end(text.substr(begin));
}

bool at(std::string_view text, std::size_t pos, std::string_view literal) {
  return text.substr(pos, literal.size()) == literal;
}

// Strings that may begin a call in `format`; the first one in a reply is where its calls start.
std::vector<std::string_view> openers(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::Hermes: return {kHermesOpen};
    case ToolCallFormat::Llama3Json: return {kPythonTag};
    case ToolCallFormat::Mistral: return {kMistralOpen};
    case ToolCallFormat::Functionary: return {kFunctionOpen, kPythonTag};
    case ToolCallFormat::FireFunction: return {kFunctoolsOpen};
    case ToolCallFormat::None: break;
  }
  return {};
}

std::size_t first_opener(ToolCallFormat format, std::string_view text) {
  std::size_t first = npos;
  for (std::string_view opener : openers(format)) first = std::min(first, text.find(opener));
  return first;
}

// Where the calls of a whole reply would start. Llama 3 writes its JSON call as the whole reply, so a
// bare object counts only as the reply's first non-whitespace byte.
std::size_t calls_start(ToolCallFormat format, std::string_view reply) {
  if (format == ToolCallFormat::Llama3Json) {
    const std::size_t first = skip_space(reply, 0);
    if (first < reply.size() && reply[first] == '{') return first;
  }
  return first_opener(format, reply);
}

// One past the JSON object or array that starts at `pos`, by its brackets (strings skipped), or npos when
// it does not close. The text found is checked by the JSON parser afterwards.
std::size_t json_extent(std::string_view text, std::size_t pos) {
  if (pos >= text.size() || (text[pos] != '{' && text[pos] != '[')) return npos;
  int depth = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = pos; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      return i + 1;
    }
  }
  return npos;
}

// The JSON object or array at `pos`, moving `pos` past it.
std::optional<Json> json_at(std::string_view text, std::size_t& pos) {
  const std::size_t end = json_extent(text, pos);
  if (end == npos) return std::nullopt;
  Json value = Json::parse(text.substr(pos, end - pos), nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return std::nullopt;
  pos = end;
  return value;
}

std::string dump(const Json& value) { return value.dump(-1, ' ', false, Json::error_handler_t::replace); }

// Appends a call, or says the reply is malformed: a name that is not a non-empty string, or arguments that
// are not an object (FireFunction's prompt asks for "arguments as JSON", so there a string holding an object
// is accepted too).
bool add_call(const Json& name, const Json& arguments, std::vector<ToolCall>& calls, bool string_arguments = false,
              std::string id = {}) {
  if (!name.is_string() || name.get_ref<const std::string&>().empty()) return false;
  const Json* object = &arguments;
  Json parsed;
  if (string_arguments && arguments.is_string()) {
    parsed = Json::parse(arguments.get_ref<const std::string&>(), nullptr, false);
    object = &parsed;
  }
  if (!object->is_object()) return false;
  calls.push_back(ToolCall{std::move(id), name.get<std::string>(), dump(*object)});
  return true;
}

const Json& member(const Json& object, const char* key) {
  static const Json missing;
  const auto found = object.find(key);
  return found == object.end() ? missing : *found;
}

using Calls = std::optional<std::vector<ToolCall>>;

// <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, repeated. The last closing tag may be
// missing: generation can stop right after the object.
Calls parse_hermes(std::string_view text) {
  std::vector<ToolCall> calls;
  std::size_t pos = 0;
  while (pos < text.size()) {
    if (!at(text, pos, kHermesOpen)) return std::nullopt;
    pos = skip_space(text, pos + kHermesOpen.size());
    const std::optional<Json> call = json_at(text, pos);
    if (!call || !call->is_object() || !add_call(member(*call, "name"), member(*call, "arguments"), calls))
      return std::nullopt;
    pos = skip_space(text, pos);
    if (at(text, pos, kHermesClose))
      pos = skip_space(text, pos + kHermesClose.size());
    else if (pos != text.size())
      return std::nullopt;
  }
  return calls;
}

// [<|python_tag|>]{"name": ..., "parameters": {...}}; {...}
Calls parse_llama3(std::string_view text) {
  std::vector<ToolCall> calls;
  std::size_t pos = skip_space(text, 0);
  if (at(text, pos, kPythonTag)) pos += kPythonTag.size();
  while ((pos = skip_space(text, pos)) < text.size()) {
    const std::optional<Json> call = json_at(text, pos);
    if (!call || !call->is_object()) return std::nullopt;
    const Json& arguments = call->contains("parameters") ? member(*call, "parameters") : member(*call, "arguments");
    if (!add_call(member(*call, "name"), arguments, calls)) return std::nullopt;
    pos = skip_space(text, pos);
    if (pos == text.size()) break;
    if (text[pos] != ';') return std::nullopt;
    ++pos;
  }
  return calls;
}

// [TOOL_CALLS] [{"name": ..., "arguments": {...}, "id": ...}], or [TOOL_CALLS]name[CALL_ID]id[ARGS]{...}
// (the id part optional) once per call.
Calls parse_mistral(std::string_view text) {
  std::vector<ToolCall> calls;
  std::size_t pos = 0;
  while (pos < text.size()) {
    if (!at(text, pos, kMistralOpen)) return std::nullopt;
    pos = skip_space(text, pos + kMistralOpen.size());
    if (pos < text.size() && text[pos] == '[') {
      const std::optional<Json> list = json_at(text, pos);
      if (!list || !list->is_array()) return std::nullopt;
      for (const Json& call : *list) {
        if (!call.is_object()) return std::nullopt;
        const Json& id = member(call, "id");
        if (!add_call(member(call, "name"), member(call, "arguments"), calls, false,
                      id.is_string() ? id.get<std::string>() : std::string()))
          return std::nullopt;
      }
    } else {
      const std::size_t args = text.find(kMistralArgs, pos);
      if (args == npos) return std::nullopt;
      std::string_view name = text.substr(pos, args - pos), id;
      const std::size_t call_id = name.find(kMistralCallId);
      if (call_id != npos) {
        id = name.substr(call_id + kMistralCallId.size());
        name = name.substr(0, call_id);
      }
      for (char c : name)
        if (is_space(c) || c == '[' || c == ']' || c == '{' || c == '"') return std::nullopt;
      pos = skip_space(text, args + kMistralArgs.size());
      const std::optional<Json> arguments = json_at(text, pos);
      if (!arguments || !add_call(Json(std::string(name)), *arguments, calls, false, std::string(trim(id))))
        return std::nullopt;
    }
    pos = skip_space(text, pos);
  }
  return calls;
}

// <function=NAME>{...}</function>, repeated, and last perhaps <|python_tag|>code: the template writes a
// call of "python" that way, its arguments being the code itself.
Calls parse_functionary(std::string_view text) {
  std::vector<ToolCall> calls;
  std::size_t pos = 0;
  while (pos < text.size()) {
    if (at(text, pos, kPythonTag)) {
      const std::string_view code = trim(text.substr(pos + kPythonTag.size()));
      if (code.empty()) return std::nullopt;
      calls.push_back(ToolCall{{}, "python", dump(Json{{"code", std::string(code)}})});
      break;
    }
    if (!at(text, pos, kFunctionOpen)) return std::nullopt;
    pos += kFunctionOpen.size();
    const std::size_t name_end = text.find('>', pos);
    if (name_end == npos) return std::nullopt;
    const std::string_view name = text.substr(pos, name_end - pos);
    for (char c : name)
      if (is_space(c) || c == '<') return std::nullopt;
    pos = skip_space(text, name_end + 1);
    const std::optional<Json> arguments = json_at(text, pos);
    if (!arguments || !add_call(Json(std::string(name)), *arguments, calls)) return std::nullopt;
    pos = skip_space(text, pos);
    if (at(text, pos, kFunctionClose))
      pos = skip_space(text, pos + kFunctionClose.size());
    else if (pos != text.size())
      return std::nullopt;
  }
  return calls;
}

// functools[{"name": ..., "arguments": ...}, ...]
Calls parse_firefunction(std::string_view text) {
  std::vector<ToolCall> calls;
  std::size_t pos = kFunctoolsOpen.size() - 1;  // at the list's bracket
  const std::optional<Json> list = json_at(text, pos);
  if (!list || !list->is_array() || skip_space(text, pos) != text.size()) return std::nullopt;
  for (const Json& call : *list)
    if (!call.is_object() || !add_call(member(call, "name"), member(call, "arguments"), calls, true))
      return std::nullopt;
  return calls;
}

// FNV-1a: the same call gets the same id on every run, so a reply parsed whole or streamed agrees.
std::uint64_t fingerprint(std::size_t index, const ToolCall& call, int salt) {
  std::uint64_t hash = 14695981039346656037ull;
  const auto mix = [&hash](std::string_view bytes) {
    for (unsigned char c : bytes) hash = (hash ^ c) * 1099511628211ull;
  };
  mix(std::to_string(index) + ':' + std::to_string(salt) + ':');
  mix(call.name);
  mix(std::string_view("\0", 1));
  mix(call.arguments);
  return hash;
}

std::string make_id(ToolCallFormat format, std::uint64_t hash) {
  static constexpr char kDigits[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  if (format == ToolCallFormat::Mistral) {
    std::string id;
    for (int i = 0; i < 9; ++i, hash /= 62) id += kDigits[hash % 62];
    return id;
  }
  std::string id = "call_";
  for (int i = 0; i < 16; ++i, hash >>= 4) id += kDigits[hash & 15];
  return id;
}

// Keeps the model's ids (unless one repeats) and makes the others, all distinct within the reply.
void assign_ids(ToolCallFormat format, std::vector<ToolCall>& calls) {
  std::set<std::string> used;
  for (ToolCall& call : calls)
    if (!call.id.empty() && !used.insert(call.id).second) call.id.clear();
  for (std::size_t i = 0; i < calls.size(); ++i) {
    if (!calls[i].id.empty()) continue;
    for (int salt = 0; calls[i].id.empty() || !used.insert(calls[i].id).second; ++salt)
      calls[i].id = make_id(format, fingerprint(i, calls[i], salt));
  }
}

Calls parse_calls(ToolCallFormat format, std::string_view text) {
  switch (format) {
    case ToolCallFormat::Hermes: return parse_hermes(text);
    case ToolCallFormat::Llama3Json: return parse_llama3(text);
    case ToolCallFormat::Mistral: return parse_mistral(text);
    case ToolCallFormat::Functionary: return parse_functionary(text);
    case ToolCallFormat::FireFunction: return parse_firefunction(text);
    case ToolCallFormat::None: break;
  }
  return std::nullopt;
}

// Where a proper prefix of an opener starts at the end of `text` (the earliest one), or text.size().
std::size_t partial_opener(ToolCallFormat format, std::string_view text) {
  std::size_t start = text.size();
  for (std::string_view opener : openers(format))
    for (std::size_t length = std::min(opener.size() - 1, text.size()); length > 0; --length)
      if (text.substr(text.size() - length) == opener.substr(0, length)) {
        start = std::min(start, text.size() - length);
        break;
      }
  return start;
}

}  // namespace
}  // namespace tool_call_parsing

const char* to_string(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::None: return "none";
    case ToolCallFormat::Hermes: return "hermes";
    case ToolCallFormat::Llama3Json: return "llama3_json";
    case ToolCallFormat::Mistral: return "mistral";
    case ToolCallFormat::Functionary: return "functionary";
    case ToolCallFormat::FireFunction: return "firefunction";
  }
  return "none";
}

ToolCallFormat tool_call_format_for_template(std::string_view source) {
  const auto has = [source](std::string_view marker) { return source.find(marker) != std::string_view::npos; };
  // The most specific markers first: Functionary v3.1 is built on Llama 3.1's template (its ipython
  // environment and <|python_tag|>), and Hermes-style templates may stand on a Llama 3 base too.
  if (has("functools[")) return ToolCallFormat::FireFunction;
  if (has("[TOOL_CALLS]")) return ToolCallFormat::Mistral;
  if (has("<function=")) return ToolCallFormat::Functionary;
  if (has("<tool_call>")) return ToolCallFormat::Hermes;
  // Llama 3.1's template writes <|python_tag|> and the ipython environment; 3.2's only the latter; all of
  // them ask for {"name": function name, "parameters": dictionary of argument name and its value}.
  if (has("<|python_tag|>") || has("Environment: ipython") || has("\"parameters\": dictionary of argument"))
    return ToolCallFormat::Llama3Json;
  return ToolCallFormat::None;
}

ParsedReply parse_tool_calls(ToolCallFormat format, std::string_view reply) {
  using namespace tool_call_parsing;
  const std::size_t start = calls_start(format, reply);
  if (start == npos) return {std::string(reply), {}};
  std::optional<std::vector<ToolCall>> calls = parse_calls(format, reply.substr(start));
  if (!calls || calls->empty()) return {std::string(reply), {}};
  assign_ids(format, *calls);
  return {std::string(trim_end(reply.substr(0, start))), std::move(*calls)};
}

ToolCallStream::ToolCallStream(ToolCallFormat format) : format_(format) {}

std::string ToolCallStream::push(std::string_view text) {
  using namespace tool_call_parsing;
  if (format_ == ToolCallFormat::None) return std::string(text);
  held_ += text;
  if (in_call_) return {};
  if (!started_) {
    const std::size_t first = skip_space(held_, 0);
    if (first == held_.size()) return {};
    started_ = true;
    in_call_ = format_ == ToolCallFormat::Llama3Json && held_[first] == '{';
    if (in_call_) return {};
  }
  // held_ never holds a whole opener here, so one found now is the reply's first.
  std::size_t hold = first_opener(format_, held_);
  in_call_ = hold != npos;
  if (!in_call_) hold = partial_opener(format_, held_);
  const std::size_t send = trim_end(std::string_view(held_).substr(0, hold)).size();
  std::string out = held_.substr(0, send);
  held_.erase(0, send);
  return out;
}

ParsedReply ToolCallStream::finish() {
  ParsedReply reply = format_ == ToolCallFormat::None ? ParsedReply{} : parse_tool_calls(format_, held_);
  held_.clear();
  in_call_ = started_ = false;
  return reply;
}

}  // namespace kvchat
