#pragma once
// Measuring the engine against the machine: the hardware ceilings (memory read bandwidth, sgemm rate)
// and one generation run timed token by token. Used by `kvchat-cli bench`.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/types.h"

namespace kvchat {

class LlamaModel;

struct HardwareCeilings {
  double read_bandwidth_gb_s = 0;  // sustained read bandwidth with the bench's threads (best of runs)
  double sgemm_gflop_s = 0;        // LibTorch (OpenBLAS) f32 matrix product rate with the same threads
  // The kernel set OpenBLAS runs ("Cooperlake", "Haswell", ...; empty when the BLAS is not an OpenBLAS that
  // chooses at run time), and whether OPENBLAS_CORETYPE chose it: forcing an AVX2 set on an AVX-512
  // processor halves the sgemm rate and every prefill product that goes through it.
  std::string blas_kernels;
  bool blas_kernels_forced = false;
};

// Measures both ceilings (a 256 MiB read buffer, far beyond any cache); takes a few seconds.
HardwareCeilings measure_hardware_ceilings(int threads);

struct BenchRun {
  GenerationStats stats;
  // Decode speed from the steps' own durations (token to token, minus any probe in between).
  double decode_tok_s = 0;
  double decode_tok_s_start = 0;  // over the first steps of the run
  double decode_tok_s_end = 0;    // over the last steps of the run
  double total_ms = 0;            // prefill + decode as a user waits for it (no probes)
  std::vector<TokenId> generated;
  std::int64_t peak_rss_bytes = 0;  // of the process so far
  std::int64_t rss_bytes = 0;       // resident after the run
  // With probe_between_steps: the read bandwidth probed just before each step, weighted by the
  // step's duration, and the bytes the steps read (weights once per step) over the bytes the machine
  // could have read in the same time at those rates. 0 without.
  double paired_bandwidth_gb_s = 0;
  double decode_fraction_of_paired_bandwidth = 0;
  int bandwidth_probes = 0;
};

// Runs `prompt_tokens` seeded random ids (after BOS) through a fresh session, then exactly
// `new_tokens` greedy tokens (end-of-sequence ids do not stop it).
// probe_between_steps: before every decode step, measure the read bandwidth over the first
// kPairedProbeBytes (or all) of the model's own lm_head weights (no extra memory; read last in a step, so the
// step gains nothing from it being in cache). For a machine whose bandwidth drifts while it runs,
// each step is then compared with the bandwidth of its own moment. Meant for models whose weights
// are far beyond the last-level cache (see pairs_bandwidth_probes).
// repeating_prompt: the prompt is one passage of kRepeatedPassageTokens random ids over and over (text that
// repeats its context, what prompt lookup catches); `speculative` applies to the decode.
struct BenchGeneration {
  bool probe_between_steps = false;
  bool repeating_prompt = false;
  SpeculativeConfig speculative;
  KvDtype kv_dtype = KvDtype::F32;  // how the cache stores K/V (the uncached path rounds through it too)
};
constexpr int kRepeatedPassageTokens = 64;
BenchRun run_generation_benchmark(const std::shared_ptr<const LlamaModel>& model, KvCacheMode mode, int prompt_tokens,
                                  int new_tokens, const BenchGeneration& how);
inline BenchRun run_generation_benchmark(const std::shared_ptr<const LlamaModel>& model, KvCacheMode mode,
                                         int prompt_tokens, int new_tokens, bool probe_between_steps = false) {
  BenchGeneration how;
  how.probe_between_steps = probe_between_steps;
  return run_generation_benchmark(model, mode, prompt_tokens, new_tokens, how);
}
// What checking speculative proposals costs: the milliseconds of one pass over `rows` rows (LlamaModel::decode_rows
// after `context_tokens` cached positions), median of `repeats`, for each entry of `rows`; a speed-up needs
// a pass of k + 1 rows to cost less than the steps its accepted tokens save.
std::vector<double> rows_pass_milliseconds(const std::shared_ptr<const LlamaModel>& model, int context_tokens,
                                           const std::vector<int>& rows, int repeats);

// `batch` sequences of `prompt_tokens` seeded random ids each (sequence i's ids the same whatever the batch), whose
// first half is common to all of them (a shared system prompt), prefilled one by one, then `new_tokens` greedy
// tokens each, all sequences' steps together through LlamaModel::decode_batch. The caches are paged (one block pool,
// kBenchBlockTokens positions a block; the others fork the first sequence's cache after the common half, so they
// hold its whole blocks once and copy the one they diverge in), or contiguous for a model with sliding-window layers.
// Decode tok/s over every sequence's tokens (aggregate) and per sequence; the first sequence's tokens, to compare
// across batch sizes (batch 1 is that sequence alone).
constexpr std::int64_t kBenchBlockTokens = 16;
struct BatchRun {
  int batch = 0;
  double aggregate_tok_s = 0.0;
  double per_sequence_tok_s = 0.0;
  double step_ms = 0.0;  // mean wall time of one batched step
  std::vector<TokenId> first_sequence;
  bool paged = false;
  std::int64_t kv_blocks_used = 0;    // at the end
  std::int64_t kv_blocks_shared = 0;  // of those, held by more than one sequence
  std::int64_t kv_block_copies = 0;   // copy-on-write: a sequence writing into a block another holds
  // Each sequence's time to its first token from the start of the run: the prompts are prefilled one after
  // another (the common half once) before the batch decodes, so the last waits for every prefill before it.
  std::vector<double> first_token_ms;
};
BatchRun run_batch_benchmark(const std::shared_ptr<const LlamaModel>& model, int batch, int prompt_tokens,
                             int new_tokens);

// A 256 MiB region reads measurably faster than the GiB-sized ones decode streams (DESIGN.md's table
// of tuning constants), so the probe before each step reads up to 1 GiB, once.
constexpr std::size_t kPairedProbeBytes = std::size_t(1) << 30;
constexpr std::size_t kPairedProbeMinimumBytes = std::size_t(256) << 20;
// Whether the model is large enough for probe_between_steps to measure main memory (>= 1 GiB of
// weights, an lm_head of at least kPairedProbeMinimumBytes). Smaller models may still use it (tests).
bool pairs_bandwidth_probes(const LlamaModel& model);

// 2 x the parameters a prefill token multiplies (every layer; not the embedding lookup, and the
// lm_head only once per prefill since only the last position gets logits).
double prefill_flops_per_token(const LlamaModel& model);
std::int64_t peak_rss_bytes();
std::int64_t current_rss_bytes();

}  // namespace kvchat
