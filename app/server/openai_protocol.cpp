#include "app/server/openai_protocol.h"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "engine/text/constraint/json_matcher.h"

namespace kvchat::app::openai {

using nlohmann::json;

ApiError::ApiError(int status_code, std::string message, std::string error_type, std::string error_param,
                   std::string error_code)
    : std::runtime_error(std::move(message)),
      status(status_code),
      type(std::move(error_type)),
      param(std::move(error_param)),
      code(std::move(error_code)) {}

json error_body(const ApiError& error) {
  json body = {{"message", error.what()}, {"type", error.type}, {"param", nullptr}, {"code", nullptr}};
  if (!error.param.empty()) body["param"] = error.param;
  if (!error.code.empty()) body["code"] = error.code;
  return json{{"error", body}};
}

namespace {

constexpr int kMaxTopLogprobs = 20;  // OpenAI's limit

ApiError invalid(const std::string& param, const std::string& message) {
  return ApiError(400, message, "invalid_request_error", param, "invalid_value");
}

json parse_object(const std::string& body) {
  json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded())
    throw ApiError(400, "the request body is not valid JSON", "invalid_request_error", "", "invalid_json");
  if (!parsed.is_object()) throw ApiError(400, "the request body must be a JSON object", "invalid_request_error");
  return parsed;
}

// The field if present and not null; ApiError when it has another JSON type than `expected` says.
const json* field(const json& object, const char* name, bool (json::*is_type)() const, const char* expected) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return nullptr;
  if (!((*it).*is_type)()) throw invalid(name, std::string("'") + name + "' must be " + expected);
  return &*it;
}

double number_in(const json& object, const char* name, double low, double high, double fallback) {
  const json* value = field(object, name, &json::is_number, "a number");
  if (!value) return fallback;
  const double number = value->get<double>();
  if (number < low || number > high)
    throw invalid(name,
                  std::string("'") + name + "' must be between " + json(low).dump() + " and " + json(high).dump());
  return number;
}

std::vector<std::string> parse_stop(const json& object) {
  auto it = object.find("stop");
  if (it == object.end() || it->is_null()) return {};
  std::vector<std::string> stops;
  if (it->is_string()) {
    stops.push_back(it->get<std::string>());
  } else if (it->is_array()) {
    for (const json& item : *it) {
      if (!item.is_string()) throw invalid("stop", "'stop' must be a string or an array of strings");
      stops.push_back(item.get<std::string>());
    }
  } else {
    throw invalid("stop", "'stop' must be a string or an array of strings");
  }
  if (stops.size() > 4) throw invalid("stop", "'stop' takes at most 4 texts");
  stops.erase(std::remove(stops.begin(), stops.end(), std::string()), stops.end());
  return stops;
}

int parse_max_tokens(const json& object) {
  constexpr std::int64_t kMaxTokens = std::int64_t(1) << 24;  // the most positions a model may have
  int max_tokens = 0;
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    const json* value = field(object, name, &json::is_number_integer, "an integer");
    if (!value) continue;
    // An unsigned value over 2^63 reads as negative as a signed one: compare it unsigned.
    if ((value->is_number_unsigned() && value->get<std::uint64_t>() > std::uint64_t(kMaxTokens)) ||
        (!value->is_number_unsigned() && value->get<std::int64_t>() > kMaxTokens))
      throw invalid(
          name, std::string("'") + name + "' must be at most " + std::to_string(kMaxTokens) + ", got " + value->dump());
    if (value->get<std::int64_t>() < 1)
      throw invalid(name, std::string("'") + name + "' must be at least 1, got " + value->dump());
    max_tokens = value->get<int>();
  }
  return max_tokens;
}

