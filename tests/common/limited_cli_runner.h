#pragma once
// Runs the built kvchat-cli as a child process the way a hostile input should meet it: 2 GiB of
// address space and a few seconds of CPU (setrlimit in the child), a wall-clock kill for blocking
// hangs, and the CPU time the child used measured from the kernel's accounting of reaped children.
// CPU time rather than wall time, so that a busy machine does not turn a fast case into a slow one.
#include <sys/resource.h>

#include <QProcess>
#include <QProcessEnvironment>
#include <QStringList>
#include <string>

#include "common/sanitized_build.h"
#include "common/test_paths.h"

namespace kvchat::test {

struct LimitedCliResult {
  bool started = false;
  bool exited_normally = false;  // false: killed by a signal (a crash, RLIMIT_CPU, or the wall-clock kill)
  bool timed_out = false;        // the wall-clock kill
  int exit_code = -1;
  double cpu_seconds = 0.0;  // user + system time of the child
  std::string out;
  std::string err;
};

// A sanitized kvchat-cli cannot start under an address-space cap (its shadow memory reserves terabytes):
// there it runs without one, and ASAN_OPTIONS' max_allocation_size_mb (scripts/test-sanitize.sh, inherited
// by the child) fails any single allocation past the same 2 GiB instead.
constexpr rlim_t kChildAddressSpaceBytes = rlim_t{2} << 30;
constexpr rlim_t kChildCpuSeconds = static_cast<rlim_t>(6 * kSanitizedCpuFactor);
constexpr int kChildWallClockMs = 30000;

inline double children_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_CHILDREN, &usage);
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

// Children must run one at a time: the CPU time is the growth of RUSAGE_CHILDREN while this one ran.
inline LimitedCliResult run_limited_cli(const QStringList& arguments, const std::string& input = {}) {
  QProcess process;
  QProcessEnvironment environment = QProcessEnvironment::systemEnvironment();
  // The test environment already sets it; without it the program re-executes itself once (process_setup.h),
  // which would count its start-up twice.
  environment.insert(QStringLiteral("OMP_WAIT_POLICY"), QStringLiteral("PASSIVE"));
  process.setProcessEnvironment(environment);
  process.setChildProcessModifier([] {
    const rlimit address_space{kChildAddressSpaceBytes, kChildAddressSpaceBytes};
    const rlimit cpu{kChildCpuSeconds, kChildCpuSeconds};
    if (!kSanitizedBuild) setrlimit(RLIMIT_AS, &address_space);
    setrlimit(RLIMIT_CPU, &cpu);
  });
  LimitedCliResult result;
  const double cpu_before = children_cpu_seconds();
  process.start(QString::fromStdString(build_dir()) + QStringLiteral("/kvchat-cli"), arguments);
  if (!process.waitForStarted(30000)) {
    result.err = "cannot start kvchat-cli: " + process.errorString().toStdString();
    return result;
  }
  result.started = true;
  process.write(input.data(), static_cast<qint64>(input.size()));
  process.closeWriteChannel();
  if (!process.waitForFinished(kChildWallClockMs)) {
    result.timed_out = true;
    process.kill();
    process.waitForFinished(10000);
  }
  result.cpu_seconds = children_cpu_seconds() - cpu_before;
  result.out = process.readAllStandardOutput().toStdString();
  result.err = process.readAllStandardError().toStdString();
  result.exited_normally = process.exitStatus() == QProcess::NormalExit && !result.timed_out;
  result.exit_code = result.exited_normally ? process.exitCode() : -1;
  return result;
}

}  // namespace kvchat::test
