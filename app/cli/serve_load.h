#pragma once
// The load that `kvchat-cli serve-bench` puts on a running server: client threads, each growing its own
// conversation over streamed chat requests (the next request resends the history, the reply and a new
// user message), measuring what a client sees. No engine code: only HTTP.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace kvchat::cli {

struct LoadPlan {
  int port = 0;
  std::string model_id;
  int clients = 8;
  int requests_per_client = 20;
  int max_tokens = 16;
  int context_length = 0;  // a conversation that would outgrow it starts over
};

struct RequestOutcome {
  bool ok = false;
  double ttft_ms = 0.0;  // from sending the request to the first piece of reply text
  double total_ms = 0.0;
  int prompt_tokens = 0;
  int cached_tokens = 0;
  int completion_tokens = 0;
  std::string error;  // when not ok
};

struct LoadResult {
  std::vector<RequestOutcome> requests;
  double wall_seconds = 0.0;
  int conversations_restarted = 0;  // at the context limit
};

// Runs every client to the end; a failed request is recorded and its client goes on. `after_request`
// (may be empty) is called from the client threads after each request.
LoadResult run_load(const LoadPlan& plan, const std::function<void()>& after_request);

// The q-quantile (0..1) of `values` (nearest rank); 0 for none.
double quantile(std::vector<double> values, double q);

}  // namespace kvchat::cli
