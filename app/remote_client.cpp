#include "app/remote_client.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <nlohmann/json.hpp>
#include <regex>

#include "app/broken_pipe.h"

namespace kvchat::app {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// The server, split for httplib: "https://host:port" and the path prefix ("/v1", no trailing slash).
struct ServerAddress {
  std::string scheme_host_port;
  std::string path_prefix;
};

ServerAddress parse_base_url(const std::string& base_url) {
  static const std::regex pattern(R"(^(https?://[^/\s?#]+)(/[^\s?#]*)?$)", std::regex::icase);
  std::smatch match;
  if (!std::regex_match(base_url, match, pattern))
    throw RemoteError("the server address '" + base_url +
                      "' is not a base URL: it must look like http://host:port/v1 (or https://...)");
  std::string prefix = match[2].str();
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  return {match[1].str(), prefix};
}

httplib::Client make_client(const ServerAddress& address, const RemoteEndpoint& endpoint) {
  ignore_broken_pipe_signals();  // a server gone while the request is sent: an error, not the end of the app
  httplib::Client client(address.scheme_host_port);
  client.set_connection_timeout(10, 0);
  // A large model may think for minutes before its first token; a dead connection is still noticed.
  client.set_read_timeout(600, 0);
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

// The human part of an error body: OpenAI's {"error": {"message"}}, {"error": "..."}, {"detail": ...}, or the text.
std::string server_message(const std::string& body) {
  const json parsed = json::parse(body, nullptr, false);
  if (parsed.is_object()) {
    if (auto error = parsed.find("error"); error != parsed.end()) {
      if (error->is_string()) return error->get<std::string>();
      if (error->is_object() && error->contains("message") && (*error)["message"].is_string())
        return (*error)["message"].get<std::string>();
    }
    if (auto detail = parsed.find("detail"); detail != parsed.end())
      return detail->is_string() ? detail->get<std::string>() : detail->dump();
  }
  std::string text = body.substr(0, 300);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return text.empty() ? "no message" : text;
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

json request_body(const std::string& model, const std::vector<ChatMessage>& messages, const GenerationConfig& generation) {
  json history = json::array();
  for (const ChatMessage& message : messages) history.push_back({{"role", message.role}, {"content", message.content}});
  json body{{"model", model},
            {"messages", std::move(history)},
            {"stream", true},
            {"stream_options", {{"include_usage", true}}},
            {"max_tokens", generation.max_new_tokens},
            {"temperature", generation.sampling.temperature}};
  if (generation.sampling.temperature > 0 && generation.sampling.top_p < 1.0f) body["top_p"] = generation.sampling.top_p;
  if (generation.sampling.seed != 0) body["seed"] = generation.sampling.seed;
  return body;
}

double number_at(const json& object, const char* key, double fallback) {
  auto it = object.find(key);
  return it != object.end() && it->is_number() ? it->get<double>() : fallback;
}

// usage (OpenAI), and "timings": llama.cpp's (prompt_ms, predicted_per_second, ...) or kvchat serve's.
void read_figures(const json& event, RemoteReply& reply) {
  if (auto usage = event.find("usage"); usage != event.end() && usage->is_object()) {
    reply.usage_reported = true;
    reply.stats.prompt_tokens = static_cast<int>(number_at(*usage, "prompt_tokens", 0));
    reply.stats.generated_tokens = static_cast<int>(number_at(*usage, "completion_tokens", 0));
    if (auto details = usage->find("prompt_tokens_details"); details != usage->end() && details->is_object())
      if (auto cached = details->find("cached_tokens"); cached != details->end() && cached->is_number())
        reply.cached_tokens = cached->get<int>();
  }
  if (auto timings = event.find("timings"); timings != event.end() && timings->is_object()) {
    const json& t = *timings;
    if (t.contains("ttft_ms") || t.contains("prompt_ms")) reply.server_timings = true;
    reply.stats.ttft_ms = number_at(t, "ttft_ms", number_at(t, "prompt_ms", reply.stats.ttft_ms));
    reply.stats.prefill_tokens_per_second =
        number_at(t, "prefill_tokens_per_second", number_at(t, "prompt_per_second", reply.stats.prefill_tokens_per_second));
    reply.stats.decode_tokens_per_second = number_at(
        t, "decode_tokens_per_second", number_at(t, "predicted_per_second", reply.stats.decode_tokens_per_second));
    reply.stats.decode_ms = number_at(t, "predicted_ms", reply.stats.decode_ms);
    if (!reply.cached_tokens && t.contains("cache_n")) reply.cached_tokens = static_cast<int>(number_at(t, "cache_n", 0));
    if (!reply.cached_tokens && t.contains("cached_tokens"))
      reply.cached_tokens = static_cast<int>(number_at(t, "cached_tokens", 0));
  }
}

}  // namespace

void check_base_url(const std::string& base_url) { parse_base_url(base_url); }

std::vector<std::string> list_remote_models(const RemoteEndpoint& endpoint) {
  const ServerAddress address = parse_base_url(endpoint.base_url);
  httplib::Client client = make_client(address, endpoint);
  client.set_read_timeout(30, 0);
  const httplib::Result result = client.Get((address.path_prefix + "/models").c_str());
  if (!result) throw RemoteError("cannot reach " + endpoint.base_url + ": " + transport_failure(result.error()));
  if (result->status != 200) throw_status(endpoint.base_url, result->status, result->body, "");
  const json parsed = json::parse(result->body, nullptr, false);
  if (!parsed.is_object() || !parsed.contains("data") || !parsed["data"].is_array())
    throw RemoteError("the server at " + endpoint.base_url + " answered /models without a \"data\" list: " +
                      server_message(result->body));
  std::vector<std::string> models;
  for (const json& entry : parsed["data"])
    if (entry.is_object() && entry.contains("id") && entry["id"].is_string()) models.push_back(entry["id"].get<std::string>());
  return models;
}

namespace {

// The server-sent events of one streamed reply, fed as bytes arrive.
class StreamParser {
 public:
  StreamParser(RemoteReply& reply, const RemoteChunkCallback& on_chunk) : reply_(reply), on_chunk_(on_chunk) {}

  void feed(const char* data, std::size_t length) {
    pending_.append(data, length);
    for (std::size_t end; (end = pending_.find('\n')) != std::string::npos;) {
      std::string line = pending_.substr(0, end);
      pending_.erase(0, end + 1);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.rfind("data:", 0) == 0) handle_data(line.substr(line.size() > 5 && line[5] == ' ' ? 6 : 5));
    }
  }
  bool done() const { return done_; }
  bool finished() const { return finish_reason_seen_; }
  int chunks() const { return chunks_; }
  const std::string& stream_error() const { return stream_error_; }
  Clock::time_point first_chunk_at() const { return first_chunk_at_; }
  Clock::time_point last_chunk_at() const { return last_chunk_at_; }

 private:
  void handle_data(const std::string& data) {
    if (data == "[DONE]") {
      done_ = true;
      return;
    }
    const json event = json::parse(data, nullptr, false);
    if (!event.is_object()) return;  // a keep-alive or a line this client does not know
    if (event.contains("error")) stream_error_ = server_message(data);
    if (event.contains("model") && event["model"].is_string()) reply_.model = event["model"].get<std::string>();
    read_figures(event, reply_);
    auto choices = event.find("choices");
    if (choices == event.end() || !choices->is_array() || choices->empty()) return;
    const json& choice = (*choices)[0];
    if (auto delta = choice.find("delta"); delta != choice.end() && delta->is_object())
      if (auto content = delta->find("content"); content != delta->end() && content->is_string() && !content->empty()) {
        const std::string text = content->get<std::string>();
        last_chunk_at_ = Clock::now();
        if (chunks_++ == 0) first_chunk_at_ = last_chunk_at_;
        reply_.text += text;
        if (on_chunk_) on_chunk_(text, chunks_);
      }
    if (auto reason = choice.find("finish_reason"); reason != choice.end() && reason->is_string()) {
      finish_reason_seen_ = true;
      reply_.stats.stop_reason = reason->get<std::string>() == "length" ? StopReason::MaxTokens : StopReason::Eos;
    }
  }

  RemoteReply& reply_;
  const RemoteChunkCallback& on_chunk_;
  std::string pending_;
  bool done_ = false;
  bool finish_reason_seen_ = false;
  int chunks_ = 0;
  std::string stream_error_;
  Clock::time_point first_chunk_at_, last_chunk_at_;
};

double milliseconds(Clock::duration duration) { return std::chrono::duration<double, std::milli>(duration).count(); }

// What the client measured, where the server reported nothing better.
void fill_client_figures(RemoteReply& reply, const StreamParser& parser, Clock::time_point started) {
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

// client.send(), and Stop honoured while no data flows too (a server still reading a long prompt): a watcher
// closes the socket (httplib's Client::stop, made for another thread) once the flag is set.
httplib::Result send_stoppable(httplib::Client& client, const httplib::Request& request, const std::atomic<bool>* stop,
                               bool& stopped) {
  if (!stop) return client.send(request);
  std::mutex mutex;
  std::condition_variable done_changed;
  bool done = false;
  std::atomic<bool> closed_by_watcher{false};
  std::thread watcher([&] {
    std::unique_lock<std::mutex> lock(mutex);
    while (!done) {
      if (stop->load()) {
        closed_by_watcher = true;
        client.stop();
        return;
      }
      done_changed.wait_for(lock, std::chrono::milliseconds(50));
    }
  });
  httplib::Result result = client.send(request);
  {
    std::lock_guard<std::mutex> lock(mutex);
    done = true;
  }
  done_changed.notify_all();
  watcher.join();
  if (closed_by_watcher) stopped = true;
  return result;
}

}  // namespace

RemoteReply stream_remote_chat(const RemoteEndpoint& endpoint, const std::vector<ChatMessage>& messages,
                               const GenerationConfig& generation, const std::atomic<bool>* stop,
                               const RemoteChunkCallback& on_chunk) {
  const ServerAddress address = parse_base_url(endpoint.base_url);
  RemoteReply reply;
  reply.model = endpoint.model;
  if (reply.model.empty()) {
    const std::vector<std::string> models = list_remote_models(endpoint);
    if (models.empty()) throw RemoteError("the server at " + endpoint.base_url + " lists no models (/models is empty)");
    reply.model = models.front();
  }
  const std::string model = reply.model;
  httplib::Client client = make_client(address, endpoint);
  httplib::Request request;
  request.method = "POST";
  request.path = address.path_prefix + "/chat/completions";
  request.body = request_body(model, messages, generation).dump();
  request.set_header("Content-Type", "application/json");
  request.set_header("Accept", "text/event-stream");
  if (!endpoint.api_key.empty()) request.set_header("Authorization", "Bearer " + endpoint.api_key);

  const Clock::time_point started = Clock::now();
  StreamParser parser(reply, on_chunk);
  int status = 0;
  std::string error_body;
  bool stopped = false;
  request.response_handler = [&](const httplib::Response& response) {
    status = response.status;
    return true;
  };
  request.content_receiver = [&](const char* data, std::size_t length, std::uint64_t, std::uint64_t) {
    if (status != 200) {
      error_body.append(data, std::min<std::size_t>(length, 65536 - std::min<std::size_t>(error_body.size(), 65536)));
      return true;
    }
    parser.feed(data, length);
    // Returning false closes the connection: the server sees the client go and stops generating.
    if (stop && stop->load()) stopped = true;
    return !stopped;
  };
  spdlog::info("remote turn: {} messages to {} (model {})", messages.size(), endpoint.base_url, model);
  const httplib::Result result = send_stoppable(client, request, stop, stopped);
  if (!result && status == 0 && !stopped)
    throw RemoteError("cannot reach " + endpoint.base_url + ": " + transport_failure(result.error()));
  if (status != 200 && status != 0) throw_status(endpoint.base_url, status, error_body, model);
  reply.model = reply.model.empty() ? model : reply.model;
  fill_client_figures(reply, parser, started);
  if (stopped) {
    reply.stats.stop_reason = StopReason::Stopped;
    return reply;
  }
  if (!parser.stream_error().empty() && reply.text.empty())
    throw RemoteError("the server at " + endpoint.base_url + " reported an error: " + parser.stream_error());
  if (!parser.done() && !parser.finished()) {
    const std::string why = !result ? transport_failure(result.error()) : "the stream ended without [DONE]";
    if (reply.text.empty())
      throw RemoteError("the server at " + endpoint.base_url + " broke off before replying: " + why);
    reply.interruption = "the connection to " + endpoint.base_url + " broke off mid-reply (" + why +
                         "): the reply is cut short; Regenerate to ask again";
    reply.stats.stop_reason = StopReason::Stopped;
    spdlog::warn("remote turn interrupted after {} chunks: {}", parser.chunks(), why);
  }
  return reply;
}

}  // namespace kvchat::app
