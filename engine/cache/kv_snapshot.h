#pragma once
// A KV cache snapshot: one conversation's cached tokens and the K/V of every layer, as a file that a
// later process can trust or reject. The file format (version 2, little-endian):
//
//   [0, 128)        header: magic "KVCHATKV", format version, model fingerprint, cache dtype and shape,
//                   token count, offsets, checksums of the tokens and the K/V data, 16 reserved bytes
//                   (zero), the writing installation's id, and last the header's own checksum (of its
//                   first 120 bytes)
//   [128, ...)      tokens: token_count int32 ids
//   [data_offset,)  K/V data (data_offset: the end of the tokens, 64-byte aligned): per layer, keys
//                   [kv_heads, tokens, row] then values in the same layout, rows of the cache's KvDtype
//                   (engine/kernels/kv_rows.h; dtype codes 1 f32, 2 bf16, 3 f16, 4 q8_0)
//
// Version 1 had a section of the caller's bytes between the tokens and the K/V data, its size and
// checksum where version 2 has the reserved bytes. The header's first 120 bytes are laid out alike in
// every version, so a file of an older version is still known as this installation's: it is never
// used, and it is deleted or replaced like a damaged one. A newer version's file is left as it is.
//
// The K/V layout is the cache's own ([kv_heads, tokens, head_dim]), so a snapshot is written and
// restored with one strided copy per layer and tensor, and the first k positions of a snapshot can be
// restored alone (a prefix shared with another conversation).
//
// Checksums are XXH3-64, keyed with the installation's secret (SnapshotKey) when there is one: a file
// written by another installation, or edited and its checksums recomputed without the secret, fails
// them. Installation 0 is the unkeyed form (XXH3's own secret).
//
// Trust: nothing in a file is used before every check passed: size, header checksum, installation,
// format version, model fingerprint, cache shape and dtype, token count against the context, token
// checksum, and (before any K/V is used) the data checksum. A failed check is a SnapshotError saying
// which one, and whether the file is a damaged snapshot of this installation (which may be deleted) or
// something else (left alone).
#include <ATen/ATen.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/cache/huge_page_buffer.h"
#include "engine/cache/kv_cache.h"
#include "engine/types.h"

