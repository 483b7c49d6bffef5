#include "engine/cache/kv_snapshot.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>

#include "engine/model/llama_model.h"

namespace kvchat {

namespace {

constexpr char kMagic[8] = {'K', 'V', 'C', 'H', 'A', 'T', 'K', 'V'};
constexpr std::int64_t kDataAlignment = 64;
// Sanity bounds of a header's shape (far above any real model): past them a file is corrupt.
constexpr std::uint64_t kMaxLayers = 4096, kMaxHeads = 4096, kMaxHeadDim = 65536;

// Offsets of the header's fields.
enum HeaderOffset : std::size_t {
  kVersionAt = 8,
  kDtypeAt = 12,
  kFingerprintAt = 16,
  kLayersAt = 24,
  kKvHeadsAt = 32,
  kHeadDimAt = 40,
  kTokenCountAt = 48,
  kDataOffsetAt = 56,
  kFileBytesAt = 64,
  kTokensChecksumAt = 72,
  kDataChecksumAt = 80,
  kReservedAt = 88,
  kInstallationAt = 104,
  kHeaderChecksumAt = 120,  // [88, 104): zero (version 1's annotation)
};

using Kind = SnapshotError::Kind;

template <typename T>
void put(std::uint8_t* header, std::size_t offset, T value) {
  std::memcpy(header + offset, &value, sizeof value);
}
template <typename T>
T get(const std::uint8_t* header, std::size_t offset) {
  T value;
  std::memcpy(&value, header + offset, sizeof value);
  return value;
}

std::uint64_t checksum(const SnapshotKey& key, const void* data, std::size_t size) {
  if (key.secret.empty()) return XXH3_64bits(data, size);
  return XXH3_64bits_withSecret(data, size, key.secret.data(), key.secret.size());
}

void check_key(const SnapshotKey& key) {
  if (key.secret.empty() ? key.installation != 0 : key.secret.size() != kSnapshotSecretBytes || key.installation == 0)
    throw std::invalid_argument("a KV snapshot key has installation 0 and no secret, or another installation and a " +
                                std::to_string(kSnapshotSecretBytes) + "-byte secret");
}

// Codes 1-3 are those of the f32, bf16 and f16 caches that version 2 files already held.
std::uint32_t dtype_code(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::F32: return 1;
    case KvDtype::BF16: return 2;
    case KvDtype::F16: return 3;
    case KvDtype::Q8_0: return 4;
  }
  throw SnapshotError("a KV cache of an unknown dtype cannot be saved");
}

KvDtype dtype_of_code(std::uint32_t code, const std::string& path) {
  switch (code) {
    case 1: return KvDtype::F32;
    case 2: return KvDtype::BF16;
    case 3: return KvDtype::F16;
    case 4: return KvDtype::Q8_0;
    default: throw SnapshotError("snapshot " + path + ": unknown cache dtype code " + std::to_string(code));
  }
}

std::int64_t align_up(std::int64_t value) { return (value + kDataAlignment - 1) / kDataAlignment * kDataAlignment; }

std::int64_t tokens_end(std::int64_t tokens) {
  return kSnapshotHeaderBytes + tokens * static_cast<std::int64_t>(sizeof(TokenId));
}
std::int64_t data_offset_for(std::int64_t tokens) { return align_up(tokens_end(tokens)); }

// A format version this kvchat knows of but no longer reads: its files are still this installation's.
bool is_older_version(std::uint32_t version) {
  return version >= kOldestSnapshotFormatVersion && version < kSnapshotFormatVersion;
}

// snapshot_data_bytes for a header's claims: false when the product does not fit in 63 bits (the bounds
// above allow shapes whose bytes wrap around, which would let a short file pass the size check).
bool checked_data_bytes(const KvCacheShape& shape, std::int64_t tokens, std::int64_t* bytes) {
  std::int64_t product = 2;
  for (const std::int64_t factor : {shape.layers, shape.kv_heads, shape.row_bytes(), tokens})
    if (__builtin_mul_overflow(product, factor, &product)) return false;
  *bytes = product;
  return true;
}

std::string os_error(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

struct FileCloser {
  int fd = -1;
  ~FileCloser() {
    if (fd >= 0) ::close(fd);
  }
};

void write_all(int fd, const void* data, std::size_t size, const std::string& path) {
  const auto* bytes = static_cast<const std::uint8_t*>(data);
  while (size > 0) {
    const ssize_t written = ::write(fd, bytes, size);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) throw SnapshotError(os_error("cannot write snapshot", path));
    bytes += written;
    size -= static_cast<std::size_t>(written);
  }
}

// Reads exactly `size` bytes at `offset`: false when the file ends first; an I/O error throws.
bool read_exactly_at(int fd, void* data, std::size_t size, std::int64_t offset, const std::string& path) {
  auto* bytes = static_cast<std::uint8_t*>(data);
  while (size > 0) {
    const ssize_t got = ::pread(fd, bytes, size, offset);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw SnapshotError(os_error("cannot read snapshot", path), Kind::Unreadable);
    if (got == 0) return false;
    bytes += got;
    size -= static_cast<std::size_t>(got);
    offset += got;
  }
  return true;
}

void read_all_at(int fd, void* data, std::size_t size, std::int64_t offset, const std::string& path) {
  if (!read_exactly_at(fd, data, size, offset, path))
    throw SnapshotError("snapshot " + path + " ends early (truncated)");
}

int open_regular(const std::string& path) {
  // O_NONBLOCK: a FIFO under a snapshot's name must not block the open; O_NOFOLLOW: nor lead elsewhere.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  if (fd < 0)
    throw SnapshotError(os_error("cannot open snapshot", path), errno == ELOOP ? Kind::NotOurs : Kind::Unreadable);
  return fd;
}

// The header of a regular file, or nullopt when there is none (too short, or not a regular file).
std::optional<std::array<std::uint8_t, kSnapshotHeaderBytes>> read_header_bytes(int fd, const std::string& path,
                                                                                struct stat* info) {
  if (::fstat(fd, info) != 0) throw SnapshotError(os_error("cannot stat snapshot", path), Kind::Unreadable);
  if (!S_ISREG(info->st_mode) || info->st_size < kSnapshotHeaderBytes) return std::nullopt;
  std::array<std::uint8_t, kSnapshotHeaderBytes> header{};
  if (!read_exactly_at(fd, header.data(), header.size(), 0, path)) return std::nullopt;
  return header;
}

bool header_checksum_holds(const std::uint8_t* header, const SnapshotKey& key) {
  return checksum(key, header, kHeaderChecksumAt) == get<std::uint64_t>(header, kHeaderChecksumAt);
}

SnapshotOwner owner_of_header(const std::uint8_t* header, const SnapshotKey& key) {
  if (std::memcmp(header, kMagic, sizeof kMagic) != 0) return SnapshotOwner::NotOurs;
  const auto installation = get<std::uint64_t>(header, kInstallationAt);
  const auto version = get<std::uint32_t>(header, kVersionAt);
  const bool known_version = version == kSnapshotFormatVersion || is_older_version(version);
  if (installation == key.installation)
    return header_checksum_holds(header, key) && known_version ? SnapshotOwner::Ours : SnapshotOwner::NotOurs;
  if (installation == 0 && header_checksum_holds(header, SnapshotKey{}) && known_version) return SnapshotOwner::Unkeyed;
  return SnapshotOwner::NotOurs;
}

// Checks a snapshot's header and what it claims against the file, then reads what `options` asks for.
SnapshotHeader read_header_from(int fd, const std::string& path, const SnapshotKey& key,
                                const SnapshotReadOptions& options) {
  check_key(key);
  struct stat info {};
  const auto bytes = read_header_bytes(fd, path, &info);
  if (!S_ISREG(info.st_mode)) throw SnapshotError("snapshot " + path + " is not a regular file", Kind::NotOurs);
  if (!bytes)
    throw SnapshotError(
        "snapshot " + path + " is truncated (" + std::to_string(info.st_size) + " bytes, less than its header)",
        Kind::NotOurs);
  const std::uint8_t* header = bytes->data();
  if (std::memcmp(header, kMagic, sizeof kMagic) != 0)
    throw SnapshotError("snapshot " + path + " is not a kvchat KV snapshot (bad magic)", Kind::NotOurs);
  const auto installation = get<std::uint64_t>(header, kInstallationAt);
  if (installation != key.installation) {
    if (owner_of_header(header, key) == SnapshotOwner::Unkeyed)
      throw SnapshotError("snapshot " + path + " has no installation key; this installation's snapshots have one");
    throw SnapshotError("snapshot " + path + " was written by another kvchat installation", Kind::NotOurs);
  }
  if (!header_checksum_holds(header, key))
    throw SnapshotError("snapshot " + path + ": header checksum mismatch (the file is corrupt, or was not written by " +
                            "this installation)",
                        Kind::NotOurs);
  const auto version = get<std::uint32_t>(header, kVersionAt);
  // An older version's file is this installation's to delete; a newer one is a newer kvchat's.
  if (version != kSnapshotFormatVersion)
    throw SnapshotError("snapshot " + path + " has format version " + std::to_string(version) +
                            "; this kvchat reads version " + std::to_string(kSnapshotFormatVersion),
                        is_older_version(version) ? Kind::Damaged : Kind::NotOurs);
  const auto layers = get<std::uint64_t>(header, kLayersAt), kv_heads = get<std::uint64_t>(header, kKvHeadsAt),
             head_dim = get<std::uint64_t>(header, kHeadDimAt), count = get<std::uint64_t>(header, kTokenCountAt);
  if (layers == 0 || layers > kMaxLayers || kv_heads == 0 || kv_heads > kMaxHeads || head_dim == 0 ||
      head_dim > kMaxHeadDim || count == 0 || count > static_cast<std::uint64_t>(kMaxSnapshotTokens))
    throw SnapshotError("snapshot " + path + ": implausible shape in its header");

  SnapshotHeader result;
  result.fingerprint = get<std::uint64_t>(header, kFingerprintAt);
  result.shape = KvCacheShape{static_cast<std::int64_t>(layers),
                              static_cast<std::int64_t>(kv_heads),
                              static_cast<std::int64_t>(head_dim),
                              0,
                              dtype_of_code(get<std::uint32_t>(header, kDtypeAt), path),
                              {}};
  const auto tokens = static_cast<std::int64_t>(count);
  result.data_offset = get<std::int64_t>(header, kDataOffsetAt);
  result.file_bytes = get<std::int64_t>(header, kFileBytesAt);
  result.data_checksum = get<std::uint64_t>(header, kDataChecksumAt);
  std::int64_t data_bytes = 0, file_bytes = 0;
  if (!checked_data_bytes(result.shape, tokens, &data_bytes) ||
      __builtin_add_overflow(result.data_offset, data_bytes, &file_bytes))
    throw SnapshotError("snapshot " + path + ": its header's shape gives more bytes than a file can hold");
  if (result.data_offset != data_offset_for(tokens) || result.file_bytes != file_bytes)
    throw SnapshotError("snapshot " + path + ": its header's sizes do not add up");
  if (info.st_size != result.file_bytes)
    throw SnapshotError("snapshot " + path + " has " + std::to_string(info.st_size) + " bytes, its header says " +
                        std::to_string(result.file_bytes) + " (truncated or extended)");
  if (tokens > options.max_tokens)
    throw SnapshotError("snapshot " + path + " holds " + std::to_string(tokens) +
                            " tokens, more than this model's context of " + std::to_string(options.max_tokens),
                        Kind::NotOurs);
  result.token_count = tokens;
  if (options.read_tokens) {
    result.tokens.resize(static_cast<std::size_t>(tokens));
    read_all_at(fd, result.tokens.data(), result.tokens.size() * sizeof(TokenId), kSnapshotHeaderBytes, path);
    if (checksum(key, result.tokens.data(), result.tokens.size() * sizeof(TokenId)) !=
        get<std::uint64_t>(header, kTokensChecksumAt))
      throw SnapshotError("snapshot " + path + ": token checksum mismatch (the file is corrupt)");
    for (TokenId id : result.tokens)
      if (id < 0) throw SnapshotError("snapshot " + path + ": negative token id " + std::to_string(id));
  }
  return result;
}

void hash_floats(XXH3_state_t* state, const float* values, std::size_t count) {
  XXH3_64bits_update(state, values, count * sizeof(float));
}

void hash_tensor(XXH3_state_t* state, const at::Tensor& tensor) {
  if (!tensor.defined()) return;
  const at::Tensor values = tensor.to(at::kFloat).contiguous();
  hash_floats(state, values.data_ptr<float>(), static_cast<std::size_t>(values.numel()));
}

void hash_linear_rows(XXH3_state_t* state, const Linear& linear, std::initializer_list<std::int64_t> rows) {
  std::vector<float> row(static_cast<std::size_t>(linear.in_features()));
  for (std::int64_t index : rows) {
    linear.row_into(std::clamp<std::int64_t>(index, 0, linear.out_features() - 1), row.data());
    hash_floats(state, row.data(), row.size());
  }
  hash_tensor(state, linear.bias);
}

}  // namespace

