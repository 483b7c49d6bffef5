#include "engine/snapshot_store.h"

#include <spdlog/spdlog.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <system_error>

namespace kvchat {

namespace fs = std::filesystem;

namespace {

constexpr const char* kExtension = ".kvsnap";
// A temporary file this old is left by a write that never finished (the process died): no live writer
// takes this long to write one snapshot.
constexpr auto kAbandonedTemporaryAge = std::chrono::minutes(10);

bool is_snapshot_name(const std::string& name) {
  return name.size() > 7 && name.compare(name.size() - 7, 7, kExtension) == 0;
}
bool is_temporary_name(const std::string& name) { return name.find(std::string(kExtension) + ".tmp.") != std::string::npos; }

std::int64_t modified_ns(const struct stat& info) {
  return static_cast<std::int64_t>(info.st_mtim.tv_sec) * 1000000000 + info.st_mtim.tv_nsec;
}

struct FolderFile {
  std::int64_t modified_ns = 0;
  std::int64_t size = 0;
  std::string path;
};

// Every snapshot file of every model's folder under `directory`.
std::vector<FolderFile> list_snapshot_files(const std::string& directory) {
  std::vector<FolderFile> files;
  std::error_code error;
  for (const auto& model_folder : fs::directory_iterator(directory, error)) {
    if (!model_folder.is_directory(error)) continue;
    for (const auto& entry : fs::directory_iterator(model_folder.path(), error)) {
      const std::string path = entry.path().string();
      struct stat info {};
      if (!is_snapshot_name(entry.path().filename().string()) || ::lstat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode))
        continue;
      files.push_back({modified_ns(info), static_cast<std::int64_t>(info.st_size), path});
    }
  }
  return files;
}

std::int64_t common_prefix(const std::vector<TokenId>& a, const std::vector<TokenId>& b) {
  const std::size_t limit = std::min(a.size(), b.size());
  std::size_t common = 0;
  while (common < limit && a[common] == b[common]) ++common;
  return static_cast<std::int64_t>(common);
}

}  // namespace

SnapshotStore::SnapshotStore(std::string directory, std::int64_t disk_budget_bytes, ModelFingerprint fingerprint,
                             KvCacheShape shape)
    : directory_(std::move(directory)),
      model_directory_(directory_ + "/" + fingerprint.hex()),
      fingerprint_(std::move(fingerprint)),
      shape_(shape),
      disk_budget_bytes_(disk_budget_bytes) {
  std::error_code error;
  fs::create_directories(model_directory_, error);
  if (error) throw SnapshotError("cannot create the KV snapshot folder " + model_directory_ + ": " + error.message());
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
  const bool valid = !key.empty() && key.size() <= 128 && std::all_of(key.begin(), key.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  });
  if (!valid) throw std::invalid_argument("invalid KV snapshot key '" + key + "'");
  return model_directory_ + "/" + key + kExtension;
}

void SnapshotStore::save(const std::string& key, KvSnapshot snapshot) {
  path_for(key);  // validates the key now, on the caller's thread
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto queued = std::find_if(queue_.begin(), queue_.end(), [&](const auto& item) { return item.first == key; });
    if (queued != queue_.end())
      queued->second = std::move(snapshot);  // only the newest state of a conversation is worth writing
    else
      queue_.emplace_back(key, std::move(snapshot));
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
    std::pair<std::string, KvSnapshot> item = std::move(queue_.front());
    queue_.erase(queue_.begin());
    writing_key_ = item.first;
    removed_while_writing_ = false;
    lock.unlock();
    write_one(item.first, item.second);
    item.second = KvSnapshot{};  // free the copy before waiting for more
    lock.lock();
    if (removed_while_writing_) ::unlink(path_for(item.first).c_str());
    writing_key_.clear();
    work_done_.notify_all();
  }
}

void SnapshotStore::write_one(const std::string& key, const KvSnapshot& snapshot) {
  const std::string path = path_for(key);
  const auto started = std::chrono::steady_clock::now();
  try {
    std::error_code error;
    fs::create_directories(model_directory_, error);  // the user may have deleted the folder meanwhile
    write_snapshot_file(path, snapshot, fingerprint_.hash);
  } catch (const std::exception& error) {
    spdlog::error("cannot write the KV snapshot of {}: {}", key, error.what());
    return;
  }
  const double milliseconds = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  struct stat info {};
  const std::int64_t file_bytes = ::stat(path.c_str(), &info) == 0 ? static_cast<std::int64_t>(info.st_size) : 0;
  spdlog::debug("KV snapshot {} written: {} tokens, {} bytes in {:.1f} ms", path, snapshot.tokens.size(), file_bytes,
                milliseconds);
  enforce_budget(path);
  WrittenCallback callback;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    callback = on_written_;
  }
  if (callback) callback(key, static_cast<std::int64_t>(snapshot.tokens.size()), file_bytes, folder_bytes());
}

void SnapshotStore::enforce_budget(const std::string& keep_path) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (disk_budget_bytes_ <= 0) return;
  std::vector<FolderFile> files = list_snapshot_files(directory_);
  std::int64_t total = 0;
  for (const FolderFile& file : files) total += file.size;
  if (total <= disk_budget_bytes_) return;
  std::sort(files.begin(), files.end(), [](const FolderFile& a, const FolderFile& b) { return a.modified_ns < b.modified_ns; });
  for (const FolderFile& file : files) {
    if (total <= disk_budget_bytes_) break;
    if (file.path == keep_path) continue;
    if (::unlink(file.path.c_str()) != 0) continue;
    total -= file.size;
    index_.erase(file.path);
    spdlog::info("KV snapshot disk budget {} bytes: deleted the least recently used snapshot {} ({} bytes)",
                 disk_budget_bytes_, file.path, file.size);
  }
}