namespace kvchat {

class LlamaModel;

struct SnapshotError : std::runtime_error {
  enum class Kind {
    // A snapshot of this installation (its header checks out under this installation's key) that fails
    // a later check or is of an older format version, or a snapshot of the unkeyed form where this
    // installation keys its own: a store may delete it.
    Damaged,
    // Not provably a snapshot this installation wrote (no kvchat header, a header checksum that fails,
    // another installation's, a newer format version's), or one this model cannot use (more tokens than
    // its context): left as it is.
    NotOurs,
    // The file could not be read (an I/O error, too many open files, no memory): it may be whole.
    Unreadable,
  };
  explicit SnapshotError(const std::string& what, Kind kind = Kind::Damaged) : std::runtime_error(what), kind(kind) {}
  Kind kind;
};

constexpr std::uint32_t kSnapshotFormatVersion = 2;
constexpr std::uint32_t kOldestSnapshotFormatVersion = 1;  // the first kvchat's
constexpr std::int64_t kSnapshotHeaderBytes = 128;
// The most tokens a snapshot file may claim, whatever the model (its context bounds it further).
constexpr std::int64_t kMaxSnapshotTokens = std::int64_t(1) << 24;

// Whose snapshots these are: `installation` is written in each header (it is no secret: it tells another
// installation's files from damaged ones), `secret` keys every checksum. The default is the unkeyed form.
struct SnapshotKey {
  std::uint64_t installation = 0;
  std::string secret;  // empty (installation 0), or kSnapshotSecretBytes bytes
};
constexpr std::size_t kSnapshotSecretBytes = 192;

// What a snapshot's K/V was computed by. Two models with the same hash give the same K/V for the same
// tokens: the hash covers the architecture, every shape, the RoPE configuration, the weights' storage
// types, the identity of the weight files (path, size, modification time) and a sample of the weights
// themselves (embedding rows and every norm vector), so weights made in memory are told apart too.
struct ModelFingerprint {
  std::uint64_t hash = 0;
  std::string description;  // "llama 2L 8x64 f32 ..." for log messages
  std::string hex() const;  // 16 hex digits: the name of the model's snapshot folder
};
ModelFingerprint fingerprint_model(const LlamaModel& model);

// A snapshot in memory: a copy of the cache's first tokens.size() positions, independent of the cache
// (the cache may grow, shrink or be freed while this is written to disk on another thread).
struct KvSnapshot {
  KvCacheShape shape;  // layers, kv_heads, head_dim, dtype (max_tokens unused)
  std::vector<TokenId> tokens;
  HugePageBuffer data;  // the K/V data section, as in the file
};

// Copies the cache's first history.size() positions (history: the ids those positions hold).
KvSnapshot capture_snapshot(const KvCache& cache, const std::vector<TokenId>& history);

// Writes `snapshot` as `name` in the folder `directory_fd` so that the name holds either its old content
// or the whole new file, never a part: a temporary file in the same folder (never through a symbolic
// link), fsync, rename, fsync of the folder. The name is replaced only when it is free or holds a
// snapshot of this installation (snapshot_owner): anything else there is left alone and the write fails.
// Throws SnapshotError (with the OS error, e.g. a full disk) and leaves no temporary file behind.
void write_snapshot_at(int directory_fd, const std::string& name, const std::string& path_for_messages,
                       const KvSnapshot& snapshot, std::uint64_t fingerprint, const SnapshotKey& key);
// The same for a path (its folder opened as named).
void write_snapshot_file(const std::string& path, const KvSnapshot& snapshot, std::uint64_t fingerprint,
                         const SnapshotKey& key = {});

// Whether the open file `fd` is a snapshot this installation may delete or replace: a regular file whose
// header checks out under `key` (Ours), or a kvchat snapshot of the unkeyed form where `key` is not
// (Unkeyed, a leftover from before the installation had a key). Anything else is NotOurs.
enum class SnapshotOwner { Ours, Unkeyed, NotOurs };
SnapshotOwner snapshot_owner(int fd, const SnapshotKey& key);
// Whether the open file `fd` is what a writer that died leaves under its temporary name: a regular file,
// empty or starting with a snapshot's magic.
bool is_unfinished_snapshot(int fd);

// What a reader checks before it reads past the header (so that a hostile header costs no allocation),
// and what it reads.
struct SnapshotReadOptions {
  std::int64_t max_tokens = kMaxSnapshotTokens;  // more is NotOurs ("more tokens than this model's context")
  bool read_tokens = true;                       // false: the token checksum is not checked either
};

// The header and tokens of a snapshot file, checked (header checksum, version, sizes, token checksum)
// but its K/V data not read: what the store indexes and matches prompts against.
struct SnapshotHeader {
  std::uint64_t fingerprint = 0;
  KvCacheShape shape;
  std::int64_t token_count = 0;
  std::vector<TokenId> tokens;  // when read (SnapshotReadOptions::read_tokens)
  std::int64_t file_bytes = 0;
  std::int64_t data_offset = 0;
  std::uint64_t data_checksum = 0;
};
SnapshotHeader read_snapshot_header(int fd, const std::string& path_for_messages, const SnapshotKey& key,
                                    const SnapshotReadOptions& options);
// Opens `path` (not through a symbolic link) and reads all of the above, up to kMaxSnapshotTokens tokens.
SnapshotHeader read_snapshot_header(const std::string& path, const SnapshotKey& key = {});
// Tokens [first, first + count) of an open snapshot whose header was read (unchecked: the caller compares
// them with what a full read gives before it trusts them).
std::vector<TokenId> read_snapshot_tokens(int fd, const std::string& path_for_messages, std::int64_t first,
                                          std::int64_t count);

// A whole snapshot file read at once and fully validated against the model and cache it will serve:
// everything read_snapshot_header checks, then the fingerprint, the cache shape and dtype, and the
// data checksum.
struct LoadedSnapshot {
  SnapshotHeader header;
  HugePageBuffer data;
};
// The fingerprint, the shape and the context (shape.max_tokens, when set) are checked before the tokens
// are read, so a file claiming millions of tokens costs no more than its header.
LoadedSnapshot read_snapshot_file(int fd, const std::string& path_for_messages, std::uint64_t fingerprint,
                                  const KvCacheShape& shape, const SnapshotKey& key);
LoadedSnapshot read_snapshot_file(const std::string& path, std::uint64_t fingerprint, const KvCacheShape& shape,
                                  const SnapshotKey& key = {});

// Replaces the cache's contents with the snapshot's first `tokens` positions (tokens <= its count).
void restore_snapshot(const KvCacheShape& shape, const std::vector<TokenId>& snapshot_tokens,
                      const HugePageBuffer& data, std::int64_t tokens, KvCache& cache);

// Bytes of the K/V data section for `tokens` positions (of a cache that exists: no overflow check).
std::int64_t snapshot_data_bytes(const KvCacheShape& shape, std::int64_t tokens);

}  // namespace kvchat
