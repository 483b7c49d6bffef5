// A hostile or broken KV snapshot folder, end to end through kvchat-cli chat under the limits of
// common/hostile_case.h: model folders that are symbolic links to the user's files, a snapshot claiming
// 2^24 tokens hard-linked forty times, a conversation's snapshot whose ids are outside the vocabulary (its
// checksums valid), a --cache-dir that is a file, and another installation's snapshots. Each turn works or fails
// with its specific error, nothing outside the store's own files is touched, and no chat is lost.
#include <sys/stat.h>
#include <unistd.h>

#include <QFile>
#include <QTemporaryDir>
#include <QtTest>
#include "common/test_suite.h"

#include <filesystem>

#include "app/snapshot_key.h"
#include "app/store/conversation_store.h"
#include "common/chat_fixture.h"
#include "common/hostile_case.h"
#include "common/snapshot_support.h"
#include "engine/cache/kv_snapshot.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_loader.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_hostile_snapshots {

using kvchat::app::ConversationStore;
using kvchat::app::StoreOpenMode;
using kvchat::test::LimitedCliResult;
using kvchat::test::run_case;
namespace fs = std::filesystem;

namespace {

int conversation_count(const QString& db) {
  if (!QFile::exists(db)) return 0;
  return static_cast<int>(ConversationStore(db, StoreOpenMode::ReadOnly).conversations().size());
}

// The snapshot files (*.kvsnap) of a model folder.
QStringList snapshot_files(const std::string& folder) {
  return QDir(QString::fromStdString(folder)).entryList({"*.kvsnap"}, QDir::Files | QDir::System);
}

}  // namespace

class HostileSnapshotsTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void initTestCase();
  void linked_model_folders_are_never_entered();
  void a_snapshot_claiming_two_to_the_24_tokens_costs_nothing();
  void ids_outside_the_vocabulary_in_a_snapshot_never_change_a_reply();
  void a_cache_dir_that_is_a_file_leaves_no_conversation();
  void another_installations_snapshots_are_left_alone();

 private:
  QStringList chat(const QString& db, const QString& cache, const QStringList& more) const {
    return QStringList{"chat",
                       "--model",
                       kvchat::test::stories_model_directory(),
                       "--db",
                       db,
                       "--cache-dir",
                       cache,
                       "--max-new-tokens",
                       "4"} +
           more;
  }
  QString path(const QString& name) const { return dir_.filePath(name); }

  QTemporaryDir dir_;
  std::string model_folder_name_;  // the fingerprint's folder of stories260K
  kvchat::SnapshotKey key_;        // this installation's (the folder the child processes use too)
};

void HostileSnapshotsTest::initTestCase() {
  QVERIFY(dir_.isValid());
  // The installation's key, the same for this process and the kvchat-cli it runs: in this suite's folder.
  qputenv("XDG_CONFIG_HOME", path("config").toLocal8Bit());
  key_ = kvchat::app::installation_snapshot_key();
  QCOMPARE(key_.secret.size(), kvchat::kSnapshotSecretBytes);
  const kvchat::LoadedModel model = kvchat::load_model(kvchat::test::shared_path("models/stories260K"));
  model_folder_name_ = kvchat::fingerprint_model(*model.model).hex();
}

// Another model's folder is a link to the user's folder, which holds a 2 MiB file named like a snapshot;
// the disk budget is 1 MiB. That file stays. This model's folder a link: the command fails naming it,
// writes nothing through it and creates no conversation.
void HostileSnapshotsTest::linked_model_folders_are_never_entered() {
  const std::string users = path("users-folder").toStdString();
  fs::create_directories(users);
  const QByteArray big(2 << 20, 'u');
  QVERIFY(kvchat::test::write_bytes(users + "/notes.kvsnap", big));
  const QString cache = path("linked-cache");
  fs::create_directories(cache.toStdString());
  fs::create_directory_symlink(users, cache.toStdString() + "/0123456789abcdef");
  const QString db = path("linked.sqlite3");
  LimitedCliResult result = run_case("another model's folder a link",
                                     chat(db, cache, {"--message", "Once upon a time", "--snapshot-budget-mib", "1"}));
  KVCHAT_EXPECT_SUCCESS(result);
  result = run_case("and a second turn",
                    chat(db, cache, {"--conversation", "1", "--message", "Lily", "--snapshot-budget-mib", "1"}));
  KVCHAT_EXPECT_SUCCESS(result);
  QCOMPARE(kvchat::test::read_bytes(users + "/notes.kvsnap"), big);
  QCOMPARE(snapshot_files(cache.toStdString() + "/" + model_folder_name_).size(), 1);

  const QString linked_own = path("linked-own-cache");
  fs::create_directories(linked_own.toStdString());
  fs::create_directory_symlink(users, linked_own.toStdString() + "/" + model_folder_name_);
  const QString other_db = path("linked-own.sqlite3");
  result = run_case("this model's folder a link", chat(other_db, linked_own, {"--message", "Once upon a time"}));
  KVCHAT_EXPECT_FAILURE(
      result, 2,
      QStringList{QString::fromStdString("--cache-dir: the KV snapshot folder " + linked_own.toStdString() + "/" +
                                         model_folder_name_ + " is a symbolic link or not a folder")});
  QCOMPARE(QDir(QString::fromStdString(users)).entryList(QDir::Files), QStringList{"notes.kvsnap"});
  QCOMPARE(conversation_count(other_db), 0);
}

