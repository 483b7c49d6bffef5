// The local server in the desktop app's window, offscreen over stories260K: the settings dialog's own
// "Local server" section (off by default, port 8080, its label naming the port, its own settings group),
// and the status bar's "Serving on http://127.0.0.1:PORT" while it runs, gone when it stops; a port
// that cannot be bound, or server threads that cannot start, say why (the window stays up).
#include <QtTest>
#include "common/test_suite.h"

#include <QCheckBox>
#include <QLabel>
#include <QLineEdit>
#include <QSettings>
#include <QSpinBox>
#include <QTemporaryDir>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "app/server/local_server.h"
#include "common/address_space_headroom.h"
#include "common/chat_fixture.h"
#include "ui/local_server_group.h"
#include "ui/main_window.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace ui_test_local_server_ui {

using kvchat::app::LocalServerSettings;

class LocalServerUiTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void section_edits_its_own_settings() {
    kvchat::ui::LocalServerGroup group{LocalServerSettings{}};
    auto* enabled = group.findChild<QCheckBox*>("serveCheck");
    auto* port = group.findChild<QSpinBox*>("servePortSpin");
    auto* key = group.findChild<QLineEdit*>("serveApiKeyEdit");
    QVERIFY(enabled && port && key);
    QVERIFY(!enabled->isChecked());
    QCOMPARE(port->value(), 8080);
    QCOMPARE(enabled->text(), QString("Serve the loaded model on localhost:8080"));
    port->setValue(9091);
    QCOMPARE(enabled->text(), QString("Serve the loaded model on localhost:9091"));
    enabled->setChecked(true);
    key->setText(" secret ");
    const LocalServerSettings edited = group.settings();
    QVERIFY(edited.enabled);
    QCOMPARE(edited.port, 9091);
    QCOMPARE(edited.api_key, QString("secret"));

    QTemporaryDir dir;
    QSettings ini(dir.filePath("kvchat.ini"), QSettings::IniFormat);
    edited.save(ini);
    QCOMPARE(ini.value("local_server/port").toInt(), 9091);
    QCOMPARE(ini.value("local_server/enabled").toBool(), true);
    QVERIFY(LocalServerSettings::load(ini) == edited);
    ini.setValue("local_server/port", "eighty");
    QCOMPARE(LocalServerSettings::load(ini).port, 8080);  // a bad value keeps the default
  }

  void status_bar_shows_the_server() {
    kvchat::test::ChatFixture fixture;
    QVERIFY(fixture.open(kvchat::test::greedy_chat_settings()));
    kvchat::ui::MainWindow window(fixture.controller());
    window.show();
    QLabel* label = window.servingLabel();
    QVERIFY(label && label->isHidden());
    LocalServerSettings serve;
    serve.enabled = true;
    serve.port = 0;
    fixture.controller()->localServerHost().applySettings(serve);
    const int port = fixture.controller()->localServerHost().server().port();
    QCOMPARE(label->text(), QString("Serving on http://127.0.0.1:%1").arg(port));
    QVERIFY(label->isVisible());
    serve.enabled = false;
    fixture.controller()->localServerHost().applySettings(serve);
    QVERIFY(label->isHidden());

    // A port already taken: the reason is shown. The port is one this test holds (the kernel picks a
    // free one), not the one just released, which another program may have taken meanwhile.
    const int taken = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = 0;
    QCOMPARE(::bind(taken, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    QCOMPARE(::listen(taken, 1), 0);
    socklen_t address_size = sizeof address;
    QCOMPARE(::getsockname(taken, reinterpret_cast<sockaddr*>(&address), &address_size), 0);
    const int taken_port = ntohs(address.sin_port);
    serve.enabled = true;
    serve.port = taken_port;
    fixture.controller()->localServerHost().applySettings(serve);
    ::close(taken);
    QCOMPARE(label->text(), QString("Not serving"));
    QVERIFY2(label->toolTip().contains(QString("localhost:%1").arg(taken_port)), qPrintable(label->toolTip()));
    QVERIFY(!fixture.controller()->localServerHost().server().isServing());
  }

  // Little address space left (a memory limit, the compute threads at their maximum): the server's
  // threads cannot start, and the status bar says so instead of the app aborting.
  void threads_that_cannot_start_show_not_serving() {
    kvchat::test::ChatFixture fixture;
    QVERIFY(fixture.open(kvchat::test::greedy_chat_settings()));
    kvchat::ui::MainWindow window(fixture.controller());
    window.show();
    LocalServerSettings serve;
    serve.enabled = true;
    serve.port = 0;
    {
      kvchat::test::AddressSpaceHeadroom headroom(std::size_t(64) << 20);
      if (!headroom.active()) QSKIP("the address space cannot be capped here (sanitized build)");
      fixture.controller()->localServerHost().applySettings(serve);
    }
    QLabel* label = window.servingLabel();
    QCOMPARE(label->text(), QString("Not serving"));
    QVERIFY(label->isVisible());
    QVERIFY2(label->toolTip().contains("cannot start the server's ") && label->toolTip().contains(" threads ("),
             qPrintable(label->toolTip()));
    QVERIFY(!fixture.controller()->localServerHost().server().isServing());
  }
};

KVCHAT_TEST_MAIN(LocalServerUiTest)

}  // namespace ui_test_local_server_ui

#include "test_local_server_ui.moc"
