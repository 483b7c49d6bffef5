#include "app/remote/remote_client.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <thread>

#include "app/remote/remote_stream.h"
#include "app/server/broken_pipe.h"

namespace kvchat::app {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// An error answer is read up to this size (its message is all that is shown of it).
constexpr std::size_t kMaxErrorBodyBytes = 64 * 1024;
// A /models answer: thousands of models fit many times over.
constexpr std::size_t kMaxModelListBytes = 8 << 20;
// A /models question is a quick one: its first byte within the first time, the whole answer within the second.
constexpr int kModelListIdleSeconds = 30;
constexpr int kModelListTimeoutSeconds = 60;

// The server, split for httplib: "https://host:port" and the path prefix ("/v1", no trailing slash).
struct ServerAddress {
  std::string scheme_host_port;
  std::string path_prefix;
};

const std::regex& base_url_pattern() {
  static const std::regex pattern(R"(^(https?://)([^/\s?#]+)(/[^\s?#]*)?$)", std::regex::icase);
  return pattern;
}

ServerAddress parse_base_url(const std::string& base_url) {
  std::smatch match;
  if (!std::regex_match(base_url, match, base_url_pattern()))
    throw RemoteError("the server address '" + displayed_base_url(base_url) +
                      "' is not a base URL: it must look like http://host:port/v1 (or https://...)");
  if (match[2].str().find('@') != std::string::npos)
    throw RemoteError("the server address '" + displayed_base_url(base_url) +
                      "' has credentials in it (user:password@): they would be shown and stored with every reply. "
                      "Give the key as the API key instead (Settings > Backend, --api-key or KVCHAT_API_KEY)");
  std::string prefix = match[3].str();
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  return {match[1].str() + match[2].str(), prefix};
}

int clamped_seconds(int seconds, int fallback) { return seconds > 0 ? std::min(seconds, 7 * 24 * 3600) : fallback; }

httplib::Client make_client(const ServerAddress& address, const RemoteEndpoint& endpoint) {
  ignore_broken_pipe_signals();  // a server gone while the request is sent: an error, not the end of the app
  httplib::Client client(address.scheme_host_port);
  client.set_connection_timeout(10, 0);
  // The idle timeout is watched by RequestWatch; the socket's own read timeout only backs it up.
  client.set_read_timeout(clamped_seconds(endpoint.idle_timeout_s, RemoteEndpoint::kDefaultIdleTimeoutSeconds) + 5, 0);
  client.set_write_timeout(60, 0);
  if (!endpoint.api_key.empty()) client.set_bearer_token_auth(endpoint.api_key.c_str());
  return client;
}

std::string transport_failure(httplib::Error error) {
  switch (error) {
    case httplib::Error::Connection: return "connection refused (is the server running, on that port?)";
    case httplib::Error::ConnectionTimeout: return "the connection timed out";
    case httplib::Error::SSLConnection: return "the TLS handshake failed";
    case httplib::Error::SSLServerVerification: return "its TLS certificate could not be verified";
    case httplib::Error::Read: return "the connection was closed while reading the answer";
    case httplib::Error::Write: return "the connection was closed while sending the request";
    default: return "the request failed (" + httplib::to_string(error) + ")";
  }
}

[[noreturn]] void throw_status(const std::string& base_url, int status, const std::string& body,
                               const std::string& model) {
  const std::string message = server_message(body);
  if (status == 401 || status == 403)
    throw RemoteError("the server at " + base_url + " refused the API key (" + std::to_string(status) +
                      "): " + message + ". Set the right key in Settings > Backend, --api-key or KVCHAT_API_KEY");
  if (status == 404)
    throw RemoteError("the server at " + base_url + " answered 404" +
                      (model.empty() ? std::string() : " for model '" + model + "'") + ": " + message +
                      ". Check the model name (its /v1/models lists them) and that the base URL ends with /v1");
  throw RemoteError("the server at " + base_url + " answered " + std::to_string(status) + ": " + message);
}

// The fields of request_body's extensions: what a server that refuses unknown fields names in its error.
constexpr const char* kExtensionFields[] = {"top_k", "min_p", "repetition_penalty", "repeat_penalty", "repeat_last_n"};

// The servers (by base URL) that refused the extensions in this process: they are not sent them again.
std::mutex refused_extensions_mutex;
std::set<std::string>& servers_refusing_extensions() {
  static std::set<std::string> servers;
  return servers;
}

bool server_refuses_extensions(const std::string& base_url) {
  std::lock_guard<std::mutex> lock(refused_extensions_mutex);
  return servers_refusing_extensions().count(base_url) != 0;
}

// The settings the extensions carry that are not at their "off" value, as the settings dialog names them.
std::string active_extensions(const GenerationConfig& generation) {
  const SamplingParams& sampling = generation.sampling;
  std::vector<std::string> names;
  if (sampling.temperature > 0 && sampling.top_k > 0) names.push_back("top-k");
  if (sampling.temperature > 0 && sampling.min_p > 0.0f) names.push_back("min-p");
  if (sampling.repetition_penalty != 1.0f) names.push_back("repetition penalty");
  std::string joined;
  for (const std::string& name : names) joined += (joined.empty() ? "" : ", ") + name;
  return joined;
}

// A 400 (or a schema's 422) whose message names one of the extension fields: the server does not take them.
bool refuses_an_extension(int status, const std::string& error_body) {
  if (status != 400 && status != 422) return false;
  return std::any_of(std::begin(kExtensionFields), std::end(kExtensionFields),
                     [&](const char* field) { return error_body.find(field) != std::string::npos; });
}

// Ends a request from another thread (httplib's Client::stop closes its socket, made for that) when the stop
// flag is set, when nothing has arrived for the idle timeout, or when the request has taken longer than the
// total timeout: a blocking read would otherwise wait as long as the server likes, and only Stop would end it.
class RequestWatch {
 public:
  enum class Reason { None, Stopped, Idle, Total };

