// The main() of each test group's program: runs the one suite named by the first argument.
// See tests/common/test_suite.h.
#include <QCoreApplication>
#include <QFile>
#include <QTemporaryDir>
#include <QXmlStreamReader>
#include <QtTest>
#ifdef QT_WIDGETS_LIB
#include <QApplication>
#endif

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "common/test_suite.h"

namespace kvchat::test {
namespace {

struct Suite {
  const char* source_file;
  SuiteApplication application;
  SuiteFactory factory;
  SuiteMain main;
};

std::map<std::string, Suite>& registry() {
  static std::map<std::string, Suite> suites;
  return suites;
}

std::string& running_suite() {
  static std::string name;
  return name;
}

// tests/engine/test_session.cpp -> engine_test_session: the group's folder and the file's stem.
std::string suite_name_of(const std::string& source_file) {
  const size_t slash = source_file.find_last_of('/');
  const size_t group_slash =
      slash == std::string::npos || slash == 0 ? std::string::npos : source_file.find_last_of('/', slash - 1);
  const std::string file = source_file.substr(slash == std::string::npos ? 0 : slash + 1);
  const std::string stem = file.substr(0, file.find_last_of('.'));
  const size_t group_begin = group_slash == std::string::npos ? 0 : group_slash + 1;
  const std::string group =
      slash == std::string::npos ? std::string() : source_file.substr(group_begin, slash - group_begin);
  return group.empty() ? stem : group + "_" + stem;
}

// ctest's SKIP_RETURN_CODE for every suite (tests/CMakeLists.txt): a suite that skipped any case (no
// AVX-512 here, npm unreachable, a sanitized build) shows as skipped, not passed, and says what it skipped.
constexpr int kSkippedReturnCode = 77;

// The skip incidents of a run, from Qt Test's XML log: each as "function(tag): why".
QStringList skipped_cases(const QString& xml_log) {
  QFile file(xml_log);
  if (!file.open(QIODevice::ReadOnly)) return {};
  QXmlStreamReader xml(&file);
  QStringList skipped;
  QString function, tag;
  bool in_skip = false;
  while (!xml.atEnd()) {
    xml.readNext();
    if (xml.isStartElement() && xml.name() == QLatin1String("TestFunction"))
      function = xml.attributes().value(QLatin1String("name")).toString();
    if (xml.isStartElement() && xml.name() == QLatin1String("Incident")) {
      in_skip = xml.attributes().value(QLatin1String("type")) == QLatin1String("skip");
      tag.clear();
    }
    if (in_skip && xml.isStartElement() && xml.name() == QLatin1String("DataTag")) tag = xml.readElementText();
    if (in_skip && xml.isStartElement() && xml.name() == QLatin1String("Description")) {
      skipped << QStringLiteral("%1%2: %3")
                     .arg(function, tag.isEmpty() ? QString() : "(" + tag + ")", xml.readElementText());
      in_skip = false;
    }
  }
  return skipped;
}

bool has_output_option(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "-o") return true;
  return false;
}

int run_suite(const Suite& suite, int argc, char** argv) {
  std::unique_ptr<QCoreApplication> application;
  if (suite.application == SuiteApplication::core) {
    application = std::make_unique<QCoreApplication>(argc, argv);
  } else if (suite.application == SuiteApplication::gui) {
#ifdef QT_WIDGETS_LIB
    application = std::make_unique<QApplication>(argc, argv);
#else
    application = std::make_unique<QCoreApplication>(argc, argv);
#endif
  }
  if (application) application->setAttribute(Qt::AA_Use96Dpi, true);
  std::unique_ptr<QObject> test_object = suite.factory();
#ifdef QT_TESTCASE_BUILDDIR
  QTest::setMainSourcePath(suite.source_file, QT_TESTCASE_BUILDDIR);
#else
  QTest::setMainSourcePath(suite.source_file);
#endif
  // The usual text on stdout, and an XML log beside it to learn what was skipped (unless the caller chose
  // its own outputs).
  QTemporaryDir log_folder;
  std::vector<char*> arguments(argv, argv + argc);
  std::string text_output = "-,txt", xml_output;
  const bool log_skips = !has_output_option(argc, argv) && log_folder.isValid();
  if (log_skips) {
    xml_output = log_folder.filePath(QStringLiteral("log.xml")).toStdString() + ",xml";
    for (char* option : {const_cast<char*>("-o"), text_output.data(), const_cast<char*>("-o"), xml_output.data()})
      arguments.push_back(option);
  }
  const int status = QTest::qExec(test_object.get(), static_cast<int>(arguments.size()), arguments.data());
  test_object.reset();  // before the application, as a QTEST_MAIN's stack object would be
  if (!log_skips || status != 0) return status;
  const QStringList skipped = skipped_cases(log_folder.filePath(QStringLiteral("log.xml")));
  if (skipped.isEmpty()) return status;
  std::fprintf(stdout, "SKIPPED %lld case(s); everything else passed:\n", static_cast<long long>(skipped.size()));
  for (const QString& line : skipped) std::fprintf(stdout, "  %s\n", qPrintable(line));
  std::fflush(stdout);
  return kSkippedReturnCode;
}

void print_suites(std::FILE* stream) {
  for (const auto& [name, suite] : registry()) std::fprintf(stream, "  %s\n", name.c_str());
}

}  // namespace

SuiteRegistration::SuiteRegistration(const char* source_file, SuiteApplication application, SuiteFactory factory,
                                     SuiteMain main) {
  registry()[suite_name_of(source_file)] = Suite{source_file, application, factory, main};
}

QString current_suite_name() { return QString::fromStdString(running_suite()); }

}  // namespace kvchat::test

int main(int argc, char** argv) {
  using namespace kvchat::test;
  if (argc < 2 || argv[1][0] == '-') {
    std::fprintf(argc < 2 ? stderr : stdout, "usage: %s SUITE [Qt Test arguments]\nsuites:\n", argv[0]);
    print_suites(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const auto found = registry().find(argv[1]);
  if (found == registry().end()) {
    std::fprintf(stderr, "%s: no suite named '%s'; suites:\n", argv[0], argv[1]);
    print_suites(stderr);
    return 2;
  }
  running_suite() = found->first;
  // The suite sees argv without its name, as its own program would have.
  std::vector<char*> arguments{argv[0]};
  for (int i = 2; i < argc; ++i) arguments.push_back(argv[i]);
  int suite_argc = static_cast<int>(arguments.size());
  arguments.push_back(nullptr);
  const Suite& suite = found->second;
  if (suite.main) return suite.main(suite_argc, arguments.data());
  return run_suite(suite, suite_argc, arguments.data());
}
