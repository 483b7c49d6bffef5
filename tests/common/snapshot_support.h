#pragma once
// What the KV snapshot tests share: made-up prompts, greedy configs, a capture of the log (rejections
// must say why) and byte-level edits of snapshot files.
#include <fcntl.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>
#include <xxhash.h>

#include <QFile>
#include <QtTest/QtTest>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/cache/kv_snapshot.h"
#include "engine/types.h"

namespace kvchat::test {

// A deterministic prompt of `length` ids in [10, 410), starting with BOS (1).
inline std::vector<TokenId> made_up_prompt(int length, int salt) {
  std::vector<TokenId> ids = {1};
  for (int i = 1; i < length; ++i) ids.push_back(static_cast<TokenId>(10 + (i * 7 + salt * 13 + i * i * salt) % 400));
  return ids;
}

inline GenerationConfig greedy(int max_new_tokens, KvCacheMode mode = KvCacheMode::Contiguous) {
  GenerationConfig config;
  config.max_new_tokens = max_new_tokens;
  config.cache_mode = mode;
  config.stop_token_ids = {-1};  // never stop early: every turn has its full length
  return config;
}

// The next turn's prompt: this one, the reply, and a user's few new tokens.
inline std::vector<TokenId> continued(std::vector<TokenId> prompt, const std::vector<TokenId>& reply, int salt) {
  prompt.insert(prompt.end(), reply.begin(), reply.end());
  const std::vector<TokenId> more = made_up_prompt(9, salt);
  prompt.insert(prompt.end(), more.begin() + 1, more.end());
  return prompt;
}

// Every message logged while it lives (warnings and up, the rejections' level).
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256)) {
    sink_->set_level(spdlog::level::warn);
    spdlog::default_logger()->sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  bool contains(const std::string& text) const {
    for (const std::string& line : sink_->last_formatted())
      if (line.find(text) != std::string::npos) return true;
    return false;
  }
  std::string all() const {
    std::string text;
    for (const std::string& line : sink_->last_formatted()) text += line;
    return text;
  }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
};

inline QByteArray read_bytes(const std::string& path) {
  QFile file(QString::fromStdString(path));
  if (!file.open(QIODevice::ReadOnly)) return {};
  return file.readAll();
}

inline bool write_bytes(const std::string& path, const QByteArray& bytes) {
  QFile file(QString::fromStdString(path));
  return file.open(QIODevice::WriteOnly | QIODevice::Truncate) && file.write(bytes) == bytes.size();
}

// Offsets of a snapshot header's fields (engine/cache/kv_snapshot.cpp), for files made or edited byte by byte.
constexpr int kSnapshotVersionAt = 8, kSnapshotFingerprintAt = 16, kSnapshotTokenCountAt = 48,
              kSnapshotDataOffsetAt = 56, kSnapshotFileBytesAt = 64, kSnapshotTokensChecksumAt = 72,
              kSnapshotInstallationAt = 104, kSnapshotHeaderChecksumAt = 120;

// XXH3-64 keyed as the snapshot files of `key` are.
inline std::uint64_t snapshot_checksum(const kvchat::SnapshotKey& key, const void* data, std::size_t size) {
  return key.secret.empty() ? XXH3_64bits(data, size)
                            : XXH3_64bits_withSecret(data, size, key.secret.data(), key.secret.size());
}

template <typename T>
T field_of(const QByteArray& bytes, int offset) {
  T value;
  std::memcpy(&value, bytes.constData() + offset, sizeof value);
  return value;
}
template <typename T>
void set_field(QByteArray& bytes, int offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof value);
}

// `bytes` (a snapshot file) with its header checksum recomputed for `key`.
inline QByteArray with_header_checksum(QByteArray bytes, const kvchat::SnapshotKey& key = {}) {
  set_field<std::uint64_t>(bytes, kSnapshotHeaderChecksumAt,
                           snapshot_checksum(key, bytes.constData(), kSnapshotHeaderChecksumAt));
  return bytes;
}

// `bytes` (a snapshot file) with its token section's checksum, then its header's, recomputed for `key`:
// what someone who edited the token ids and knew the key would write.
inline QByteArray with_token_checksum(QByteArray bytes, const kvchat::SnapshotKey& key = {}) {
  const auto tokens = field_of<std::uint64_t>(bytes, kSnapshotTokenCountAt);
  const auto token_bytes = static_cast<std::size_t>(tokens) * sizeof(TokenId);
  set_field<std::uint64_t>(bytes, kSnapshotTokensChecksumAt,
                           snapshot_checksum(key, bytes.constData() + 128, token_bytes));
  return with_header_checksum(bytes, key);
}

