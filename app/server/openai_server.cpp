#include "app/server/openai_server.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <ctime>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "app/remote/connection_probe.h"
#include "app/server/bounded_http_server.h"
#include "app/server/broken_pipe.h"
#include "app/server/openai_protocol.h"
#include "app/server/openai_sessions.h"
#include "engine/model/model_loader.h"

namespace kvchat::app::openai {

using nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;

// What the request log line reports. httplib serves a request, its streamed body included, on one pool
// thread and calls the logger on that thread afterwards, so a thread-local carries it there (and the
// logger clears it for the thread's next request).
struct RequestRecord {
  int prompt_tokens = 0;
  int cached_tokens = 0;
  int completion_tokens = 0;
  bool client_gone = false;
};
thread_local RequestRecord t_record;

void record_stats(const GenerationStats& stats, bool client_gone) {
  t_record.prompt_tokens = stats.prompt_tokens;
  t_record.cached_tokens = stats.reused_tokens;
  t_record.completion_tokens = stats.generated_tokens;
  t_record.client_gone = client_gone;
}

void send_error(httplib::Response& response, const ApiError& error) {
  response.status = error.status;
  response.set_content(error_body(error).dump(), "application/json");
}

std::int64_t unix_time() { return static_cast<std::int64_t>(std::time(nullptr)); }

ApiError refusal_error(const HttpRefusal& refusal) {
  return ApiError(refusal.status, refusal.message, "invalid_request_error", "", refusal.code);
}

ServerOptions validated(ServerOptions options) {
  auto check = [](bool in_range, const std::string& message) {
    if (!in_range) throw std::invalid_argument(message);
  };
  check(options.parallel >= 1 && options.parallel <= ServerOptions::kMaxParallel,
        "parallel must be from 1 to " + std::to_string(ServerOptions::kMaxParallel));
  check(options.max_queue >= 0 && options.max_queue <= ServerOptions::kMaxQueue,
        "max queue must be from 0 to " + std::to_string(ServerOptions::kMaxQueue));
  check(options.max_body_bytes >= 1 && options.max_body_bytes <= ServerOptions::kMaxBodyBytes,
        "max body must be from 1 byte to " + std::to_string(ServerOptions::kMaxBodyBytes >> 20) + " MiB");
  check(options.header_timeout_ms >= 1 && options.body_timeout_ms >= 1, "the request timeouts must be positive");
  return options;
}

HttpLimits http_limits(const ServerOptions& options) {
  HttpLimits limits;
  limits.header_timeout = std::chrono::milliseconds(options.header_timeout_ms);
  limits.body_timeout = std::chrono::milliseconds(options.body_timeout_ms);
  limits.max_body_bytes = options.max_body_bytes;
  limits.max_connections =
      static_cast<std::size_t>(options.parallel + options.max_queue + ServerOptions::kSpareConnections);
  return limits;
}

std::string ascii_lowercase(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

std::string trim_blanks(const std::string& text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return {};
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

// "Bearer KEY", the scheme in any case (RFC 9110: schemes are case-insensitive). Every byte of a key of
// the right length is compared whatever the first difference, so the time taken does not tell how much
// of a guess was right.
bool bearer_matches(const std::string& authorization, const std::string& key) {
  const std::string value = trim_blanks(authorization);
  const auto space = value.find_first_of(" \t");
  if (space == std::string::npos || ascii_lowercase(value.substr(0, space)) != "bearer") return false;
  const std::string given = trim_blanks(value.substr(space));
  if (key.empty() || given.size() != key.size()) return false;
  unsigned char difference = 0;
  for (std::size_t i = 0; i < key.size(); ++i) difference |= static_cast<unsigned char>(given[i] ^ key[i]);
  return difference == 0;
}

// A page served from this machine: http(s)://localhost, 127.0.0.1 or [::1], with any port.
bool local_origin(const std::string& origin) {
  std::string rest;
  for (const char* scheme : {"http://", "https://"})
    if (origin.rfind(scheme, 0) == 0) rest = origin.substr(std::string(scheme).size());
  for (const char* host : {"localhost", "127.0.0.1", "[::1]"}) {
    const std::string name(host);
    if (rest.rfind(name, 0) != 0) continue;
    const std::string port = rest.substr(name.size());
    if (port.empty()) return true;
    return port.size() >= 2 && port.size() <= 6 && port[0] == ':' &&
           port.find_first_not_of("0123456789", 1) == std::string::npos;
  }
  return false;
}

bool origin_allowed(const std::string& origin, const std::string& setting) {
  if (setting == "*") return true;
  if (setting.empty()) return local_origin(origin);
  std::size_t start = 0;
  while (start <= setting.size()) {
    const std::size_t end = std::min(setting.find(',', start), setting.size());
    std::string allowed = trim_blanks(setting.substr(start, end - start));
    while (!allowed.empty() && allowed.back() == '/') allowed.pop_back();
    if (!allowed.empty() && ascii_lowercase(allowed) == ascii_lowercase(origin)) return true;
    start = end + 1;
  }
  return false;
}

// The request headers a preflight asks for, kept when they are header names (the reply echoes them).
std::string requested_headers(const httplib::Request& request) {
  std::string names = "Authorization, Content-Type";
  const std::string asked = request.get_header_value("Access-Control-Request-Headers");
  std::size_t start = 0;
  while (start < asked.size()) {
    const std::size_t end = std::min(asked.find(',', start), asked.size());
    const std::string name = trim_blanks(asked.substr(start, end - start));
    const bool token = !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](unsigned char c) {
      return std::isalnum(c) || c == '-' || c == '_';
    });
    const std::string lower = ascii_lowercase(name);
    if (token && lower != "authorization" && lower != "content-type") names += ", " + name;
    start = end + 1;
  }
  return names;
}

// The methods a known path answers ("" for an unknown path).
std::string route_methods(const std::string& path) {
  for (const char* get : {"/health", "/v1/models", "/models"})
    if (path == get) return "GET";
  for (const std::string model_prefix : {"/v1/models/", "/models/"})
    if (path.size() > model_prefix.size() && path.compare(0, model_prefix.size(), model_prefix) == 0) return "GET";
  for (const char* post : {"/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions"})
    if (path == post) return "POST";
  return {};
}

}  // namespace

