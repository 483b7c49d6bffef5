#pragma once
// The folder of KV snapshots on disk: one file per conversation, per model, under a disk budget.
//
//   <directory>/<model fingerprint>/<key>.kvsnap      (key: the caller's name of a conversation)
//
// Writes happen on the store's own thread, so a reply's snapshot never holds up the engine thread: a
// caller hands over a captured copy (capture_snapshot) and goes on. A newer snapshot of the same key
// replaces a queued older one, and on disk replaces the file atomically (write_snapshot_file). After
// each write, the least recently used snapshots of the whole folder (every model's) are deleted until
// the folder is within the budget; the file just written is never deleted, so the folder exceeds the
// budget by at most that one snapshot.
//
// Lookups see the newest state of every key saved here, written or not: a snapshot still queued (or being
// written) is matched from memory, and the file it will replace is not used meanwhile. So what a lookup finds
// does not depend on how far the writer has got. They also see every snapshot in the model's folder,
// including files written by another kvchat process since the last lookup (the folder is listed each time; a file's
// header and tokens are read once per identity). The index keeps a bounded summary of each snapshot, not its tokens:
// chained hashes of its token blocks (at most kMaxSummaryBlocks a file, at most kMaxIndexedSnapshots files, the newest
// first), so a lookup compares hashes and then reads at most one block of tokens from a few files. A file of more
// tokens than the model's context is not read past its header.
//
// What the store touches: only regular files named <key>.kvsnap (and its own temporary names) in model
// folders named by a fingerprint, each opened relative to its folder without following a symbolic link;
// a model folder that is a symbolic link is never entered (this model's makes the constructor throw).
// A file is deleted (disk budget, remove, a failed check) only when its header shows it is a snapshot of
// this installation (snapshot_owner); anything else is left as it is. A file that fails a check is
// logged and never used; it is deleted only when it is such a snapshot, and never because this process
// could not read it (an I/O error, no memory).
//
// Thread-safe: any thread may call any method.
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/cache/kv_snapshot.h"

namespace kvchat {

class SnapshotStore {
 public:
  // Called on the store's thread after each successful write: key, tokens, file bytes, folder bytes.
  using WrittenCallback = std::function<void(const std::string& key, std::int64_t tokens, std::int64_t file_bytes,
                                             std::int64_t folder_bytes)>;

  // disk_budget_bytes <= 0: no budget. `shape` is the cache shape snapshots must have (dtype included;
  // max_tokens, the model's context, bounds their token counts). `key`: the installation's (kv_snapshot.h).
  // Throws SnapshotError when the folder cannot be made or the model's folder is not a folder of its own.
  SnapshotStore(std::string directory, std::int64_t disk_budget_bytes, ModelFingerprint fingerprint, KvCacheShape shape,
                SnapshotKey key = {});
  ~SnapshotStore();  // writes what is still queued, then stops the thread
  SnapshotStore(const SnapshotStore&) = delete;
  SnapshotStore& operator=(const SnapshotStore&) = delete;

  void set_written_callback(WrittenCallback callback);
  void set_disk_budget(std::int64_t disk_budget_bytes);

  // Queues `snapshot` as `key`'s (letters, digits, '-' and '_' only).
  void save(const std::string& key, KvSnapshot snapshot);
  // Waits until every queued snapshot is written (or failed).
  void flush();

