// The main() of each test group's program: runs the one suite named by the first argument.
// See tests/common/test_suite.h.
#include <QCoreApplication>
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
  const size_t group_slash = slash == std::string::npos || slash == 0 ? std::string::npos
                                                                       : source_file.find_last_of('/', slash - 1);
  const std::string file = source_file.substr(slash == std::string::npos ? 0 : slash + 1);
  const std::string stem = file.substr(0, file.find_last_of('.'));
  const size_t group_begin = group_slash == std::string::npos ? 0 : group_slash + 1;
  const std::string group =
      slash == std::string::npos ? std::string() : source_file.substr(group_begin, slash - group_begin);
  return group.empty() ? stem : group + "_" + stem;
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
  const int status = QTest::qExec(test_object.get(), argc, argv);
  test_object.reset();  // before the application, as a QTEST_MAIN's stack object would be
  return status;
}

void print_suites(std::FILE* stream) {
  for (const auto& [name, suite] : registry()) std::fprintf(stream, "  %s\n", name.c_str());
}

}  // namespace

SuiteRegistration::SuiteRegistration(const char* source_file, SuiteApplication application,
                                     SuiteFactory factory, SuiteMain main) {
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