  RequestWatch(httplib::Client& client, const std::atomic<bool>* stop, int idle_seconds, int total_seconds)
      : client_(client),
        stop_(stop),
        idle_(std::chrono::seconds(idle_seconds)),
        deadline_(Clock::now() + std::chrono::seconds(total_seconds)) {
    arrived();
    thread_ = std::thread([this] { run(); });
  }
  ~RequestWatch() { finish(); }
  RequestWatch(const RequestWatch&) = delete;
  RequestWatch& operator=(const RequestWatch&) = delete;

  void arrived() { last_arrival_ = Clock::now().time_since_epoch().count(); }
  Reason reason() const { return reason_.load(); }
  void finish() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    changed_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!done_) {
      if (reason_ == Reason::None) {
        const Clock::time_point now = Clock::now();
        if (stop_ && stop_->load())
          reason_ = Reason::Stopped;
        else if (now - Clock::time_point(Clock::duration(last_arrival_.load())) > idle_)
          reason_ = Reason::Idle;
        else if (now > deadline_)
          reason_ = Reason::Total;
      }
      // Again at every tick: a connection still being opened at the first call is closed at the next.
      if (reason_ != Reason::None) client_.stop();
      changed_.wait_for(lock, std::chrono::milliseconds(50));
    }
  }

  httplib::Client& client_;
  const std::atomic<bool>* stop_;
  const Clock::duration idle_;
  const Clock::time_point deadline_;
  std::atomic<Clock::rep> last_arrival_{0};
  std::atomic<Reason> reason_{Reason::None};
  std::mutex mutex_;
  std::condition_variable changed_;
  bool done_ = false;
  std::thread thread_;
};

// The response's status into `status`; its arrival counts as progress for `watch`.
void take_status(httplib::Request& request, RequestWatch& watch, int& status) {
  request.response_handler = [&watch, &status](const httplib::Response& response) {
    status = response.status;
    watch.arrived();
    return true;
  };
}

