// kvchat-cli bench: the engine's speed against the machine's ceilings, measured in the same run.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "app/cli/bench_snapshot.h"
#include "app/cli/cli_command.h"
#include "app/cli/model_options.h"
#include "app/cli/tokenizer_source.h"
#include "engine/bench/benchmark.h"
#include "engine/compute/compute_context.h"
#include "engine/compute/process_setup.h"
#include "engine/generation/session.h"
#include "engine/kernels/memory_probe.h"
#include "engine/model/llama_model.h"
#include "engine/text/constraint/json_grammar.h"
#include "engine/text/constraint/token_constraint.h"
#include "engine/text/regular_file.h"

namespace kvchat::cli {
// Named, not anonymous: the command files are compiled in batches (unity build).
namespace bench_command {

const std::string kUsage =
    std::string(
        "usage: kvchat-cli bench (--model DIR|FILE.gguf | --random-weights CONFIG.json [--weights-seed N])\n"
        "                        [--prompt-tokens 5,128,512,2048] [--new-tokens N] [--kv-cache on,naive,off]\n"
        "                        [--kv-dtype f32,bf16,f16,q8_0]\n"
        "                        [--dtype f32,bf16,q8_0,q4_k,...] [--threads N] [--kernels on|off]\n"
        "                        [--bandwidth-probe auto|step|row] [--speculative lookup|draft [--draft-tokens K]\n"
        "                        [--draft-model PATH] [--pairs N]] [--prompt-kind random|repeating]\n"
        "                        [--batch 1,2,4,8] [--json-schema FILE [--tokenizer DIR|FILE.gguf]] [--warmup]\n"
        "                        [--json]\n"
        "       kvchat-cli bench --snapshot (--model ... | --random-weights ...) [--prompt-tokens 2000] [--new-tokens "
        "32]\n"
        "                        [--dtype f32,bf16] [--cache-dir DIR] [--threads N] [--kernels on|off] [--json]\n"
        "--dtype      how the weights are kept, one run each: f32, bf16 (a directory's weights converted on load,\n"
        "             or random ones), or, with --random-weights only, a GGUF block type the random weights are\n"
        "             made in: f16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k (case-insensitive; every row\n"
        "             length must be a multiple of the type's block). A GGUF file keeps its own types: leave\n"
        "             --dtype out (or f32) with --model FILE.gguf.\n"
        "Measures memory read bandwidth and sgemm GFLOP/s first, then one generation per configuration.\n"
        "decode %bw   = weight bytes read by the decode steps / bytes the machine could read in the same time\n"
        "               step: bandwidth probed before every decode step, over the model's own weights (the\n"
        "                     default for models of 1 GiB or more, whose decode is bound by memory)\n"
        "               row:  one probe of a 256 MiB buffer just before the row (the default below 1 GiB)\n"
        "               GB/s column: the bandwidth used (step: the steps' time-weighted mean)\n"
        "prefill %mm  = prefill tok/s x FLOP per token / sgemm FLOP/s\n"
        "Every cache-off run is compared with the cache-on run of the same size: speedup and identical tokens.\n"
        "--kv-dtype   how the cache stores K/V, one row each (default f32); kv B/tok: the cache's bytes per token.\n"
        "--speculative lookup|draft: after the rows, plain and speculative decoding with the cache on, in N "
        "interleaved\n"
        "             pairs (default 3) per prompt length: decode tok/s of each (median), the speed-up, the\n"
        "             proposed tokens accepted, and whether the tokens are identical (they must be).\n"
        "--batch 1,2,4,8: after the rows, that many sequences decoding together (one pass over the weights per\n"
        "             step for all of them), in --pairs interleaved rounds: aggregate and per-sequence tok/s\n"
        "             (medians), against batch 1, and whether the first sequence's tokens are its tokens alone. The\n"
        "             prompts share their first half (held once in a paged KV cache: blocks used, shared, copied).\n"
        "             TTFT p50/p99 over every sequence of the rounds: the prompts are prefilled one after another\n"
        "             before the batch decodes.\n"
        "--json-schema FILE: after the rows, plain and constrained greedy decoding (the reply a JSON value valid\n"
        "             against the schema in FILE) in --pairs interleaved pairs: decode tok/s of each (median), the\n"
        "             cost, and the milliseconds the token mask takes per token. Needs the model's tokenizer or\n"
        "             --tokenizer (random weights have none).\n"
        "--prompt-kind repeating: the prompt repeats one passage of 64 random ids (text that repeats its\n"
        "             context, what prompt lookup catches); random (the default): no repetition.\n"
        "--warmup     before each row, one generation of the row's prompt and one new token, not measured (as\n"
        "             llama-bench warms up): without it a row's figures include the process's first touches of\n"
        "             the model's mapped file and of its buffers, which the first prompt after loading pays.\n") +
    kSnapshotBenchUsage;

double mib(double bytes) { return bytes / 1048576.0; }

struct BenchOptions {
  bool json_output = false;
  std::vector<long long> prompt_lengths;
  int new_tokens = 32;
  std::vector<KvCacheMode> modes;
  std::vector<KvDtype> kv_dtypes;
  std::vector<WeightStorage> dtypes;
  std::string kernels = "on";
  std::string bandwidth_probe = "auto";
  SpeculativeConfig speculative;       // mode None: no comparison
  std::vector<long long> batch_sizes;  // --batch: batched decode at these widths (empty: none)
  int pairs = 3;
  bool repeating_prompt = false;
  bool warmup = false;                         // --warmup: an unmeasured generation before each row
  std::shared_ptr<const JsonGrammar> grammar;  // --json-schema: constrained decoding compared (null: not)
};

// Every option checked before anything is measured or loaded.
BenchOptions parse_bench_options(const ArgParser& parser) {
  if (parser.has(kCacheDirOption)) throw UsageError("--cache-dir is for --snapshot only");
  BenchOptions options;
  options.json_output = parser.has("json");
  options.warmup = parser.has("warmup");
  options.prompt_lengths = parse_int_list("prompt-tokens", parser.value_or("prompt-tokens", "5,128,512"));
  options.new_tokens = parser.int_or("new-tokens", 32);
  if (options.new_tokens < 1) throw UsageError("--new-tokens must be at least 1");
  for (const std::string& mode : split_list(parser.value_or("kv-cache", "on,off")))
    options.modes.push_back(cache_mode_from_option(mode));
  for (const std::string& dtype : split_list(parser.value_or("kv-dtype", "f32")))
    options.kv_dtypes.push_back(kv_dtype_from_option(dtype));
  options.dtypes = weight_storages_from_option(parser);
  options.kernels = kernels_from_option(parser);
  options.bandwidth_probe = parser.value_or("bandwidth-probe", "auto");
  const std::string& probe = options.bandwidth_probe;
  if (probe != "auto" && probe != "step" && probe != "row")
    throw UsageError("--bandwidth-probe must be auto, step or row");
  options.speculative = speculative_from_options(parser);
  if (parser.value("batch")) {
    options.batch_sizes = parse_int_list("batch", *parser.value("batch"));
    for (long long size : options.batch_sizes)
      if (size < 1 || size > 256) throw UsageError("--batch sizes must be from 1 to 256");
  }
  options.pairs = parser.int_or("pairs", 3);
  if (options.pairs < 1) throw UsageError("--pairs must be at least 1");
  const std::string prompt_kind = parser.value_or("prompt-kind", "random");
  if (prompt_kind != "random" && prompt_kind != "repeating")
    throw UsageError("--prompt-kind must be random or repeating");
  options.repeating_prompt = prompt_kind == "repeating";
  if (const auto path = parser.value("json-schema")) {
    std::string contents, error;
    if (!read_regular_file(*path, contents, error)) throw UsageError("--json-schema " + *path + ": " + error);
    try {
      options.grammar = std::make_shared<const JsonGrammar>(compile_json_schema(std::string_view(contents)));
    } catch (const SchemaError& schema_error) {
      throw UsageError("--json-schema " + *path + ": " + schema_error.what());
    }
  } else if (parser.value("tokenizer")) {
    throw UsageError("--tokenizer is for --json-schema");
  }
  return options;
}

void print_machine(const BenchOptions& options, int threads, const HardwareCeilings& ceilings) {
  if (options.json_output) {
    std::cout << nlohmann::ordered_json({{"machine",
                                          {{"threads", threads},
                                           {"read_bandwidth_gb_s", ceilings.read_bandwidth_gb_s},
                                           {"sgemm_gflop_s", ceilings.sgemm_gflop_s},
                                           {"blas_kernels", ceilings.blas_kernels},
                                           {"blas_kernels_forced", ceilings.blas_kernels_forced},
                                           {"kernels", options.kernels}}}})
                     .dump()
              << std::endl;
    return;
  }
  std::string blas;
  if (!ceilings.blas_kernels.empty())
    blas = " (OpenBLAS " + ceilings.blas_kernels + " kernels" +
           (ceilings.blas_kernels_forced ? ", chosen by OPENBLAS_CORETYPE)" : ")");
  std::printf("machine: %d threads, read bandwidth %.1f GB/s, sgemm %.1f GFLOP/s%s, kernels %s\n\n", threads,
              ceilings.read_bandwidth_gb_s, ceilings.sgemm_gflop_s, blas.c_str(), options.kernels.c_str());
  std::printf("%-6s %-6s %-5s %7s %5s %10s %9s %10s %10s %10s %6s %7s %8s %11s %10s %8s %9s %9s %9s\n", "dtype",
              "cache", "kv", "prompt", "new", "prefill/s", "ttft ms", "decode/s", "start/s", "end/s", "GB/s", "%bw",
              "%mm", "weights MiB", "cache MiB", "kv B/tok", "model MiB", "RSS MiB", "total s");
}

// One configuration's run, and where its figures are read against.
struct BenchRow {
  std::string dtype_name;
  KvCacheMode mode = KvCacheMode::Contiguous;
  KvDtype kv_dtype = KvDtype::F32;
  long long prompt_tokens = 0;
  BenchRun run;
  double bandwidth = 0.0;  // GB/s the decode is read against
  bool per_step = false;
  double decode_fraction = 0.0, prefill_fraction = 0.0;
  // Resident memory the model holds after the run (its weights all read once): the process's resident
  // bytes then, less those before the model was loaded.
  std::int64_t model_resident_bytes = 0;
  double warmup_ms = 0.0;  // --warmup: the unmeasured generation before the row (0 without)
};

// The cache's bytes per token (0 with the cache off).
std::int64_t kv_bytes_per_token(const GenerationStats& s) {
  return s.cache_tokens > 0 ? s.cache_bytes / s.cache_tokens : 0;
}

void print_row(const BenchOptions& options, const ModelSource& source, int threads, const BenchRow& row) {
  const GenerationStats& s = row.run.stats;
  const BenchRun& run = row.run;
  if (!options.json_output) {
    std::printf(
        "%-6s %-6s %-5s %7lld %5d %10.1f %9.1f %10.2f %10.2f %10.2f %6.1f %6.1f%% %7.1f%% %11.2f %10.2f %8lld %9.0f "
        "%9.0f %9.2f\n",
        row.dtype_name.c_str(), to_string(row.mode), to_string(row.kv_dtype), row.prompt_tokens, options.new_tokens,
        s.prefill_tokens_per_second, s.ttft_ms, run.decode_tok_s, run.decode_tok_s_start, run.decode_tok_s_end,
        row.bandwidth, 100 * row.decode_fraction, 100 * row.prefill_fraction, mib(double(source.model->weight_bytes())),
        mib(double(s.cache_bytes)), static_cast<long long>(kv_bytes_per_token(s)),
        mib(double(row.model_resident_bytes)), mib(double(run.peak_rss_bytes)), run.total_ms / 1000.0);
    std::fflush(stdout);
    return;
  }
  nlohmann::ordered_json line = {{"model", source.description},
                                 {"dtype", row.dtype_name},
                                 {"weight_types", source.model->weight_types()},
                                 {"kv_cache", to_string(row.mode)},
                                 {"kv_dtype", to_string(row.kv_dtype)},
                                 {"kv_bytes_per_token", kv_bytes_per_token(s)},
                                 {"threads", threads},
                                 {"prompt_tokens", row.prompt_tokens},
                                 {"new_tokens", options.new_tokens},
                                 {"warmup_ms", row.warmup_ms},
                                 {"prefill_tok_s", s.prefill_tokens_per_second},
                                 {"ttft_ms", s.ttft_ms},
                                 {"decode_tok_s", run.decode_tok_s},
                                 {"decode_tok_s_start", run.decode_tok_s_start},
                                 {"decode_tok_s_end", run.decode_tok_s_end},
                                 {"per_token_ms", run.decode_tok_s > 0 ? 1000.0 / run.decode_tok_s : 0.0},
                                 {"total_ms", run.total_ms},
                                 {"weight_bytes", source.model->weight_bytes()},
                                 {"cache_bytes", s.cache_bytes},
                                 {"model_resident_bytes", row.model_resident_bytes},
                                 {"peak_rss_bytes", run.peak_rss_bytes},
                                 {"rss_bytes", run.rss_bytes},
                                 {"read_bandwidth_gb_s", row.bandwidth},
                                 {"bandwidth_probe", row.per_step ? "step" : "row"},
                                 {"bandwidth_probes", row.per_step ? run.bandwidth_probes : 1},
                                 {"decode_fraction_of_bandwidth", row.decode_fraction},
                                 {"prefill_fraction_of_sgemm", row.prefill_fraction}};
  std::cout << line.dump() << std::endl;
}

// A cache-off run against the cache-on run of the same size: the speedup, and whether the tokens agree.
void print_speedup(const BenchOptions& options, const BenchRow& uncached, const BenchRun& cached) {
  const double ratio = uncached.run.total_ms / cached.total_ms;
  const bool identical = uncached.run.generated == cached.generated;
  if (options.json_output) {
    nlohmann::ordered_json speedup = {{"speedup",
                                       {{"dtype", uncached.dtype_name},
                                        {"prompt_tokens", uncached.prompt_tokens},
                                        {"new_tokens", options.new_tokens},
                                        {"cached_ms", cached.total_ms},
                                        {"uncached_ms", uncached.run.total_ms},
                                        {"cached_over_uncached", ratio},
                                        {"identical_tokens", identical}}}};
    std::cout << speedup.dump() << std::endl;
  } else {
    std::printf("      cache on vs off, %lld + %d tokens: %.2f s vs %.2f s = %.1fx faster, tokens %s\n",
                uncached.prompt_tokens, options.new_tokens, cached.total_ms / 1000, uncached.run.total_ms / 1000, ratio,
                identical ? "identical" : "DIFFERENT");
  }
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n == 0 ? 0.0 : n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// The nearest-rank percentile (0 < q <= 1) of `values`: the smallest value with at least q of them at or below it.
double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(values.size())));
  return values[std::clamp<std::size_t>(rank, 1, values.size()) - 1];
}