std::int64_t snapshot_data_bytes(const KvCacheShape& shape, std::int64_t tokens) {
  return 2 * shape.layers * shape.kv_heads * shape.row_bytes() * tokens;
}

std::string ModelFingerprint::hex() const {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

ModelFingerprint fingerprint_model(const LlamaModel& model) {
  const ModelConfig& config = model.config();
  const ModelWeights& weights = model.weights();
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
  XXH3_64bits_reset(state.get());
  // Everything that decides the K/V of a token, in words: readable in a log, hashed here.
  std::string description = config.model_type + " " + std::to_string(config.num_hidden_layers) + "L hidden " +
                            std::to_string(config.hidden_size) + " heads " +
                            std::to_string(config.num_attention_heads) + "/" +
                            std::to_string(config.num_key_value_heads) + "x" + std::to_string(config.head_dim) +
                            " vocab " + std::to_string(config.vocab_size) + " weights " + model.weight_types();
  std::string details =
      description + " ff " + std::to_string(config.intermediate_size) + " eps " + std::to_string(config.rms_norm_eps) +
      " rope " + std::to_string(config.rope_theta) + " " + config.rope_scaling.rope_type + " " +
      std::to_string(config.rope_scaling.factor) + " " + std::to_string(config.rope_scaling.low_freq_factor) + " " +
      std::to_string(config.rope_scaling.high_freq_factor) + " " +
      std::to_string(config.rope_scaling.original_max_position_embeddings) + " bias " +
      std::to_string(config.qkv_bias) + std::to_string(config.output_bias) + std::to_string(config.mlp_bias) + " tie " +
      std::to_string(config.tie_word_embeddings) + " act " + config.hidden_act;
  if (config.qk_norm) details += " qk_norm";  // only where set: the fingerprints of earlier snapshots stay
  // The families' other fields, likewise only where set.
  if (config.rotated_dims() != config.head_dim) details += " rotary " + std::to_string(config.rotary_dim);
  for (double factor : config.rope_scaling.longrope_factors) details += " longrope " + std::to_string(factor);
  if (config.rope_scaling.rope_type == "longrope")
    details += " attention_factor " + std::to_string(config.rope_scaling.attention_factor);
  if (config.embedding_scale != 1.0 || config.post_norms || config.norm_weight_offset != 0)
    details += " gemma " + std::to_string(config.embedding_scale) + " " + std::to_string(config.norm_weight_offset) +
               " " + std::to_string(config.query_pre_attention_scalar) + " " +
               std::to_string(config.attention_logit_softcap) + " " + std::to_string(config.final_logit_softcap) + " " +
               std::to_string(config.rope_local_theta);
  if (config.sliding_window > 0) {
    details += " window " + std::to_string(config.sliding_window) + " ";
    for (bool sliding : config.sliding_layers) details += sliding ? "s" : "g";
  }
  if (!config.layers_without_rope.empty()) {
    details += " nope ";
    for (bool without : config.layers_without_rope) details += without ? "0" : "1";
  }
  for (double factor : config.rope_frequency_factors) details += " " + std::to_string(factor);
  // A GGUF BF16 file's products on bf16 input (Linear::bf16_packed) give other K/V than exact products: a
  // snapshot of the one must not continue in the other (only where set, as above).
  bool bf16_input = false;
  for (const LayerWeights& layer : weights.layers)
    for (const Linear* linear : layer.matrices()) bf16_input = bf16_input || linear->rounds_input_to_bf16();
  if (bf16_input) details += " bf16_input";
  for (const FileIdentity& file : weights.mapped_files)
    details += "\nfile " + file.path + " " + std::to_string(file.size) + " " + std::to_string(file.modified.tv_sec) +
               "." + std::to_string(file.modified.tv_nsec);
  XXH3_64bits_update(state.get(), details.data(), details.size());
  // A sample of the weights themselves: the same shapes with other values give other K/V.
  const std::int64_t vocab = weights.embedding.out_features();
  hash_linear_rows(state.get(), weights.embedding, {0, vocab / 2, vocab - 1});
  if (!config.tie_word_embeddings) hash_linear_rows(state.get(), weights.lm_head, {0, vocab - 1});
  hash_tensor(state.get(), weights.final_norm);
  for (const LayerWeights& layer : weights.layers) {
    hash_tensor(state.get(), layer.attention_norm);
    hash_tensor(state.get(), layer.mlp_norm);
    hash_linear_rows(state.get(), layer.k, {0});
    hash_linear_rows(state.get(), layer.v, {0});
  }
  return ModelFingerprint{XXH3_64bits_digest(state.get()), description};
}

KvSnapshot capture_snapshot(const KvCache& cache, const std::vector<TokenId>& history) {
  const auto tokens = static_cast<std::int64_t>(history.size());
  if (tokens == 0 || tokens > cache.size())
    throw SnapshotError("capture_snapshot: " + std::to_string(tokens) + " tokens, the cache holds " +
                        std::to_string(cache.size()));
  KvSnapshot snapshot;
  snapshot.shape = cache.shape();
  snapshot.tokens = history;
  snapshot.data = HugePageBuffer(static_cast<std::size_t>(snapshot_data_bytes(snapshot.shape, tokens)));
  const KvCacheShape& shape = snapshot.shape;
  const std::int64_t tensor_bytes = snapshot_data_bytes(shape, tokens) / (2 * shape.layers);
  const auto options = at::TensorOptions().dtype(shape.storage_type());
  // Each head's positions are one run of bytes in the cache's buffers: copied with memcpy (LibTorch's
  // strided copy_ was measured ~3x slower here, and this runs on the engine thread).
  const std::size_t head_bytes = static_cast<std::size_t>(tensor_bytes / shape.kv_heads);
  auto copy_heads = [&](const at::Tensor& source, std::uint8_t* target) {
    const bool rows_contiguous = source.stride(2) == 1 && source.stride(1) == shape.row_elements();
    if (!rows_contiguous || source.scalar_type() != shape.storage_type()) {
      at::from_blob(target, {shape.kv_heads, tokens, shape.row_elements()}, options).copy_(source);
      return;
    }
    const auto* bytes = static_cast<const std::uint8_t*>(source.data_ptr());
    const std::size_t head_stride = static_cast<std::size_t>(source.stride(0)) * source.element_size();
    for (std::int64_t head = 0; head < shape.kv_heads; ++head)
      std::memcpy(target + head * head_bytes, bytes + head * head_stride, head_bytes);
  };
  for (std::int64_t layer = 0; layer < shape.layers; ++layer) {
    const auto [keys, values] = cache.view(layer, tokens);
    std::uint8_t* base = snapshot.data.data() + 2 * layer * tensor_bytes;
    copy_heads(keys, base);
    copy_heads(values, base + tensor_bytes);
  }
  return snapshot;
}

void write_snapshot_at(int directory_fd, const std::string& name, const std::string& path, const KvSnapshot& snapshot,
                       std::uint64_t fingerprint, const SnapshotKey& key) {
  check_key(key);
  const auto tokens = static_cast<std::int64_t>(snapshot.tokens.size());
  const std::int64_t data_offset = data_offset_for(tokens);
  if (tokens == 0 || static_cast<std::int64_t>(snapshot.data.size()) != snapshot_data_bytes(snapshot.shape, tokens))
    throw SnapshotError("write_snapshot_file: the snapshot's data does not match its shape");
  std::uint8_t header[kSnapshotHeaderBytes] = {};
  std::memcpy(header, kMagic, sizeof kMagic);
  put<std::uint32_t>(header, kVersionAt, kSnapshotFormatVersion);
  put<std::uint32_t>(header, kDtypeAt, dtype_code(snapshot.shape.dtype));
  put<std::uint64_t>(header, kFingerprintAt, fingerprint);
  put<std::uint64_t>(header, kLayersAt, static_cast<std::uint64_t>(snapshot.shape.layers));
  put<std::uint64_t>(header, kKvHeadsAt, static_cast<std::uint64_t>(snapshot.shape.kv_heads));
  put<std::uint64_t>(header, kHeadDimAt, static_cast<std::uint64_t>(snapshot.shape.head_dim));
  put<std::uint64_t>(header, kTokenCountAt, static_cast<std::uint64_t>(tokens));
  put<std::int64_t>(header, kDataOffsetAt, data_offset);
  put<std::int64_t>(header, kFileBytesAt, data_offset + static_cast<std::int64_t>(snapshot.data.size()));
  put<std::uint64_t>(header, kTokensChecksumAt,
                     checksum(key, snapshot.tokens.data(), snapshot.tokens.size() * sizeof(TokenId)));
  put<std::uint64_t>(header, kDataChecksumAt, checksum(key, snapshot.data.data(), snapshot.data.size()));
  put<std::uint64_t>(header, kInstallationAt, key.installation);
  put<std::uint64_t>(header, kHeaderChecksumAt, checksum(key, header, kHeaderChecksumAt));

  // A name no other writer (thread or process) uses; the rename makes the whole file appear at once.
  static std::atomic<std::uint64_t> counter{0};
  const std::string temporary = name + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(++counter);
  const std::string temporary_path = path + ".tmp." + temporary.substr(name.size() + 5);
  try {
    FileCloser file{
        ::openat(directory_fd, temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644)};
    if (file.fd < 0) throw SnapshotError(os_error("cannot create snapshot", temporary_path));
    write_all(file.fd, header, sizeof header, temporary_path);
    write_all(file.fd, snapshot.tokens.data(), snapshot.tokens.size() * sizeof(TokenId), temporary_path);
    const std::vector<std::uint8_t> padding(static_cast<std::size_t>(data_offset - tokens_end(tokens)), 0);
    write_all(file.fd, padding.data(), padding.size(), temporary_path);
    write_all(file.fd, snapshot.data.data(), snapshot.data.size(), temporary_path);
    if (::fsync(file.fd) != 0) throw SnapshotError(os_error("cannot flush snapshot", temporary_path));
    if (::close(file.fd) != 0) {
      file.fd = -1;
      throw SnapshotError(os_error("cannot close snapshot", temporary_path));
    }
    file.fd = -1;
    // The name is taken only while free; a file already there is replaced only when it is one of this
    // installation's snapshots (a symbolic link, a folder or another program's file stays as it is).
    if (::renameat2(directory_fd, temporary.c_str(), directory_fd, name.c_str(), RENAME_NOREPLACE) != 0) {
      if (errno != EEXIST && errno != EINVAL && errno != ENOSYS)
        throw SnapshotError(os_error("cannot rename snapshot to", path));
      FileCloser existing{::openat(directory_fd, name.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW)};
      if (existing.fd >= 0 ? snapshot_owner(existing.fd, key) == SnapshotOwner::NotOurs : errno != ENOENT)
        throw SnapshotError(path + " exists and is not a KV snapshot of this installation: it is left as it is",
                            Kind::NotOurs);
      if (::renameat(directory_fd, temporary.c_str(), directory_fd, name.c_str()) != 0)
        throw SnapshotError(os_error("cannot rename snapshot to", path));
    }
  } catch (...) {
    ::unlinkat(directory_fd, temporary.c_str(), 0);
    throw;
  }
  ::fsync(directory_fd);  // best effort: the rename is already atomic
}

void write_snapshot_file(const std::string& path, const KvSnapshot& snapshot, std::uint64_t fingerprint,
                         const SnapshotKey& key) {
  const std::size_t slash = path.find_last_of('/');
  const std::string directory = slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash);
  FileCloser folder{::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (folder.fd < 0) throw SnapshotError(os_error("cannot open the folder of snapshot", path));
  write_snapshot_at(folder.fd, slash == std::string::npos ? path : path.substr(slash + 1), path, snapshot, fingerprint,
                    key);
}

SnapshotOwner snapshot_owner(int fd, const SnapshotKey& key) {
  struct stat info {};
  try {
    const auto header = read_header_bytes(fd, "", &info);
    return header ? owner_of_header(header->data(), key) : SnapshotOwner::NotOurs;
  } catch (const SnapshotError&) {
    return SnapshotOwner::NotOurs;
  }
}

bool is_unfinished_snapshot(int fd) {
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) return false;
  if (info.st_size == 0) return true;
  char start[sizeof kMagic] = {};
  const auto length = static_cast<std::size_t>(std::min<std::int64_t>(info.st_size, sizeof kMagic));
  try {
    return read_exactly_at(fd, start, length, 0, "") && std::memcmp(start, kMagic, length) == 0;
  } catch (const SnapshotError&) {
    return false;
  }
}

