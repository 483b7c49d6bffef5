#include "app/openai_server.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "app/broken_pipe.h"
#include "app/connection_probe.h"
#include "app/openai_protocol.h"
#include "app/openai_sessions.h"
#include "engine/model_loader.h"

namespace kvchat::app::openai {

using nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;

// What the request log line reports. httplib serves a request, its streamed body included, on one pool
// thread and calls the logger on that thread afterwards, so a thread-local carries it there.
struct RequestRecord {
  Clock::time_point started;
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

}  // namespace

class OpenAiServer::Impl {
 public:
  Impl(const LoadedModel& model, std::shared_ptr<SnapshotStore> snapshots, ServerOptions options)
      : model_(model),
        options_(std::move(options)),
        sessions_(model, std::move(snapshots), options_.parallel, options_.max_queue, options_.memory_budget_bytes) {
    ignore_broken_pipe_signals();  // a client gone mid-stream is a failed write, not the end of the server
    // Enough threads that every running and queued request has one, plus a few that answer /health,
    // errors and 429s while all of those are busy.
    const std::size_t threads = static_cast<std::size_t>(options_.parallel + options_.max_queue + 4);
    server_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    server_.set_payload_max_length(options_.max_body_bytes);
    server_.set_read_timeout(60);
    server_.set_write_timeout(60);
    install_hooks();
    install_routes();
  }

  void bind() {
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
  }
  ServerSessions& sessions() { return sessions_; }

 private:
  void install_hooks();
  void install_routes();
  void chat_completions(const httplib::Request& request, httplib::Response& response);
  void completions(const httplib::Request& request, httplib::Response& response);
  void check_model(const std::string& model) const;

  // One generation request, either endpoint: runs it whole, or streams it from httplib's content
  // provider (after the status line went out, so every refusal happens before).
  struct Job {
    std::unique_ptr<ServerSessions::Lease> lease;
    SamplingRequest sampling;
    std::vector<TokenId> prompt_ids;    // the messages or the raw prompt, encoded
    bool chat = true;
    ChunkIdentity identity;
  };
  CompletionResult run_job(Job& job, const TextSink& sink, bool* client_gone);
  void respond(std::shared_ptr<Job> job, const httplib::Request& request, httplib::Response& response);
  bool stream(Job& job, httplib::DataSink& sink);

