#pragma once
// Runs the built kvchat-cli with its standard output on a pseudo-terminal, as a shell in a terminal
// window gives it (standard error on a pipe): `out` is exactly the bytes the terminal would have been
// sent (the terminal is raw, so nothing is translated on the way).
#include <fcntl.h>
#include <termios.h>
#include <unistd.h>

#include <QProcess>
#include <QStringList>
#include <cstdlib>
#include <string>

#include "common/cli_runner.h"
#include "common/test_paths.h"

namespace kvchat::test {

inline CliResult run_cli_on_terminal(const QStringList& arguments, int timeout_ms = 120000) {
  CliResult result;
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
  if (master < 0 || ::grantpt(master) != 0 || ::unlockpt(master) != 0) {
    result.err = "cannot open a pseudo-terminal";
    if (master >= 0) ::close(master);
    return result;
  }
  const std::string slave_name = ::ptsname(master);
  const int slave = ::open(slave_name.c_str(), O_RDWR | O_NOCTTY);
  termios raw{};
  if (slave < 0 || ::tcgetattr(slave, &raw) != 0) {
    result.err = "cannot open " + slave_name;
    ::close(master);
    return result;
  }
  ::cfmakeraw(&raw);
  ::tcsetattr(slave, TCSANOW, &raw);
  ::fcntl(master, F_SETFL, ::fcntl(master, F_GETFL) | O_NONBLOCK);

  QProcess process;
  process.setChildProcessModifier([slave] { ::dup2(slave, STDOUT_FILENO); });
  process.start(QString::fromStdString(build_dir()) + QStringLiteral("/kvchat-cli"), arguments);
  auto drain = [&] {
    char buffer[4096];
    for (ssize_t got; (got = ::read(master, buffer, sizeof buffer)) > 0;)
      result.out.append(buffer, static_cast<size_t>(got));
  };
  if (process.waitForStarted(30000)) {
    process.closeWriteChannel();
    // Read while it runs: a full terminal buffer would block the program's writes.
    for (int waited = 0; !process.waitForFinished(50) && waited < timeout_ms; waited += 50) drain();
    if (process.state() != QProcess::NotRunning) process.kill();
    process.waitForFinished(5000);
    drain();
    result.err = process.readAllStandardError().toStdString();
    result.exit_code = process.exitStatus() == QProcess::NormalExit ? process.exitCode() : -1;
  } else {
    result.err = "cannot start kvchat-cli: " + process.errorString().toStdString();
  }
  ::close(slave);
  ::close(master);
  return result;
}

}  // namespace kvchat::test