SamplingRequest parse_sampling(const json& object) {
  SamplingRequest request;
  // Optional, as llama.cpp and Ollama take it: one server serves one model.
  if (const json* model = field(object, "model", &json::is_string, "a string"))
    request.model = model->get<std::string>();
  request.max_tokens = parse_max_tokens(object);
  request.temperature = static_cast<float>(number_in(object, "temperature", 0.0, 2.0, 1.0));
  request.top_p = static_cast<float>(number_in(object, "top_p", 0.0, 1.0, 1.0));
  if (request.top_p <= 0.0f) throw invalid("top_p", "'top_p' must be greater than 0");
  if (const json* seed = field(object, "seed", &json::is_number_integer, "an integer"))
    request.seed =
        seed->is_number_unsigned() ? seed->get<std::uint64_t>() : static_cast<std::uint64_t>(seed->get<std::int64_t>());
  request.stop = parse_stop(object);
  if (const json* top_k = field(object, "top_k", &json::is_number_integer, "an integer")) {
    if (top_k->get<std::int64_t>() < -1 || top_k->get<std::int64_t>() > (1 << 24))
      throw invalid("top_k", "'top_k' must be between -1 and 16777216 (-1 and 0: off)");
    request.top_k = std::max(0, top_k->get<int>());
  }
  request.min_p = static_cast<float>(number_in(object, "min_p", 0.0, 1.0, 0.0));
  for (const char* name : {"repetition_penalty", "repeat_penalty"}) {
    if (!field(object, name, &json::is_number, "a number")) continue;
    const auto penalty = static_cast<float>(number_in(object, name, 0.0, 10.0, 1.0));
    if (penalty <= 0.0f) throw invalid(name, std::string("'") + name + "' must be greater than 0");
    if (request.repetition_penalty != 1.0f && penalty != request.repetition_penalty)
      throw invalid(name, "'repetition_penalty' and 'repeat_penalty' differ: give one of them");
    request.repetition_penalty = penalty;
  }
  if (const json* window = field(object, "repeat_last_n", &json::is_number_integer, "an integer")) {
    // llama-server's meaning: -1 the whole context, 0 no penalty, n the last n tokens.
    const std::int64_t last_n = window->get<std::int64_t>();
    if (last_n < -1 || last_n > (1 << 24))
      throw invalid("repeat_last_n", "'repeat_last_n' must be between -1 and 16777216");
    if (last_n == 0) request.repetition_penalty = 1.0f;
    request.repetition_window = last_n == -1 ? 0 : static_cast<int>(last_n);
  }
  if (const json* n = field(object, "n", &json::is_number_integer, "an integer"); n && n->get<std::int64_t>() != 1)
    throw invalid("n", "only n = 1 is supported");
  if (const json* stream = field(object, "stream", &json::is_boolean, "a boolean"))
    request.stream = stream->get<bool>();
  if (const json* options = field(object, "stream_options", &json::is_object, "an object"))
    if (const json* usage = field(*options, "include_usage", &json::is_boolean, "a boolean"))
      request.include_usage = usage->get<bool>();
  return request;
}

// A message's content: a string, or OpenAI's array of {"type": "text", "text": ...} parts joined.
std::string message_content(const json& message, std::size_t index) {
  const std::string param = "messages[" + std::to_string(index) + "].content";
  auto it = message.find("content");
  if (it == message.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) throw invalid(param, "'" + param + "' must be a string or an array of text parts");
  std::string text;
  for (const json& part : *it) {
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
        !part["text"].is_string())
      throw invalid(param, "'" + param + "' parts must be {\"type\": \"text\", \"text\": string}");
    text += part["text"].get<std::string>();
  }
  return text;
}

// Whether a value asks for nothing: null, false, 0, "", an empty array or object.
bool asks_for_nothing(const json& value) {
  return value.is_null() || (value.is_boolean() && !value.get<bool>()) || (value.is_number() && value == 0) ||
         ((value.is_string() || value.is_array() || value.is_object()) && value.empty());
}

// The fields each endpoint reads (parse_sampling and its own parser), and those accepted only at a value
// that asks for nothing (or one of the values listed, which ask for what the server does anyway).
struct KnownField {
  const char* name;
  std::vector<json> also_accepted = {};  // values besides asks_for_nothing() that change nothing
  const char* why_refused = nullptr;     // null: the field is read; else why another value is refused
};

const std::vector<KnownField>& sampling_fields() {
  static const std::vector<KnownField> fields = {
      {"model"},
      {"max_tokens"},
      {"max_completion_tokens"},
      {"temperature"},
      {"top_p"},
      {"seed"},
      {"stop"},
      {"n"},
      {"stream"},
      {"stream_options"},
      {"top_k"},
      {"min_p"},
      {"repetition_penalty"},
      {"repeat_penalty"},
      {"repeat_last_n"},
      // What only OpenAI's own service does with them: abuse monitoring, its stored completions, its tiers.
      {"user"},
      {"metadata"},
      {"safety_identifier"},
      {"prompt_cache_key"},
      {"service_tier", {"auto", "default"}, "this server has one service tier"},
      {"store", {}, "this server stores no completions"},
      {"frequency_penalty", {}, "use repetition_penalty (or repeat_penalty with repeat_last_n) instead"},
      {"presence_penalty", {}, "use repetition_penalty (or repeat_penalty with repeat_last_n) instead"},
      {"logit_bias", {}, "logit biases are not implemented"},
  };
  return fields;
}