std::vector<std::string> list_models(const RemoteEndpoint& endpoint) {
  const ServerAddress address = parse_base_url(endpoint.base_url);
  httplib::Client client = make_client(address, endpoint);
  client.set_read_timeout(kModelListIdleSeconds, 0);
  httplib::Request request;
  request.method = "GET";
  request.path = address.path_prefix + "/models";
  int status = 0;
  std::string body;
  bool too_long = false;
  RequestWatch watch(client, nullptr, kModelListIdleSeconds, kModelListTimeoutSeconds);
  take_status(request, watch, status);
  request.content_receiver = [&](const char* data, std::size_t length, std::uint64_t, std::uint64_t) {
    watch.arrived();
    const std::size_t cap = status == 200 ? kMaxModelListBytes : kMaxErrorBodyBytes;
    body.append(data, std::min(length, cap - body.size()));
    too_long = body.size() >= cap;
    return !too_long;
  };
  const httplib::Result result = client.send(request);
  watch.finish();
  if (watch.reason() == RequestWatch::Reason::Idle || watch.reason() == RequestWatch::Reason::Total) {
    const int waited = watch.reason() == RequestWatch::Reason::Idle ? kModelListIdleSeconds : kModelListTimeoutSeconds;
    throw RemoteError("the server at " + endpoint.base_url + " did not answer /models within " +
                      std::to_string(waited) + " s");
  }
  if (!result && status == 0)
    throw RemoteError("cannot reach " + endpoint.base_url + ": " + transport_failure(result.error()));
  if (status != 200) throw_status(endpoint.base_url, status, body, "");
  if (too_long)
    throw RemoteError("the server at " + endpoint.base_url + " answered /models with more than " +
                      std::to_string(kMaxModelListBytes >> 20) + " MiB");
  std::string problem;
  const json parsed = parse_server_json(body, &problem);
  if (parsed.is_discarded())
    throw RemoteError("the server at " + endpoint.base_url + " answered /models with " +
                      (problem == "not JSON" ? "something other than JSON: " + server_message(body) : problem));
  if (!parsed.is_object() || !parsed.contains("data") || !parsed["data"].is_array())
    throw RemoteError("the server at " + endpoint.base_url +
                      " answered /models without a \"data\" list: " + server_message(body));
  std::vector<std::string> models;
  for (const json& entry : parsed["data"])
    if (entry.is_object() && entry.contains("id") && entry["id"].is_string())
      models.push_back(entry["id"].get<std::string>());
  return models;
}

double milliseconds(Clock::duration duration) { return std::chrono::duration<double, std::milli>(duration).count(); }

// What the client measured, where the server reported nothing better.
void fill_client_figures(RemoteReply& reply, const ServerEventStream& parser, Clock::time_point started) {
  GenerationStats& stats = reply.stats;
  if (!reply.usage_reported) stats.generated_tokens = parser.chunks();  // one chunk per token on the servers known
  stats.reused_tokens = reply.cached_tokens.value_or(0);
  stats.prefilled_tokens = std::max(0, stats.prompt_tokens - stats.reused_tokens);
  stats.cache_mode = KvCacheMode::Contiguous;
  if (reply.server_timings || parser.chunks() == 0) return;
  stats.ttft_ms = milliseconds(parser.first_chunk_at() - started);
  stats.decode_ms = milliseconds(parser.last_chunk_at() - parser.first_chunk_at());
  if (stats.decode_ms > 0 && stats.generated_tokens > 1)
    stats.decode_tokens_per_second = (stats.generated_tokens - 1) * 1000.0 / stats.decode_ms;
}

