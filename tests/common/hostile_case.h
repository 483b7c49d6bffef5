#pragma once
// One hostile-input case of kvchat-cli: run under limits (limited_cli_runner.h), its CPU time printed,
// then checked as a clear failure (a normal exit with the expected code and message) or a success, in
// both cases within kMaxCaseCpuSeconds of CPU.
#include <QStringList>
#include <QtTest>
#include <string>

#include "common/limited_cli_runner.h"
#include "common/sanitized_build.h"

namespace kvchat::test {

// Start-up (dynamic linking, LibTorch's static registrations) takes about half of it.
constexpr double kMaxCaseCpuSeconds = 2.0 * kSanitizedCpuFactor;
// The few cases whose legitimate work alone is over a second of CPU on a loaded 2-core machine: a
// render stopped by the 10^7-step budget, loading a 128k-token tokenizer.json, tokenizing 2 MB.
constexpr double kHeavyCaseCpuSeconds = 4.0 * kSanitizedCpuFactor;

inline LimitedCliResult run_case(const std::string& name, const QStringList& arguments, const std::string& input = {}) {
  LimitedCliResult result = run_limited_cli(arguments, input);
  qInfo("%s: %.2f s CPU, %s %d", name.c_str(), result.cpu_seconds,
        result.exited_normally ? "exit code" : "killed, exit code", result.exit_code);
  return result;
}

inline std::string describe(const LimitedCliResult& result) {
  return "exit code " + std::to_string(result.exit_code) + (result.exited_normally ? "" : " (killed or crashed)") +
         (result.timed_out ? " (wall-clock kill)" : "") + ", " + std::to_string(result.cpu_seconds) +
         " s CPU, stderr: " + result.err.substr(0, 2000);
}

// "" when `result` is a clear failure: a normal exit with `exit_code`, every fragment on stderr, CPU in budget.
inline std::string failure_mismatch(const LimitedCliResult& result, int exit_code, const QStringList& fragments,
                                    double cpu_budget = kMaxCaseCpuSeconds) {
  if (!result.exited_normally || result.exit_code != exit_code)
    return "expected exit code " + std::to_string(exit_code) + ", got " + describe(result);
  for (const QString& fragment : fragments)
    if (result.err.find(fragment.toStdString()) == std::string::npos)
      return "stderr lacks '" + fragment.toStdString() + "': " + describe(result);
  if (result.cpu_seconds > cpu_budget) return "over the CPU budget: " + describe(result);
  return {};
}

// "" when `result` is a success within the CPU budget.
inline std::string success_mismatch(const LimitedCliResult& result) {
  if (!result.exited_normally || result.exit_code != 0) return "expected success, got " + describe(result);
  if (result.cpu_seconds > kMaxCaseCpuSeconds) return "over the CPU budget: " + describe(result);
  return {};
}

}  // namespace kvchat::test

// Variadic so that a braced QStringList{"a", "b"} passes through the preprocessor whole.
#define KVCHAT_EXPECT_FAILURE(result, exit_code, ...)                                                  \
  do {                                                                                                 \
    const std::string problem_ = kvchat::test::failure_mismatch((result), (exit_code), (__VA_ARGS__)); \
    QVERIFY2(problem_.empty(), problem_.c_str());                                                      \
  } while (false)

#define KVCHAT_EXPECT_SUCCESS(result)                                      \
  do {                                                                     \
    const std::string problem_ = kvchat::test::success_mismatch((result)); \
    QVERIFY2(problem_.empty(), problem_.c_str());                          \
  } while (false)
