#include "engine/cache/snapshot_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <new>
#include <string_view>
#include <system_error>
#include <utility>

namespace kvchat {

namespace fs = std::filesystem;

namespace {

constexpr const char* kExtension = ".kvsnap";
constexpr std::size_t kExtensionLength = 7;
// A temporary file this old is left by a write that never finished (the process died): no live writer
// takes this long to write one snapshot.
constexpr auto kAbandonedTemporaryAge = std::chrono::minutes(10);
// What one lookup reads to index files it has not seen (their token sections): a folder that another
// process filled is indexed over several lookups, the newest files first, rather than all at once.
constexpr std::int64_t kMaxIndexedTokenBytesPerLookup = std::int64_t(64) << 20;
// Snapshots whose summaries tie for the longest prefix and whose exact prefix is read (one block each).
constexpr std::size_t kMaxRefinedCandidates = 8;

class Descriptor {
 public:
  explicit Descriptor(int fd = -1) : fd_(fd) {}
  ~Descriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  Descriptor(Descriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Descriptor& operator=(Descriptor&& other) noexcept {
    if (this != &other) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_;
};

bool is_key(std::string_view key) {
  return !key.empty() && key.size() <= 128 && std::all_of(key.begin(), key.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  });
}

bool is_digits(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// <key>.kvsnap
bool is_snapshot_name(std::string_view name) {
  return name.size() > kExtensionLength && name.substr(name.size() - kExtensionLength) == kExtension &&
         is_key(name.substr(0, name.size() - kExtensionLength));
}

// <key>.kvsnap.tmp.<pid>.<counter>, as write_snapshot_at names them.
bool is_temporary_name(std::string_view name) {
  const std::size_t marker = name.find(std::string(kExtension) + ".tmp.");
  if (marker == std::string_view::npos || !is_key(name.substr(0, marker))) return false;
  const std::string_view numbers = name.substr(marker + kExtensionLength + 5);
  const std::size_t dot = numbers.find('.');
  return dot != std::string_view::npos && is_digits(numbers.substr(0, dot)) && is_digits(numbers.substr(dot + 1));
}

// 16 lowercase hex digits: ModelFingerprint::hex().
bool is_model_folder_name(std::string_view name) {
  return name.size() == 16 &&
         std::all_of(name.begin(), name.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::int64_t modified_ns(const struct stat& info) {
  return static_cast<std::int64_t>(info.st_mtim.tv_sec) * 1000000000 + info.st_mtim.tv_nsec;
}

// The folder the user named (a symbolic link there is theirs to make).
Descriptor open_cache_folder(const std::string& directory) {
  return Descriptor(::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
}

// A folder inside `parent`, never through a symbolic link.
Descriptor open_subfolder(int parent, const std::string& name) {
  return Descriptor(::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
}

Descriptor open_file(int folder, const std::string& name) {
  return Descriptor(::openat(folder, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
}

// The names in an open folder ("." and ".." left out).
std::vector<std::string> names_in(int folder) {
  std::vector<std::string> names;
  const int copy = ::dup(folder);
  if (copy < 0) return names;
  DIR* listing = ::fdopendir(copy);
  if (!listing) {
    ::close(copy);
    return names;
  }
  ::rewinddir(listing);
  while (const dirent* entry = ::readdir(listing)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(listing);
  return names;
}

// The regular file `name` of `folder`, as lstat sees it.
bool regular_file(int folder, const std::string& name, struct stat* info) {
  return ::fstatat(folder, name.c_str(), info, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(info->st_mode);
}

bool same_file(const struct stat& a, const struct stat& b) { return a.st_dev == b.st_dev && a.st_ino == b.st_ino; }

// Deletes `name` of `folder` if it is a snapshot this installation may delete (and still the file that was
// checked when it is unlinked).
bool delete_if_own(int folder, const std::string& name, const SnapshotKey& key) {
  const Descriptor file = open_file(folder, name);
  struct stat opened {
  }, named{};
  if (!file || snapshot_owner(file.get(), key) == SnapshotOwner::NotOurs || ::fstat(file.get(), &opened) != 0 ||
      !regular_file(folder, name, &named) || !same_file(opened, named))
    return false;
  return ::unlinkat(folder, name.c_str(), 0) == 0;
}

struct OwnFile {
  std::string folder;  // the model folder's name
  std::string name;
  std::int64_t modified_ns = 0;
  std::int64_t size = 0;
};

// Every snapshot of this installation in every model's folder under `cache`.
std::vector<OwnFile> list_own_snapshots(int cache, const SnapshotKey& key) {
  std::vector<OwnFile> files;
  for (const std::string& folder_name : names_in(cache)) {
    if (!is_model_folder_name(folder_name)) continue;
    const Descriptor folder = open_subfolder(cache, folder_name);
    if (!folder) continue;  // a symbolic link, a file, or gone
    for (const std::string& name : names_in(folder.get())) {
      struct stat info {};
      if (!is_snapshot_name(name) || !regular_file(folder.get(), name, &info)) continue;
      const Descriptor file = open_file(folder.get(), name);
      if (!file || snapshot_owner(file.get(), key) == SnapshotOwner::NotOurs) continue;
      files.push_back({folder_name, name, modified_ns(info), static_cast<std::int64_t>(info.st_size)});
    }
  }
  return files;
}

std::int64_t block_tokens_for(std::int64_t max_tokens) {
  std::int64_t block = 16;
  while ((max_tokens + block - 1) / block > SnapshotStore::kMaxSummaryBlocks) block *= 2;
  return block;
}

}  // namespace

SnapshotStore::SnapshotStore(std::string directory, std::int64_t disk_budget_bytes, ModelFingerprint fingerprint,
                             KvCacheShape shape, SnapshotKey key)
    : directory_(std::move(directory)),
      model_directory_(directory_ + "/" + fingerprint.hex()),
      fingerprint_(std::move(fingerprint)),
      shape_(shape),
      key_(std::move(key)),
      max_tokens_(shape.max_tokens > 0 ? std::min(shape.max_tokens, kMaxSnapshotTokens) : kMaxSnapshotTokens),
      block_tokens_(block_tokens_for(max_tokens_)),
      disk_budget_bytes_(disk_budget_bytes) {
  if (key_.secret.empty() ? key_.installation != 0
                          : key_.secret.size() != kSnapshotSecretBytes || key_.installation == 0)
    throw std::invalid_argument(
        "a KV snapshot key has installation 0 and no secret, or another installation and a secret of " +
        std::to_string(kSnapshotSecretBytes) + " bytes");
  std::error_code error;
  fs::create_directories(directory_, error);
  if (error || !fs::is_directory(directory_, error))
    throw SnapshotError("cannot create the KV snapshot folder " + directory_ + ": " +
                        (error ? error.message() : std::string("it is not a folder")));
  const Descriptor cache = open_cache_folder(directory_);
  if (!cache) throw SnapshotError("cannot open the KV snapshot folder " + directory_ + ": " + std::strerror(errno));
  if (::mkdirat(cache.get(), fingerprint_.hex().c_str(), 0755) != 0 && errno != EEXIST)
    throw SnapshotError("cannot create the KV snapshot folder " + model_directory_ + ": " + std::strerror(errno));
  if (!open_subfolder(cache.get(), fingerprint_.hex()))
    throw SnapshotError(
        "the KV snapshot folder " + model_directory_ + " is " +
        (errno == ELOOP || errno == ENOTDIR ? "a symbolic link or not a folder" : std::string(std::strerror(errno))) +
        ": kvchat keeps snapshots only in a folder of its own");
  writer_ = std::thread([this] { writer_loop(); });
  spdlog::info("KV snapshots in {} (model {}: {}), disk budget {} bytes", directory_, fingerprint_.hex(),
               fingerprint_.description, disk_budget_bytes);
}

SnapshotStore::~SnapshotStore() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  writer_.join();
}

void SnapshotStore::set_written_callback(WrittenCallback callback) {
  std::lock_guard<std::mutex> lock(mutex_);
  on_written_ = std::move(callback);
}

void SnapshotStore::set_disk_budget(std::int64_t disk_budget_bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  disk_budget_bytes_ = disk_budget_bytes;
}

std::string SnapshotStore::path_for(const std::string& key) const {
  if (!is_key(key)) throw std::invalid_argument("invalid KV snapshot key '" + key + "'");
  return model_directory_ + "/" + key + kExtension;
}

void SnapshotStore::save(const std::string& key, KvSnapshot snapshot) {
  path_for(key);  // validates the key now, on the caller's thread
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto queued = std::find_if(queue_.begin(), queue_.end(), [&](const auto& item) { return item.first == key; });
    auto held = std::make_shared<const KvSnapshot>(std::move(snapshot));
    if (queued != queue_.end())
      queued->second = std::move(held);  // only the newest state of a conversation is worth writing
    else
      queue_.emplace_back(key, std::move(held));
  }
  work_ready_.notify_all();
}

void SnapshotStore::flush() {
  std::unique_lock<std::mutex> lock(mutex_);
  work_done_.wait(lock, [this] { return queue_.empty() && writing_key_.empty(); });
}

void SnapshotStore::writer_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_ready_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) break;  // stopping, and everything queued is written
    std::pair<std::string, std::shared_ptr<const KvSnapshot>> item = std::move(queue_.front());
    queue_.erase(queue_.begin());
    writing_key_ = item.first;
    writing_snapshot_ = item.second;
    removed_while_writing_ = false;
    lock.unlock();
    write_one(item.first, *item.second);
    item.second.reset();  // free the copy before waiting for more (unless a restore still reads it)
    lock.lock();
    writing_snapshot_.reset();
    if (removed_while_writing_) {
      const Descriptor cache = open_cache_folder(directory_);
      const Descriptor folder = cache ? open_subfolder(cache.get(), fingerprint_.hex()) : Descriptor();
      if (folder) delete_if_own(folder.get(), item.first + kExtension, key_);
    }
    writing_key_.clear();
    work_done_.notify_all();
  }
}

void SnapshotStore::write_one(const std::string& key, const KvSnapshot& snapshot) {
  const std::string path = path_for(key), name = key + kExtension;
  const auto started = std::chrono::steady_clock::now();
  std::int64_t file_bytes = 0;
  try {
    std::error_code error;
    fs::create_directories(directory_, error);  // the user may have deleted the folder meanwhile
    const Descriptor cache = open_cache_folder(directory_);
    if (!cache) throw SnapshotError("cannot open the KV snapshot folder " + directory_ + ": " + std::strerror(errno));
    ::mkdirat(cache.get(), fingerprint_.hex().c_str(), 0755);
    const Descriptor folder = open_subfolder(cache.get(), fingerprint_.hex());
    if (!folder)
      throw SnapshotError("the KV snapshot folder " + model_directory_ + " is not a folder of its own (" +
                          std::strerror(errno) + "): nothing is written there");
    write_snapshot_at(folder.get(), name, path, snapshot, fingerprint_.hash, key_);
    struct stat info {};
    if (regular_file(folder.get(), name, &info)) file_bytes = static_cast<std::int64_t>(info.st_size);
  } catch (const std::exception& error) {
    spdlog::error("cannot write the KV snapshot of {}: {}", key, error.what());
    return;
  }
  const double milliseconds =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  spdlog::debug("KV snapshot {} written: {} tokens, {} bytes in {:.1f} ms", path, snapshot.tokens.size(), file_bytes,
                milliseconds);
  enforce_budget(name);
  WrittenCallback callback;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    callback = on_written_;
  }
  if (callback) callback(key, static_cast<std::int64_t>(snapshot.tokens.size()), file_bytes, folder_bytes());
}

void SnapshotStore::enforce_budget(const std::string& keep_name) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (disk_budget_bytes_ <= 0) return;
  const Descriptor cache = open_cache_folder(directory_);
  if (!cache) return;
  std::vector<OwnFile> files = list_own_snapshots(cache.get(), key_);
  std::int64_t total = 0;
  for (const OwnFile& file : files) total += file.size;
  if (total <= disk_budget_bytes_) return;
  std::sort(files.begin(), files.end(),
            [](const OwnFile& a, const OwnFile& b) { return a.modified_ns < b.modified_ns; });
  for (const OwnFile& file : files) {
    if (total <= disk_budget_bytes_) break;
    const bool this_model = file.folder == fingerprint_.hex();
    if (this_model && file.name == keep_name) continue;
    const Descriptor folder = open_subfolder(cache.get(), file.folder);
    if (!folder || !delete_if_own(folder.get(), file.name, key_)) continue;
    total -= file.size;
    if (this_model) index_.erase(file.name);
    spdlog::info("KV snapshot disk budget {} bytes: deleted the least recently used snapshot {}/{}/{} ({} bytes)",
                 disk_budget_bytes_, directory_, file.folder, file.name, file.size);
  }
}

bool SnapshotStore::delete_locked(int folder, const std::string& name) {
  index_.erase(name);
  return delete_if_own(folder, name, key_);
}

void SnapshotStore::unusable_locked(int folder, const std::string& name) {
  struct stat info {};
  IndexEntry entry;
  if (regular_file(folder, name, &info))
    entry.identity = FileIdentity{static_cast<std::uint64_t>(info.st_dev), static_cast<std::uint64_t>(info.st_ino),
                                  static_cast<std::int64_t>(info.st_size), modified_ns(info)};
  index_[name] = std::move(entry);
}

void SnapshotStore::reject_locked(int folder, const std::string& name, const SnapshotError& error) {
  switch (error.kind) {
    case SnapshotError::Kind::Damaged:
      if (delete_locked(folder, name)) {
        spdlog::warn("KV snapshot rejected and deleted: {}", error.what());
        return;
      }
      spdlog::warn("KV snapshot rejected: {}", error.what());
      break;
    case SnapshotError::Kind::NotOurs: spdlog::warn("KV snapshot ignored and left as it is: {}", error.what()); break;
    case SnapshotError::Kind::Unreadable: spdlog::warn("KV snapshot not used (kept): {}", error.what()); break;
  }
  unusable_locked(folder, name);
}

std::vector<std::uint64_t> SnapshotStore::block_hashes(const TokenId* tokens, std::int64_t count) const {
  std::vector<std::uint64_t> hashes;
  const std::int64_t blocks = std::min(count, max_tokens_) / block_tokens_;
  hashes.reserve(static_cast<std::size_t>(blocks));
  std::uint64_t chain = 0;
  for (std::int64_t block = 0; block < blocks; ++block) {
    chain = XXH3_64bits_withSeed(tokens + block * block_tokens_,
                                 static_cast<std::size_t>(block_tokens_) * sizeof(TokenId), chain);
    hashes.push_back(chain);
  }
  return hashes;
}

SnapshotStore::IndexEntry SnapshotStore::index_file(int folder, const std::string& name, const FileIdentity& identity) {
  const std::string path = model_directory_ + "/" + name;
  const Descriptor file = open_file(folder, name);
  if (!file)
    throw SnapshotError("cannot open snapshot " + path + ": " + std::strerror(errno),
                        errno == ELOOP ? SnapshotError::Kind::NotOurs : SnapshotError::Kind::Unreadable);
  SnapshotReadOptions options;
  options.max_tokens = max_tokens_;
  const SnapshotHeader header = read_snapshot_header(file.get(), path, key_, options);
  if (header.fingerprint != fingerprint_.hash)
    throw SnapshotError("snapshot " + path + " was made by another model than its folder's");
  IndexEntry entry;
  entry.identity = identity;
  entry.usable = true;
  entry.tokens = header.token_count;
  entry.block_hashes = block_hashes(header.tokens.data(), header.token_count);
  return entry;
}

void SnapshotStore::refresh_index_locked() {
  const Descriptor cache = open_cache_folder(directory_);
  const Descriptor folder = cache ? open_subfolder(cache.get(), fingerprint_.hex()) : Descriptor();
  if (!folder) {
    index_.clear();
    return;
  }
  struct Listed {
    std::string name;
    FileIdentity identity;
  };
  std::vector<Listed> listed;
  const std::int64_t now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (const std::string& name : names_in(folder.get())) {
    struct stat info {};
    if (is_temporary_name(name)) {
      if (!regular_file(folder.get(), name, &info) ||
          std::chrono::nanoseconds(now_ns - modified_ns(info)) <= kAbandonedTemporaryAge)
        continue;
      const Descriptor file = open_file(folder.get(), name);
      struct stat opened {};
      if (file && is_unfinished_snapshot(file.get()) && ::fstat(file.get(), &opened) == 0 && same_file(opened, info) &&
          ::unlinkat(folder.get(), name.c_str(), 0) == 0)
        spdlog::info("deleted {}/{}: a KV snapshot whose write never finished", model_directory_, name);
      continue;
    }
    if (!is_snapshot_name(name) || !regular_file(folder.get(), name, &info)) continue;
    listed.push_back(
        {name, FileIdentity{static_cast<std::uint64_t>(info.st_dev), static_cast<std::uint64_t>(info.st_ino),
                            static_cast<std::int64_t>(info.st_size), modified_ns(info)}});
  }
  // The newest first: they are the ones indexed when the folder holds more than the index keeps.
  std::sort(listed.begin(), listed.end(),
            [](const Listed& a, const Listed& b) { return a.identity.modified_ns > b.identity.modified_ns; });
  if (listed.size() > kMaxIndexedSnapshots) {
    spdlog::warn("{} holds {} KV snapshots; only the newest {} are used", model_directory_, listed.size(),
                 kMaxIndexedSnapshots);
    listed.resize(kMaxIndexedSnapshots);
  }
  std::map<std::string, IndexEntry> fresh;
  std::int64_t token_bytes_read = 0;
  for (Listed& file : listed) {
    auto known = index_.find(file.name);
    if (known != index_.end() && known->second.identity == file.identity) {
      fresh.emplace(file.name, std::move(known->second));
      continue;
    }
    if (token_bytes_read >= kMaxIndexedTokenBytesPerLookup) continue;  // the next lookup reads it
    try {
      IndexEntry entry = index_file(folder.get(), file.name, file.identity);
      token_bytes_read += entry.tokens * static_cast<std::int64_t>(sizeof(TokenId));
      fresh.emplace(file.name, std::move(entry));
    } catch (const SnapshotError& failure) {
      reject_locked(folder.get(), file.name, failure);
      if (index_.count(file.name)) fresh[file.name] = std::move(index_[file.name]);
    } catch (const std::bad_alloc&) {
      // This process's shortage, not the file's fault: it stays, unused until it changes.
      spdlog::warn("KV snapshot {}/{} not indexed (kept): out of memory", model_directory_, file.name);
      IndexEntry unusable;
      unusable.identity = file.identity;
      fresh[file.name] = std::move(unusable);
    }
  }
  index_ = std::move(fresh);
}

bool SnapshotStore::pending_locked(const std::string& key) const {
  if (key == writing_key_ && !removed_while_writing_) return true;
  return std::any_of(queue_.begin(), queue_.end(), [&](const auto& item) { return item.first == key; });
}

std::optional<SnapshotStore::PendingMatch> SnapshotStore::best_pending_match(const std::vector<TokenId>& prompt,
                                                                             std::int64_t minimum_tokens) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::optional<PendingMatch> best;
  auto consider = [&](const std::string& key, const std::shared_ptr<const KvSnapshot>& snapshot) {
    // As a file's header is checked: a snapshot of another cache layout does not fit this model's caches.
    const KvCacheShape& shape = snapshot->shape;
    if (shape.dtype != shape_.dtype || shape.layers != shape_.layers || shape.kv_heads != shape_.kv_heads ||
        shape.head_dim != shape_.head_dim)
      return;
    const std::size_t limit = std::min({snapshot->tokens.size(), prompt.size(), static_cast<std::size_t>(max_tokens_)});
    std::size_t common = 0;
    while (common < limit && snapshot->tokens[common] == prompt[common]) ++common;
    const auto tokens = static_cast<std::int64_t>(common);
    if (tokens >= std::max<std::int64_t>(minimum_tokens, 1) && (!best || tokens > best->tokens))
      best = PendingMatch{key, tokens, snapshot};
  };
  for (const auto& [key, snapshot] : queue_) consider(key, snapshot);
  if (writing_snapshot_ && !removed_while_writing_) consider(writing_key_, writing_snapshot_);
  return best;
}

std::optional<SnapshotStore::Match> SnapshotStore::best_match(const std::vector<TokenId>& prompt,
                                                              std::int64_t minimum_tokens) {
  std::lock_guard<std::mutex> lock(mutex_);
  refresh_index_locked();
  const std::int64_t minimum = std::max<std::int64_t>(minimum_tokens, 1);
  const auto prompt_tokens = static_cast<std::int64_t>(prompt.size());
  const std::vector<std::uint64_t> prompt_hashes = block_hashes(prompt.data(), prompt_tokens);
  // The summaries' longest common prefix, in whole blocks; the exact prefix of a snapshot that has it is
  // less than one block longer, and no other snapshot's can reach it.
  std::size_t best_blocks = 0;
  std::vector<std::pair<const std::string*, const IndexEntry*>> tied;
  for (const auto& [name, entry] : index_) {
    // A file about to be replaced by a pending snapshot holds an older state: best_pending_match sees the newer.
    if (!entry.usable || pending_locked(name.substr(0, name.size() - kExtensionLength))) continue;
    const std::size_t limit = std::min(entry.block_hashes.size(), prompt_hashes.size());
    std::size_t blocks = 0;
    while (blocks < limit && entry.block_hashes[blocks] == prompt_hashes[blocks]) ++blocks;
    if (blocks > best_blocks) {
      best_blocks = blocks;
      tied.clear();
    }
    if (blocks == best_blocks) tied.emplace_back(&name, &entry);
  }
  const std::int64_t whole = static_cast<std::int64_t>(best_blocks) * block_tokens_;
  std::sort(tied.begin(), tied.end(), [](const auto& a, const auto& b) {
    return a.second->identity.modified_ns > b.second->identity.modified_ns;
  });
  const Descriptor cache = open_cache_folder(directory_);
  const Descriptor folder = cache ? open_subfolder(cache.get(), fingerprint_.hex()) : Descriptor();
  std::optional<Match> best;
  std::size_t refined = 0;
  for (const auto& [name, entry] : tied) {
    const std::int64_t reachable = std::min({whole + block_tokens_ - 1, entry->tokens, prompt_tokens});
    if (!folder || reachable < minimum || (best && reachable <= best->tokens)) continue;
    if (refined++ == kMaxRefinedCandidates) break;
    // The tokens of the block after the common ones, from the file the summary was made of.
    const std::string path = model_directory_ + "/" + *name;
    const Descriptor file = open_file(folder.get(), *name);
    struct stat info {};
    if (!file || ::fstat(file.get(), &info) != 0 || static_cast<std::uint64_t>(info.st_ino) != entry->identity.inode ||
        modified_ns(info) != entry->identity.modified_ns)
      continue;
    std::int64_t common = whole;
    try {
      const std::int64_t count = std::min({block_tokens_, entry->tokens - whole, prompt_tokens - whole});
      const std::vector<TokenId> tail = read_snapshot_tokens(file.get(), path, whole, count);
      while (common - whole < count &&
             tail[static_cast<std::size_t>(common - whole)] == prompt[static_cast<std::size_t>(common)])
        ++common;
    } catch (const SnapshotError& failure) {
      spdlog::warn("KV snapshot {} not used: {}", path, failure.what());
      continue;
    }
    if (common < minimum || (best && common <= best->tokens)) continue;
    best = Match{path, name->substr(0, name->size() - kExtensionLength), common, entry->tokens};
  }
  return best;
}

std::optional<LoadedSnapshot> SnapshotStore::load(const Match& match, std::string* rejection) {
  const std::string name = fs::path(match.path).filename().string();
  const Descriptor cache = open_cache_folder(directory_);
  const Descriptor folder = cache ? open_subfolder(cache.get(), fingerprint_.hex()) : Descriptor();
  auto failed = [&](const SnapshotError& failure) -> std::optional<LoadedSnapshot> {
    std::lock_guard<std::mutex> lock(mutex_);
    if (folder) reject_locked(folder.get(), name, failure);
    if (rejection) *rejection = failure.what();
    return std::nullopt;
  };
  try {
    if (!is_snapshot_name(name) || !folder)
      throw SnapshotError("cannot open snapshot " + match.path + ": its folder is gone",
                          SnapshotError::Kind::Unreadable);
    const Descriptor file = open_file(folder.get(), name);
    if (!file)
      throw SnapshotError("cannot open snapshot " + match.path + ": " + std::strerror(errno),
                          errno == ELOOP ? SnapshotError::Kind::NotOurs : SnapshotError::Kind::Unreadable);
    LoadedSnapshot loaded = read_snapshot_file(file.get(), match.path, fingerprint_.hash, shape_, key_);
    ::futimens(file.get(), nullptr);  // used now: the last to go under the disk budget
    return loaded;
  } catch (const SnapshotError& failure) {
    return failed(failure);
  } catch (const std::bad_alloc&) {
    return failed(
        SnapshotError("snapshot " + match.path + ": out of memory while reading it", SnapshotError::Kind::Unreadable));
  } catch (const std::exception& other) {
    return failed(SnapshotError("snapshot " + match.path + ": " + other.what(), SnapshotError::Kind::Unreadable));
  }
}

std::optional<SnapshotHeader> SnapshotStore::describe(const std::string& key) {
  const std::string path = path_for(key), name = key + kExtension;
  const Descriptor cache = open_cache_folder(directory_);
  const Descriptor folder = cache ? open_subfolder(cache.get(), fingerprint_.hex()) : Descriptor();
  if (!folder) return std::nullopt;
  struct stat info {};
  if (!regular_file(folder.get(), name, &info)) return std::nullopt;  // none written (or not a file of ours)
  const Descriptor file = open_file(folder.get(), name);
  if (!file) return std::nullopt;
  try {
    SnapshotReadOptions options;
    options.max_tokens = max_tokens_;
    options.read_tokens = false;  // the count is what is described; the tokens are read when a turn restores it
    SnapshotHeader header = read_snapshot_header(file.get(), path, key_, options);
    if (header.fingerprint != fingerprint_.hash) {
      spdlog::debug("snapshot {} not described: made by another model than its folder's", path);
      return std::nullopt;
    }
    return header;
  } catch (const std::exception& error) {
    spdlog::debug("snapshot {} not described: {}", path, error.what());
    return std::nullopt;
  }
}

void SnapshotStore::remove(const std::string& key) {
  const std::string name = fs::path(path_for(key)).filename().string();
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.erase(std::remove_if(queue_.begin(), queue_.end(), [&](const auto& item) { return item.first == key; }),
               queue_.end());
  if (writing_key_ == key) removed_while_writing_ = true;
  // Every model's snapshot of it: a deleted chat leaves nothing behind.
  const Descriptor cache = open_cache_folder(directory_);
  if (!cache) return;
  for (const std::string& folder_name : names_in(cache.get())) {
    if (!is_model_folder_name(folder_name)) continue;
    const Descriptor folder = open_subfolder(cache.get(), folder_name);
    if (!folder || !delete_if_own(folder.get(), name, key_)) continue;
    spdlog::info("KV snapshot {}/{}/{} deleted", directory_, folder_name, name);
    if (folder_name == fingerprint_.hex()) index_.erase(name);
  }
}

void SnapshotStore::remove_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.clear();
  if (!writing_key_.empty()) removed_while_writing_ = true;
  std::int64_t removed = 0;
  const Descriptor cache = open_cache_folder(directory_);
  if (cache)
    for (const OwnFile& file : list_own_snapshots(cache.get(), key_)) {
      const Descriptor folder = open_subfolder(cache.get(), file.folder);
      if (folder && delete_if_own(folder.get(), file.name, key_)) ++removed;
    }
  index_.clear();
  spdlog::info("deleted all {} KV snapshots in {}", removed, directory_);
}

std::int64_t SnapshotStore::folder_bytes() const {
  const Descriptor cache = open_cache_folder(directory_);
  if (!cache) return 0;
  std::int64_t total = 0;
  for (const OwnFile& file : list_own_snapshots(cache.get(), key_)) total += file.size;
  return total;
}

}  // namespace kvchat