// `bytes` (a snapshot file of the current format) as the first kvchat wrote it, format version 1: the
// same header, tokens and K/V data with a section of `annotation` bytes between the tokens and the data
// (its size at header offset 88, its checksum at 96), every checksum right for `key`.
inline QByteArray as_format_version_1(const QByteArray& bytes, const QByteArray& annotation,
                                      const kvchat::SnapshotKey& key = {}) {
  const auto tokens = field_of<std::uint64_t>(bytes, kSnapshotTokenCountAt);
  const int tokens_end = 128 + static_cast<int>(tokens) * 4;
  const auto data_at = field_of<std::int64_t>(bytes, kSnapshotDataOffsetAt);
  QByteArray old = bytes.left(tokens_end) + annotation;
  old += QByteArray(static_cast<int>((old.size() + 63) / 64 * 64 - old.size()), '\0');
  const std::int64_t data_offset = old.size();
  old += bytes.mid(static_cast<int>(data_at));
  set_field<std::uint32_t>(old, kSnapshotVersionAt, 1);
  set_field<std::int64_t>(old, kSnapshotDataOffsetAt, data_offset);
  set_field<std::int64_t>(old, kSnapshotFileBytesAt, old.size());
  set_field<std::uint64_t>(old, 88, static_cast<std::uint64_t>(annotation.size()));
  const auto annotation_bytes = static_cast<std::size_t>(annotation.size());
  set_field<std::uint64_t>(old, 96, snapshot_checksum(key, annotation.constData(), annotation_bytes));
  return with_header_checksum(old, key);
}

// A snapshot file made byte by byte, as a hostile one would be: `tokens` copies of `token` and
// `data_bytes` of K/V data left as a hole (the file is sparse). Every checksum but the data's is right
// for `key`, and the header claims what it is given, whether it adds up or not.
struct CraftedSnapshot {
  std::uint64_t fingerprint = 0;
  std::uint64_t layers = 1, kv_heads = 1, head_dim = 1;
  std::uint32_t dtype_code = 1;  // f32
  std::int64_t tokens = 1;
  TokenId token = 0;
  std::int64_t data_bytes = 0;
};
inline bool write_crafted_snapshot(const std::string& path, const CraftedSnapshot& crafted,
                                   const kvchat::SnapshotKey& key = {}) {
  QByteArray header(128, '\0');
  std::memcpy(header.data(), "KVCHATKV", 8);
  set_field<std::uint32_t>(header, kSnapshotVersionAt, kvchat::kSnapshotFormatVersion);
  set_field<std::uint32_t>(header, 12, crafted.dtype_code);
  set_field<std::uint64_t>(header, kSnapshotFingerprintAt, crafted.fingerprint);
  set_field<std::uint64_t>(header, 24, crafted.layers);
  set_field<std::uint64_t>(header, 32, crafted.kv_heads);
  set_field<std::uint64_t>(header, 40, crafted.head_dim);
  set_field<std::uint64_t>(header, kSnapshotTokenCountAt, static_cast<std::uint64_t>(crafted.tokens));
  const std::int64_t data_offset = (128 + crafted.tokens * 4 + 63) / 64 * 64;
  set_field<std::int64_t>(header, kSnapshotDataOffsetAt, data_offset);
  set_field<std::int64_t>(header, kSnapshotFileBytesAt, data_offset + crafted.data_bytes);
  // The token section's checksum, a piece at a time (it may be tens of MB).
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
  if (key.secret.empty())
    XXH3_64bits_reset(state.get());
  else
    XXH3_64bits_reset_withSecret(state.get(), key.secret.data(), key.secret.size());
  const std::vector<TokenId> piece(65536, crafted.token);
  for (std::int64_t done = 0; done < crafted.tokens; done += static_cast<std::int64_t>(piece.size()))
    XXH3_64bits_update(
        state.get(), piece.data(),
        static_cast<std::size_t>(std::min<std::int64_t>(crafted.tokens - done, piece.size())) * sizeof(TokenId));
  set_field<std::uint64_t>(header, kSnapshotTokensChecksumAt, XXH3_64bits_digest(state.get()));
  set_field<std::uint64_t>(header, kSnapshotInstallationAt, key.installation);
  header = with_header_checksum(header, key);

  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  bool ok = ::write(fd, header.constData(), 128) == 128;
  if (crafted.token != 0)
    for (std::int64_t done = 0; ok && done < crafted.tokens; done += static_cast<std::int64_t>(piece.size())) {
      const auto bytes =
          static_cast<std::size_t>(std::min<std::int64_t>(crafted.tokens - done, piece.size())) * sizeof(TokenId);
      ok = ::write(fd, piece.data(), bytes) == static_cast<ssize_t>(bytes);
    }
  ok = ok && ::ftruncate(fd, data_offset + crafted.data_bytes) == 0;
  return ::close(fd) == 0 && ok;
}

}  // namespace kvchat::test
