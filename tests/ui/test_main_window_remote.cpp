// The main window with the remote backend, offscreen: Settings > Backend switched to a `kvchat-cli serve`
// started here (the model picked from its /v1/models), one turn typed and sent, the reply shown with the
// server's figures under it and the gauge saying the cache lives on the server. A wrong key shows the 401.
#include <QSignalSpy>
#include <QtTest>
#include "common/test_suite.h"

#include <QComboBox>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QSpinBox>

#include "app/store/chat_history.h"
#include "common/chat_fixture.h"
#include "common/server_process.h"
#include "ui/chat_view.h"
#include "ui/elided_label.h"
#include "ui/main_window.h"
#include "ui/message_input.h"
#include "ui/message_widget.h"
#include "ui/settings_dialog.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace ui_test_main_window_remote {

using kvchat::app::ChatController;
using kvchat::ui::MainWindow;

namespace {
const char* kApiKey = "window-remote-key";
}

class MainWindowRemoteTest : public QObject {
  Q_OBJECT

 private:
  kvchat::test::ServerProcess server_;
  kvchat::test::ChatFixture fixture_;
  std::unique_ptr<MainWindow> window_;
  QString base_url() const { return QStringLiteral("http://127.0.0.1:%1/v1").arg(server_.port()); }

  void switch_to_server(const QString& key) {
    kvchat::ui::SettingsDialog* dialog = window_->openSettingsDialog();
    QVERIFY(dialog->isVisible());
    dialog->findChild<QComboBox*>("backendCombo")->setCurrentIndex(1);
    dialog->findChild<QLineEdit*>("remoteUrlEdit")->setText(base_url());
    dialog->findChild<QLineEdit*>("remoteApiKeyEdit")->setText(key);
    auto* models = dialog->findChild<QComboBox*>("remoteModelCombo");
    models->setCurrentText(QString());
    QSignalSpy fetched(dialog, &kvchat::ui::SettingsDialog::modelsFetched);
    dialog->findChild<QPushButton*>("fetchModelsButton")->click();
    QVERIFY(fetched.wait(30000));
    if (key == QLatin1String(kApiKey)) {
      QCOMPARE(models->count(), 1);
      QCOMPARE(models->currentText(), QStringLiteral("stories260K"));
    } else {
      QVERIFY2(dialog->findChild<QLabel*>("remoteStatusLabel")->text().contains("refused the API key (401)"),
               qPrintable(dialog->findChild<QLabel*>("remoteStatusLabel")->text()));
    }
    dialog->accept();
  }

  void type_and_send(const QString& text) {
    QTest::keyClicks(window_->messageInput(), text);
    QTest::keyClick(window_->messageInput(), Qt::Key_Return);
    QVERIFY(fixture_.waitIdle());
  }

 private Q_SLOTS:
  void initTestCase() {
    QVERIFY2(
        server_.start({"--model", kvchat::test::stories_model_directory(), "--api-key", kApiKey, "--threads", "1"}),
        server_.log().c_str());
    QVERIFY(fixture_.open(kvchat::test::greedy_chat_settings(30)));
    window_ = std::make_unique<MainWindow>(fixture_.controller());
    window_->show();
    QVERIFY(QTest::qWaitForWindowExposed(window_.get()));
    window_->messageInput()->setFocus();
  }

  void one_remote_turn_through_the_window() {
    switch_to_server(kApiKey);
    ChatController* controller = fixture_.controller();
    QVERIFY(controller->usesRemoteBackend());
    QCOMPARE(controller->settings().remote_model, QStringLiteral("stories260K"));
    // The title and the new-chat screen name the server's model, not the local one (also stories260K here).
    QCOMPARE(window_->windowTitle(), QStringLiteral("kvchat \u2014 stories260K on %1").arg(base_url()));
    const QString welcome = window_->chatView()->placeholderText();
    QVERIFY2(
        welcome.startsWith(QStringLiteral("<p>Replies come from <b>stories260K</b> on the OpenAI-compatible server "
                                          "at %1.</p>")
                               .arg(base_url())),
        qPrintable(welcome));
    QVERIFY2(!welcome.contains(QStringLiteral("is loaded")), qPrintable(welcome));
    type_and_send("Once upon a time");
    const auto records = controller->currentMessages();
    QCOMPARE(records.size(), 2);
    QCOMPARE(records[1].backend, base_url());
    QCOMPARE(records[1].model, QStringLiteral("stories260K"));
    QVERIFY(!records[1].text.isEmpty());
    const auto widgets = window_->chatView()->messageWidgets();
    QCOMPARE(widgets.size(), 2);
    const QString stats = widgets[1]->statsText();
    QVERIFY2(stats.startsWith(
                 QStringLiteral("server \u00b7 %1 tokens").arg(records[1].stats.value("generated_tokens").toInt())),
             qPrintable(stats));
    QVERIFY2(stats.contains(QStringLiteral("cached on the server")), qPrintable(stats));
    QVERIFY2(window_->cacheLabel()->text().startsWith(QStringLiteral("KV cache on the server")),
             qPrintable(window_->cacheLabel()->text()));
    // The server prefilled: no prefill speed is shown for it (it would read "prefill 0.0 tok/s").
    const QString last = window_->findChild<kvchat::ui::ElidedLabel*>("replyStatsLabel")->fullText();
    QVERIFY2(last == QStringLiteral("last (server): TTFT %1 ms \u00b7 %2 tok")
                         .arg(records[1].stats.value("ttft_ms").toDouble(), 0, 'f', 0)
                         .arg(records[1].stats.value("generated_tokens").toInt()),
             qPrintable(last));
    QVERIFY2(!stats.contains(QStringLiteral("prefill")), qPrintable(stats));
  }

