#pragma once
// What a KV snapshot on disk buys and costs, measured in one run (`kvchat-cli bench --snapshot`):
//
//   1. full prefill   a fresh session prefills a conversation and samples one token (the time to first token
//                     a returning conversation pays without a snapshot)
//   2. write          capture_snapshot on the engine thread (what holds up the next turn), then
//                     write_snapshot_file (checksum, write, fsync, rename) as the store's thread runs it
//   3. restore        a new SessionPool and SnapshotStore over the same folder (nothing in memory) continue the
//                     conversation with a few new user tokens: cold (the file dropped from the page cache,
//                     best effort) and warm (in the page cache)
//   4. decode         a reply with no write in flight, then one with a large snapshot write in flight on the
//                     store's thread (the engine and the writer share the cores)
//
// The reply after each restore is compared id by id with the reply of the session whose cache came from
// the full prefill: a restore that fed the model a wrong cache shows as "not identical", never as a speed.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/types.h"

namespace kvchat {

class LlamaModel;

struct SnapshotBenchConfig {
  int conversation_tokens = 2000;  // the snapshotted conversation (seeded ids after BOS)
  int followup_tokens = 8;         // the user's new turn after it
  int reply_tokens = 32;           // sampled per reply (greedy; end-of-sequence ids do not stop it)
  std::string directory;           // the snapshot folder; must exist
};

// One continuation of the conversation from its snapshot by a pool with nothing in memory.
struct SnapshotRestoreRun {
  double ttft_ms = 0;       // restore + prefill of the new tokens + first sample
  double restore_ms = 0;    // GenerationStats::restore_ms: find, read, check, copy into the cache
  double restore_mb_s = 0;  // file bytes / restore_ms, 10^6 bytes per second
  int restored_tokens = 0;
  std::string restored_from;          // the snapshot's key
  double resident_before = -1;        // fraction of the file's pages in the page cache just before (-1: unknown)
  bool cache_drop_requested = false;  // cold: posix_fadvise(DONTNEED) accepted
  double decode_tok_s = 0;
  std::vector<TokenId> generated;  // the reply
  bool ids_identical = false;      // the reply's ids equal the full-prefill session's
};

struct SnapshotBenchResult {
  // 1. full prefill
  double prefill_ttft_ms = 0;
  double prefill_tok_s = 0;
  // 2. capture and write of the conversation's snapshot
  std::int64_t snapshot_tokens = 0;
  std::int64_t file_bytes = 0;
  double capture_ms = 0;
  double write_ms = 0;
  double write_mb_s = 0;
  // 3. restore; the reference reply is the full-prefill session's
  std::vector<TokenId> reference_ids;
  SnapshotRestoreRun cold, warm;
  // 4. decode of a reply (the same length) with no write in flight, and with one queued just before
  double decode_tok_s_idle = 0;
  double decode_tok_s_writing = 0;       // over the whole reply
  double decode_tok_s_during_write = 0;  // over the steps that ended before the write did (0: none)
  int decode_steps = 0;                  // steps after the first token
  int decode_steps_during_write = 0;
  std::int64_t background_tokens = 0;  // the snapshot written meanwhile
  std::int64_t background_file_bytes = 0;
  double background_capture_ms = 0;  // SessionPool::save_snapshot on the engine thread
  double background_write_ms = 0;    // from the save to the end of the write on the store's thread
};

// The context the bench fills: the conversation, its new turn and three replies.
std::int64_t snapshot_bench_context_tokens(const SnapshotBenchConfig& config);

// Runs the four measurements on `model` (cache on, contiguous). The files it writes in
// config.directory are deleted before it returns. Throws std::invalid_argument when the conversation,
// the new turn and three replies do not fit the model's context.
SnapshotBenchResult run_snapshot_benchmark(const std::shared_ptr<const LlamaModel>& model,
                                           const SnapshotBenchConfig& config);

// The deterministic conversation: BOS, then ids in [3, vocab) from a seeded generator.
std::vector<TokenId> seeded_token_ids(const LlamaModel& model, int count, unsigned seed, bool with_bos);

}  // namespace kvchat