const std::vector<KnownField>& chat_fields() {
  static const std::vector<KnownField> fields = {
      {"messages"},
      {"logprobs"},
      {"top_logprobs"},
      {"tools"},
      {"tool_choice"},
      {"parallel_tool_calls"},
      {"functions", {}, "the deprecated functions are not implemented: send them as tools"},
      {"function_call", {"none", "auto"}, "the deprecated function_call is not implemented: use tool_choice"},
      {"response_format"},
      {"modalities", {json::array({"text"})}, "this server answers in text only"},
      {"audio", {}, "this server answers in text only"},
      {"prediction", {}, "predicted outputs are not implemented"},
      {"reasoning_effort", {}, "the served model has no reasoning effort setting"},
      {"verbosity", {"medium"}, "the served model has no verbosity setting"},
      {"web_search_options", {}, "this server has no web search"},
  };
  return fields;
}

const std::vector<KnownField>& completion_fields() {
  static const std::vector<KnownField> fields = {
      {"prompt"},
      {"echo", {}, "echo is not implemented"},
      {"best_of", {1}, "best_of is not implemented"},
      {"suffix", {}, "suffix (insertion) is not implemented"},
      {"logprobs"},
  };
  return fields;
}

// Refuses, naming it, the first field of `object` this endpoint does not read and that asks for something.
void check_fields(const json& object, const std::vector<KnownField>& endpoint_fields) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    const KnownField* known = nullptr;
    for (const auto* list : {&sampling_fields(), &endpoint_fields})
      for (const KnownField& candidate : *list)
        if (it.key() == candidate.name) known = &candidate;
    if (!known)
      throw ApiError(400, "unknown field '" + it.key() + "': this server does not implement it",
                     "invalid_request_error", it.key(), "unknown_field");
    if (!known->why_refused || asks_for_nothing(*it)) continue;
    if (std::find(known->also_accepted.begin(), known->also_accepted.end(), *it) != known->also_accepted.end())
      continue;
    throw ApiError(400, "'" + it.key() + "' " + it->dump() + " is not supported: " + known->why_refused,
                   "invalid_request_error", it.key(), "unsupported_field");
  }
}

// The fields of one message: role and content are read, and an assistant's tool_calls and a tool message's
// tool_call_id and name; what an assistant message carries when sent back as it came (refusal, annotations:
// null or empty) is accepted at such values; the rest is refused.
void check_message_fields(const json& message, const std::string& param) {
  const std::string role =
      message.contains("role") && message["role"].is_string() ? message["role"].get<std::string>() : "";
  for (auto it = message.begin(); it != message.end(); ++it) {
    if (it.key() == "role" || it.key() == "content" || asks_for_nothing(*it)) continue;
    if (role == "assistant" && it.key() == "tool_calls") continue;
    if (role == "tool" && (it.key() == "tool_call_id" || it.key() == "name")) continue;
    const bool known = it.key() == "name" || it.key() == "tool_calls" || it.key() == "tool_call_id" ||
                       it.key() == "function_call" || it.key() == "refusal" || it.key() == "annotations" ||
                       it.key() == "audio";
    throw ApiError(
        400,
        "'" + param + "." + it.key() + "' is not supported" +
            (known ? std::string(" on a message of role '" + role + "'") : std::string(": unknown message field")),
        "invalid_request_error", param + "." + it.key(), known ? "unsupported_field" : "unknown_field");
  }
}

// An assistant message's tool_calls, checked and kept as OpenAI's JSON.
std::string message_tool_calls(const json& calls, const std::string& param) {
  if (!calls.is_array()) throw invalid(param, "'" + param + "' must be an array");
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const std::string at = param + "[" + std::to_string(i) + "]";
    const json& call = calls[i];
    if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
      throw invalid(at,
                    "'" + at + "' must be {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}");
    const json& function = call["function"];
    if (!function.contains("name") || !function["name"].is_string())
      throw invalid(at + ".function.name", "'" + at + ".function.name' must be a string");
    if (function.contains("arguments") && !function["arguments"].is_string() && !function["arguments"].is_object())
      throw invalid(at + ".function.arguments", "'" + at + ".function.arguments' must be a JSON string");
    if (call.contains("type") && call["type"] != "function")
      throw invalid(at + ".type", "'" + at + ".type' must be \"function\"");
  }
  return calls.dump();
}

