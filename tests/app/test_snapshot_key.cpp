// The installation's KV snapshot key file ($XDG_CONFIG_HOME/kvchat/kv-snapshot-key): made owner-only on
// first use, the same key on every later use (so the app and kvchat-cli continue each other's snapshots),
// narrowed to 0600 when it was readable by others, and a clear error naming the file when it is not a key.
#include <sys/stat.h>

#include <QFile>
#include <QTemporaryDir>
#include <QtTest>
#include "common/test_suite.h"

#include <filesystem>
#include <stdexcept>

#include "app/snapshot_key.h"
#include "engine/cache/kv_snapshot.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_snapshot_key {

namespace {

mode_t mode_of(const QString& path) {
  struct stat info {};
  return ::stat(QFile::encodeName(path).constData(), &info) == 0 ? (info.st_mode & 0777) : 0;
}

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const std::runtime_error& error) {
    return error.what();
  }
  return "no error";
}

}  // namespace

class SnapshotKeyTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void init() {
    folder_ = std::make_unique<QTemporaryDir>();
    QVERIFY(folder_->isValid());
    qputenv("XDG_CONFIG_HOME", folder_->path().toLocal8Bit());
  }

  void made_owner_only_and_kept() {
    const QString path = kvchat::app::snapshot_key_path();
    QCOMPARE(path, folder_->filePath("kvchat/kv-snapshot-key"));
    QVERIFY(!QFile::exists(path));
    const kvchat::SnapshotKey first = kvchat::app::installation_snapshot_key();
    QCOMPARE(mode_of(path), mode_t{0600});
    QCOMPARE(QFileInfo(path).size(), qint64(8 + kvchat::kSnapshotSecretBytes));
    QVERIFY(first.installation != 0);
    QCOMPARE(first.secret.size(), kvchat::kSnapshotSecretBytes);
    const kvchat::SnapshotKey again = kvchat::app::installation_snapshot_key();
    QCOMPARE(again.installation, first.installation);
    QVERIFY(again.secret == first.secret);
    // Another config folder is another installation.
    QTemporaryDir other;
    qputenv("XDG_CONFIG_HOME", other.path().toLocal8Bit());
    const kvchat::SnapshotKey theirs = kvchat::app::installation_snapshot_key();
    QVERIFY(theirs.installation != first.installation);
    QVERIFY(theirs.secret != first.secret);
  }

  void a_key_readable_by_others_is_narrowed() {
    const kvchat::SnapshotKey first = kvchat::app::installation_snapshot_key();
    const QString path = kvchat::app::snapshot_key_path();
    QCOMPARE(::chmod(QFile::encodeName(path).constData(), 0644), 0);
    const kvchat::SnapshotKey again = kvchat::app::installation_snapshot_key();
    QCOMPARE(mode_of(path), mode_t{0600});
    QVERIFY(again.secret == first.secret);
  }

  void a_file_that_is_not_a_key_is_an_error_naming_it() {
    const QString path = kvchat::app::snapshot_key_path();
    QVERIFY(QDir().mkpath(QFileInfo(path).absolutePath()));
    {
      QFile file(path);
      QVERIFY(file.open(QIODevice::WriteOnly));
      file.write("short");
    }
    QCOMPARE(
        error_of([] { kvchat::app::installation_snapshot_key(); }),
        "KV snapshot key " + path.toStdString() +
            ": 5 bytes, a key has 200 (delete it to make a new one; the snapshots made with it are then not used)");
    QVERIFY(QFile::remove(path));
    std::filesystem::create_symlink(folder_->filePath("elsewhere").toStdString(), path.toStdString());
    QCOMPARE(error_of([] { kvchat::app::installation_snapshot_key(); }),
             "KV snapshot key " + path.toStdString() +
                 ": cannot be opened: Too many levels of symbolic links (a symbolic link)");
    QVERIFY(!QFile::exists(folder_->filePath("elsewhere")));
  }

 private:
  std::unique_ptr<QTemporaryDir> folder_;
};

KVCHAT_TEST_GUILESS_MAIN(SnapshotKeyTest)

}  // namespace app_test_snapshot_key

#include "test_snapshot_key.moc"