// Plain and speculative decoding with the cache on, in interleaved pairs (A B A B ...: drift in the machine's
// speed falls on both alike): each one's decode tok/s (median), the speed-up, and how many proposals held.
void measure_speculative(const BenchOptions& options, const SpeculativeConfig& config, const ModelSource& source,
                         const std::string& dtype_name, long long prompt_tokens) {
  BenchGeneration plain, speculative;
  plain.repeating_prompt = speculative.repeating_prompt = options.repeating_prompt;
  speculative.speculative = config;
  std::vector<double> plain_rates, speculative_rates, ratios;
  int drafted = 0, accepted = 0, checks = 0;
  bool identical = true;
  for (int pair = 0; pair < options.pairs; ++pair) {
    const BenchRun a = run_generation_benchmark(source.model, KvCacheMode::Contiguous, static_cast<int>(prompt_tokens),
                                                options.new_tokens, plain);
    const BenchRun b = run_generation_benchmark(source.model, KvCacheMode::Contiguous, static_cast<int>(prompt_tokens),
                                                options.new_tokens, speculative);
    plain_rates.push_back(a.decode_tok_s);
    speculative_rates.push_back(b.decode_tok_s);
    ratios.push_back(a.decode_tok_s > 0 ? b.decode_tok_s / a.decode_tok_s : 0.0);
    identical = identical && a.generated == b.generated;
    drafted += b.stats.drafted_tokens;
    accepted += b.stats.accepted_tokens;
    checks += b.stats.draft_checks;
  }
  const double acceptance = drafted > 0 ? double(accepted) / drafted : 0.0;
  // A check's cost: one pass over k rows against a one-row step, at this context (9: a token and the default
  // eight proposals).
  const std::vector<int> row_counts = {1, 2, 4, 8, 9};
  const std::vector<double> pass_ms =
      rows_pass_milliseconds(source.model, static_cast<int>(prompt_tokens), row_counts, 5);
  // Tokens a step produced: the one sampled plus those accepted, over every step of the run.
  const double tokens_per_step = double(options.pairs) * (options.new_tokens - 1) /
                                 std::max(1.0, double(options.pairs) * (options.new_tokens - 1) - accepted);
  if (options.json_output) {
    std::cout
        << nlohmann::ordered_json(
               {{"speculative",
                 {{"mode", to_string(options.speculative.mode)},
                  {"dtype", dtype_name},
                  {"prompt_tokens", prompt_tokens},
                  {"prompt_kind", options.repeating_prompt ? "repeating" : "random"},
                  {"new_tokens", options.new_tokens},
                  {"draft_tokens", options.speculative.draft_tokens},
                  {"pairs", options.pairs},
                  {"plain_decode_tok_s", median(plain_rates)},
                  {"speculative_decode_tok_s", median(speculative_rates)},
                  {"speedup", median(ratios)},
                  {"speedup_min", *std::min_element(ratios.begin(), ratios.end())},
                  {"speedup_max", *std::max_element(ratios.begin(), ratios.end())},
                  {"drafted_tokens", drafted},
                  {"accepted_tokens", accepted},
                  {"draft_checks", checks},
                  {"acceptance", acceptance},
                  {"tokens_per_step", tokens_per_step},
                  {"identical_tokens", identical},
                  {"pass_ms_by_rows",
                   {{"1", pass_ms[0]}, {"2", pass_ms[1]}, {"4", pass_ms[2]}, {"8", pass_ms[3]}, {"9", pass_ms[4]}}}}}})
               .dump()
        << std::endl;
    return;
  }
  std::printf(
      "      %s vs plain, %lld + %d tokens (%s prompt), %d pairs: decode %.2f vs %.2f tok/s = %.2fx (%.2f-%.2f), "
      "%d of %d proposed accepted (%.0f%%, %.2f tokens per step), tokens %s\n",
      to_string(options.speculative.mode), prompt_tokens, options.new_tokens,
      options.repeating_prompt ? "repeating" : "random", options.pairs, median(speculative_rates), median(plain_rates),
      median(ratios), *std::min_element(ratios.begin(), ratios.end()), *std::max_element(ratios.begin(), ratios.end()),
      accepted, drafted, 100 * acceptance, tokens_per_step, identical ? "identical" : "DIFFERENT");
  std::printf(
      "      a pass over 1, 2, 4, 8, 9 rows: %.2f, %.2f, %.2f, %.2f, %.2f ms (%.2fx, %.2fx, %.2fx, %.2fx a one-row "
      "step)\n",
      pass_ms[0], pass_ms[1], pass_ms[2], pass_ms[3], pass_ms[4], pass_ms[1] / pass_ms[0], pass_ms[2] / pass_ms[0],
      pass_ms[3] / pass_ms[0], pass_ms[4] / pass_ms[0]);
  std::fflush(stdout);
}