// 40 names of one sparse file whose header claims 2^24 tokens (64 MiB of ids, far past the context of
// 512; every checksum but the K/V data's valid): reading their ids would take 2.5 GiB, more than the
// 2 GiB the process may have. The turn works, restores nothing, and all 40 stay (no disk budget: its
// deletions of the least recently used snapshots are not what this is about).
void HostileSnapshotsTest::a_snapshot_claiming_two_to_the_24_tokens_costs_nothing() {
  const QString cache = path("bomb-cache");
  const std::string folder = cache.toStdString() + "/" + model_folder_name_;
  fs::create_directories(folder);
  kvchat::test::CraftedSnapshot crafted;
  crafted.fingerprint = 0;
  {
    const kvchat::LoadedModel model = kvchat::load_model(kvchat::test::shared_path("models/stories260K"));
    const kvchat::KvCacheShape shape = model.model->cache_shape();
    crafted.fingerprint = kvchat::fingerprint_model(*model.model).hash;
    crafted.layers = static_cast<std::uint64_t>(shape.layers);
    crafted.kv_heads = static_cast<std::uint64_t>(shape.kv_heads);
    crafted.head_dim = static_cast<std::uint64_t>(shape.head_dim);
    crafted.tokens = std::int64_t(1) << 24;
    crafted.data_bytes = kvchat::snapshot_data_bytes(shape, crafted.tokens);
  }
  QVERIFY(kvchat::test::write_crafted_snapshot(folder + "/bomb-0.kvsnap", crafted, key_));
  for (int link = 1; link < 40; ++link)
    fs::create_hard_link(folder + "/bomb-0.kvsnap", folder + "/bomb-" + std::to_string(link) + ".kvsnap");
  const LimitedCliResult result =
      run_case("40 links of a 2^24-token snapshot",
               chat(path("bomb.sqlite3"), cache, {"--message", "Once upon a time", "--snapshot-budget-mib", "0"}));
  KVCHAT_EXPECT_SUCCESS(result);
  QVERIFY2(result.err.find("/bomb-0.kvsnap holds 16777216 tokens, more than this model's context of 512") !=
               std::string::npos,
           result.err.c_str());
  QVERIFY2(result.err.find("bad_alloc") == std::string::npos, result.err.c_str());
  QVERIFY2(result.err.find("(0 restored from disk") != std::string::npos, result.err.c_str());
  for (int link = 0; link < 40; ++link) QVERIFY(fs::exists(folder + "/bomb-" + std::to_string(link) + ".kvsnap"));
}

