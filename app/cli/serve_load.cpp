#include "app/cli/serve_load.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <iterator>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "app/server/broken_pipe.h"

namespace kvchat::cli {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

const char* const kOpenings[] = {"Once upon a time",   "Tom had a red ball", "Lily saw a big dog", "The sun was hot",
                                 "A little bird sang", "One day, a cat",     "Mia liked to run",   "Ben found a box"};
const char* const kFollowUps[] = {" Then the",     " The next day", " She said",     " After that",
                                  " They went to", " But the",      " He was happy", " So they"};

json user(const std::string& text) { return {{"role", "user"}, {"content", text}}; }

double milliseconds_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// One streamed request; the reply text goes to `reply`.
RequestOutcome stream_request(httplib::Client& client, const LoadPlan& plan, const json& messages, std::string* reply) {
  RequestOutcome outcome;
  const json body = {{"model", plan.model_id}, {"messages", messages},
                     {"temperature", 0},       {"max_tokens", plan.max_tokens},
                     {"stream", true},         {"stream_options", {{"include_usage", true}}}};
  httplib::Request request;
  request.method = "POST";
  request.path = "/v1/chat/completions";
  request.body = body.dump();
  request.set_header("Content-Type", "application/json");
  std::string pending;
  bool done = false;
  const Clock::time_point start = Clock::now();
  request.content_receiver = [&](const char* data, std::size_t length, std::uint64_t, std::uint64_t) {
    pending.append(data, length);
    for (std::size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
      const std::string event = pending.substr(0, end);
      pending.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      const std::string payload = event.substr(6);
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      const json chunk = json::parse(payload, nullptr, false);
      if (chunk.is_discarded()) continue;
      if (chunk.contains("usage") && chunk["usage"].is_object()) {
        outcome.prompt_tokens = chunk["usage"].value("prompt_tokens", 0);
        outcome.completion_tokens = chunk["usage"].value("completion_tokens", 0);
        outcome.cached_tokens = chunk["usage"]["prompt_tokens_details"].value("cached_tokens", 0);
      }
      if (chunk.contains("error")) outcome.error = chunk["error"].value("message", "error in the stream");
      if (!chunk.contains("choices") || chunk["choices"].empty()) continue;
      const json& delta = chunk["choices"][0]["delta"];
      if (delta.contains("content") && delta["content"].is_string() && !delta["content"].get<std::string>().empty()) {
        if (outcome.ttft_ms == 0.0) outcome.ttft_ms = milliseconds_since(start);
        *reply += delta["content"].get<std::string>();
      }
    }
    return true;
  };
  const httplib::Result result = client.send(request);
  outcome.total_ms = milliseconds_since(start);
  if (!result) {
    outcome.error = "no answer: " + httplib::to_string(result.error());
  } else if (result->status != 200) {
    outcome.error = "status " + std::to_string(result->status) + ": " + result->body.substr(0, 200);
  } else if (!done) {
    if (outcome.error.empty()) outcome.error = "the stream ended without data: [DONE]";
  } else {
    outcome.ok = outcome.error.empty();
  }
  if (outcome.ttft_ms == 0.0) outcome.ttft_ms = outcome.total_ms;  // a reply with no text
  return outcome;
}

}  // namespace

LoadResult run_load(const LoadPlan& plan, const std::function<void()>& after_request) {
  app::ignore_broken_pipe_signals();  // the server may close a connection while a request is sent
  LoadResult result;
  std::mutex mutex;
  std::vector<std::thread> clients;
  const Clock::time_point start = Clock::now();
  for (int client_index = 0; client_index < plan.clients; ++client_index) {
    clients.emplace_back([&, client_index] {
      httplib::Client client("127.0.0.1", plan.port);
      client.set_read_timeout(600, 0);
      client.set_write_timeout(60, 0);
      const std::string opening = kOpenings[client_index % std::size(kOpenings)];
      json messages = json::array({user(opening)});
      for (int turn = 0; turn < plan.requests_per_client; ++turn) {
        std::string reply;
        const RequestOutcome outcome = stream_request(client, plan, messages, &reply);
        bool restarted = false;
        // The next request adds this reply and a user message: start over before it cannot fit.
        if (plan.context_length > 0 &&
            outcome.prompt_tokens + outcome.completion_tokens + 2 * plan.max_tokens + 16 > plan.context_length) {
          messages = json::array({user(opening)});
          restarted = true;
        } else {
          messages.push_back({{"role", "assistant"}, {"content", reply}});
          messages.push_back(user(kFollowUps[(client_index + turn) % std::size(kFollowUps)]));
        }
        {
          std::lock_guard<std::mutex> lock(mutex);
          result.requests.push_back(outcome);
          result.conversations_restarted += restarted ? 1 : 0;
        }
        if (after_request) after_request();
      }
    });
  }
  for (std::thread& client : clients) client.join();
  result.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

double quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(values.size())));
  return values[std::min(values.size() - 1, rank == 0 ? 0 : rank - 1)];
}

}  // namespace kvchat::cli