class OpenAiServer::Impl {
 public:
  Impl(const LoadedModel& model, std::shared_ptr<SnapshotStore> snapshots, ServerOptions options)
      : options_(validated(std::move(options))),
        sessions_(model, std::move(snapshots), options_.parallel, options_.max_queue, options_.memory_budget_bytes),
        // A connection for every running and queued request, and spare ones that answer /health, errors and
        // 429s while all of those are busy.
        server_(http_limits(options_),
                [](const HttpRefusal& refusal) { return error_body(refusal_error(refusal)).dump(); }) {
    ignore_broken_pipe_signals();  // a client gone mid-stream is a failed write, not the end of the server
    sessions_.set_compute_context(options_.compute);
    sessions_.set_speculative(options_.speculative);
    sessions_.set_kv_dtype(options_.kv_dtype);
    server_.set_write_timeout(60);
    install_hooks();
    install_routes();
  }

  void bind() {
    server_.start_threads();  // first: a server that cannot start them never holds the port
    if (options_.port == 0) {
      port_ = server_.bind_to_any_port(options_.host);
      if (port_ < 0) throw std::runtime_error("cannot bind " + options_.host + " on any port");
    } else {
      if (!server_.bind_to_port(options_.host, options_.port))
        throw std::runtime_error("cannot bind " + options_.host + ":" + std::to_string(options_.port) +
                                 " (in use, or not an address of this machine)");
      port_ = options_.port;
    }
  }
  int port() const { return port_; }
  void serve() {
    {
      std::lock_guard<std::mutex> lock(lifecycle_mutex_);
      if (stopping_) return;
      serving_ = true;
    }
    server_.listen_after_bind();
    listen_returned_.store(true);
  }
  // httplib's stop() does nothing before its accept loop runs, so a stop() right after serve() began
  // on another thread waits for that loop.
  void stop() {
    shutting_down_.store(true);
    sessions_.shut_down();
    bool serving = false;
    {
      std::lock_guard<std::mutex> lock(lifecycle_mutex_);
      stopping_ = true;
      serving = serving_;
    }
    if (!serving) return;
    while (!server_.is_running() && !listen_returned_.load()) std::this_thread::yield();
    server_.stop();
    server_.close_waiting_connections();
  }
  ServerSessions& sessions() { return sessions_; }

