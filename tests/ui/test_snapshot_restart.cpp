// Quit and relaunch: a chat's KV cache survives the app. A first instance of the real app (the kvchat
// program, its own process, offscreen) chats once and quits; a second instance on the same data folder
// (database, settings, snapshot folder) continues that chat: the next turn is served from the first
// instance's snapshot, the gauge and the reply's stats say so, and the reply is the one a third
// instance gives when it holds both turns in memory (one run, its own snapshot folder).
#include <QtTest>
#include "common/test_suite.h"

#include <QDir>
#include <QFile>
#include <QProcess>
#include <QSettings>
#include <QSignalSpy>
#include <QTemporaryDir>

#include <memory>

#include "app/chat/chat_controller.h"
#include "app/store/conversation_store.h"
#include "app/store/message_stats_json.h"
#include "common/chat_fixture.h"
#include "common/test_paths.h"
#include "ui/elided_label.h"
#include "ui/main_window.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace ui_test_snapshot_restart {

using kvchat::app::BackendHost;
using kvchat::app::ChatController;
using kvchat::app::ChatSettings;
using kvchat::ui::MainWindow;

namespace {

struct Instance {
  std::unique_ptr<QSettings> ini;
  std::unique_ptr<ChatController> controller;
  std::unique_ptr<MainWindow> window;
};

// An app instance in this process: its own controller (engine thread, model load) and window.
bool open_instance(Instance& instance, const QString& ini_path, const QString& database, const QString& snapshots) {
  instance.ini = std::make_unique<QSettings>(ini_path, QSettings::IniFormat);
  instance.controller = std::make_unique<ChatController>(database, instance.ini.get());
  instance.controller->setSnapshotDirectoryOverride(snapshots);
  instance.window = std::make_unique<MainWindow>(instance.controller.get());
  instance.window->show();
  QSignalSpy loaded(&instance.controller->backendHost(), &BackendHost::modelLoaded);
  instance.controller->loadModel(QString());
  return loaded.wait(60000);
}

// Sends `text` in conversation 1 and waits for the reply; returns its text.
QString send_and_wait(Instance& instance, const QString& text) {
  ChatController* controller = instance.controller.get();
  controller->selectConversation(1);
  QSignalSpy finished(controller, &ChatController::replyFinished);
  if (!controller->send(text)) return QStringLiteral("<send refused>");
  if (!finished.wait(120000)) return QStringLiteral("<no reply>");
  return finished.takeFirst().at(0).value<kvchat::app::MessageRecord>().text;
}

}  // namespace

class SnapshotRestartTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void the_next_turn_after_a_restart_is_served_from_the_snapshot() {
    QTemporaryDir data;
    const QString ini = data.filePath("kvchat.ini"), database = data.filePath("chats.sqlite3");
    const QString snapshots = data.filePath("kv-snapshots");
    {
      QSettings settings(ini, QSettings::IniFormat);
      kvchat::test::greedy_chat_settings(24).save(settings);
    }

    // Instance 1: the real program, which quits after its reply (and a screenshot).
    QProcess first;
    first.setProcessChannelMode(QProcess::MergedChannels);
    first.start(QString::fromStdString(kvchat::test::build_dir()) + "/kvchat",
                {"--db", database, "--settings", ini, "--cache-dir", snapshots, "--send", "Once upon a time, Lily",
                 "--screenshot", data.filePath("first.png")});
    QVERIFY2(first.waitForFinished(120000), "the first instance did not quit");
    QVERIFY2(first.exitCode() == 0, first.readAll().constData());
    const QStringList model_folders = QDir(snapshots).entryList(QDir::Dirs | QDir::NoDotAndDotDot);
    QCOMPARE(model_folders.size(), 1);
    QCOMPARE(QDir(snapshots + "/" + model_folders[0]).entryList({"*.kvsnap"}).size(), 1);

    // Instance 2: the same data folder; the old chat's next turn.
    Instance second;
    QVERIFY(open_instance(second, ini, database, snapshots));
    const QString reply = send_and_wait(second, "She went outside");
    const auto stats = second.controller->lastReplyStats();
    QVERIFY(stats.has_value());
    QVERIFY2(stats->restored_tokens > 20, qPrintable(QString::number(stats->restored_tokens)));
    QCOMPARE(stats->restored_tokens, stats->reused_tokens);  // nothing was in memory: all came from disk
    const auto* gauge = second.window->findChild<kvchat::ui::ElidedLabel*>("cacheLabel");
    QVERIFY(gauge);
    QVERIFY2(gauge->fullText().contains(QStringLiteral("%1 restored from disk").arg(stats->restored_tokens)),
             qPrintable(gauge->fullText()));
    second.window.reset();
    second.controller.reset();

    // Instance 3: both turns in one run, the cache in memory throughout: the same second reply.
    QProcess reference;
    reference.setProcessChannelMode(QProcess::MergedChannels);
    const QString reference_database = data.filePath("reference.sqlite3");
    reference.start(
        QString::fromStdString(kvchat::test::build_dir()) + "/kvchat",
        {"--db", reference_database, "--settings", ini, "--cache-dir", data.filePath("reference-snapshots"), "--send",
         "Once upon a time, Lily", "--send", "She went outside", "--screenshot", data.filePath("third.png")});
    QVERIFY2(reference.waitForFinished(120000), "the third instance did not quit");
    QVERIFY2(reference.exitCode() == 0, reference.readAll().constData());
    const QList<kvchat::app::MessageRecord> messages = kvchat::app::ConversationStore(reference_database).messages(1);
    QCOMPARE(messages.size(), 4);
    QCOMPARE(messages[3].text, reply);
    QCOMPARE(kvchat::app::stats_from_json(messages[3].stats).restored_tokens, 0);
    QVERIFY(kvchat::app::stats_from_json(messages[3].stats).reused_tokens > 20);
  }
};

KVCHAT_TEST_MAIN(SnapshotRestartTest)

}  // namespace ui_test_snapshot_restart

#include "test_snapshot_restart.moc"