RemoteReply stream_reply(const RemoteEndpoint& endpoint, const std::vector<ChatMessage>& messages,
                         const GenerationConfig& generation, const std::atomic<bool>* stop,
                         const RemoteChunkCallback& on_chunk, const std::string& response_format) {
  const ServerAddress address = parse_base_url(endpoint.base_url);
  RemoteReply reply;
  reply.model = endpoint.model;
  if (reply.model.empty()) {
    const std::vector<std::string> models = list_models(endpoint);
    if (models.empty()) throw RemoteError("the server at " + endpoint.base_url + " lists no models (/models is empty)");
    reply.model = models.front();
  }
  const std::string model = reply.model;
  const int idle_seconds = clamped_seconds(endpoint.idle_timeout_s, RemoteEndpoint::kDefaultIdleTimeoutSeconds);
  const int total_seconds = clamped_seconds(endpoint.total_timeout_s, RemoteEndpoint::kDefaultTotalTimeoutSeconds);
  ServerEventStream parser(reply, on_chunk, ReplyLimits::for_max_tokens(generation.max_new_tokens));
  bool extensions = !server_refuses_extensions(endpoint.base_url);
  Clock::time_point started;
  int status = 0;
  bool stopped = false;
  std::optional<httplib::Error> transport_error;  // the last request's, when it ended without a whole answer
  RequestWatch::Reason ended_by = RequestWatch::Reason::None;
  // At most twice: once more without the sampling extensions when the server refuses them (nothing has been
  // streamed then: the parser is still untouched).
  while (true) {
    httplib::Client client = make_client(address, endpoint);
    httplib::Request request;
    request.method = "POST";
    request.path = address.path_prefix + "/chat/completions";
    request.body = chat_request_body(model, messages, generation, extensions, response_format);
    request.set_header("Content-Type", "application/json");
    request.set_header("Accept", "text/event-stream");
    if (!endpoint.api_key.empty()) request.set_header("Authorization", "Bearer " + endpoint.api_key);

    started = Clock::now();
    status = 0;
    std::string error_body;
    RequestWatch watch(client, stop, idle_seconds, total_seconds);
    take_status(request, watch, status);
    // Bytes arrive here after decompression: the parser's bound on the stream also bounds a compressed bomb.
    request.content_receiver = [&](const char* data, std::size_t length, std::uint64_t, std::uint64_t) {
      watch.arrived();
      if (status != 200) {
        error_body.append(data, std::min(length, kMaxErrorBodyBytes - error_body.size()));
        return error_body.size() < kMaxErrorBodyBytes;
      }
      // What arrived before Stop is kept; returning false closes the connection: the server sees the client go
      // and stops generating.
      const bool more = parser.feed(data, length);
      if (stop && stop->load()) stopped = true;
      return more && !stopped && watch.reason() == RequestWatch::Reason::None;
    };
    spdlog::info("remote turn: {} messages to {} (model {})", messages.size(), endpoint.base_url, model);
    const httplib::Result result = client.send(request);
    watch.finish();
    ended_by = watch.reason();
    transport_error = result ? std::nullopt : std::optional<httplib::Error>(result.error());
    if (!result && status == 0 && ended_by == RequestWatch::Reason::None)
      throw RemoteError("cannot reach " + endpoint.base_url + ": " + transport_failure(result.error()));
    if (extensions && refuses_an_extension(status, error_body) && ended_by == RequestWatch::Reason::None) {
      spdlog::warn(
          "the server at {} refused a sampling field ({}): asking again without top_k, min_p and the "
          "repetition penalty, which it will not be sent again",
          endpoint.base_url, server_message(error_body));
      {
        std::lock_guard<std::mutex> lock(refused_extensions_mutex);
        servers_refusing_extensions().insert(endpoint.base_url);
      }
      extensions = false;
      continue;
    }
    if (status != 200 && status != 0) throw_status(endpoint.base_url, status, error_body, model);
    break;
  }
  if (!extensions) reply.unsent_settings = active_extensions(generation);
  reply.model = reply.model.empty() ? model : reply.model;
  fill_client_figures(reply, parser, started);
  if ((stopped || ended_by == RequestWatch::Reason::Stopped) && parser.failure().empty() && !parser.done()) {
    reply.stats.stop_reason = StopReason::Stopped;
    return reply;
  }
  if (!parser.stream_error().empty() && reply.text.empty())
    throw RemoteError("the server at " + endpoint.base_url + " reported an error: " + parser.stream_error());
  if (parser.done()) return reply;
  // Why the client ended the reply before the server said it was complete (a bound, a timeout).
  std::string ended;
  if (!parser.failure().empty())
    ended = parser.failure();
  else if (ended_by == RequestWatch::Reason::Idle)
    ended = "it sent nothing for " + std::to_string(idle_seconds) +
            " s (the idle timeout: Settings > Backend, --idle-timeout)";
  else if (ended_by == RequestWatch::Reason::Total)
    ended = "the reply took longer than " + std::to_string(total_seconds) +
            " s (the reply timeout: Settings > Backend, --reply-timeout)";
  if (ended.empty() && parser.finished()) return reply;
  if (!ended.empty()) {
    if (reply.text.empty())
      throw RemoteError("the server at " + endpoint.base_url + (status == 0 ? " did not answer: " : " sent no text: ") +
                        ended);
    reply.interruption = "the reply from " + endpoint.base_url + " was ended: " + ended +
                         ". The text so far is kept; Regenerate to ask again";
  } else {
    const std::string why = transport_error ? transport_failure(*transport_error) : "the stream ended without [DONE]";
    if (reply.text.empty())
      throw RemoteError("the server at " + endpoint.base_url + " broke off before replying: " + why);
    reply.interruption = "the connection to " + endpoint.base_url + " broke off mid-reply (" + why +
                         "): the reply is cut short; Regenerate to ask again";
  }
  reply.stats.stop_reason = StopReason::Stopped;
  spdlog::warn("remote turn cut short after {} chunks: {}", parser.chunks(), reply.interruption);
  return reply;
}

}  // namespace

void check_base_url(const std::string& base_url) { parse_base_url(base_url); }