 private:
  void install_hooks();
  void install_routes();
  void chat_completions(const httplib::Request& request, httplib::Response& response);
  void completions(const httplib::Request& request, httplib::Response& response);
  void check_model(const std::string& model) const;
  bool add_cors_headers(const httplib::Request& request, httplib::Response& response) const;
  void answer_options(const httplib::Request& request, httplib::Response& response) const;
  ApiError interrupted_error(const CompletionResult& result) const;

  // One generation request, either endpoint: runs it whole, or streams it from httplib's content
  // provider (after the status line went out, so every refusal happens before).
  struct Job {
    std::unique_ptr<ServerSessions::Lease> lease;
    SamplingRequest sampling;
    std::vector<TokenId> prompt_ids;  // the messages or the raw prompt, encoded
    bool chat = true;
    // Tool calls are parsed out of the reply in this format (None: the reply is all content).
    ToolCallFormat tool_format = ToolCallFormat::None;
    bool parallel_tool_calls = true;
    ChunkIdentity identity;
  };
  CompletionResult run_job(Job& job, const TextSink& sink, bool* client_gone, const LogprobSink& logprob_sink = {});
  // Moves the calls parsed out of a finished reply into `result`: its text becomes their content, and a reply
  // that ended by itself ends for them ("tool_calls").
  static void take_tool_calls(const Job& job, ParsedReply parsed, CompletionResult& result);
  void respond(std::shared_ptr<Job> job, const httplib::Request& request, httplib::Response& response);
  bool stream(Job& job, httplib::DataSink& sink);

  ServerOptions options_;
  ServerSessions sessions_;
  BoundedHttpServer server_;
  int port_ = 0;
  std::atomic<bool> shutting_down_{false};
  std::atomic<std::uint64_t> next_id_{1};
  std::mutex lifecycle_mutex_;
  bool stopping_ = false;
  bool serving_ = false;
  std::atomic<bool> listen_returned_{false};
};

// CORS: a page of an allowed origin gets the Access-Control headers; false for an Origin not allowed.
bool OpenAiServer::Impl::add_cors_headers(const httplib::Request& request, httplib::Response& response) const {
  if (!request.has_header("Origin")) return true;
  const std::string origin = request.get_header_value("Origin");
  if (!origin_allowed(origin, options_.cors_origin)) return false;
  if (!response.has_header("Access-Control-Allow-Origin")) {
    response.set_header("Access-Control-Allow-Origin", options_.cors_origin == "*" ? "*" : origin);
    response.set_header("Access-Control-Expose-Headers", "Retry-After");
    response.set_header("Vary", "Origin");
  }
  return true;
}

// OPTIONS: a browser's preflight (or a client asking what a path takes), answered before any key is asked
// for: a preflight carries no credentials.
void OpenAiServer::Impl::answer_options(const httplib::Request& request, httplib::Response& response) const {
  const std::string methods = route_methods(request.path);
  if (methods.empty()) {
    send_error(response,
               ApiError(404, "no endpoint OPTIONS " + request.path, "invalid_request_error", "", "unknown_url"));
    return;
  }
  if (!add_cors_headers(request, response)) {
    const std::string allowed = options_.cors_origin.empty() ? "this machine's pages" : options_.cors_origin;
    send_error(response, ApiError(403,
                                  "pages of origin " + request.get_header_value("Origin") +
                                      " may not call this server (allowed: " + allowed +
                                      "; kvchat-cli serve --cors-origin sets them)",
                                  "invalid_request_error", "", "origin_not_allowed"));
    return;
  }
  response.status = 204;
  response.set_header("Allow", methods + ", OPTIONS");
  if (request.has_header("Origin")) {
    response.set_header("Access-Control-Allow-Methods", methods + ", OPTIONS");
    response.set_header("Access-Control-Allow-Headers", requested_headers(request));
    response.set_header("Access-Control-Max-Age", "600");
  }
}