// The "tools" array: each {"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}.
// Read from the body as an ordered object, so that the template renders each tool's keys as the client wrote
// them (as Python's json keeps them for transformers).
void parse_tools(const nlohmann::ordered_json& object, ChatCompletionRequest& request) {
  auto tools = object.find("tools");
  if (tools == object.end() || tools->is_null() || (tools->is_array() && tools->empty())) return;
  if (!tools->is_array()) throw invalid("tools", "'tools' must be an array");
  for (std::size_t i = 0; i < tools->size(); ++i) {
    const std::string at = "tools[" + std::to_string(i) + "]";
    const auto& tool = (*tools)[i];
    if (!tool.is_object() || tool.value("type", "") != "function" || !tool.contains("function") ||
        !tool["function"].is_object())
      throw invalid(at, "'" + at + "' must be {\"type\": \"function\", \"function\": {...}}");
    const auto& function = tool["function"];
    if (!function.contains("name") || !function["name"].is_string() || function["name"].get<std::string>().empty())
      throw invalid(at + ".function.name", "'" + at + ".function.name' must be a non-empty string");
    if (function.contains("parameters") && !function["parameters"].is_object())
      throw invalid(at + ".function.parameters", "'" + at + ".function.parameters' must be a JSON schema object");
    for (auto it = function.begin(); it != function.end(); ++it)
      if (it.key() != "name" && it.key() != "description" && it.key() != "parameters" && it.key() != "strict")
        throw ApiError(400, "'" + at + ".function." + it.key() + "' is not supported", "invalid_request_error",
                       at + ".function." + it.key(), "unknown_field");
  }
  request.tools_json = tools->dump();
}

void parse_tool_choice(const json& object, ChatCompletionRequest& request) {
  auto choice = object.find("tool_choice");
  if (choice == object.end() || choice->is_null()) {
    request.tool_choice = ToolChoice::Auto;
    return;
  }
  const auto tool_names = [&] {
    std::vector<std::string> names;
    if (!request.tools_json.empty())
      for (const json& tool : json::parse(request.tools_json)) names.push_back(tool["function"]["name"]);
    return names;
  };
  if (choice->is_string()) {
    const std::string value = choice->get<std::string>();
    if (value == "auto" || value == "none" || value == "required") {
      request.tool_choice = value == "auto"   ? ToolChoice::Auto
                            : value == "none" ? ToolChoice::None
                                              : ToolChoice::Required;
      if (request.tool_choice == ToolChoice::Required && request.tools_json.empty())
        throw invalid("tool_choice", "'tool_choice' \"required\" needs 'tools'");
      return;
    }
    throw invalid("tool_choice",
                  "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", ...}");
  }
  if (choice->is_object() && choice->value("type", "") == "function" && choice->contains("function") &&
      (*choice)["function"].is_object() && (*choice)["function"].contains("name") &&
      (*choice)["function"]["name"].is_string()) {
    const std::string name = (*choice)["function"]["name"];
    const std::vector<std::string> names = tool_names();
    if (std::find(names.begin(), names.end(), name) == names.end())
      throw invalid("tool_choice", "'tool_choice' names the function '" + name + "', which is not in 'tools'");
    request.tool_choice = ToolChoice::Function;
    request.tool_choice_function = name;
    return;
  }
  throw invalid("tool_choice",
                "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": "
                "{\"name\": ...}}");
}

