// kvchat-cli bench: the engine's speed against the machine's ceilings, measured in the same run.
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "app/cli/cli_command.h"
#include "app/cli/model_options.h"
#include "engine/benchmark.h"
#include "engine/compute_options.h"
#include "engine/kernels/memory_probe.h"
#include "engine/kernels/thread_pool.h"
#include "engine/llama_model.h"

namespace kvchat::cli {
namespace {

const char* kUsage =
    "usage: kvchat-cli bench (--model DIR | --random-weights CONFIG.json [--weights-seed N])\n"
    "                        [--prompt-tokens 5,128,512,2048] [--new-tokens N] [--kv-cache on,naive,off]\n"
    "                        [--dtype f32,bf16] [--threads N] [--kernels on|off] [--bandwidth-probe auto|step|row]\n"
    "                        [--json]\n"
    "Measures memory read bandwidth and sgemm GFLOP/s first, then one generation per configuration.\n"
    "decode %bw   = weight bytes read by the decode steps / bytes the machine could read in the same time\n"
    "               step: bandwidth probed before every decode step, over the model's own weights (the\n"
    "                     default for models of 1 GiB or more, whose decode is bound by memory)\n"
    "               row:  one probe of a 256 MiB buffer just before the row (the default below 1 GiB)\n"
    "               GB/s column: the bandwidth used (step: the steps' time-weighted mean)\n"
    "prefill %mm  = prefill tok/s x FLOP per token / sgemm FLOP/s\n"
    "Every cache-off run is compared with the cache-on run of the same size: speedup and identical tokens.";

double mib(double bytes) { return bytes / 1048576.0; }

int run_bench(const std::vector<std::string>& args) {
  ArgParser parser(with_model_options({"prompt-tokens", "new-tokens", "kv-cache", "kernels", "bandwidth-probe"}), {"json"});
  parser.parse(args);
  const bool json_output = parser.has("json");
  std::vector<long long> prompt_lengths = parse_int_list("prompt-tokens", parser.value_or("prompt-tokens", "5,128,512"));
  const int new_tokens = parser.int_or("new-tokens", 32);
  if (new_tokens < 1) throw UsageError("--new-tokens must be at least 1");
  std::vector<KvCacheMode> modes;
  for (const std::string& mode : split_list(parser.value_or("kv-cache", "on,off"))) modes.push_back(cache_mode_from_option(mode));
  std::vector<std::pair<std::string, WeightDtype>> dtypes;
  for (const std::string& name : split_list(parser.value_or("dtype", "f32"))) {
    try {
      dtypes.emplace_back(name, weight_dtype_from_string(name));
    } catch (const std::invalid_argument& error) {
      throw UsageError(error.what());
    }
  }
  const std::string kernels = parser.value_or("kernels", "on");
  if (kernels != "on" && kernels != "off") throw UsageError("--kernels must be on or off");
  set_fast_kernels_enabled(kernels == "on");
  const std::string probe_option = parser.value_or("bandwidth-probe", "auto");
  if (probe_option != "auto" && probe_option != "step" && probe_option != "row")
    throw UsageError("--bandwidth-probe must be auto, step or row");

  const int threads_option = parser.int_or("threads", 0);
  set_engine_threads(threads_option);
  const int threads = kernels::default_threads();

  // Ceilings first, before any model is in memory (the probe's buffer must not add to peak RSS).
  HardwareCeilings ceilings = measure_hardware_ceilings(threads);
  nlohmann::ordered_json machine = {{"machine", {{"threads", threads},
                                                 {"read_bandwidth_gb_s", ceilings.read_bandwidth_gb_s},
                                                 {"sgemm_gflop_s", ceilings.sgemm_gflop_s},
                                                 {"kernels", kernels}}}};
  if (json_output) {
    std::cout << machine.dump() << std::endl;
  } else {
    std::printf("machine: %d threads, read bandwidth %.1f GB/s, sgemm %.1f GFLOP/s, kernels %s\n\n", threads,
                ceilings.read_bandwidth_gb_s, ceilings.sgemm_gflop_s, kernels.c_str());
    std::printf("%-5s %-6s %7s %5s %10s %9s %10s %10s %10s %6s %7s %8s %10s %9s %9s\n", "dtype", "cache", "prompt", "new",
                "prefill/s", "ttft ms", "decode/s", "start/s", "end/s", "GB/s", "%bw", "%mm", "cache MiB", "RSS MiB",
                "total s");
  }

  for (const auto& [dtype_name, dtype] : dtypes) {
    // Each dtype gets its own model; the previous one was released at the end of the last iteration.
    ModelSource source = open_model_source(parser, dtype);
    const LlamaModel& model = *source.model;
    const double weight_bytes = static_cast<double>(model.weight_bytes());
    const double flops_per_token = prefill_flops_per_token(model);
    std::map<std::pair<long long, int>, BenchRun> cached_runs;  // (prompt, new) -> cache-on run

    for (long long prompt_tokens : prompt_lengths) {
      if (prompt_tokens < 1 || prompt_tokens + new_tokens > model.config().max_position_embeddings)
        throw UsageError("--prompt-tokens " + std::to_string(prompt_tokens) + " plus --new-tokens does not fit the context");
      for (KvCacheMode mode : modes) {
        // This machine's bandwidth drifts by tens of percent within seconds (other tenants), so each
        // decode figure is read against bandwidth probed at its own moment: before every step for a
        // model bound by memory, else just before the row.
        const bool per_step = probe_option == "step" || (probe_option == "auto" && pairs_bandwidth_probes(model));
        const double row_bandwidth =
            per_step ? 0.0 : kernels::measure_read_bandwidth(threads, std::size_t(256) << 20, 5).gigabytes_per_second;
        BenchRun run = run_generation_benchmark(source.model, mode, static_cast<int>(prompt_tokens), new_tokens, per_step);
        const GenerationStats& s = run.stats;
        const double bandwidth = per_step ? run.paired_bandwidth_gb_s : row_bandwidth;
        const double decode_fraction = per_step ? run.decode_fraction_of_paired_bandwidth
                                                : run.decode_tok_s * weight_bytes / (bandwidth * 1e9);
        const double prefill_fraction = s.prefill_tokens_per_second * flops_per_token / (ceilings.sgemm_gflop_s * 1e9);
        nlohmann::ordered_json line = {
            {"model", source.description}, {"dtype", dtype_name}, {"kv_cache", to_string(mode)}, {"threads", threads},
            {"prompt_tokens", prompt_tokens}, {"new_tokens", new_tokens},
            {"prefill_tok_s", s.prefill_tokens_per_second}, {"ttft_ms", s.ttft_ms},
            {"decode_tok_s", run.decode_tok_s}, {"decode_tok_s_start", run.decode_tok_s_start},
            {"decode_tok_s_end", run.decode_tok_s_end}, {"per_token_ms", run.decode_tok_s > 0 ? 1000.0 / run.decode_tok_s : 0.0},
            {"total_ms", run.total_ms}, {"weight_bytes", model.weight_bytes()}, {"cache_bytes", s.cache_bytes},
            {"peak_rss_bytes", run.peak_rss_bytes}, {"rss_bytes", run.rss_bytes},
            {"read_bandwidth_gb_s", bandwidth}, {"bandwidth_probe", per_step ? "step" : "row"},
            {"bandwidth_probes", per_step ? run.bandwidth_probes : 1}, {"decode_fraction_of_bandwidth", decode_fraction}, {"prefill_fraction_of_sgemm", prefill_fraction}};
        if (mode == KvCacheMode::Contiguous) cached_runs[{prompt_tokens, new_tokens}] = run;
        if (json_output) {
          std::cout << line.dump() << std::endl;
        } else {
          std::printf("%-5s %-6s %7lld %5d %10.1f %9.1f %10.2f %10.2f %10.2f %6.1f %6.1f%% %7.1f%% %10.2f %9.0f %9.2f\n",
                      dtype_name.c_str(), to_string(mode), prompt_tokens, new_tokens, s.prefill_tokens_per_second,
                      s.ttft_ms, run.decode_tok_s, run.decode_tok_s_start, run.decode_tok_s_end, bandwidth,
                      100 * decode_fraction, 100 * prefill_fraction, mib(double(s.cache_bytes)),
                      mib(double(run.peak_rss_bytes)), run.total_ms / 1000.0);
          std::fflush(stdout);
        }
        auto cached = cached_runs.find({prompt_tokens, new_tokens});
        if (mode == KvCacheMode::Off && cached != cached_runs.end()) {
          const double ratio = run.total_ms / cached->second.total_ms;
          const bool identical = run.generated == cached->second.generated;
          nlohmann::ordered_json speedup = {{"speedup", {{"dtype", dtype_name}, {"prompt_tokens", prompt_tokens},
                                                         {"new_tokens", new_tokens}, {"cached_ms", cached->second.total_ms},
                                                         {"uncached_ms", run.total_ms}, {"cached_over_uncached", ratio},
                                                         {"identical_tokens", identical}}}};
          if (json_output) std::cout << speedup.dump() << std::endl;
          else std::printf("      cache on vs off, %lld + %d tokens: %.2f s vs %.2f s = %.1fx faster, tokens %s\n",
                           prompt_tokens, new_tokens, cached->second.total_ms / 1000, run.total_ms / 1000, ratio,
                           identical ? "identical" : "DIFFERENT");
        }
      }
    }
  }
  // The machine's bandwidth drifts with what else runs on it: measure again at the end (with every
  // model released), so each figure can be read against both.
  HardwareCeilings after = measure_hardware_ceilings(threads);
  if (json_output) {
    std::cout << nlohmann::ordered_json({{"machine_after", {{"read_bandwidth_gb_s", after.read_bandwidth_gb_s},
                                                            {"sgemm_gflop_s", after.sgemm_gflop_s}}}}).dump()
              << std::endl;
  } else {
    std::printf("\nmachine at the end: read bandwidth %.1f GB/s, sgemm %.1f GFLOP/s (%%bw uses the GB/s column, %%mm the start)\n",
                after.read_bandwidth_gb_s, after.sgemm_gflop_s);
  }
  return 0;
}

const CliRegistration registration({"bench", "measure prefill/decode speed against the machine's ceilings", kUsage, run_bench});

}  // namespace
}  // namespace kvchat::cli
