#pragma once
// Each tests/<group>/test_*.cpp is one Qt Test suite; all suites of a group are linked into one program
// (tests/common/suite_main.cpp), and ctest runs that program once per suite:
//     kvchat_<group>_tests <group>_test_<name> [Qt Test arguments]
// The suite's name comes from its file (tests/engine/test_session.cpp -> engine_test_session).
// One program per group rather than one per suite: each program paid Qt's moc step and a link against
// LibTorch, a third of the whole build.
//
// A suite ends with one of the macros below instead of Qt Test's QTEST_*_MAIN; they choose the same
// application object Qt Test's macros would (none, QCoreApplication, QApplication for widget suites).
#include <QtTest/qtestcase.h>
#include <QObject>
#include <QString>

#include <memory>

namespace kvchat::test {

enum class SuiteApplication { none, core, gui };

using SuiteFactory = std::unique_ptr<QObject> (*)();
using SuiteMain = int (*)(int argc, char** argv);

// Registers a suite at static-initialization time. `main` replaces the default run for suites that
// do more than Qt Test's main (a child-process mode, an address-space cap before anything runs).
struct SuiteRegistration {
  SuiteRegistration(const char* source_file, SuiteApplication application, SuiteFactory factory,
                    SuiteMain main = nullptr);
};

// The running suite's name: a suite that starts its own program as a child passes it as the first argument.
QString current_suite_name();

}  // namespace kvchat::test

#define KVCHAT_TEST_SUITE_WITH_APPLICATION_(TestObject, application)                     \
  static const ::kvchat::test::SuiteRegistration kvchat_suite_registration_##TestObject( \
      __FILE__, application, []() -> std::unique_ptr<QObject> {                          \
        QTest::Internal::callInitMain<TestObject>();                                     \
        return std::make_unique<TestObject>();                                           \
      });

#define KVCHAT_TEST_APPLESS_MAIN(TestObject) \
  KVCHAT_TEST_SUITE_WITH_APPLICATION_(TestObject, ::kvchat::test::SuiteApplication::none)
#define KVCHAT_TEST_GUILESS_MAIN(TestObject) \
  KVCHAT_TEST_SUITE_WITH_APPLICATION_(TestObject, ::kvchat::test::SuiteApplication::core)
#define KVCHAT_TEST_MAIN(TestObject) \
  KVCHAT_TEST_SUITE_WITH_APPLICATION_(TestObject, ::kvchat::test::SuiteApplication::gui)
// A suite with its own main(argc, argv): the program calls it with the suite's name removed from argv.
#define KVCHAT_TEST_CUSTOM_MAIN(function)                                               \
  static const ::kvchat::test::SuiteRegistration kvchat_suite_registration_custom_main( \
      __FILE__, ::kvchat::test::SuiteApplication::none, nullptr, function);