// Plain and constrained greedy decoding (cache on), in interleaved pairs from the same random prompt: decode tok/s
// of each (median) and the cost; then the token mask alone, replayed over the constrained reply's tokens.
void measure_constrained(const BenchOptions& options, const ModelSource& source, const Tokenizer& tokenizer,
                         const std::string& dtype_name, long long prompt_tokens) {
  const auto started = std::chrono::steady_clock::now();
  const auto vocabulary = ConstraintVocabulary::from_tokenizer(tokenizer);
  const double trie_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  std::mt19937 random(1234);
  std::vector<TokenId> prompt;
  const int vocab = std::min(tokenizer.vocab_size(), static_cast<int>(source.model->config().vocab_size));
  while (static_cast<long long>(prompt.size()) < prompt_tokens) {
    const auto id = static_cast<TokenId>(random() % static_cast<unsigned>(vocab));
    if (!tokenizer.is_special(id)) prompt.push_back(id);
  }
  GenerationConfig plain;
  plain.max_new_tokens = options.new_tokens;
  plain.sampled_vocabulary = tokenizer.vocab_size();
  if (const auto eos = tokenizer.eos_id()) plain.stop_token_ids = {*eos};
  GenerationConfig constrained = plain;
  constrained.grammar = options.grammar;
  constrained.grammar_vocabulary = vocabulary;
  std::vector<double> plain_rates, constrained_rates, ratios;
  std::vector<TokenId> reply;
  for (int pair = 0; pair < options.pairs; ++pair) {
    Session a(source.model, KvCacheMode::Contiguous), b(source.model, KvCacheMode::Contiguous);
    const GenerationResult plain_result = a.generate(prompt, plain);
    const GenerationResult constrained_result = b.generate(prompt, constrained);
    plain_rates.push_back(plain_result.stats.decode_tokens_per_second);
    constrained_rates.push_back(constrained_result.stats.decode_tokens_per_second);
    ratios.push_back(plain_rates.back() > 0 ? constrained_rates.back() / plain_rates.back() : 0.0);
    reply = constrained_result.generated;
  }
  // The mask alone: allowed() and accept() over the reply's tokens.
  TokenConstraint constraint(options.grammar, vocabulary);
  std::vector<double> mask_ms;
  for (TokenId token : reply) {
    const auto mask_started = std::chrono::steady_clock::now();
    constraint.allowed();
    mask_ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - mask_started).count());
    if (!constraint.accept(token)) break;  // the end-of-sequence id
  }
  std::string text;
  for (TokenId token : reply) text += vocabulary->bytes(token);
  const double mask_median = median(mask_ms);
  const double mask_max = mask_ms.empty() ? 0.0 : *std::max_element(mask_ms.begin(), mask_ms.end());
  if (options.json_output) {
    std::cout << nlohmann::ordered_json({{"constrained",
                                          {{"dtype", dtype_name},
                                           {"prompt_tokens", prompt_tokens},
                                           {"new_tokens", options.new_tokens},
                                           {"reply_tokens", reply.size()},
                                           {"vocabulary", vocabulary->size()},
                                           {"pairs", options.pairs},
                                           {"plain_decode_tok_s", median(plain_rates)},
                                           {"constrained_decode_tok_s", median(constrained_rates)},
                                           {"ratio", median(ratios)},
                                           {"mask_ms_median", mask_median},
                                           {"mask_ms_max", mask_max},
                                           {"trie_ms", trie_ms},
                                           {"reply", text}}}})
                     .dump()
              << std::endl;
    return;
  }
  std::printf(
      "      constrained vs plain, %lld + %d tokens, %d pairs: decode %.2f vs %.2f tok/s = %.3fx (%.3f-%.3f); mask "
      "%.3f ms per token (median, max %.3f) over %zu reply tokens, vocabulary %lld (trie made in %.0f ms)\n",
      prompt_tokens, options.new_tokens, options.pairs, median(constrained_rates), median(plain_rates), median(ratios),
      *std::min_element(ratios.begin(), ratios.end()), *std::max_element(ratios.begin(), ratios.end()), mask_median,
      mask_max, reply.size(), static_cast<long long>(vocabulary->size()), trie_ms);
  std::printf("      reply: %.160s\n", text.c_str());
  std::fflush(stdout);
}

