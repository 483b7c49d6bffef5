// kvchat-cli serve: the OpenAI-compatible HTTP API on one model (app/server/openai_server.h), until SIGINT/SIGTERM.
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include "app/cli/cli_command.h"
#include "app/cli/model_options.h"
#include "app/server/openai_server.h"
#include "app/settings.h"
#include "app/snapshot_key.h"
#include "engine/cache/kv_snapshot.h"
#include "engine/cache/snapshot_store.h"
#include "engine/compute/compute_context.h"
#include "engine/compute/compute_options.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_loader.h"

namespace kvchat::cli {
// Named, not anonymous: the command files are compiled in batches (unity build).
namespace serve_command {

const std::string kUsage =
    "usage: kvchat-cli serve --model DIR|FILE.gguf [--host 127.0.0.1] [--port 8080] [--api-key KEY]\n"
    "                        [--parallel N] [--max-queue N] [--cache-dir DIR] [--model-id NAME]\n"
    "                        [--max-body-mib N] [--memory-budget-mib N] [--threads N] [--cors-origin ORIGIN|*]\n"
    "                        [--header-timeout-s N] [--body-timeout-s N] [--speculative none|lookup|draft]\n"
    "                        [--draft-tokens K] [--draft-model PATH] [--kv-dtype f32|bf16|f16|q8_0] [--long-context]\n"
    "Serves the OpenAI API: GET /health, GET /v1/models, POST /v1/chat/completions, POST /v1/completions\n"
    "(stream true: server-sent events), each also without /v1 (a client given the bare base URL). Requests\n"
    "may name the model by its id: --model-id, default the model's folder or file name. --parallel requests\n"
    "generate at once (default 1, at most 64), each on its own KV cache, their decode steps batched (one\n"
    "pass over the weights for all of them; each reply as it would be alone); up to --max-queue more wait\n"
    "(default 16, at most 256), any beyond are answered 429 (Retry-After). A request's prompt is its\n"
    "messages encoded whole; it reuses the cache sharing the longest prefix with it (a copy of that prefix\n"
    "when another conversation's cache holds it), so a multi-turn client prefills only its new turn and\n"
    "conversations sharing a system prompt prefill it once. A client that leaves stops its prefill before\n"
    "the next chunk, or its generation at the next token.\n"
    "--cache-dir: KV snapshots are written there after each request and restored by later ones\n"
    "(and by the next run). --memory-budget-mib: the sessions' KV caches together (default as the desktop\n"
    "app's: a quarter of the machine's memory); the least recently used idle ones are evicted beyond it\n"
    "(with --cache-dir their snapshots are written first). GET /health reports the caches and the budget.\n"
    "--api-key: every endpoint but /health needs Authorization: Bearer KEY.\n"
    "--cors-origin: the web pages that may call the API from a browser: ORIGIN (https://host[:port], several\n"
    "separated by commas) or * for any; default this machine's (http(s)://localhost, 127.0.0.1, [::1]).\n"
    "A request's headers must arrive within --header-timeout-s (default 10) and its body within\n"
    "--body-timeout-s (default 60) of them; --max-body-mib (default 8, at most 256) holds for chunked bodies too.\n"
    "Binds 127.0.0.1 unless --host says otherwise. Prints `listening on http://HOST:PORT` on stderr.\n" +
    std::string(kSpeculativeUsage) + kKvDtypeUsage + kLongContextUsage;

// SIGINT and SIGTERM stop the server from a thread of their own, not from the handler: stopping takes
// locks that the interrupted thread may hold. The handler only writes the signal's number to a pipe
// (async-signal-safe); the thread reads it and stops the server.
int g_signal_pipe[2] = {-1, -1};

void forward_signal(int signal) {
  const char byte = static_cast<char>(signal);
  [[maybe_unused]] const ssize_t written = ::write(g_signal_pipe[1], &byte, 1);
}

class SignalStopper {
 public:
  ~SignalStopper() {
    if (!thread_.joinable()) return;
    const char wake = 0;  // 0 is no signal: it only ends the wait
    [[maybe_unused]] const ssize_t written = ::write(g_signal_pipe[1], &wake, 1);
    thread_.join();
  }
  void stop_on_signal(app::openai::OpenAiServer& server) {
    if (::pipe(g_signal_pipe) != 0) throw std::runtime_error("cannot create the signal pipe");
    thread_ = std::thread([&server] {
      char byte = 0;
      if (::read(g_signal_pipe[0], &byte, 1) == 1 && byte != 0) {
        spdlog::info("signal {}: stopping", static_cast<int>(byte));
        server.stop();
      }
    });
    std::signal(SIGINT, forward_signal);
    std::signal(SIGTERM, forward_signal);
  }