// response_format: text (free), json_object (any JSON object) or json_schema (a value valid against its schema).
void parse_response_format(const nlohmann::ordered_json& object, SamplingRequest& request) {
  auto format = object.find("response_format");
  if (format == object.end() || format->is_null()) return;
  if (!format->is_object() || !format->contains("type") || !(*format)["type"].is_string())
    throw invalid("response_format",
                  "'response_format' must be {\"type\": \"text\" | \"json_object\" | \"json_schema\"}");
  const std::string type = (*format)["type"];
  if (type == "text") return;
  if (type == "json_object") {
    request.grammar = std::make_shared<const JsonGrammar>(any_json_object_grammar());
    return;
  }
  if (type != "json_schema")
    throw invalid("response_format.type",
                  "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"");
  const auto spec = format->find("json_schema");
  if (spec == format->end() || !spec->is_object())
    throw invalid("response_format.json_schema", "'response_format.json_schema' must be an object with a 'schema'");
  const auto schema = spec->find("schema");
  if (schema == spec->end())
    throw invalid("response_format.json_schema.schema", "'response_format.json_schema.schema' is missing");
  try {
    request.grammar = std::make_shared<const JsonGrammar>(compile_json_schema(*schema));
  } catch (const SchemaError& error) {
    throw ApiError(400, std::string("'response_format.json_schema.schema' cannot constrain the reply: ") + error.what(),
                   "invalid_request_error", "response_format.json_schema.schema", "invalid_schema");
  }
}

}  // namespace

ChatCompletionRequest parse_chat_completion_request(const std::string& body) {
  const json object = parse_object(body);
  ChatCompletionRequest request;
  request.sampling = parse_sampling(object);
  check_fields(object, chat_fields());
  // logprobs: true asks for them; top_logprobs (0 to 20) adds the most likely tokens and needs it.
  const json* logprobs = field(object, "logprobs", &json::is_boolean, "a boolean");
  const json* top = field(object, "top_logprobs", &json::is_number_integer, "an integer");
  if (top && (top->get<std::int64_t>() < 0 || top->get<std::int64_t>() > kMaxTopLogprobs))
    throw invalid("top_logprobs", "'top_logprobs' must be between 0 and " + std::to_string(kMaxTopLogprobs));
  if (top && !(logprobs && logprobs->get<bool>()))
    throw invalid("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  if (logprobs && logprobs->get<bool>()) request.sampling.top_logprobs = top ? top->get<int>() : 0;
  const json* messages = field(object, "messages", &json::is_array, "an array");
  if (!messages || messages->empty()) throw invalid("messages", "'messages' must be a non-empty array");
  for (std::size_t i = 0; i < messages->size(); ++i) {
    const json& message = (*messages)[i];
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!message.is_object()) throw invalid(param, "'" + param + "' must be an object");
    check_message_fields(message, param);
    const json* role = field(message, "role", &json::is_string, "a string");
    static const std::vector<std::string> kRoles = {"system", "developer", "user", "assistant", "tool"};
    if (!role || std::find(kRoles.begin(), kRoles.end(), role->get<std::string>()) == kRoles.end())
      throw invalid(param + ".role", "'" + param + ".role' must be system, developer, user, assistant or tool");
    // A template knows system, user and assistant; OpenAI's newer "developer" is the system prompt.
    const std::string name = role->get<std::string>() == "developer" ? "system" : role->get<std::string>();
    ChatMessage chat_message{name, message_content(message, i)};
    if (const auto calls = message.find("tool_calls"); calls != message.end() && !asks_for_nothing(*calls))
      chat_message.tool_calls = message_tool_calls(*calls, param + ".tool_calls");
    if (name == "tool") {
      const json* call_id = field(message, "tool_call_id", &json::is_string, "a string");
      if (!call_id) throw invalid(param + ".tool_call_id", "'" + param + ".tool_call_id' is missing");
      chat_message.tool_call_id = call_id->get<std::string>();
      if (const json* tool_name = field(message, "name", &json::is_string, "a string"))
        chat_message.name = tool_name->get<std::string>();
    }
    request.messages.push_back(std::move(chat_message));
  }
  // Tools and schemas keep the client's key order (the template renders them; properties come in that order).
  if (object.contains("tools") || object.contains("response_format")) {
    const auto ordered = nlohmann::ordered_json::parse(body);
    parse_tools(ordered, request);
    parse_response_format(ordered, request.sampling);
  }
  parse_tool_choice(object, request);
  if (const json* parallel = field(object, "parallel_tool_calls", &json::is_boolean, "a boolean"))
    request.parallel_tool_calls = parallel->get<bool>();
  if (request.sampling.grammar && request.tool_choice != ToolChoice::None && !request.tools_json.empty() &&
      request.tool_choice != ToolChoice::Auto)
    throw invalid("response_format", "'response_format' and a required tool call cannot both shape the reply");
  return request;
}