  struct Match {
    std::string path;
    std::string key;
    std::int64_t tokens = 0;           // the prompt's prefix this snapshot holds
    std::int64_t snapshot_tokens = 0;  // all the snapshot holds
  };
  // The snapshot file of this model sharing the longest prefix with `prompt`, if that prefix has at least
  // `minimum_tokens` tokens. A file whose key has a newer snapshot pending is left out.
  std::optional<Match> best_match(const std::vector<TokenId>& prompt, std::int64_t minimum_tokens);
  // The snapshot saved here and not yet written (queued, or being written) sharing the longest prefix with
  // `prompt`, if that prefix has at least `minimum_tokens` tokens. Held, not copied: it stays valid after
  // the writer is done with it.
  struct PendingMatch {
    std::string key;
    std::int64_t tokens = 0;  // the prompt's prefix this snapshot holds
    std::shared_ptr<const KvSnapshot> snapshot;
  };
  std::optional<PendingMatch> best_pending_match(const std::vector<TokenId>& prompt, std::int64_t minimum_tokens);
  // Reads `match`'s file and validates it fully. A file that fails is not used again (and deleted when it
  // is a damaged snapshot of this installation); the reason is logged and returned in `rejection`.
  std::optional<LoadedSnapshot> load(const Match& match, std::string* rejection = nullptr);
  // The header (not the tokens) of this model's snapshot of `key`, opened through the store's folders like
  // every other read; nullopt when there is none or it is not a readable snapshot of this model (logged).
  std::optional<SnapshotHeader> describe(const std::string& key);

  void remove(const std::string& key);  // every model's snapshot of `key` (a deleted or cleared chat)
  void remove_all();                    // every snapshot in the folder, of every model

  std::int64_t folder_bytes() const;  // every snapshot of this installation in the folder, of every model
  std::string path_for(const std::string& key) const;
  const std::string& directory() const { return directory_; }
  const ModelFingerprint& fingerprint() const { return fingerprint_; }
  const KvCacheShape& shape() const { return shape_; }
  std::int64_t summary_block_tokens() const { return block_tokens_; }

  static constexpr std::size_t kMaxIndexedSnapshots = 4096;
  static constexpr std::int64_t kMaxSummaryBlocks = 1024;

 private:
  struct FileIdentity {
    std::uint64_t device = 0, inode = 0;
    std::int64_t size = 0, modified_ns = 0;
    bool operator==(const FileIdentity& other) const {
      return device == other.device && inode == other.inode && size == other.size && modified_ns == other.modified_ns;
    }
  };
  struct IndexEntry {
    FileIdentity identity;
    bool usable = false;  // false: failed a check or left alone; not read again until the file changes
    std::int64_t tokens = 0;
    std::vector<std::uint64_t> block_hashes;  // [i]: the hash of tokens [0, (i + 1) * block_tokens_)
  };
  void writer_loop();
  void write_one(const std::string& key, const KvSnapshot& snapshot);
  void refresh_index_locked();
  IndexEntry index_file(int folder, const std::string& name, const FileIdentity& identity);
  void enforce_budget(const std::string& keep_name);
  // Logs why `name` (of this model's folder) failed and acts on it: deleted when it is a damaged snapshot
  // of this installation, else marked unusable in the index.
  void reject_locked(int folder, const std::string& name, const SnapshotError& error);
  void unusable_locked(int folder, const std::string& name);
  bool delete_locked(int folder, const std::string& name);
  std::vector<std::uint64_t> block_hashes(const TokenId* tokens, std::int64_t count) const;

  const std::string directory_;
  const std::string model_directory_;
  const ModelFingerprint fingerprint_;
  const KvCacheShape shape_;
  const SnapshotKey key_;
  const std::int64_t max_tokens_;    // the model's context (kMaxSnapshotTokens when the shape has none)
  const std::int64_t block_tokens_;  // tokens per summary block

  mutable std::mutex mutex_;
  std::condition_variable work_ready_, work_done_;
  bool pending_locked(const std::string& key) const;  // queued, or being written and not removed
  std::vector<std::pair<std::string, std::shared_ptr<const KvSnapshot>>> queue_;  // at most one per key, oldest first
  std::string writing_key_;                             // the key being written now ("" when idle)
  std::shared_ptr<const KvSnapshot> writing_snapshot_;  // what is being written
  bool removed_while_writing_ = false;
  bool stopping_ = false;
  std::int64_t disk_budget_bytes_ = 0;
  WrittenCallback on_written_;
  std::map<std::string, IndexEntry> index_;  // by file name: this model's snapshots as last listed
  std::thread writer_;
};

}  // namespace kvchat