// Batched decode at each --batch width, in --pairs interleaved rounds (1, 2, 4, 8, 1, 2, 4, 8, ...): aggregate
// and per-sequence tok/s (medians), against batch 1, and whether the first sequence's tokens are its tokens alone.
void measure_batches(const BenchOptions& options, const ModelSource& source, const std::string& dtype_name,
                     long long prompt_tokens) {
  std::map<long long, std::vector<double>> aggregate, per_sequence, first_token_ms;
  std::map<long long, bool> identical;
  std::map<long long, BatchRun> last;  // its KV block counts (the same every round)
  std::vector<TokenId> alone;
  for (int round = 0; round < options.pairs; ++round)
    for (long long size : options.batch_sizes) {
      const BatchRun run = run_batch_benchmark(source.model, static_cast<int>(size), static_cast<int>(prompt_tokens),
                                               options.new_tokens);
      aggregate[size].push_back(run.aggregate_tok_s);
      per_sequence[size].push_back(run.per_sequence_tok_s);
      first_token_ms[size].insert(first_token_ms[size].end(), run.first_token_ms.begin(), run.first_token_ms.end());
      if (alone.empty())
        alone =
            run_batch_benchmark(source.model, 1, static_cast<int>(prompt_tokens), options.new_tokens).first_sequence;
      identical[size] = (identical.count(size) == 0 || identical[size]) && run.first_sequence == alone;
      last[size] = run;
    }
  const double base = aggregate.count(1) ? median(aggregate[1]) : 0.0;
  for (long long size : options.batch_sizes) {
    const double total = median(aggregate[size]), each = median(per_sequence[size]);
    const double ttft_p50 = percentile(first_token_ms[size], 0.5), ttft_p99 = percentile(first_token_ms[size], 0.99);
    if (options.json_output) {
      std::cout << nlohmann::ordered_json({{"batch",
                                            {{"dtype", dtype_name},
                                             {"batch", size},
                                             {"prompt_tokens", prompt_tokens},
                                             {"new_tokens", options.new_tokens},
                                             {"rounds", options.pairs},
                                             {"aggregate_decode_tok_s", total},
                                             {"per_sequence_decode_tok_s", each},
                                             {"aggregate_over_batch_1", base > 0 ? total / base : 0.0},
                                             {"ttft_p50_ms", ttft_p50},
                                             {"ttft_p99_ms", ttft_p99},
                                             {"identical_tokens", identical[size]},
                                             {"paged_kv", last[size].paged},
                                             {"kv_block_tokens", last[size].paged ? kBenchBlockTokens : 0},
                                             {"kv_blocks_used", last[size].kv_blocks_used},
                                             {"kv_blocks_shared", last[size].kv_blocks_shared},
                                             {"kv_block_copies", last[size].kv_block_copies}}}})
                       .dump()
                << std::endl;
    } else {
      std::printf(
          "      batch %3lld, %lld + %d tokens each: aggregate %.2f tok/s (%.2fx batch 1), per sequence %.2f "
          "tok/s, TTFT p50 %.1f ms, p99 %.1f ms, tokens %s",
          size, prompt_tokens, options.new_tokens, total, base > 0 ? total / base : 0.0, each, ttft_p50, ttft_p99,
          identical[size] ? "identical" : "DIFFERENT");
      if (last[size].paged)
        std::printf("; KV blocks of %lld positions: %lld used, %lld shared, %lld copied\n",
                    static_cast<long long>(kBenchBlockTokens), static_cast<long long>(last[size].kv_blocks_used),
                    static_cast<long long>(last[size].kv_blocks_shared),
                    static_cast<long long>(last[size].kv_block_copies));
      else
        std::printf("; KV cache contiguous (sliding-window layers)\n");
    }
  }
  std::fflush(stdout);
}