  const LoadedModel& model_;
  ServerOptions options_;
  ServerSessions sessions_;
  httplib::Server server_;
  int port_ = 0;
  std::atomic<std::uint64_t> next_id_{1};
  std::mutex lifecycle_mutex_;
  bool stopping_ = false;
  bool serving_ = false;
  std::atomic<bool> listen_returned_{false};
};

void OpenAiServer::Impl::install_hooks() {
  server_.set_pre_routing_handler([this](const httplib::Request& request, httplib::Response& response) {
    t_record = RequestRecord{Clock::now()};
    if (options_.api_key.empty() || request.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    if (request.get_header_value("Authorization") == "Bearer " + options_.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(response, ApiError(401,
                                  request.has_header("Authorization") ? "incorrect API key provided"
                                                                      : "missing API key: send Authorization: Bearer KEY",
                                  "invalid_request_error", "", "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });
  // httplib's own refusals (unknown path, body over the limit) get OpenAI's error shape too.
  server_.set_error_handler([this](const httplib::Request& request, httplib::Response& response) {
    if (!response.body.empty()) return;
    // cpp-httplib caps form-encoded bodies at 8 KiB: what curl -d sends without a Content-Type header.
    const bool form = request.get_header_value("Content-Type") == "application/x-www-form-urlencoded";
    if (response.status == 413)
      send_error(response, ApiError(413,
                                    "the request body is larger than the server accepts (" +
                                        std::to_string(options_.max_body_bytes) + " bytes" +
                                        (form ? "; 8192 for a form-encoded body: send Content-Type: application/json)"
                                              : ")"),
                                    "invalid_request_error", "", "request_too_large"));
    else if (response.status == 404)
      send_error(response, ApiError(404, "no endpoint " + request.method + " " + request.path, "invalid_request_error",
                                    "", "unknown_url"));
    else
      send_error(response, ApiError(response.status, "the request failed", "invalid_request_error"));
  });
  server_.set_logger([](const httplib::Request& request, const httplib::Response& response) {
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t_record.started).count();
    spdlog::info("{} {} {} prompt {} (cached {}) completion {} tokens {:.1f} ms{}", request.method, request.path,
                 response.status, t_record.prompt_tokens, t_record.cached_tokens, t_record.completion_tokens, ms,
                 t_record.client_gone ? " (client disconnected)" : "");
  });
}

void OpenAiServer::Impl::install_routes() {
  server_.Get("/health", [this](const httplib::Request&, httplib::Response& response) {
    const ServerSessions::Status status = sessions_.status();
    const json body = {{"status", "ok"},
                       {"running", status.running},
                       {"waiting", status.waiting},
                       {"sessions", status.sessions},
                       {"kv_cache_bytes", status.cache_bytes},
                       {"kv_cache_budget_bytes", status.budget_bytes},
                       {"kv_cache_evictions", status.evictions}};
    response.set_content(body.dump(), "application/json");
  });
  server_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& response) {
    json model = {{"id", options_.model_id}, {"object", "model"}, {"created", 0}, {"owned_by", "kvchat"},
                  {"context_length", sessions_.context_limit()}};
    response.set_content(json{{"object", "list"}, {"data", json::array({model})}}.dump(), "application/json");
  });
  auto guarded = [this](void (Impl::*handler)(const httplib::Request&, httplib::Response&)) {
    return [this, handler](const httplib::Request& request, httplib::Response& response) {
      try {
        (this->*handler)(request, response);
      } catch (const ApiError& error) {
        send_error(response, error);
      } catch (const std::exception& error) {
        spdlog::error("{} {}: {}", request.method, request.path, error.what());
        send_error(response, ApiError(500, error.what(), "server_error"));
      }
    };
  };
  server_.Post("/v1/chat/completions", guarded(&Impl::chat_completions));
  server_.Post("/v1/completions", guarded(&Impl::completions));
}

void OpenAiServer::Impl::check_model(const std::string& model) const {
  if (model != options_.model_id)
    throw ApiError(404, "the model '" + model + "' does not exist; this server serves '" + options_.model_id + "'",
                   "invalid_request_error", "model", "model_not_found");
}

void OpenAiServer::Impl::chat_completions(const httplib::Request& request, httplib::Response& response) {
  ChatCompletionRequest parsed = parse_chat_completion_request(request.body);
  check_model(parsed.sampling.model);
  auto job = std::make_shared<Job>();
  job->sampling = std::move(parsed.sampling);
  job->prompt_ids = sessions_.encode_chat(parsed.messages);
  job->lease = sessions_.acquire_for_prompt(job->prompt_ids);
  job->identity = ChunkIdentity{"chatcmpl-" + std::to_string(next_id_++), unix_time(), options_.model_id};
  respond(std::move(job), request, response);
}

void OpenAiServer::Impl::completions(const httplib::Request& request, httplib::Response& response) {
  CompletionRequest parsed = parse_completion_request(request.body);
  check_model(parsed.sampling.model);
  auto job = std::make_shared<Job>();
  job->chat = false;
  job->sampling = std::move(parsed.sampling);
  job->prompt_ids = sessions_.encode_prompt(parsed.prompt);
  job->lease = sessions_.acquire_for_prompt(job->prompt_ids);
  job->identity = ChunkIdentity{"cmpl-" + std::to_string(next_id_++), unix_time(), options_.model_id};
  respond(std::move(job), request, response);
}

CompletionResult OpenAiServer::Impl::run_job(Job& job, const TextSink& sink, bool* client_gone) {
  CompletionResult result = sessions_.run(*job.lease, job.prompt_ids, job.sampling, sink, client_gone);
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
      spdlog::warn("{}: the request's socket was not found; a disconnect will not stop its generation", job->identity.id);
    bool client_gone = false;
    const CompletionResult result =
        run_job(*job, [&connection](const std::string&) { return connection.open(); }, &client_gone);
    // With the client gone the write below fails; the log line says why the reply was cut short.
    const json body = job->chat ? chat_completion_response(job->identity.id, job->identity.created, job->identity.model, result)
                                : completion_response(job->identity.id, job->identity.created, job->identity.model, result);
    response.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
    return;
  }
  response.set_header("Cache-Control", "no-cache");
  response.set_chunked_content_provider("text/event-stream", [this, job](std::size_t, httplib::DataSink& sink) {
    return stream(*job, sink);
  });
}

bool OpenAiServer::Impl::stream(Job& job, httplib::DataSink& sink) {
  auto write = [&](const std::string& event) { return sink.write(event.data(), event.size()); };
  if (job.chat && !write(sse_event(chat_chunk(job.identity, "", /*delta_role=*/true, std::nullopt)))) return false;
  const TextSink text_sink = [&](const std::string& text) {
    if (text.empty()) return sink.is_writable();  // cpp-httplib 0.11 checks that the peer has not closed
    return write(sse_event(job.chat ? chat_chunk(job.identity, text, false, std::nullopt)
                                    : completion_chunk(job.identity, text, std::nullopt)));
  };
  bool client_gone = false;
  CompletionResult result;
  try {
    result = run_job(job, text_sink, &client_gone);
  } catch (const std::exception& error) {
    // The status line is out: the error goes in the stream, as OpenAI's streams carry them.
    spdlog::error("{} stream failed: {}", job.identity.id, error.what());
    write(sse_event(error_body(ApiError(500, error.what(), "server_error"))));
    sink.done();
    return true;
  }
  if (client_gone) return false;
  const json last = job.chat ? chat_chunk(job.identity, "", false, result.finish_reason)
                             : completion_chunk(job.identity, "", result.finish_reason);
  if (!write(sse_event(last))) return false;
  if (job.sampling.include_usage &&
      !write(sse_event(usage_chunk(job.identity, job.chat ? "chat.completion.chunk" : "text_completion", result.stats))))
    return false;
  if (!write(kSseDone)) return false;
  sink.done();
  return true;
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
