#pragma once
// kvchat-cli bench --snapshot: a conversation's KV cache restored from disk against prefilled again
// (engine/bench/snapshot_benchmark.h), one run per --dtype, printed as text or JSON lines.
#include "app/cli/cli_command.h"

namespace kvchat::cli {

// The usage lines of --snapshot, for bench's usage text.
extern const char* const kSnapshotBenchUsage;

// The options bench accepts besides its own (`--snapshot`, `--cache-dir`).
constexpr const char* kSnapshotFlag = "snapshot";
constexpr const char* kCacheDirOption = "cache-dir";

// Runs the snapshot bench with bench's parsed options (--snapshot given).
int run_snapshot_bench(const ArgParser& parser);

}  // namespace kvchat::cli
