#pragma once
// A KV cache snapshot: one conversation's cached tokens and the K/V of every layer, as a file that a
// later process can trust or reject. The file format (version 1, little-endian):
//
//   [0, 128)        header: magic "KVCHATKV", format version, model fingerprint, cache dtype and shape,
//                   token count, offsets, checksums of the tokens, the annotation and the K/V data, and
//                   last the header's own checksum (XXH3-64 of its first 120 bytes)
//   [128, ...)      tokens: token_count int32 ids
//   then            annotation: the caller's bytes about what the tokens stand for (kvchat's app keeps a
//                   conversation's exact transcript there, so a later process encodes the next prompt
//                   with the very ids the model sampled)
//   [data_offset,)  K/V data (data_offset 64-byte aligned): per layer, keys [kv_heads, tokens, head_dim]
//                   then values in the same layout, elements of the cache dtype
//
// The K/V layout is the cache's own ([kv_heads, tokens, head_dim]), so a snapshot is written and
// restored with one strided copy per layer and tensor, and the first k positions of a snapshot can be
// restored alone (a prefix shared with another conversation).
//
// Trust: nothing in a file is used before every check passed: size, header checksum, format version,
// model fingerprint, cache shape and dtype, token checksum, and (before any K/V is used) the data
// checksum. A failed check is a SnapshotError saying which one.
#include <ATen/ATen.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/huge_pages.h"
#include "engine/kv_cache.h"
#include "engine/types.h"

namespace kvchat {

class LlamaModel;

struct SnapshotError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

constexpr std::uint32_t kSnapshotFormatVersion = 1;
constexpr std::int64_t kSnapshotHeaderBytes = 128;

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
  HugePageBuffer data;             // the K/V data section, as in the file
  std::string annotation;          // opaque to the engine (at most kMaxSnapshotAnnotationBytes)
};
constexpr std::int64_t kMaxSnapshotAnnotationBytes = std::int64_t(64) << 20;

// Copies the cache's first history.size() positions (history: the ids those positions hold).
KvSnapshot capture_snapshot(const KvCache& cache, const std::vector<TokenId>& history);

// Writes `snapshot` to `path` so that `path` is either its old content or the whole new file, never a
// part: a temporary file in the same folder, fsync, rename over `path`, fsync of the folder. Throws
// SnapshotError (with the OS error, e.g. a full disk) and leaves no temporary file behind.
void write_snapshot_file(const std::string& path, const KvSnapshot& snapshot, std::uint64_t fingerprint);

// The header and tokens of a snapshot file, checked (header checksum, version, sizes, token checksum)
// but its K/V data not read: what the store indexes and matches prompts against.
struct SnapshotHeader {
  std::uint64_t fingerprint = 0;
  KvCacheShape shape;
  std::vector<TokenId> tokens;
  std::string annotation;
  std::int64_t file_bytes = 0;
  std::int64_t data_offset = 0;
  std::uint64_t data_checksum = 0;
};
SnapshotHeader read_snapshot_header(const std::string& path);

// A whole snapshot file read at once and fully validated against the model and cache it will serve:
// everything read_snapshot_header checks, then the fingerprint, the cache shape and dtype, and the
// data checksum.
struct LoadedSnapshot {
  SnapshotHeader header;
  HugePageBuffer data;
};
LoadedSnapshot read_snapshot_file(const std::string& path, std::uint64_t fingerprint, const KvCacheShape& shape);

// Replaces the cache's contents with the snapshot's first `tokens` positions (tokens <= its count).
void restore_snapshot(const KvCacheShape& shape, const std::vector<TokenId>& snapshot_tokens,
                      const HugePageBuffer& data, std::int64_t tokens, KvCache& cache);

// Bytes of the K/V data section for `tokens` positions.
std::int64_t snapshot_data_bytes(const KvCacheShape& shape, std::int64_t tokens);

}  // namespace kvchat
