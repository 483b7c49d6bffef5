#include "app/cli/bench_snapshot.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <system_error>

#include "app/cli/model_options.h"
#include "engine/bench/snapshot_benchmark.h"
#include "engine/compute/compute_context.h"
#include "engine/model/llama_model.h"

namespace kvchat::cli {

const char* const kSnapshotBenchUsage =
    "--snapshot   instead of the table: a conversation's KV cache restored from a snapshot on disk against a\n"
    "             full prefill, per --dtype: --prompt-tokens N (one size, default 2000) is the conversation,\n"
    "             8 new user tokens follow it, --new-tokens (default 32) is each reply's length.\n"
    "             Prints the full prefill's TTFT, the snapshot's capture and write cost, the TTFT and MB/s of\n"
    "             a restore by a new pool, cold (the file dropped from the page cache, best effort) and warm,\n"
    "             the speedup, whether the ids after the restore equal those after the full prefill, and the\n"
    "             decode speed with and without a snapshot write in flight.\n"
    "--cache-dir  with --snapshot: the folder the snapshots are written in (default: a temporary folder,\n"
    "             removed at the end); the bench deletes the files it wrote there.";

namespace {

constexpr int kFollowupTokens = 8;

struct SnapshotBenchOptions {
  bool json_output = false;
  int conversation_tokens = 2000;
  int reply_tokens = 32;
  std::vector<WeightStorage> dtypes;
  std::string kernels = "on";
  std::optional<std::string> cache_dir;
};

// Every option checked before anything is loaded or measured.
SnapshotBenchOptions parse_options(const ArgParser& parser) {
  for (const char* table_only : {"kv-cache", "bandwidth-probe"})
    if (parser.has(table_only))
      throw UsageError(std::string("--") + table_only + " does not apply to --snapshot (its cache is on, contiguous)");
  SnapshotBenchOptions options;
  options.json_output = parser.has("json");
  const std::vector<long long> sizes = parse_int_list("prompt-tokens", parser.value_or("prompt-tokens", "2000"));
  if (sizes.size() != 1 || sizes[0] < 2 || sizes[0] > 1000000)
    throw UsageError("--prompt-tokens takes one size of 2 or more with --snapshot");
  options.conversation_tokens = static_cast<int>(sizes[0]);
  options.reply_tokens = parser.int_or("new-tokens", 32);
  if (options.reply_tokens < 2) throw UsageError("--new-tokens must be at least 2 with --snapshot");
  options.dtypes = weight_storages_from_option(parser);
  options.kernels = kernels_from_option(parser);
  options.cache_dir = parser.value(kCacheDirOption);
  if (options.cache_dir && options.cache_dir->empty()) throw UsageError("--cache-dir needs a folder");
  return options;
}

// The snapshot folder: --cache-dir, or a temporary folder removed when this goes.
class BenchDirectory {
 public:
  explicit BenchDirectory(const std::optional<std::string>& given) {
    namespace fs = std::filesystem;
    if (given) {
      std::error_code error;
      fs::create_directories(*given, error);
      if (error) throw std::runtime_error("cannot create --cache-dir " + *given + ": " + error.message());
      path_ = *given;
      return;
    }
    std::string pattern = (fs::temp_directory_path() / "kvchat-snapshot-bench-XXXXXX").string();
    if (!::mkdtemp(pattern.data()))
      throw std::runtime_error("cannot create a temporary folder in " + fs::temp_directory_path().string());
    path_ = pattern;
    temporary_ = true;
  }
  ~BenchDirectory() {
    std::error_code error;
    if (temporary_) std::filesystem::remove_all(path_, error);
  }
  BenchDirectory(const BenchDirectory&) = delete;
  BenchDirectory& operator=(const BenchDirectory&) = delete;
  const std::string& path() const { return path_; }
  bool temporary() const { return temporary_; }