// One generation of a configuration, with the bandwidth it is read against. This machine's bandwidth
// drifts by tens of percent within seconds (other tenants), so each decode figure is read against
// bandwidth probed at its own moment: before every step for a model bound by memory, else just before
// the row.
BenchRow measure_row(const BenchOptions& options, const ModelSource& source, const HardwareCeilings& ceilings,
                     int threads, const std::string& dtype_name, KvCacheMode mode, KvDtype kv_dtype,
                     long long prompt_tokens) {
  const LlamaModel& model = *source.model;
  BenchRow row;
  row.dtype_name = dtype_name;
  row.mode = mode;
  row.kv_dtype = kv_dtype;
  row.prompt_tokens = prompt_tokens;
  row.per_step =
      options.bandwidth_probe == "step" || (options.bandwidth_probe == "auto" && pairs_bandwidth_probes(model));
  if (options.warmup) {
    BenchGeneration warmup;
    warmup.repeating_prompt = options.repeating_prompt;
    warmup.kv_dtype = kv_dtype;
    row.warmup_ms = run_generation_benchmark(source.model, mode, static_cast<int>(prompt_tokens), 1, warmup).total_ms;
  }
  const double row_bandwidth =
      row.per_step ? 0.0 : kernels::measure_read_bandwidth(threads, std::size_t(256) << 20, 5).gigabytes_per_second;
  BenchGeneration how;
  how.probe_between_steps = row.per_step;
  how.repeating_prompt = options.repeating_prompt;
  how.kv_dtype = kv_dtype;
  row.run = run_generation_benchmark(source.model, mode, static_cast<int>(prompt_tokens), options.new_tokens, how);
  row.bandwidth = row.per_step ? row.run.paired_bandwidth_gb_s : row_bandwidth;
  row.decode_fraction = row.per_step
                            ? row.run.decode_fraction_of_paired_bandwidth
                            : row.run.decode_tok_s * static_cast<double>(model.weight_bytes()) / (row.bandwidth * 1e9);
  row.prefill_fraction =
      row.run.stats.prefill_tokens_per_second * prefill_flops_per_token(model) / (ceilings.sgemm_gflop_s * 1e9);
  return row;
}