void SnapshotStore::reject(const std::string& path, const std::string& reason) {
  spdlog::warn("KV snapshot rejected and deleted: {}", reason);
  ::unlink(path.c_str());
  index_.erase(path);
}

void SnapshotStore::refresh_index_locked() {
  std::map<std::string, IndexEntry> fresh;
  std::error_code error;
  const auto now = fs::file_time_type::clock::now();
  for (const auto& entry : fs::directory_iterator(model_directory_, error)) {
    const std::string path = entry.path().string(), name = entry.path().filename().string();
    if (is_temporary_name(name)) {
      std::error_code age_error;
      const auto modified = fs::last_write_time(entry.path(), age_error);
      if (!age_error && now - modified > kAbandonedTemporaryAge) {
        spdlog::info("deleting {}: a KV snapshot whose write never finished", path);
        fs::remove(entry.path(), age_error);
      }
      continue;
    }
    struct stat info {};
    if (!is_snapshot_name(name) || ::lstat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode)) continue;
    IndexEntry identity{static_cast<std::uint64_t>(info.st_dev), static_cast<std::uint64_t>(info.st_ino),
                        static_cast<std::int64_t>(info.st_size), modified_ns(info), {}};
    auto known = index_.find(path);
    if (known != index_.end() && known->second.device == identity.device && known->second.inode == identity.inode &&
        known->second.size == identity.size && known->second.modified_ns == identity.modified_ns) {
      fresh.emplace(path, std::move(known->second));
      continue;
    }
    try {
      SnapshotHeader header = read_snapshot_header(path);
      if (header.fingerprint != fingerprint_.hash)
        throw SnapshotError("snapshot " + path + " was made by another model than its folder's");
      identity.tokens = std::move(header.tokens);
      fresh.emplace(path, std::move(identity));
    } catch (const std::exception& failure) {
      reject(path, failure.what());
    }
  }
  index_ = std::move(fresh);
}

std::optional<SnapshotStore::Match> SnapshotStore::best_match(const std::vector<TokenId>& prompt, std::int64_t minimum_tokens) {
  std::lock_guard<std::mutex> lock(mutex_);
  refresh_index_locked();
  std::optional<Match> best;
  for (const auto& [path, entry] : index_) {
    const std::int64_t common = common_prefix(entry.tokens, prompt);
    if (common < std::max<std::int64_t>(minimum_tokens, 1) || (best && common <= best->tokens)) continue;
    const std::string name = fs::path(path).filename().string();
    best = Match{path, name.substr(0, name.size() - 7), common, static_cast<std::int64_t>(entry.tokens.size())};
  }
  return best;
}

std::optional<LoadedSnapshot> SnapshotStore::load(const Match& match, std::string* rejection) {
  try {
    LoadedSnapshot loaded = read_snapshot_file(match.path, fingerprint_.hash, shape_);
    ::utimensat(AT_FDCWD, match.path.c_str(), nullptr, 0);  // used now: the last to go under the disk budget
    return loaded;
  } catch (const std::exception& failure) {
    std::lock_guard<std::mutex> lock(mutex_);
    reject(match.path, failure.what());
    if (rejection) *rejection = failure.what();
    return std::nullopt;
  }
}

std::optional<std::string> SnapshotStore::annotation_of(const std::string& key) {
  const std::string path = path_for(key);
  if (!fs::exists(path)) return std::nullopt;
  try {
    SnapshotHeader header = read_snapshot_header(path);
    if (header.fingerprint != fingerprint_.hash) throw SnapshotError("snapshot " + path + " was made by another model than its folder's");
    return std::move(header.annotation);
  } catch (const std::exception& failure) {
    std::lock_guard<std::mutex> lock(mutex_);
    reject(path, failure.what());
    return std::nullopt;
  }
}

void SnapshotStore::remove(const std::string& key) {
  const std::string name = fs::path(path_for(key)).filename().string();
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.erase(std::remove_if(queue_.begin(), queue_.end(), [&](const auto& item) { return item.first == key; }), queue_.end());
  if (writing_key_ == key) removed_while_writing_ = true;
  // Every model's snapshot of it: a deleted chat leaves nothing behind.
  for (const FolderFile& file : list_snapshot_files(directory_)) {
    if (fs::path(file.path).filename() != name || ::unlink(file.path.c_str()) != 0) continue;
    spdlog::info("KV snapshot {} deleted", file.path);
    index_.erase(file.path);
  }
}

void SnapshotStore::remove_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.clear();
  if (!writing_key_.empty()) removed_while_writing_ = true;
  std::int64_t removed = 0;
  for (const FolderFile& file : list_snapshot_files(directory_))
    if (::unlink(file.path.c_str()) == 0) ++removed;
  index_.clear();
  spdlog::info("deleted all {} KV snapshots in {}", removed, directory_);
}

std::int64_t SnapshotStore::folder_bytes() const {
  std::int64_t total = 0;
  for (const FolderFile& file : list_snapshot_files(directory_)) total += file.size;
  return total;
}

}  // namespace kvchat