 private:
  std::string path_;
  bool temporary_ = false;
};

double ratio(double numerator, double denominator) { return denominator > 0 ? numerator / denominator : 0.0; }

std::string percent_resident(double fraction) {
  if (fraction < 0) return "unknown";
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %%", 100 * fraction);
  return text;
}

void print_header(const SnapshotBenchOptions& options, int threads, const BenchDirectory& directory) {
  double load[3] = {0, 0, 0};
  const bool have_load = ::getloadavg(load, 3) == 3;
  if (options.json_output) {
    nlohmann::ordered_json line = {
        {"snapshot_machine",
         {{"threads", threads},
          {"kernels", options.kernels},
          {"load_average", have_load ? nlohmann::json{load[0], load[1], load[2]} : nlohmann::json()},
          {"folder", directory.path()},
          {"temporary_folder", directory.temporary()}}}};
    std::cout << line.dump() << std::endl;
    return;
  }
  std::printf("snapshot bench: %d threads, kernels %s, load average %.2f %.2f %.2f (1, 5, 15 min)\n", threads,
              options.kernels.c_str(), load[0], load[1], load[2]);
  std::printf("snapshot folder: %s (%s)\n", directory.path().c_str(),
              directory.temporary() ? "temporary, removed at the end"
                                    : "--cache-dir: the bench deletes its own files at the end");
  std::printf(
      "cold restore: the file is dropped from the page cache first with posix_fadvise(DONTNEED), best effort "
      "(the resident share is measured with mincore and printed)\n");
  std::fflush(stdout);
}

nlohmann::ordered_json restore_json(const SnapshotRestoreRun& run, double prefill_ttft_ms) {
  return {{"ttft_ms", run.ttft_ms},
          {"restore_ms", run.restore_ms},
          {"restore_mb_s", run.restore_mb_s},
          {"restored_tokens", run.restored_tokens},
          {"restored_from", run.restored_from},
          {"resident_before", run.resident_before},
          {"cache_drop_requested", run.cache_drop_requested},
          {"decode_tok_s", run.decode_tok_s},
          {"ids_identical", run.ids_identical},
          {"speedup", ratio(prefill_ttft_ms, run.ttft_ms)}};
}

void print_json(const SnapshotBenchOptions& options, const std::string& dtype, const ModelSource& source,
                const SnapshotBenchResult& r) {
  nlohmann::ordered_json line = {
      {"snapshot_bench",
       {{"model", source.description},
        {"dtype", dtype},
        {"weight_types", source.model->weight_types()},
        {"conversation_tokens", options.conversation_tokens},
        {"followup_tokens", kFollowupTokens},
        {"reply_tokens", options.reply_tokens},
        {"prefill_ttft_ms", r.prefill_ttft_ms},
        {"prefill_tok_s", r.prefill_tok_s},
        {"snapshot_tokens", r.snapshot_tokens},
        {"file_bytes", r.file_bytes},
        {"capture_ms", r.capture_ms},
        {"write_ms", r.write_ms},
        {"write_mb_s", r.write_mb_s},
        {"restore_cold", restore_json(r.cold, r.prefill_ttft_ms)},
        {"restore_warm", restore_json(r.warm, r.prefill_ttft_ms)},
        {"cache_drop", "best effort: posix_fadvise DONTNEED"},
        {"ids_identical", r.cold.ids_identical && r.warm.ids_identical},
        {"decode_tok_s_idle", r.decode_tok_s_idle},
        {"decode_tok_s_writing", r.decode_tok_s_writing},
        {"decode_tok_s_during_write", r.decode_tok_s_during_write},
        {"decode_steps", r.decode_steps},
        {"decode_steps_during_write", r.decode_steps_during_write},
        {"background_tokens", r.background_tokens},
        {"background_file_bytes", r.background_file_bytes},
        {"background_capture_ms", r.background_capture_ms},
        {"background_write_ms", r.background_write_ms},
        {"background_write_mb_s", ratio(r.background_file_bytes / 1e6, r.background_write_ms / 1e3)}}}};
  std::cout << line.dump() << std::endl;
}

void print_restore(const char* label, const SnapshotRestoreRun& run, std::int64_t snapshot_tokens) {
  std::printf(
      "  restore %s: ttft %.1f ms, restore %.1f ms = %.1f MB/s, %d tokens restored from %s; %s of the file in the page "
      "cache before\n",
      label, run.ttft_ms, run.restore_ms, run.restore_mb_s, run.restored_tokens,
      run.restored_from.empty() ? "nothing" : run.restored_from.c_str(), percent_resident(run.resident_before).c_str());
  if (run.restored_tokens != snapshot_tokens)
    std::printf(
        "  warning: the %s restore did not restore the conversation's %lld tokens: its figures measure a prefill\n",
        label, static_cast<long long>(snapshot_tokens));
}

void print_text(const SnapshotBenchOptions& options, const std::string& dtype, const ModelSource& source,
                const SnapshotBenchResult& r) {
  std::printf("\n%s (%s): a %d-token conversation, then %d new user tokens and %d-token replies\n", dtype.c_str(),
              source.description.c_str(), options.conversation_tokens, kFollowupTokens, options.reply_tokens);
  std::printf("  full prefill: ttft %.1f ms, prefill %.1f tok/s\n", r.prefill_ttft_ms, r.prefill_tok_s);
  std::printf(
      "  snapshot: %lld tokens, %lld bytes; capture %.1f ms on the engine thread; write %.1f ms = %.1f MB/s "
      "(checksum, write, fsync, rename)\n",
      static_cast<long long>(r.snapshot_tokens), static_cast<long long>(r.file_bytes), r.capture_ms, r.write_ms,
      r.write_mb_s);
  print_restore("cold", r.cold, r.snapshot_tokens);
  print_restore("warm", r.warm, r.snapshot_tokens);
  std::printf("  speedup (full prefill ttft / restore ttft): cold %.1fx, warm %.1fx\n",
              ratio(r.prefill_ttft_ms, r.cold.ttft_ms), ratio(r.prefill_ttft_ms, r.warm.ttft_ms));
  const bool identical = r.cold.ids_identical && r.warm.ids_identical;
  std::printf(
      "  ids identical: %s (the %d ids after the cold and the warm restore against those after the full prefill%s)\n",
      identical ? "yes" : "no", options.reply_tokens,
      identical ? ""
                : (std::string(": cold ") + (r.cold.ids_identical ? "same" : "DIFFERENT") + ", warm " +
                   (r.warm.ids_identical ? "same" : "DIFFERENT"))
                      .c_str());
  std::printf("  decode: %.2f tok/s with no write in flight, %.2f tok/s with a snapshot write in flight (%d steps)\n",
              r.decode_tok_s_idle, r.decode_tok_s_writing, r.decode_steps);
  std::printf(
      "  background write: %lld tokens, %lld bytes; capture %.1f ms on the engine thread, written in %.1f ms = %.1f "
      "MB/s "
      "on the store's thread; %d of the %d decode steps ran during it",
      static_cast<long long>(r.background_tokens), static_cast<long long>(r.background_file_bytes),
      r.background_capture_ms, r.background_write_ms, ratio(r.background_file_bytes / 1e6, r.background_write_ms / 1e3),
      r.decode_steps_during_write, r.decode_steps);
  if (r.decode_steps_during_write > 0)
    std::printf(", at %.2f tok/s\n", r.decode_tok_s_during_write);
  else
    std::printf("\n");
  std::fflush(stdout);
}

}  // namespace

int run_snapshot_bench(const ArgParser& parser) {
  const SnapshotBenchOptions options = parse_options(parser);
  // The bench computes with a context of its own (its threads, its kernels switch, its kernels' pool), as the
  // app's engine and server do: nothing process-wide is switched for it.
  const ComputeContext compute(ComputeContext::Options{threads_from_option(parser), options.kernels == "on"});
  const ComputeScope compute_scope(&compute);
  const int threads = compute.threads();
  const BenchDirectory directory(options.cache_dir);
  bool header_printed = false;
  for (const WeightStorage& storage : options.dtypes) {
    // Each dtype gets its own model; the previous one was released at the end of the last iteration.
    const ModelSource source = open_model_source(parser, storage);
    SnapshotBenchConfig config;
    config.conversation_tokens = options.conversation_tokens;
    config.followup_tokens = kFollowupTokens;
    config.reply_tokens = options.reply_tokens;
    config.directory = directory.path();
    const std::int64_t context = source.model->config().max_position_embeddings;
    if (snapshot_bench_context_tokens(config) > context)
      throw UsageError("--prompt-tokens + " + std::to_string(kFollowupTokens) + " + 3 x --new-tokens (" +
                       std::to_string(snapshot_bench_context_tokens(config)) +
                       ") does not fit the model's context of " + std::to_string(context));
    if (!header_printed) print_header(options, threads, directory);
    header_printed = true;
    const SnapshotBenchResult result = run_snapshot_benchmark(source.model, config);
    if (options.json_output)
      print_json(options, storage.name, source, result);
    else
      print_text(options, storage.name, source, result);
  }
  return 0;
}

}  // namespace kvchat::cli
