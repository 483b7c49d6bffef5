#pragma once
// Measuring the engine against the machine: the hardware ceilings (memory read bandwidth, sgemm rate)
// and one generation run timed token by token. Used by `kvchat-cli bench`.
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/types.h"

namespace kvchat {

class LlamaModel;

struct HardwareCeilings {
  double read_bandwidth_gb_s = 0;  // sustained read bandwidth with the bench's threads (best of runs)
  double sgemm_gflop_s = 0;        // LibTorch (OpenBLAS) f32 matrix product rate with the same threads
};

// Measures both ceilings (a 256 MiB read buffer, far beyond any cache); takes a few seconds.
HardwareCeilings measure_hardware_ceilings(int threads);

struct BenchRun {
  GenerationStats stats;
  double decode_tok_s_start = 0;  // over the first tokens of the run
  double decode_tok_s_end = 0;    // over the last tokens of the run
  double total_ms = 0;            // prefill + decode, what a user waits
  std::vector<TokenId> generated;
  std::int64_t peak_rss_bytes = 0;  // of the process so far
  std::int64_t rss_bytes = 0;       // resident after the run
};

// Runs `prompt_tokens` seeded random ids (after BOS) through a fresh session, then exactly
// `new_tokens` greedy tokens (end-of-sequence ids do not stop it).
BenchRun run_generation_benchmark(const std::shared_ptr<const LlamaModel>& model, KvCacheMode mode,
                                  int prompt_tokens, int new_tokens);

// 2 x the parameters a prefill token multiplies (every layer; not the embedding lookup, and the
// lm_head only once per prefill since only the last position gets logits).
double prefill_flops_per_token(const LlamaModel& model);
std::int64_t peak_rss_bytes();
std::int64_t current_rss_bytes();

}  // namespace kvchat