 private:
  std::thread thread_;
};

std::string default_model_id(const std::string& path) {
  std::filesystem::path p(path);
  if (!p.has_filename()) p = p.parent_path();
  return p.filename().string();
}

int positive_option(const ArgParser& parser, const std::string& name, int fallback, int minimum) {
  const int value = parser.int_or(name, fallback);
  if (value < minimum) throw UsageError("--" + name + " must be at least " + std::to_string(minimum));
  return value;
}

int bounded_option(const ArgParser& parser, const std::string& name, int fallback, int minimum, int maximum) {
  const int value = parser.int_or(name, fallback);
  if (value < minimum || value > maximum)
    throw UsageError("--" + name + " must be from " + std::to_string(minimum) + " to " + std::to_string(maximum) +
                     ", got " + std::to_string(value));
  return value;
}

int run_serve(const std::vector<std::string>& args) {
  ArgParser parser({"model", "host", "port", "api-key", "parallel", "max-queue", "cache-dir", "model-id",
                    "max-body-mib", "memory-budget-mib", "threads", "cors-origin", "header-timeout-s", "body-timeout-s",
                    "speculative", "draft-tokens", "draft-model", "kv-dtype"},
                   {"long-context"});
  parser.parse(args);
  const std::string model_path = parser.required("model");
  app::openai::ServerOptions options;
  options.host = parser.value_or("host", "127.0.0.1");
  options.port = parser.int_or("port", 8080);
  if (options.port < 0 || options.port > 65535) throw UsageError("--port must be 0 (any free port) to 65535");
  options.api_key = parser.value_or("api-key", "");
  using app::openai::ServerOptions;
  options.parallel = bounded_option(parser, "parallel", 1, 1, ServerOptions::kMaxParallel);
  options.max_queue = bounded_option(parser, "max-queue", 16, 0, ServerOptions::kMaxQueue);
  options.max_body_bytes = static_cast<std::size_t>(bounded_option(
                               parser, "max-body-mib", 8, 1, static_cast<int>(ServerOptions::kMaxBodyBytes >> 20)))
                           << 20;
  options.cors_origin = parser.value_or("cors-origin", "");
  if (parser.value("cors-origin") && options.cors_origin != "*") {
    std::size_t start = 0;
    do {
      const std::size_t end = std::min(options.cors_origin.find(',', start), options.cors_origin.size());
      const std::string origin = options.cors_origin.substr(start, end - start);
      if (origin.find("http://") == std::string::npos && origin.find("https://") == std::string::npos)
        throw UsageError(
            "--cors-origin takes * or origins such as https://chat.example.org:3000 (several separated "
            "by commas), got '" +
            origin + "'");
      start = end + 1;
    } while (start <= options.cors_origin.size());
  }
  options.header_timeout_ms = bounded_option(parser, "header-timeout-s", 10, 1, 3600) * 1000;
  options.body_timeout_ms = bounded_option(parser, "body-timeout-s", 60, 1, 3600) * 1000;
  options.model_id = parser.value_or("model-id", default_model_id(model_path));
  constexpr std::int64_t kMiB = std::int64_t(1) << 20;
  options.memory_budget_bytes = parser.value("memory-budget-mib")
                                    ? std::int64_t(positive_option(parser, "memory-budget-mib", 0, 1)) * kMiB
                                    : app::ChatSettings{}.effective_cache_budget_bytes();
  const int threads = threads_from_option(parser);
  options.speculative = speculative_from_options(parser);
  options.kv_dtype = kv_dtype_from_option(parser.value_or("kv-dtype", "f32"));

  spdlog::set_level(spdlog::level::info);
  const LoadedModel model =
      load_model(model_path, LoadOptions{WeightDtype::Float32, threads, long_context_from_option(parser)});
  if (!model.tokenizer) throw UsageError("model " + model_path + " has no tokenizer, so it cannot serve text");
  load_draft_model(parser, options.speculative, *model.model);
  std::shared_ptr<SnapshotStore> snapshots;
  if (auto directory = parser.value("cache-dir")) {
    try {
      snapshots = app::open_snapshot_store(*directory, std::int64_t(2048) << 20, *model.model, options.kv_dtype);
    } catch (const SnapshotError& error) {
      throw UsageError(std::string("--cache-dir: ") + error.what());
    }
  }

  options.compute = std::make_shared<const ComputeContext>(ComputeContext::Options{threads, fast_kernels_enabled()});
  app::openai::OpenAiServer server(model, snapshots, options);
  server.bind();
  SignalStopper signals;  // destroyed before the server
  signals.stop_on_signal(server);
  std::fprintf(stderr, "listening on http://%s:%d (model id %s, KV cache budget %lld MiB)\n", options.host.c_str(),
               server.bound_port(), options.model_id.c_str(),
               static_cast<long long>(options.memory_budget_bytes / kMiB));
  std::fflush(stderr);
  server.serve();
  spdlog::info("server stopped");
  return 0;
}

const CliRegistration registration({"serve", "serve the OpenAI HTTP API on a model", kUsage, run_serve});

}  // namespace serve_command
}  // namespace kvchat::cli
