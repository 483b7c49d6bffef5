#pragma once
// Runs the built kvchat-cli as a child process and captures what it prints.
#include <QProcess>
#include <QStringList>
#include <string>

#include "common/test_paths.h"

namespace kvchat::test {

struct CliResult {
  int exit_code = -1;  // -1: did not start, crashed or timed out
  std::string out;
  std::string err;
};

inline CliResult run_cli(const QStringList& arguments, const std::string& input = {}, int timeout_ms = 300000) {
  const QString program = QString::fromStdString(build_dir()) + QStringLiteral("/kvchat-cli");
  QProcess process;
  process.start(program, arguments);
  CliResult result;
  if (!process.waitForStarted(30000)) {
    result.err = QStringLiteral("cannot start %1: %2").arg(program, process.errorString()).toStdString();
    return result;
  }
  process.write(input.data(), static_cast<qint64>(input.size()));
  process.closeWriteChannel();
  if (!process.waitForFinished(timeout_ms)) process.kill();
  process.waitForFinished(5000);
  result.out = process.readAllStandardOutput().toStdString();
  result.err = process.readAllStandardError().toStdString();
  result.exit_code = process.exitStatus() == QProcess::NormalExit ? process.exitCode() : -1;
  return result;
}

}  // namespace kvchat::test