SnapshotHeader read_snapshot_header(int fd, const std::string& path, const SnapshotKey& key,
                                    const SnapshotReadOptions& options) {
  return read_header_from(fd, path, key, options);
}

SnapshotHeader read_snapshot_header(const std::string& path, const SnapshotKey& key) {
  FileCloser file{open_regular(path)};
  return read_header_from(file.fd, path, key, SnapshotReadOptions{});
}

std::vector<TokenId> read_snapshot_tokens(int fd, const std::string& path, std::int64_t first, std::int64_t count) {
  std::vector<TokenId> tokens(static_cast<std::size_t>(std::max<std::int64_t>(count, 0)));
  read_all_at(fd, tokens.data(), tokens.size() * sizeof(TokenId),
              kSnapshotHeaderBytes + first * std::int64_t(sizeof(TokenId)), path);
  return tokens;
}

LoadedSnapshot read_snapshot_file(int fd, const std::string& path, std::uint64_t fingerprint, const KvCacheShape& shape,
                                  const SnapshotKey& key) {
  LoadedSnapshot loaded;
  SnapshotReadOptions options;
  if (shape.max_tokens > 0) options.max_tokens = std::min(options.max_tokens, shape.max_tokens);
  // The header alone first: the model and the cache it claims are checked before the tokens are read.
  const SnapshotHeader header = read_header_from(fd, path, key, SnapshotReadOptions{kMaxSnapshotTokens, false});
  if (header.fingerprint != fingerprint)
    throw SnapshotError("snapshot " + path + " was made by another model (fingerprint " +
                        ModelFingerprint{header.fingerprint, {}}.hex() + ", this model's is " +
                        ModelFingerprint{fingerprint, {}}.hex() + ")");
  // Another KV dtype's snapshot is whole and may serve when the setting changes back: left alone.
  if (header.shape.dtype != shape.dtype)
    throw SnapshotError(std::string("snapshot ") + path + " holds a " + to_string(header.shape.dtype) +
                            " KV cache; this cache is " + to_string(shape.dtype),
                        SnapshotError::Kind::NotOurs);
  if (header.shape.layers != shape.layers || header.shape.kv_heads != shape.kv_heads ||
      header.shape.head_dim != shape.head_dim)
    throw SnapshotError("snapshot " + path + " has another cache shape than this model's");
  loaded.header = read_header_from(fd, path, key, options);
  loaded.data = HugePageBuffer(static_cast<std::size_t>(loaded.header.file_bytes - loaded.header.data_offset));
  read_all_at(fd, loaded.data.data(), loaded.data.size(), loaded.header.data_offset, path);
  if (checksum(key, loaded.data.data(), loaded.data.size()) != loaded.header.data_checksum)
    throw SnapshotError("snapshot " + path + ": K/V data checksum mismatch (the file is corrupt)");
  return loaded;
}

