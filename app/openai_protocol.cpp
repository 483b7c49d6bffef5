#include "app/openai_protocol.h"

#include <algorithm>

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
    throw invalid(name, std::string("'") + name + "' must be between " + json(low).dump() + " and " + json(high).dump());
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
      throw invalid(name, std::string("'") + name + "' must be at most " + std::to_string(kMaxTokens) + ", got " +
                              value->dump());
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
    request.seed = seed->is_number_unsigned() ? seed->get<std::uint64_t>()
                                              : static_cast<std::uint64_t>(seed->get<std::int64_t>());
  request.stop = parse_stop(object);
  if (const json* n = field(object, "n", &json::is_number_integer, "an integer"); n && n->get<std::int64_t>() != 1)
    throw invalid("n", "only n = 1 is supported");
  if (const json* stream = field(object, "stream", &json::is_boolean, "a boolean")) request.stream = stream->get<bool>();
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

}  // namespace

ChatCompletionRequest parse_chat_completion_request(const std::string& body) {
  const json object = parse_object(body);
  ChatCompletionRequest request;
  request.sampling = parse_sampling(object);
  const json* messages = field(object, "messages", &json::is_array, "an array");
  if (!messages || messages->empty()) throw invalid("messages", "'messages' must be a non-empty array");
  for (std::size_t i = 0; i < messages->size(); ++i) {
    const json& message = (*messages)[i];
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!message.is_object()) throw invalid(param, "'" + param + "' must be an object");
    const json* role = field(message, "role", &json::is_string, "a string");
    static const std::vector<std::string> kRoles = {"system", "developer", "user", "assistant"};
    if (!role || std::find(kRoles.begin(), kRoles.end(), role->get<std::string>()) == kRoles.end())
      throw invalid(param + ".role", "'" + param + ".role' must be system, developer, user or assistant");
    // A template knows system, user and assistant; OpenAI's newer "developer" is the system prompt.
    const std::string name = role->get<std::string>() == "developer" ? "system" : role->get<std::string>();
    request.messages.push_back(ChatMessage{name, message_content(message, i)});
  }
  return request;
}

CompletionRequest parse_completion_request(const std::string& body) {
  const json object = parse_object(body);
  CompletionRequest request;
  request.sampling = parse_sampling(object);
  const json* prompt = field(object, "prompt", &json::is_string, "a string");
  if (!prompt || prompt->get<std::string>().empty()) throw invalid("prompt", "'prompt' must be a non-empty string");
  request.prompt = prompt->get<std::string>();
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

json chat_completion_response(const std::string& id, std::int64_t created, const std::string& model,
                              const CompletionResult& result) {
  json choice = {{"index", 0},
                 {"message", {{"role", "assistant"}, {"content", result.text}}},
                 {"logprobs", nullptr},
                 {"finish_reason", result.finish_reason}};
  return json{{"id", id},          {"object", "chat.completion"},          {"created", created},
              {"model", model},    {"choices", json::array({choice})},      {"usage", usage_json(result.stats)},
              {"timings", timings_json(result.stats)}};
}

json completion_response(const std::string& id, std::int64_t created, const std::string& model,
                         const CompletionResult& result) {
  json choice = {{"index", 0}, {"text", result.text}, {"logprobs", nullptr}, {"finish_reason", result.finish_reason}};
  return json{{"id", id},       {"object", "text_completion"},      {"created", created},
              {"model", model}, {"choices", json::array({choice})}, {"usage", usage_json(result.stats)},
              {"timings", timings_json(result.stats)}};
}

json chat_chunk(const ChunkIdentity& identity, const std::string& text, bool delta_role,
                const std::optional<std::string>& finish) {
  json delta = json::object();
  if (delta_role) delta["role"] = "assistant";
  if (!text.empty() || delta_role) delta["content"] = text;
  json choice = {{"index", 0}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  if (finish) choice["finish_reason"] = *finish;
  return json{{"id", identity.id},       {"object", "chat.completion.chunk"}, {"created", identity.created},
              {"model", identity.model}, {"choices", json::array({choice})}};
}

json completion_chunk(const ChunkIdentity& identity, const std::string& text, const std::optional<std::string>& finish) {
  json choice = {{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  if (finish) choice["finish_reason"] = *finish;
  return json{{"id", identity.id},       {"object", "text_completion"},     {"created", identity.created},
              {"model", identity.model}, {"choices", json::array({choice})}};
}

json usage_chunk(const ChunkIdentity& identity, const std::string& object, const GenerationStats& stats) {
  return json{{"id", identity.id},       {"object", object},           {"created", identity.created},
              {"model", identity.model}, {"choices", json::array()},   {"usage", usage_json(stats)},
              {"timings", timings_json(stats)}};
}

std::string sse_event(const json& payload) {
  // Invalid UTF-8 would make dump() throw; the decoder never emits it, but a client must never get half a line.
  return "data: " + payload.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

}  // namespace kvchat::app::openai
