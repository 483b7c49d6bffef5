// kvchat-cli serve-bench: the OpenAI server under load, in one process: the server on a model (default
// the embedded stories260K) and client threads talking HTTP to it (app/cli/serve_load.h).
#include <spdlog/spdlog.h>

#include <QDir>
#include <QFileInfo>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "app/cli/cli_command.h"
#include "app/cli/model_options.h"
#include "app/cli/serve_load.h"
#include "app/model_locator.h"
#include "app/server/openai_server.h"
#include "app/server/openai_sessions.h"
#include "app/settings.h"
#include "engine/bench/benchmark.h"
#include "engine/model/model_loader.h"

namespace kvchat::cli {
// Named, not anonymous: the command files are compiled in batches (unity build).
namespace serve_bench_command {

const char* kUsage =
    "usage: kvchat-cli serve-bench [--model DIR|FILE.gguf] [--clients 8] [--requests 20] [--parallel 2]\n"
    "                              [--max-tokens 16] [--memory-budget-mib N] [--threads N] [--json]\n"
    "Starts the OpenAI server in this process on the model (default the embedded stories260K) and runs\n"
    "--clients threads, each sending --requests streamed chat requests, greedy, of one growing\n"
    "conversation (each request resends the history, the last reply and a new user message; a\n"
    "conversation about to outgrow the context starts over). --parallel requests generate at once,\n"
    "their decode steps batched; the queue holds every client, so none is refused. Prints: requests/s\n"
    "and generated tokens/s over the wall time, p50/p99 time to first token as the clients saw it, the\n"
    "cached-token share (sum of cached_tokens / sum of prompt_tokens), failed requests, peak RSS beside\n"
    "the KV cache budget (--memory-budget-mib, default as the desktop app's: a quarter of the machine's\n"
    "memory), and the decode batches (tokens, steps, the most in one step).";

constexpr double kMiB = 1048576.0;

int option_at_least(const ArgParser& parser, const std::string& name, int fallback, int minimum) {
  const int value = parser.int_or(name, fallback);
  if (value < minimum) throw UsageError("--" + name + " must be at least " + std::to_string(minimum));
  return value;
}

int run_serve_bench(const std::vector<std::string>& args) {
  ArgParser parser({"model", "clients", "requests", "parallel", "max-tokens", "memory-budget-mib", "threads"},
                   {"json"});
  parser.parse(args);
  LoadPlan plan;
  plan.clients = option_at_least(parser, "clients", 8, 1);
  plan.requests_per_client = option_at_least(parser, "requests", 20, 1);
  plan.max_tokens = option_at_least(parser, "max-tokens", 16, 1);
  app::openai::ServerOptions options;
  options.port = 0;
  options.parallel = option_at_least(parser, "parallel", 2, 1);
  options.max_queue = plan.clients;
  options.memory_budget_bytes = parser.value("memory-budget-mib")
                                    ? std::int64_t(option_at_least(parser, "memory-budget-mib", 0, 1)) << 20
                                    : app::ChatSettings{}.effective_cache_budget_bytes();
  const int threads = threads_from_option(parser);
  const QString model_path = app::resolve_model_path(QString::fromStdString(parser.value_or("model", "")));
  options.model_id = QFileInfo(QDir::cleanPath(model_path)).fileName().toStdString();

  spdlog::set_level(spdlog::level::warn);  // one line per request would bury the figures
  const LoadedModel model = load_model(model_path.toStdString(), LoadOptions{WeightDtype::Float32, threads});
  if (!model.tokenizer)
    throw UsageError("model " + model_path.toStdString() + " has no tokenizer, so it cannot serve chat");
  const std::int64_t rss_after_load = current_rss_bytes();
  app::openai::OpenAiServer server(model, nullptr, options);
  server.bind();
  std::thread serve_thread([&server] { server.serve(); });
  plan.port = server.bound_port();
  plan.model_id = options.model_id;
  plan.context_length = static_cast<int>(model.config.max_position_embeddings);

  std::mutex peak_mutex;
  std::int64_t peak_cache_bytes = 0;
  const LoadResult load = run_load(plan, [&] {
    const std::int64_t bytes = server.sessions().status().cache_bytes;
    std::lock_guard<std::mutex> lock(peak_mutex);
    peak_cache_bytes = std::max(peak_cache_bytes, bytes);
  });
  const app::openai::ServerSessions::Status status = server.sessions().status();
  server.stop();
  serve_thread.join();

  int failed = 0;
  long long generated = 0, prompt = 0, cached = 0;
  std::vector<double> ttft;
  std::string first_error;
  for (const RequestOutcome& request : load.requests) {
    if (!request.ok) {
      if (failed++ == 0) first_error = request.error;
      continue;
    }
    generated += request.completion_tokens;
    prompt += request.prompt_tokens;
    cached += request.cached_tokens;
    ttft.push_back(request.ttft_ms);
  }
  const double seconds = std::max(load.wall_seconds, 1e-9);
  nlohmann::ordered_json out = {{"model", options.model_id},
                                {"clients", plan.clients},
                                {"requests_per_client", plan.requests_per_client},
                                {"parallel", options.parallel},
                                {"max_tokens", plan.max_tokens},
                                {"threads", threads},
                                {"requests", load.requests.size()},
                                {"failed", failed},
                                {"conversations_restarted", load.conversations_restarted},
                                {"wall_s", load.wall_seconds},
                                {"requests_per_s", double(load.requests.size() - failed) / seconds},
                                {"generated_tokens", generated},
                                {"generated_tokens_per_s", double(generated) / seconds},
                                {"ttft_p50_ms", quantile(ttft, 0.50)},
                                {"ttft_p99_ms", quantile(ttft, 0.99)},
                                {"prompt_tokens", prompt},
                                {"cached_tokens", cached},
                                {"cached_share", prompt > 0 ? double(cached) / double(prompt) : 0.0},
                                {"peak_rss_mib", peak_rss_bytes() / kMiB},
                                {"rss_after_model_load_mib", rss_after_load / kMiB},
                                {"kv_cache_peak_mib", peak_cache_bytes / kMiB},
                                {"kv_cache_budget_mib", options.memory_budget_bytes / kMiB},
                                {"kv_cache_evictions", status.evictions},
                                {"batched_decode_steps", status.batched_steps},
                                {"batched_decode_rows", status.batched_rows},
                                {"largest_decode_batch", status.largest_batch}};
  if (!first_error.empty()) out["first_error"] = first_error;
  if (parser.has("json")) {
    std::cout << out.dump() << std::endl;
    return failed == 0 ? 0 : 1;
  }
  std::printf("serve-bench: model %s, %d clients x %d requests, parallel %d, max_tokens %d, threads %d\n",
              options.model_id.c_str(), plan.clients, plan.requests_per_client, options.parallel, plan.max_tokens,
              threads);
  std::printf("requests: %zu, failed %d, conversations restarted at the context limit %d\n", load.requests.size(),
              failed, load.conversations_restarted);
  std::printf("throughput: %.1f requests/s, %.0f generated tokens/s (%.2f s wall)\n",
              out["requests_per_s"].get<double>(), out["generated_tokens_per_s"].get<double>(), load.wall_seconds);
  std::printf("ttft: p50 %.1f ms, p99 %.1f ms\n", quantile(ttft, 0.50), quantile(ttft, 0.99));
  std::printf("cached tokens: %lld of %lld prompt tokens (%.1f %%)\n", cached, prompt,
              100.0 * out["cached_share"].get<double>());
  std::printf(
      "memory: peak RSS %.1f MiB (%.1f MiB after loading the model); KV caches at most %.2f MiB, budget %.1f MiB, %lld "
      "evictions\n",
      out["peak_rss_mib"].get<double>(), rss_after_load / kMiB, peak_cache_bytes / kMiB,
      options.memory_budget_bytes / kMiB, static_cast<long long>(status.evictions));
  if (status.batched_steps > 0)
    std::printf("decode batches: %lld tokens in %lld steps (%.2f a step, at most %lld)\n",
                static_cast<long long>(status.batched_rows), static_cast<long long>(status.batched_steps),
                double(status.batched_rows) / double(status.batched_steps),
                static_cast<long long>(status.largest_batch));
  else
    std::printf("decode batches: none (--parallel 1, or the model's products are not on the engine kernels)\n");
  if (!first_error.empty()) std::printf("first failure: %s\n", first_error.c_str());
  return failed == 0 ? 0 : 1;
}

const CliRegistration registration({"serve-bench",
                                    "load-test the OpenAI server in-process (throughput, TTFT, cache reuse)", kUsage,
                                    run_serve_bench});

}  // namespace serve_bench_command
}  // namespace kvchat::cli