  // Back on the local model, the chat's last turn was the server's: its cached_tokens are not this
  // process's reuse, so the gauge shows no reused/prefilled figures until a local turn.
  void the_servers_figures_are_not_shown_as_local_reuse() {
    ChatController* controller = fixture_.controller();
    QVERIFY(controller->usesRemoteBackend());
    QVERIFY(controller->cacheGauge().has_turn);
    kvchat::ui::SettingsDialog* dialog = window_->openSettingsDialog();
    QVERIFY(dialog->isVisible());
    dialog->findChild<QComboBox*>("backendCombo")->setCurrentIndex(0);
    dialog->accept();
    QVERIFY(!controller->usesRemoteBackend());
    QCOMPARE(controller->currentMessages().size(), 2);
    QVERIFY(!controller->cacheGauge().has_turn);
    const QString gauge = window_->findChild<kvchat::ui::ElidedLabel*>("cacheLabel")->fullText();
    QVERIFY2(gauge.startsWith(QStringLiteral("KV ")), qPrintable(gauge));
    QVERIFY2(!gauge.contains(QStringLiteral("reused")) && !gauge.contains(QStringLiteral("prefilled")),
             qPrintable(gauge));
    // A local turn brings local figures back.
    type_and_send("The cat");
    QVERIFY(controller->cacheGauge().has_turn);
    const QString after = window_->findChild<kvchat::ui::ElidedLabel*>("cacheLabel")->fullText();
    QVERIFY2(after.contains(QStringLiteral(" reused / ")), qPrintable(after));
    QVERIFY2(window_->findChild<kvchat::ui::ElidedLabel*>("replyStatsLabel")->fullText().startsWith("last: prefill "),
             qPrintable(window_->findChild<kvchat::ui::ElidedLabel*>("replyStatsLabel")->fullText()));
  }

  void a_wrong_key_shows_the_401_message() {
    switch_to_server(QStringLiteral("not-the-key"));
    type_and_send("Hello");
    const auto widgets = window_->chatView()->messageWidgets();
    const QString stats = widgets.last()->statsText();
    QVERIFY2(
        stats.startsWith(QStringLiteral("Error: the server at %1 refused the API key (401): incorrect API key provided")
                             .arg(base_url())),
        qPrintable(stats));
    QVERIFY(window_->findChild<QPushButton*>("regenerateButton")->isEnabled());
  }

  // The remote timeouts are set in the dialog and kept in the settings.
  void timeouts_are_set_in_the_dialog() {
    kvchat::ui::SettingsDialog* dialog = window_->openSettingsDialog();
    QVERIFY(dialog->isVisible());
    auto* idle = dialog->findChild<QSpinBox*>("remoteIdleTimeoutSpin");
    auto* whole = dialog->findChild<QSpinBox*>("remoteReplyTimeoutSpin");
    QVERIFY(idle && whole);
    QCOMPARE(idle->value(), fixture_.controller()->settings().remote_idle_timeout_s);
    idle->setValue(77);
    whole->setValue(900);
    dialog->accept();
    QCOMPARE(fixture_.controller()->settings().remote_idle_timeout_s, 77);
    QCOMPARE(fixture_.controller()->settings().remote_reply_timeout_s, 900);
  }

  // A base URL with credentials in it: the status bar names the server without them.
  void credentials_in_the_url_are_never_shown() {
    ChatController* controller = fixture_.controller();
    kvchat::app::ChatSettings settings = controller->settings();
    settings.remote_base_url = QStringLiteral("http://me:sk-in-the-url@127.0.0.1:%1/v1").arg(server_.port());
    controller->applySettings(settings);
    auto* label = window_->findChild<kvchat::ui::ElidedLabel*>("modelLabel");
    QVERIFY(label);
    QVERIFY2(label->fullText().contains(QStringLiteral("http://***@127.0.0.1:%1/v1").arg(server_.port())),
             qPrintable(label->fullText()));
    QVERIFY(!label->fullText().contains(QStringLiteral("sk-in-the-url")));
    QVERIFY(!label->toolTip().contains(QStringLiteral("sk-in-the-url")));
  }

  void cleanupTestCase() { window_.reset(); }
};

KVCHAT_TEST_MAIN(MainWindowRemoteTest)

}  // namespace ui_test_main_window_remote

#include "test_main_window_remote.moc"