void OpenAiServer::Impl::install_hooks() {
  server_.set_pre_routing_handler([this](const httplib::Request& request, httplib::Response& response) {
    if (request.method == "OPTIONS") {
      answer_options(request, response);
      return httplib::Server::HandlerResponse::Handled;
    }
    // A page of another origin is refused before anything runs: a browser sends some requests (a form's
    // POST) without a preflight, and would run them even though the page cannot read the answer.
    if (!add_cors_headers(request, response)) {
      send_error(response, ApiError(403,
                                    "pages of origin " + request.get_header_value("Origin") +
                                        " may not call this server (kvchat-cli serve --cors-origin allows them)",
                                    "invalid_request_error", "", "origin_not_allowed"));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (const std::optional<HttpRefusal> refusal = server_.framing_refusal(request)) {
      send_error(response, refusal_error(*refusal));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (options_.api_key.empty() || request.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    if (bearer_matches(request.get_header_value("Authorization"), options_.api_key))
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(response,
               ApiError(401,
                        request.has_header("Authorization") ? "incorrect API key provided"
                                                            : "missing API key: send Authorization: Bearer KEY",
                        "invalid_request_error", "", "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });
  // Sent before the body (curl asks for large ones): a body that would be refused is refused unsent.
  server_.set_expect_100_continue_handler([this](const httplib::Request& request, httplib::Response& response) {
    if (const std::optional<HttpRefusal> refusal = server_.framing_refusal(request)) {
      send_error(response, refusal_error(*refusal));
      return refusal->status;
    }
    return 100;
  });
  // httplib's own refusals (unknown path, a request it could not read) get OpenAI's error shape too.
  server_.set_error_handler([this](const httplib::Request& request, httplib::Response& response) {
    if (!response.body.empty()) return;
    if (const std::optional<HttpRefusal> refusal = server_.read_refusal()) {
      send_error(response, refusal_error(*refusal));
    } else if (response.status == 404) {
      const std::string methods = route_methods(request.path);
      if (methods.empty()) {
        send_error(response, ApiError(404, "no endpoint " + request.method + " " + request.path,
                                      "invalid_request_error", "", "unknown_url"));
      } else {
        response.set_header("Allow", methods + ", OPTIONS");
        send_error(response, ApiError(405, request.path + " takes " + methods + ", not " + request.method,
                                      "invalid_request_error", "", "method_not_allowed"));
      }
    } else if (response.status == 413) {
      send_error(response, ApiError(413,
                                    "the request body is larger than the server accepts (" +
                                        std::to_string(options_.max_body_bytes) + " bytes)",
                                    "invalid_request_error", "", "request_too_large"));
    } else if (response.status == 414) {
      send_error(response, ApiError(414, "the request's URL is too long", "invalid_request_error", "", "uri_too_long"));
    } else if (response.status == 400) {
      send_error(response, ApiError(400, "the request is not valid HTTP: its request line or a header is malformed",
                                    "invalid_request_error", "", "invalid_http"));
    } else {
      send_error(response,
                 ApiError(response.status, "the request failed (HTTP " + std::to_string(response.status) + ")",
                          "invalid_request_error"));
    }
  });
  // Last before the status line goes out, for every response: CORS, and whether the connection stays.
  server_.set_post_routing_handler([this](const httplib::Request& request, httplib::Response& response) {
    add_cors_headers(request, response);
    // A body left unread would be taken for the next request.
    if (BoundedHttpServer::body_unread(request)) BoundedHttpServer::close_after_response();
    if (BoundedHttpServer::closing_after_response()) {
      response.headers.erase("Keep-Alive");
      if (!response.has_header("Connection")) response.set_header("Connection", "close");
    }
  });
  server_.set_logger([](const httplib::Request& request, const httplib::Response& response) {
    const double ms =
        std::chrono::duration<double, std::milli>(Clock::now() - BoundedHttpServer::request_started()).count();
    spdlog::info("{} {} {} prompt {} (cached {}) completion {} tokens {:.1f} ms{}", request.method, request.path,
                 response.status, t_record.prompt_tokens, t_record.cached_tokens, t_record.completion_tokens, ms,
                 t_record.client_gone ? " (client disconnected)" : "");
    t_record = RequestRecord{};
  });
}

void OpenAiServer::Impl::install_routes() {
  const auto health = [this](const httplib::Request&, httplib::Response& response) {
    const ServerSessions::Status status = sessions_.status();
    const json body = {{"status", "ok"},
                       {"running", status.running},
                       {"waiting", status.waiting},
                       {"sessions", status.sessions},
                       {"kv_cache_bytes", status.cache_bytes},
                       {"kv_cache_budget_bytes", status.budget_bytes},
                       {"kv_cache_reserved_bytes", status.reserved_bytes},
                       {"kv_cache_peak_bytes", status.peak_bytes},
                       {"waiting_for_memory", status.waiting_for_memory},
                       {"memory_waits", status.memory_waits},
                       {"kv_reservation_extensions", status.reservation_extensions},
                       {"kv_budget_overshoots", status.budget_overshoots},
                       {"kv_cache_evictions", status.evictions},
                       {"waiting_for_prefix", status.waiting_for_prefix},
                       {"prefix_copies", status.prefix_copies},
                       {"batched_decode_steps", status.batched_steps},
                       {"batched_decode_rows", status.batched_rows},
                       {"largest_decode_batch", status.largest_batch}};
    response.set_content(body.dump(), "application/json");
  };
  const auto model_object = [this] {
    return json{{"id", options_.model_id},
                {"object", "model"},
                {"created", 0},
                {"owned_by", "kvchat"},
                {"architecture", sessions_.architecture()},
                {"context_length", sessions_.context_limit()}};
  };
  const auto models = [model_object](const httplib::Request&, httplib::Response& response) {
    response.set_content(json{{"object", "list"}, {"data", json::array({model_object()})}}.dump(), "application/json");
  };
  // The SDKs' models.retrieve(id): the served model, or OpenAI's 404 for another id.
  const auto model_by_id = [this, model_object](const httplib::Request& request, httplib::Response& response) {
    const std::string id = request.matches.size() > 1 ? request.matches[1].str() : std::string();
    if (id != options_.model_id) {
      send_error(response,
                 ApiError(404, "the model '" + id + "' does not exist; this server serves '" + options_.model_id + "'",
                          "invalid_request_error", "model", "model_not_found"));
      return;
    }
    response.set_content(model_object().dump(), "application/json");
  };
  // The body is read here, within the server's limits whatever its encoding, then the handler runs on a
  // copy of the request that carries it.
  auto guarded = [this](void (Impl::*handler)(const httplib::Request&, httplib::Response&)) {
    return [this, handler](const httplib::Request& request, httplib::Response& response,
                           const httplib::ContentReader& content) {
      std::string body;
      if (const std::optional<HttpRefusal> refusal = server_.read_body(content, body)) {
        send_error(response, refusal_error(*refusal));
        return;
      }
      httplib::Request with_body = request;
      with_body.body = std::move(body);
      try {
        (this->*handler)(with_body, response);
      } catch (const ApiError& error) {
        send_error(response, error);
        if (error.status == 429) response.set_header("Retry-After", "1");
      } catch (const std::exception& error) {
        spdlog::error("{} {}: {}", request.method, request.path, error.what());
        send_error(response, ApiError(500, error.what(), "server_error"));
      }
    };
  };
  // Each path also without /v1: clients given the bare base URL (and llama.cpp's) call those.
  for (const std::string prefix : {"/v1", ""}) {
    server_.Get(prefix + "/models", models);
    server_.Get(prefix + "/models/(.+)", model_by_id);
    server_.Post(prefix + "/chat/completions", guarded(&Impl::chat_completions));
    server_.Post(prefix + "/completions", guarded(&Impl::completions));
  }
  server_.Get("/health", health);
}

void OpenAiServer::Impl::check_model(const std::string& model) const {
  if (!model.empty() && model != options_.model_id)
    throw ApiError(404, "the model '" + model + "' does not exist; this server serves '" + options_.model_id + "'",
                   "invalid_request_error", "model", "model_not_found");
}

void OpenAiServer::Impl::chat_completions(const httplib::Request& request, httplib::Response& response) {
  ChatCompletionRequest parsed = parse_chat_completion_request(request.body);
  check_model(parsed.sampling.model);
  auto job = std::make_shared<Job>();
  std::string tools_json;
  if (!parsed.tools_json.empty()) {
    const ToolCallFormat format = sessions_.tool_call_format();
    if (format == ToolCallFormat::None)
      throw ApiError(400, "'tools' cannot be used with this model: its chat template renders no tools",
                     "invalid_request_error", "tools", "unsupported_value");
    if (parsed.tool_choice == ToolChoice::Required || parsed.tool_choice == ToolChoice::Function)
      parsed.sampling.grammar = std::make_shared<const JsonGrammar>(required_tool_call_grammar(parsed, format));
    // "none": the model sees the tools (a conversation may already hold their calls) but its reply is all text.
    if (parsed.tool_choice != ToolChoice::None) {
      job->tool_format = format;
      job->parallel_tool_calls = parsed.parallel_tool_calls;
      parsed.sampling.exact_text = true;
    }
    tools_json = parsed.tools_json;
  }
  job->sampling = std::move(parsed.sampling);
  job->prompt_ids = sessions_.encode_chat(parsed.messages, tools_json);
  job->lease = sessions_.acquire_for_prompt(job->prompt_ids, job->sampling.max_tokens);
  job->identity = ChunkIdentity{"chatcmpl-" + std::to_string(next_id_++), unix_time(), options_.model_id};
  respond(std::move(job), request, response);
}

void OpenAiServer::Impl::completions(const httplib::Request& request, httplib::Response& response) {
  CompletionRequest parsed = parse_completion_request(request.body);
  check_model(parsed.sampling.model);
  auto job = std::make_shared<Job>();
  job->chat = false;
  job->sampling = std::move(parsed.sampling);
  job->prompt_ids = parsed.prompt_token_ids.empty() ? sessions_.encode_prompt(parsed.prompt)
                                                    : sessions_.checked_prompt_ids(std::move(parsed.prompt_token_ids));
  job->lease = sessions_.acquire_for_prompt(job->prompt_ids, job->sampling.max_tokens);
  job->identity = ChunkIdentity{"cmpl-" + std::to_string(next_id_++), unix_time(), options_.model_id};
  respond(std::move(job), request, response);
}

CompletionResult OpenAiServer::Impl::run_job(Job& job, const TextSink& sink, bool* client_gone,
                                             const LogprobSink& logprob_sink) {
  CompletionResult result = sessions_.run(*job.lease, job.prompt_ids, job.sampling, sink, client_gone, logprob_sink);
  job.lease.reset();  // the slot is free as soon as the generation is done
  record_stats(result.stats, client_gone && *client_gone);
  return result;
}

void OpenAiServer::Impl::respond(std::shared_ptr<Job> job, const httplib::Request& request,
                                 httplib::Response& response) {
  if (!job->sampling.stream) {
    // Nothing is written until the reply is whole, so the socket itself is asked after every token
    // whether the client is still there.
    const ConnectionProbe connection(request.local_addr, request.local_port, request.remote_addr, request.remote_port);
    if (!connection.found())
      spdlog::warn("{}: the request's socket was not found; a disconnect will not stop its generation",
                   job->identity.id);
    bool client_gone = false;
    CompletionResult result = run_job(
        *job, [&connection](const std::string&) { return connection.open(); }, &client_gone);
    // Stopped by the server's shutdown: an error, not a 200 with part of a reply. With the client gone the
    // write below fails; the log line says why the reply was cut short.
    if (result.finish_reason == kFinishInterrupted && !client_gone) throw interrupted_error(result);
    if (job->tool_format != ToolCallFormat::None)
      take_tool_calls(*job, parse_tool_calls(job->tool_format, result.text), result);
    const json body =
        job->chat ? chat_completion_response(job->identity.id, job->identity.created, job->identity.model, result)
                  : completion_response(job->identity.id, job->identity.created, job->identity.model, result);
    response.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
    return;
  }
  response.set_header("Cache-Control", "no-cache");
  response.set_chunked_content_provider(
      "text/event-stream", [this, job](std::size_t, httplib::DataSink& sink) { return stream(*job, sink); });
}

void OpenAiServer::Impl::take_tool_calls(const Job& job, ParsedReply parsed, CompletionResult& result) {
  if (parsed.tool_calls.empty()) return;
  if (!job.parallel_tool_calls) parsed.tool_calls.resize(1);
  result.text = std::move(parsed.content);
  result.tool_calls = std::move(parsed.tool_calls);
  if (result.finish_reason == "stop") result.finish_reason = "tool_calls";
}

bool OpenAiServer::Impl::stream(Job& job, httplib::DataSink& sink) {
  auto write = [&](const std::string& event) { return sink.write(event.data(), event.size()); };
  if (job.chat && !write(sse_event(chat_chunk(job.identity, "", /*delta_role=*/true, std::nullopt)))) return false;
  // With logprobs asked for, each piece of text carries the entries of the tokens it completes (those of text
  // held back while it may be a tool call go with the next piece sent).
  std::vector<LogprobEntry> piece_logprobs;
  const LogprobSink logprob_sink = [&](const std::vector<LogprobEntry>& entries) {
    piece_logprobs.insert(piece_logprobs.end(), entries.begin(), entries.end());
  };
  const std::vector<LogprobEntry>* logprobs = job.sampling.top_logprobs >= 0 ? &piece_logprobs : nullptr;
  ToolCallStream tool_calls(job.tool_format);
  const auto write_text = [&](const std::string& text) {
    const bool written = write(sse_event(job.chat ? chat_chunk(job.identity, text, false, std::nullopt, logprobs)
                                                  : completion_chunk(job.identity, text, std::nullopt, logprobs)));
    piece_logprobs.clear();
    return written;
  };
  const TextSink text_sink = [&](const std::string& text) {
    if (text.empty()) return sink.is_writable();  // cpp-httplib 0.11 checks that the peer has not closed
    const std::string content = tool_calls.push(text);
    return content.empty() ? sink.is_writable() : write_text(content);
  };
  bool client_gone = false;
  CompletionResult result;
  try {
    result = run_job(job, text_sink, &client_gone, logprob_sink);
  } catch (const std::exception& error) {
    // The status line is out: the error goes in the stream, as OpenAI's streams carry them.
    spdlog::error("{} stream failed: {}", job.identity.id, error.what());
    write(sse_event(error_body(ApiError(500, error.what(), "server_error"))));
    sink.done();
    return true;
  }
  if (client_gone) return false;
  if (result.finish_reason == kFinishInterrupted) {
    // No finish reason and no [DONE]: the stream ends with the error, so no client takes the cut reply
    // for a whole one.
    const ApiError error = interrupted_error(result);
    spdlog::warn("{}: {}", job.identity.id, error.what());
    write(sse_event(error_body(error)));
    sink.done();
    return true;
  }
  if (job.tool_format != ToolCallFormat::None) {
    ParsedReply rest = tool_calls.finish();
    if (!rest.content.empty() && !write_text(rest.content)) return false;
    rest.content.clear();
    take_tool_calls(job, std::move(rest), result);
    if (!result.tool_calls.empty() && !write(sse_event(chat_tool_calls_chunk(job.identity, result.tool_calls))))
      return false;
  }
  const json last = job.chat ? chat_chunk(job.identity, "", false, result.finish_reason)
                             : completion_chunk(job.identity, "", result.finish_reason);
  if (!write(sse_event(last))) return false;
  if (job.sampling.include_usage &&
      !write(
          sse_event(usage_chunk(job.identity, job.chat ? "chat.completion.chunk" : "text_completion", result.stats))))
    return false;
  if (!write(kSseDone)) return false;
  sink.done();
  return true;
}

ApiError OpenAiServer::Impl::interrupted_error(const CompletionResult& result) const {
  const std::string cut = "the reply was cut short after " + std::to_string(result.stats.generated_tokens) + " tokens";
  if (shutting_down_.load())
    return ApiError(503, "the server is shutting down: " + cut + "; send the request again when it is back",
                    "server_error", "", "server_shutting_down");
  return ApiError(500, "the generation was stopped before its end: " + cut, "server_error", "",
                  "generation_interrupted");
}

OpenAiServer::OpenAiServer(const LoadedModel& model, std::shared_ptr<SnapshotStore> snapshots, ServerOptions options)
    : impl_(std::make_unique<Impl>(model, std::move(snapshots), std::move(options))) {}
OpenAiServer::~OpenAiServer() = default;
void OpenAiServer::bind() { impl_->bind(); }
int OpenAiServer::bound_port() const { return impl_->port(); }
void OpenAiServer::serve() { impl_->serve(); }
void OpenAiServer::stop() { impl_->stop(); }
ServerSessions& OpenAiServer::sessions() { return impl_->sessions(); }

}  // namespace kvchat::app::openai