std::uint64_t remote_seed(std::uint64_t seed) { return seed & kMaxRemoteSeed; }

std::string chat_request_body(const std::string& model, const std::vector<ChatMessage>& messages,
                              const GenerationConfig& generation, bool sampling_extensions,
                              const std::string& response_format) {
  json history = json::array();
  for (const ChatMessage& message : messages) {
    json& entry = history.emplace_back(json{{"role", message.role}, {"content", message.content}});
    // Tool use as the server's template expects it: an assistant's calls, and the call a tool result answers.
    if (!message.tool_calls.empty()) {
      entry["tool_calls"] = json::parse(message.tool_calls, nullptr, false);
      if (entry["tool_calls"].is_discarded())
        entry.erase("tool_calls");
      else if (message.content.empty())
        entry["content"] = nullptr;
    }
    if (!message.tool_call_id.empty()) entry["tool_call_id"] = message.tool_call_id;
    if (!message.name.empty()) entry["name"] = message.name;
  }
  const SamplingParams& sampling = generation.sampling;
  // Ordered: a response format's schema keeps its properties' order, which is the order the reply writes them in.
  nlohmann::ordered_json body{{"model", model},
                              {"messages", std::move(history)},
                              {"stream", true},
                              {"stream_options", {{"include_usage", true}}},
                              {"max_tokens", generation.max_new_tokens},
                              {"temperature", sampling.temperature}};
  if (!response_format.empty()) body["response_format"] = nlohmann::ordered_json::parse(response_format);
  // Greedy (temperature 0) takes the most likely token whatever the filters say: they are left out then.
  const bool sampled = sampling.temperature > 0;
  if (sampled && sampling.top_p < 1.0f) body["top_p"] = sampling.top_p;
  // As a signed 64-bit number: servers (vLLM) refuse larger seeds.
  if (sampling.seed != 0) body["seed"] = static_cast<std::int64_t>(remote_seed(sampling.seed));
  if (!sampling_extensions) return body.dump();
  // Each setting at its "off" value is left out: servers differ in how they spell off (vLLM's top_k -1).
  if (sampled && sampling.top_k > 0) body["top_k"] = sampling.top_k;
  if (sampled && sampling.min_p > 0.0f) body["min_p"] = sampling.min_p;
  if (sampling.repetition_penalty != 1.0f) {
    body["repetition_penalty"] = sampling.repetition_penalty;  // vLLM
    body["repeat_penalty"] = sampling.repetition_penalty;      // llama-server, over the same recent window
    body["repeat_last_n"] = sampling.repetition_window;
  }
  return body.dump();
}

std::string displayed_base_url(const std::string& base_url) {
  static const std::regex credentials(R"(^([A-Za-z][A-Za-z0-9+.-]*://)[^/\s?#]*@)");
  return std::regex_replace(base_url, credentials, "$1***@", std::regex_constants::format_first_only);
}

std::string redact_api_key(std::string text, const RemoteEndpoint& endpoint) {
  const std::string& key = endpoint.api_key;
  if (key.empty()) return text;
  const std::string replacement = "[API key]";
  for (std::size_t at = 0; (at = text.find(key, at)) != std::string::npos; at += replacement.size())
    text.replace(at, key.size(), replacement);
  return text;
}

std::vector<std::string> list_remote_models(const RemoteEndpoint& endpoint) {
  try {
    std::vector<std::string> models = list_models(endpoint);
    for (std::string& model : models) model = redact_api_key(std::move(model), endpoint);
    return models;
  } catch (const RemoteError& error) {
    throw RemoteError(redact_api_key(error.what(), endpoint));
  }
}

RemoteReply stream_remote_chat(const RemoteEndpoint& endpoint, const std::vector<ChatMessage>& messages,
                               const GenerationConfig& generation, const std::atomic<bool>* stop,
                               const RemoteChunkCallback& on_chunk, const std::string& response_format) {
  try {
    RemoteReply reply = stream_reply(endpoint, messages, generation, stop, on_chunk, response_format);
    reply.model = redact_api_key(std::move(reply.model), endpoint);
    reply.interruption = redact_api_key(std::move(reply.interruption), endpoint);
    reply.rejected_figures = redact_api_key(std::move(reply.rejected_figures), endpoint);
    return reply;
  } catch (const RemoteError& error) {
    throw RemoteError(redact_api_key(error.what(), endpoint));
  }
}

}  // namespace kvchat::app