CompletionRequest parse_completion_request(const std::string& body) {
  const json object = parse_object(body);
  CompletionRequest request;
  request.sampling = parse_sampling(object);
  check_fields(object, completion_fields());
  // logprobs N: the chosen tokens' and the N most likely tokens' (0 to 20; null: none).
  if (const json* logprobs = field(object, "logprobs", &json::is_number_integer, "an integer")) {
    if (logprobs->get<std::int64_t>() < 0 || logprobs->get<std::int64_t>() > kMaxTopLogprobs)
      throw invalid("logprobs", "'logprobs' must be between 0 and " + std::to_string(kMaxTopLogprobs));
    request.sampling.top_logprobs = logprobs->get<int>();
  }
  // A string, an array of one string, an array of token ids, or an array of one such array.
  const char* kPromptForms =
      "'prompt' must be a non-empty string, an array of token ids, or an array holding one of "
      "those (one prompt per request)";
  auto it = object.find("prompt");
  if (it == object.end() || it->is_null()) throw invalid("prompt", kPromptForms);
  json prompt = *it;
  const auto is_token_ids = [](const json& value) {
    return value.is_array() && !value.empty() &&
           std::all_of(value.begin(), value.end(), [](const json& id) { return id.is_number_integer(); });
  };
  if (prompt.is_array() && prompt.size() == 1 && (prompt[0].is_string() || prompt[0].is_array()))
    prompt = json(prompt[0]);
  else if (prompt.is_array() && prompt.size() > 1 && !is_token_ids(prompt))
    throw invalid("prompt", "'prompt' holds " + std::to_string(prompt.size()) +
                                " prompts; this server answers one prompt per request");
  if (prompt.is_string() && !prompt.get<std::string>().empty()) {
    request.prompt = prompt.get<std::string>();
  } else if (is_token_ids(prompt)) {
    for (const json& id : prompt) {
      if (id.get<std::int64_t>() < 0 || id.get<std::int64_t>() > std::numeric_limits<TokenId>::max())
        throw invalid("prompt", "'prompt' token id " + id.dump() + " is outside the vocabulary");
      request.prompt_token_ids.push_back(static_cast<TokenId>(id.get<std::int64_t>()));
    }
  } else {
    throw invalid("prompt", kPromptForms);
  }
  return request;
}

json usage_json(const GenerationStats& stats) {
  return json{{"prompt_tokens", stats.prompt_tokens},
              {"completion_tokens", stats.generated_tokens},
              {"total_tokens", stats.prompt_tokens + stats.generated_tokens},
              {"prompt_tokens_details", {{"cached_tokens", stats.reused_tokens}}}};
}

json timings_json(const GenerationStats& stats) {
  return json{{"prompt_tokens", stats.prompt_tokens},
              {"cached_tokens", stats.reused_tokens},
              {"restored_tokens", stats.restored_tokens},
              {"prefilled_tokens", stats.prefilled_tokens},
              {"ttft_ms", stats.ttft_ms},
              {"prefill_tokens_per_second", stats.prefill_tokens_per_second},
              {"decode_tokens_per_second", stats.decode_tokens_per_second},
              {"completion_tokens", stats.generated_tokens}};
}

std::string finish_reason(StopReason reason, bool stop_text_matched) {
  if (stop_text_matched || reason == StopReason::Eos) return "stop";
  if (reason == StopReason::Stopped) return kFinishInterrupted;
  return "length";
}

namespace {

json text_bytes(const std::string& text) {
  json bytes = json::array();
  for (unsigned char byte : text) bytes.push_back(static_cast<int>(byte));
  return bytes;
}

json chat_logprob(const LogprobToken& token) {
  return json{{"token", token.text}, {"logprob", token.logprob}, {"bytes", text_bytes(token.text)}};
}

}  // namespace

json chat_logprobs_json(const std::vector<LogprobEntry>& entries) {
  json content = json::array();
  for (const LogprobEntry& entry : entries) {
    json item = chat_logprob(entry.chosen);
    item["top_logprobs"] = json::array();
    for (const LogprobToken& top : entry.top) item["top_logprobs"].push_back(chat_logprob(top));
    content.push_back(std::move(item));
  }
  return json{{"content", std::move(content)}, {"refusal", nullptr}};
}

