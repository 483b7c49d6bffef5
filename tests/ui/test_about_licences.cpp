// The licences the About box lists come from one table (app/third_party.h), checked here against what the
// built programs load: every shared library kvchat and kvchat-cli name as a direct dependency has an
// entry, and every entry's library is one they load (itself, or through the library its entry names).
#include <QtTest>
#include "common/test_suite.h"

#include <QLibraryInfo>
#include <QMessageBox>
#include <QProcess>
#include <QRegularExpression>

#include "app/third_party.h"
#include "common/chat_fixture.h"
#include "ui/main_window.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace ui_test_about_licences {

using kvchat::app::ThirdPartyLibrary;

namespace {

QString program_path(const QString& name) {
  return QString::fromStdString(kvchat::test::build_dir()) + QLatin1Char('/') + name;
}

QString run(const QString& program, const QStringList& arguments) {
  QProcess process;
  process.start(program, arguments);
  if (!process.waitForFinished(60000) || process.exitCode() != 0) {
    qWarning("%s %s failed: %s", qPrintable(program), qPrintable(arguments.join(' ')),
             process.readAllStandardError().constData());
    return QString();
  }
  return QString::fromLocal8Bit(process.readAllStandardOutput());
}

// The shared objects an ELF file names as NEEDED (its direct dependencies).
QStringList direct_dependencies(const QString& path) {
  static const QRegularExpression needed(QStringLiteral(R"(\(NEEDED\)\s+Shared library: \[([^\]]+)\])"));
  QStringList names;
  auto matches = needed.globalMatch(run(QStringLiteral("readelf"), {QStringLiteral("-d"), QStringLiteral("-W"), path}));
  while (matches.hasNext()) names << matches.next().captured(1);
  return names;
}

// Every shared object the dynamic loader maps for `path`, by file name (sonames, resolved through links).
QStringList loaded_libraries(const QString& path) {
  // "libz.so.1 => /lib/.../libz.so.1 (0x...)", or the loader itself: "/lib64/ld-linux-x86-64.so.2 (0x...)".
  static const QRegularExpression line(QStringLiteral(R"(^\s*(\S+)(?:\s+=>\s+(\S+))?)"),
                                       QRegularExpression::MultilineOption);
  QStringList names;
  auto matches = line.globalMatch(run(QStringLiteral("ldd"), {path}));
  while (matches.hasNext()) {
    const QRegularExpressionMatch match = matches.next();
    names << QFileInfo(match.captured(1)).fileName();
    if (match.hasCaptured(2)) names << QFileInfo(QFileInfo(match.captured(2)).canonicalFilePath()).fileName();
  }
  return names;
}

// The compiler's sanitizer runtimes, which a build with -fsanitize links (scripts/test-sanitize.sh).
bool is_sanitizer_runtime(const QString& shared_object) {
  for (const char* runtime : {"libasan.so", "libubsan.so", "liblsan.so", "libtsan.so"})
    if (shared_object.startsWith(QLatin1String(runtime))) return true;
  return false;
}

const ThirdPartyLibrary* entry_for(const QString& shared_object) {
  for (const ThirdPartyLibrary& library : kvchat::app::third_party_libraries())
    for (const QString& prefix : library.shared_objects)
      if (shared_object.startsWith(prefix)) return &library;
  return nullptr;
}

}  // namespace

class AboutLicencesTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void every_linked_library_has_an_entry();
  void every_entry_is_a_library_the_programs_load();
  void the_about_box_lists_the_table();
};

void AboutLicencesTest::every_linked_library_has_an_entry() {
  for (const QString& program : {QStringLiteral("kvchat"), QStringLiteral("kvchat-cli")}) {
    const QStringList needed = direct_dependencies(program_path(program));
    QVERIFY2(needed.contains(QStringLiteral("libQt6Core.so.6")), qPrintable(program + ": " + needed.join(' ')));
    for (const QString& library : needed) {
      if (is_sanitizer_runtime(library)) continue;  // make test-sanitize's build: never part of a shipped program
      const ThirdPartyLibrary* entry = entry_for(library);
      QVERIFY2(entry, qPrintable(program + " links " + library + ", which app/third_party.cpp does not list"));
      QVERIFY2(entry->loaded_through.isEmpty(),
               qPrintable(program + " links " + library + " itself, but its entry says it comes through " +
                          entry->loaded_through));
    }
  }
  QVERIFY(direct_dependencies(program_path(QStringLiteral("kvchat"))).contains(QStringLiteral("libQt6Charts.so.6")));
}

void AboutLicencesTest::every_entry_is_a_library_the_programs_load() {
  QStringList loaded = loaded_libraries(program_path(QStringLiteral("kvchat")));
  // SQLite: Qt Sql's driver plugin links it, loaded when the store opens its database.
  const QString sqlite_driver =
      QLibraryInfo::path(QLibraryInfo::PluginsPath) + QStringLiteral("/sqldrivers/libqsqlite.so");
  QVERIFY2(QFileInfo::exists(sqlite_driver), qPrintable(sqlite_driver));
  loaded << loaded_libraries(sqlite_driver);
  for (const ThirdPartyLibrary& library : kvchat::app::third_party_libraries()) {
    QVERIFY2(!library.licence.isEmpty(), qPrintable(library.name));
    for (const QString& prefix : library.shared_objects) {
      const bool found =
          std::any_of(loaded.begin(), loaded.end(), [&](const QString& name) { return name.startsWith(prefix); });
      QVERIFY2(found, qPrintable(library.name + ": nothing loaded is " + prefix + "*"));
    }
  }
  // Debian's libblas.so.3 is an alternative: the entry names OpenBLAS, so it must be OpenBLAS's.
  const QString ldd = run(QStringLiteral("ldd"), {program_path(QStringLiteral("kvchat"))});
  const QRegularExpressionMatch blas = QRegularExpression(QStringLiteral(R"(libblas\.so\.3 => (\S+))")).match(ldd);
  QVERIFY2(blas.hasMatch(), qPrintable(ldd));
  const QString blas_file = QFileInfo(blas.captured(1)).canonicalFilePath();
  QVERIFY2(blas_file.contains(QStringLiteral("openblas")), qPrintable(blas_file));
}

void AboutLicencesTest::the_about_box_lists_the_table() {
  kvchat::test::ChatFixture fixture;
  QVERIFY(fixture.open(kvchat::test::greedy_chat_settings(8)));
  kvchat::ui::MainWindow window(fixture.controller());
  QMessageBox* about = window.openAboutDialog();
  QVERIFY(about);
  const QString text = about->text();
  for (const ThirdPartyLibrary& library : kvchat::app::third_party_libraries())
    QVERIFY2(text.contains(QStringLiteral("%1 \u2014 %2").arg(library.name, library.licence).toHtmlEscaped()),
             qPrintable(library.name + " is not in: " + text));
  for (const QString& line :
       {QStringLiteral("Qt Charts \u2014 GPL-3.0-only"), QStringLiteral("cpp-httplib \u2014 MIT"),
        QStringLiteral("xxHash \u2014 BSD-2-Clause"), QStringLiteral("OpenBLAS \u2014 BSD-3-Clause (through LibTorch)"),
        QStringLiteral("OpenSSL \u2014 Apache-2.0 (through cpp-httplib)"),
        QStringLiteral("LibTorch \u2014 BSD-3-Clause"), QStringLiteral("SQLite \u2014 public domain")})
    QVERIFY2(text.contains(line), qPrintable(line));
  about->accept();
}

KVCHAT_TEST_MAIN(AboutLicencesTest)

}  // namespace ui_test_about_licences

#include "test_about_licences.moc"