// A conversation's snapshot, its ids from the 20th on changed to 1000000 (outside the vocabulary of 512)
// and its checksums recomputed with this installation's key (what only a bug or someone holding the key
// could write). The next turns restore no more than the 20 ids the prompt shares with it and reply
// exactly as the same conversation does without snapshots.
void HostileSnapshotsTest::ids_outside_the_vocabulary_in_a_snapshot_never_change_a_reply() {
  const QString cache = path("oov-cache"), db = path("oov.sqlite3"), without = path("oov-without-snapshots.sqlite3");
  const QStringList longer{"--max-new-tokens", "24"};
  const QStringList first{"--message", "Once upon a time, there was a little girl named Lily"};
  KVCHAT_EXPECT_SUCCESS(run_case("first turn", chat(db, cache, first + longer)));
  QVERIFY(QFile::copy(db, without));
  const std::string folder = cache.toStdString() + "/" + model_folder_name_;
  const QStringList files = snapshot_files(folder);
  QCOMPARE(files.size(), 1);
  const std::string snapshot = folder + "/" + files[0].toStdString();
  QByteArray bytes = kvchat::test::read_bytes(snapshot);
  const auto tokens = kvchat::test::field_of<std::uint64_t>(bytes, kvchat::test::kSnapshotTokenCountAt);
  QVERIFY(tokens > 32);
  for (int i = 20; i < static_cast<int>(tokens); ++i)
    kvchat::test::set_field<std::int32_t>(bytes, 128 + 4 * i, 1000000);
  QVERIFY(kvchat::test::write_bytes(snapshot, kvchat::test::with_token_checksum(bytes, key_)));

  const QStringList lines = {"Lily", "and Tom"};
  for (int turn = 0; turn < lines.size(); ++turn) {
    const QStringList arguments = QStringList{"--conversation", "1", "--message", lines[turn]} + longer;
    const LimitedCliResult result = run_case("a turn after the edit", chat(db, cache, arguments));
    KVCHAT_EXPECT_SUCCESS(result);
    if (turn == 0) QVERIFY2(result.err.find("(20 restored from disk") != std::string::npos, result.err.c_str());
    const QStringList off{"--kv-snapshots", "off"};
    KVCHAT_EXPECT_SUCCESS(run_case("the same turn without snapshots", chat(without, cache, arguments + off)));
  }
  const auto messages = ConversationStore(db, StoreOpenMode::ReadOnly).messages(1);
  const auto expected = ConversationStore(without, StoreOpenMode::ReadOnly).messages(1);
  QCOMPARE(messages.size(), 6);
  QCOMPARE(expected.size(), 6);
  for (int i = 0; i < 6; ++i) {
    QVERIFY2(messages[i].stats.value("error").isUndefined(), qPrintable(messages[i].text));
    QCOMPARE(messages[i].text, expected[i].text);
    QCOMPARE(messages[i].token_ids, expected[i].token_ids);
  }
  QVERIFY(!messages[5].token_ids.empty());
}

void HostileSnapshotsTest::a_cache_dir_that_is_a_file_leaves_no_conversation() {
  const QString file = path("a-file");
  QVERIFY(kvchat::test::write_bytes(file.toStdString(), "not a folder\n"));
  const QString db = path("file-cache.sqlite3");
  const LimitedCliResult result = run_case("--cache-dir a file", chat(db, file, {"--message", "Once upon a time"}));
  KVCHAT_EXPECT_FAILURE(result, 2, QStringList{"--cache-dir: " + file + " is not a folder"});
  QCOMPARE(conversation_count(db), 0);
  QCOMPARE(kvchat::test::read_bytes(file.toStdString()), QByteArray("not a folder\n"));
}

// Two installations (two config folders, two keys) share one snapshot folder: neither restores nor
// deletes the other's snapshots; each restores its own.
void HostileSnapshotsTest::another_installations_snapshots_are_left_alone() {
  const QString cache = path("shared-cache"), db = path("shared.sqlite3");
  KVCHAT_EXPECT_SUCCESS(
      run_case("first turn",
               chat(db, cache,
                    {"--message", "Once upon a time, there was a little girl named Lily", "--max-new-tokens", "24"})));
  const std::string folder = cache.toStdString() + "/" + model_folder_name_;
  QCOMPARE(snapshot_files(folder).size(), 1);
  const QString mine = snapshot_files(folder)[0];

  qputenv("XDG_CONFIG_HOME", path("other-config").toLocal8Bit());
  LimitedCliResult result =
      run_case("another installation", chat(path("other.sqlite3"), cache, {"--message", "Once upon a time"}));
  qputenv("XDG_CONFIG_HOME", path("config").toLocal8Bit());
  KVCHAT_EXPECT_SUCCESS(result);
  QVERIFY2(result.err.find("(0 restored from disk") != std::string::npos, result.err.c_str());
  QVERIFY2(
      result.err.find("/" + mine.toStdString() + " was written by another kvchat installation") != std::string::npos,
      result.err.c_str());
  QCOMPARE(QFile::permissions(path("other-config/kvchat/kv-snapshot-key")),
           QFileDevice::ReadOwner | QFileDevice::WriteOwner | QFileDevice::ReadUser | QFileDevice::WriteUser);
  QStringList files = snapshot_files(folder);
  QCOMPARE(files.size(), 2);
  files.removeOne(mine);
  const std::string theirs = folder + "/" + files[0].toStdString();
  const QByteArray theirs_bytes = kvchat::test::read_bytes(theirs);

  result = run_case("this installation again", chat(db, cache, {"--conversation", "1", "--message", "Lily"}));
  KVCHAT_EXPECT_SUCCESS(result);
  QVERIFY2(result.err.find("(0 restored from disk") == std::string::npos, result.err.c_str());
  QVERIFY2(result.err.find("/" + files[0].toStdString() + " was written by another kvchat installation") !=
               std::string::npos,
           result.err.c_str());
  QCOMPARE(kvchat::test::read_bytes(theirs), theirs_bytes);
}

KVCHAT_TEST_GUILESS_MAIN(HostileSnapshotsTest)

}  // namespace app_test_hostile_snapshots

#include "test_hostile_snapshots.moc"
