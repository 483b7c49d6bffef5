#include "app/snapshot_key.h"

#include <spdlog/spdlog.h>

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QStandardPaths>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <vector>

#include "engine/model/llama_model.h"

namespace kvchat::app {

namespace {

// The file: the installation id (8 bytes, never 0) then the secret.
constexpr std::size_t kKeyFileBytes = 8 + kSnapshotSecretBytes;

std::runtime_error key_error(const QString& path, const std::string& what) {
  return std::runtime_error("KV snapshot key " + path.toStdString() + ": " + what);
}

std::string errno_text() { return std::strerror(errno); }

class Descriptor {
 public:
  explicit Descriptor(int fd) : fd_(fd) {}
  ~Descriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

std::vector<unsigned char> random_bytes(std::size_t count) {
  std::vector<unsigned char> bytes(count);
  std::size_t filled = 0;
  while (filled < count) {
    const ssize_t got = ::getrandom(bytes.data() + filled, count - filled, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) throw std::runtime_error("no random bytes for the KV snapshot key: " + errno_text());
    filled += static_cast<std::size_t>(got);
  }
  return bytes;
}

// nullopt: there is no key file yet.
std::optional<SnapshotKey> read_key(const QString& path) {
  const QByteArray name = QFile::encodeName(path);
  const Descriptor file(::open(name.constData(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (file.get() < 0) {
    const int error = errno;
    if (error == ENOENT) return std::nullopt;
    throw key_error(
        path, "cannot be opened: " + std::string(std::strerror(error)) + (error == ELOOP ? " (a symbolic link)" : ""));
  }
  struct stat info {};
  if (::fstat(file.get(), &info) != 0) throw key_error(path, "cannot be read: " + errno_text());
  if (!S_ISREG(info.st_mode)) throw key_error(path, "not a regular file");
  if (info.st_uid != ::getuid()) throw key_error(path, "owned by another user");
  if (info.st_size != static_cast<off_t>(kKeyFileBytes))
    throw key_error(path, std::to_string(info.st_size) + " bytes, a key has " + std::to_string(kKeyFileBytes) +
                              " (delete it to make a new one; the snapshots made with it are then not used)");
  if ((info.st_mode & 077) != 0) {
    spdlog::warn("KV snapshot key {} was readable by others (mode {:o}): narrowed to 0600", path.toStdString(),
                 info.st_mode & 0777);
    if (::fchmod(file.get(), 0600) != 0) throw key_error(path, "cannot be made owner-only: " + errno_text());
  }
  std::vector<unsigned char> bytes(kKeyFileBytes);
  std::size_t got_total = 0;
  while (got_total < bytes.size()) {
    const ssize_t got = ::read(file.get(), bytes.data() + got_total, bytes.size() - got_total);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) throw key_error(path, "cannot be read: " + (got < 0 ? errno_text() : std::string("it ends early")));
    got_total += static_cast<std::size_t>(got);
  }
  SnapshotKey key;
  std::memcpy(&key.installation, bytes.data(), sizeof key.installation);
  if (key.installation == 0) throw key_error(path, "its installation id is 0");
  key.secret.assign(reinterpret_cast<const char*>(bytes.data()) + 8, kSnapshotSecretBytes);
  return key;
}

// Writes a new key beside `path` and links it there: link() fails when another process was first, and
// then its key is the one.
void make_key(const QString& path) {
  std::vector<unsigned char> bytes = random_bytes(kKeyFileBytes);
  if (std::all_of(bytes.begin(), bytes.begin() + 8, [](unsigned char b) { return b == 0; })) bytes[0] = 1;
  const QByteArray name = QFile::encodeName(path);
  const QByteArray temporary = name + ".tmp." + QByteArray::number(::getpid());
  ::unlink(temporary.constData());
  {
    const Descriptor file(::open(temporary.constData(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (file.get() < 0) throw key_error(path, "cannot be created: " + errno_text());
    const bool written = ::write(file.get(), bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()) &&
                         ::fsync(file.get()) == 0;
    if (!written) {
      const std::string reason = errno_text();
      ::unlink(temporary.constData());
      throw key_error(path, "cannot be written: " + reason);
    }
  }
  const int linked = ::link(temporary.constData(), name.constData());
  const int link_errno = errno;
  ::unlink(temporary.constData());
  if (linked != 0 && link_errno != EEXIST) {
    errno = link_errno;
    throw key_error(path, "cannot be created: " + errno_text());
  }
  if (linked == 0) spdlog::info("made a new KV snapshot key {}", path.toStdString());
}

}  // namespace

QString snapshot_key_path() {
  QString folder = QStandardPaths::writableLocation(QStandardPaths::GenericConfigLocation);
  if (folder.isEmpty()) folder = QDir::homePath() + QStringLiteral("/.config");
  return folder + QStringLiteral("/kvchat/kv-snapshot-key");
}

SnapshotKey installation_snapshot_key() {
  const QString path = snapshot_key_path();
  if (std::optional<SnapshotKey> key = read_key(path)) return *key;
  if (!QDir().mkpath(QFileInfo(path).absolutePath())) throw key_error(path, "its folder cannot be created");
  make_key(path);
  if (std::optional<SnapshotKey> key = read_key(path)) return *key;
  throw key_error(path, "it was made and is gone");
}

std::shared_ptr<SnapshotStore> open_snapshot_store(const std::string& directory, std::int64_t disk_budget_bytes,
                                                   const LlamaModel& model, KvDtype kv_dtype) {
  SnapshotKey key = installation_snapshot_key();
  return std::make_shared<SnapshotStore>(directory, disk_budget_bytes, fingerprint_model(model),
                                         model.cache_shape(kv_dtype), std::move(key));
}

}  // namespace kvchat::app