json completion_logprobs_json(const std::vector<LogprobEntry>& entries) {
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(), offsets = json::array();
  for (const LogprobEntry& entry : entries) {
    tokens.push_back(entry.chosen.text);
    token_logprobs.push_back(entry.chosen.logprob);
    json top = json::object();
    for (const LogprobToken& candidate : entry.top)
      if (!top.contains(candidate.text)) top[candidate.text] = candidate.logprob;  // texts may repeat
    top_logprobs.push_back(std::move(top));
    offsets.push_back(entry.text_offset);
  }
  return json{{"tokens", std::move(tokens)},
              {"token_logprobs", std::move(token_logprobs)},
              {"top_logprobs", std::move(top_logprobs)},
              {"text_offset", std::move(offsets)}};
}

namespace {

json tool_calls_json(const std::vector<ToolCall>& calls, bool with_index) {
  json list = json::array();
  for (std::size_t i = 0; i < calls.size(); ++i) {
    json call = {{"id", calls[i].id},
                 {"type", "function"},
                 {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (with_index) call["index"] = i;
    list.push_back(std::move(call));
  }
  return list;
}

}  // namespace

JsonGrammar required_tool_call_grammar(const ChatCompletionRequest& request, ToolCallFormat format) {
  using ordered = nlohmann::ordered_json;
  const ordered tools = ordered::parse(request.tools_json);
  // The call object of each tool that may be called: {"name": its name, <arguments key>: its parameters}.
  const char* arguments_key = format == ToolCallFormat::Llama3Json ? "parameters" : "arguments";
  ordered calls = ordered::array();
  // Each such tool's parameters alone, with its name: where the name is outside the JSON (functionary), a
  // branch of the grammar.
  std::vector<std::pair<std::string, JsonGrammar>> parameters_of;
  for (std::size_t i = 0; i < tools.size(); ++i) {
    const ordered& function = tools[i]["function"];
    const std::string name = function["name"];
    if (request.tool_choice == ToolChoice::Function && name != request.tool_choice_function) continue;
    ordered parameters = function.contains("parameters") ? function["parameters"] : ordered{{"type", "object"}};
    try {
      parameters_of.emplace_back(name, compile_json_schema(parameters));
    } catch (const SchemaError& error) {
      const std::string param = "tools[" + std::to_string(i) + "].function.parameters";
      throw ApiError(400, "'" + param + "' cannot constrain a required tool call: " + error.what(),
                     "invalid_request_error", param, "invalid_schema");
    }
    calls.push_back({{"type", "object"},
                     {"properties", {{"name", {{"const", name}}}, {arguments_key, parameters}}},
                     {"required", {"name", arguments_key}},
                     {"additionalProperties", false}});
  }
  // The matcher follows at most kMaxThreads paths at once: a call among more functions than that would leave some
  // of them never callable, so the request is refused instead.
  if (calls.size() > static_cast<std::size_t>(JsonMatcher::kMaxThreads))
    throw ApiError(400,
                   "'tools': a required call can choose among at most " + std::to_string(JsonMatcher::kMaxThreads) +
                       " functions; this request offers " + std::to_string(calls.size()),
                   "invalid_request_error", "tools", "unsupported_value");
  JsonGrammar grammar;
  const auto refuse = [&](const std::string& why) {
    return ApiError(400,
                    "'tool_choice' cannot force a call with this model's chat template (" +
                        std::string(to_string(format)) + " tool calls): " + why,
                    "invalid_request_error", "tool_choice", "unsupported_value");
  };
  switch (format) {
    case ToolCallFormat::Hermes:
      grammar = compile_json_schema(calls.size() == 1 ? calls[0] : ordered{{"anyOf", calls}});
      grammar.prefix = "<tool_call>\n";
      grammar.suffix = "\n</tool_call>";
      break;
    case ToolCallFormat::Llama3Json:
      grammar = compile_json_schema(calls.size() == 1 ? calls[0] : ordered{{"anyOf", calls}});
      break;
    case ToolCallFormat::FireFunction:
      grammar = compile_json_schema(calls.size() == 1 ? calls[0] : ordered{{"anyOf", calls}});
      grammar.prefix = " functools[";
      grammar.suffix = "]";
      break;
    case ToolCallFormat::Functionary: {
      // <function=NAME>{arguments}</function>: the name is outside the JSON, so each function is a branch of
      // its own, its markup literal around its parameters.
      std::vector<JsonGrammar> branches;
      for (auto& [name, branch] : parameters_of) {
        branch.prefix = "<function=" + name + ">";
        branch.suffix = "</function>";
        branches.push_back(std::move(branch));
      }
      grammar = join_grammars(branches);
      break;
    }
    case ToolCallFormat::Mistral:
      throw refuse("its calls start with the control token [TOOL_CALLS], which constrained decoding does not write");
    case ToolCallFormat::None: throw refuse("the template renders no tool calls");
  }
  return grammar;
}

json chat_completion_response(const std::string& id, std::int64_t created, const std::string& model,
                              const CompletionResult& result) {
  json message = {{"role", "assistant"}, {"content", result.text}};
  if (!result.tool_calls.empty()) {
    message["tool_calls"] = tool_calls_json(result.tool_calls, false);
    if (result.text.empty()) message["content"] = nullptr;
  }
  json choice = {{"index", 0},
                 {"message", message},
                 {"logprobs", result.has_logprobs ? chat_logprobs_json(result.logprobs) : json(nullptr)},
                 {"finish_reason", result.finish_reason}};
  return json{{"id", id},
              {"object", "chat.completion"},
              {"created", created},
              {"model", model},
              {"choices", json::array({choice})},
              {"usage", usage_json(result.stats)},
              {"timings", timings_json(result.stats)}};
}

json completion_response(const std::string& id, std::int64_t created, const std::string& model,
                         const CompletionResult& result) {
  json choice = {{"index", 0},
                 {"text", result.text},
                 {"logprobs", result.has_logprobs ? completion_logprobs_json(result.logprobs) : json(nullptr)},
                 {"finish_reason", result.finish_reason}};
  return json{{"id", id},
              {"object", "text_completion"},
              {"created", created},
              {"model", model},
              {"choices", json::array({choice})},
              {"usage", usage_json(result.stats)},
              {"timings", timings_json(result.stats)}};
}

json chat_chunk(const ChunkIdentity& identity, const std::string& text, bool delta_role,
                const std::optional<std::string>& finish, const std::vector<LogprobEntry>* logprobs) {
  json delta = json::object();
  if (delta_role) delta["role"] = "assistant";
  if (!text.empty() || delta_role) delta["content"] = text;
  json choice = {{"index", 0},
                 {"delta", delta},
                 {"logprobs", logprobs ? chat_logprobs_json(*logprobs) : json(nullptr)},
                 {"finish_reason", nullptr}};
  if (finish) choice["finish_reason"] = *finish;
  return json{{"id", identity.id},
              {"object", "chat.completion.chunk"},
              {"created", identity.created},
              {"model", identity.model},
              {"choices", json::array({choice})}};
}

json chat_tool_calls_chunk(const ChunkIdentity& identity, const std::vector<ToolCall>& calls) {
  json choice = {{"index", 0},
                 {"delta", {{"tool_calls", tool_calls_json(calls, true)}}},
                 {"logprobs", nullptr},
                 {"finish_reason", nullptr}};
  return json{{"id", identity.id},
              {"object", "chat.completion.chunk"},
              {"created", identity.created},
              {"model", identity.model},
              {"choices", json::array({choice})}};
}

json completion_chunk(const ChunkIdentity& identity, const std::string& text, const std::optional<std::string>& finish,
                      const std::vector<LogprobEntry>* logprobs) {
  json choice = {{"index", 0},
                 {"text", text},
                 {"logprobs", logprobs ? completion_logprobs_json(*logprobs) : json(nullptr)},
                 {"finish_reason", nullptr}};
  if (finish) choice["finish_reason"] = *finish;
  return json{{"id", identity.id},
              {"object", "text_completion"},
              {"created", identity.created},
              {"model", identity.model},
              {"choices", json::array({choice})}};
}

json usage_chunk(const ChunkIdentity& identity, const std::string& object, const GenerationStats& stats) {
  return json{{"id", identity.id},
              {"object", object},
              {"created", identity.created},
              {"model", identity.model},
              {"choices", json::array()},
              {"usage", usage_json(stats)},
              {"timings", timings_json(stats)}};
}

std::string sse_event(const json& payload) {
  // Invalid UTF-8 would make dump() throw; the decoder never emits it, but a client must never get half a line.
  return "data: " + payload.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

}  // namespace kvchat::app::openai