int run_bench(const std::vector<std::string>& args) {
  ArgParser parser(with_model_options({"prompt-tokens", "new-tokens", "kv-cache", "kv-dtype", "kernels",
                                       "bandwidth-probe", "speculative", "draft-tokens", "draft-model", "pairs",
                                       "prompt-kind", "batch", "json-schema", "tokenizer", kCacheDirOption}),
                   {"json", "warmup", kSnapshotFlag});
  parser.parse(args);
  if (parser.has(kSnapshotFlag)) return run_snapshot_bench(parser);
  const BenchOptions options = parse_bench_options(parser);
  // The bench computes with a context of its own (its threads, its kernels switch, its kernels' pool), as the
  // app's engine and server do: nothing process-wide is switched for it.
  const ComputeContext compute(ComputeContext::Options{threads_from_option(parser), options.kernels == "on"});
  const ComputeScope compute_scope(&compute);
  const int threads = compute.threads();

  // Ceilings first, before any model is in memory (the probe's buffer must not add to peak RSS).
  const HardwareCeilings ceilings = measure_hardware_ceilings(threads);
  print_machine(options, threads, ceilings);

  for (const WeightStorage& storage : options.dtypes) {
    // Each dtype gets its own model; the previous one was released at the end of the last iteration.
    // Freed heap memory goes back first, so that what the load adds is not hidden by pages it reuses.
    release_freed_memory();
    const std::int64_t resident_before_load = current_rss_bytes();
    const ModelSource source = open_model_source(parser, storage);
    SpeculativeConfig speculative = options.speculative;
    load_draft_model(parser, speculative, *source.model);
    // A GGUF file's rows name its own types (Q4_K_M, ...), not the --dtype it ignores.
    const std::string dtype_name = source.weight_format.empty() ? storage.name : source.weight_format;
    std::map<long long, BenchRun> cached_runs;  // prompt tokens -> cache-on run
    for (long long prompt_tokens : options.prompt_lengths) {
      if (prompt_tokens < 1 || prompt_tokens + options.new_tokens > source.model->config().max_position_embeddings)
        throw UsageError("--prompt-tokens " + std::to_string(prompt_tokens) +
                         " plus --new-tokens does not fit the context");
      for (KvDtype kv_dtype : options.kv_dtypes) {
        cached_runs.erase(prompt_tokens);
        for (KvCacheMode mode : options.modes) {
          BenchRow row = measure_row(options, source, ceilings, threads, dtype_name, mode, kv_dtype, prompt_tokens);
          row.model_resident_bytes = row.run.rss_bytes - resident_before_load;
          if (mode == KvCacheMode::Contiguous) cached_runs[prompt_tokens] = row.run;
          print_row(options, source, threads, row);
          const auto cached = cached_runs.find(prompt_tokens);
          if (mode == KvCacheMode::Off && cached != cached_runs.end()) print_speedup(options, row, cached->second);
        }
      }
      if (speculative.mode != SpeculativeMode::None)
        measure_speculative(options, speculative, source, dtype_name, prompt_tokens);
      if (!options.batch_sizes.empty()) measure_batches(options, source, dtype_name, prompt_tokens);
      if (options.grammar) {
        if (!source.tokenizer && !parser.value("tokenizer"))
          throw UsageError("--json-schema needs the model's tokenizer: give --tokenizer DIR|FILE.gguf");
        std::optional<Tokenizer> named;
        if (parser.value("tokenizer")) named.emplace(tokenizer_from_path(*parser.value("tokenizer")));
        measure_constrained(options, source, named ? *named : *source.tokenizer, dtype_name, prompt_tokens);
      }
    }
  }
  // The machine's bandwidth drifts with what else runs on it: measure again at the end (with every
  // model released), so each figure can be read against both.
  const HardwareCeilings after = measure_hardware_ceilings(threads);
  if (options.json_output) {
    std::cout << nlohmann::ordered_json(
                     {{"machine_after",
                       {{"read_bandwidth_gb_s", after.read_bandwidth_gb_s}, {"sgemm_gflop_s", after.sgemm_gflop_s}}}})
                     .dump()
              << std::endl;
  } else {
    std::printf(
        "\nmachine at the end: read bandwidth %.1f GB/s, sgemm %.1f GFLOP/s (%%bw uses the GB/s column, %%mm the "
        "start)\n",
        after.read_bandwidth_gb_s, after.sgemm_gflop_s);
  }
  return 0;
}

const CliRegistration registration({"bench", "measure prefill/decode speed against the machine's ceilings", kUsage,
                                    run_bench});

}  // namespace bench_command
}  // namespace kvchat::cli