LoadedSnapshot read_snapshot_file(const std::string& path, std::uint64_t fingerprint, const KvCacheShape& shape,
                                  const SnapshotKey& key) {
  FileCloser file{open_regular(path)};
  return read_snapshot_file(file.fd, path, fingerprint, shape, key);
}

void restore_snapshot(const KvCacheShape& shape, const std::vector<TokenId>& snapshot_tokens,
                      const HugePageBuffer& data, std::int64_t tokens, KvCache& cache) {
  const auto count = static_cast<std::int64_t>(snapshot_tokens.size());
  if (tokens <= 0 || tokens > count || static_cast<std::int64_t>(data.size()) != snapshot_data_bytes(shape, count))
    throw SnapshotError("restore_snapshot: " + std::to_string(tokens) + " of " + std::to_string(count) + " tokens");
  const std::int64_t tensor_bytes = snapshot_data_bytes(shape, count) / (2 * shape.layers);
  const auto options = at::TensorOptions().dtype(shape.storage_type());
  if (shape.dtype != cache.shape().dtype)
    throw SnapshotError(std::string("restore_snapshot: a ") + to_string(shape.dtype) + " snapshot into a " +
                            to_string(cache.shape().dtype) + " KV cache",
                        SnapshotError::Kind::NotOurs);
  // The first `tokens` positions of each head: a strided view of the data, copied into the cache.
  const std::int64_t row = shape.row_elements();
  const std::vector<std::int64_t> sizes{shape.kv_heads, tokens, row};
  const std::vector<std::int64_t> strides{count * row, row, 1};
  cache.truncate(0);
  auto* base = const_cast<std::uint8_t*>(data.data());  // read only: the views are copied from
  for (std::int64_t layer = 0; layer < shape.layers; ++layer) {
    std::uint8_t* keys = base + 2 * layer * tensor_bytes;
    cache.append(layer, at::from_blob(keys, sizes, strides, options),
                 at::from_blob(keys + tensor_bytes, sizes, strides, options));
  }
  cache.commit(tokens);
}

}  // namespace kvchat
