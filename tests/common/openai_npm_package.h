#pragma once
// The official `openai` npm package, pinned, installed once per build folder so later runs need no registry.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <QDir>
#include <QFile>
#include <QProcess>
#include <QString>
#include <nlohmann/json.hpp>

#include "common/test_paths.h"

namespace kvchat::test {

inline constexpr const char* kOpenAiNpmVersion = "4.95.0";

inline QString openai_npm_package_dir() { return QString::fromStdString(build_dir()) + "/npm-openai"; }

// Installs the package into openai_npm_package_dir() unless that version is already there. Returns why it
// cannot be had (no npm, no registry): the caller skips with it. Empty when the package is ready.
inline QString install_openai_npm_package() {
  const QString package_dir = openai_npm_package_dir();
  // Suites that run at the same time (ctest -j) install one after the other: npm writing the same folder
  // twice at once leaves it half-written for the other.
  QDir().mkpath(package_dir);
  const int lock =
      ::open((package_dir + "/.install-lock").toLocal8Bit().constData(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (lock < 0) return "cannot create " + package_dir + "/.install-lock";
  struct LockHolder {
    int fd;
    ~LockHolder() { ::close(fd); }  // closing releases the lock
  } holder{lock};
  ::flock(lock, LOCK_EX);
  QFile installed(package_dir + "/node_modules/openai/package.json");
  if (installed.open(QIODevice::ReadOnly) &&
      nlohmann::json::parse(installed.readAll().toStdString(), nullptr, false).value("version", "") ==
          kOpenAiNpmVersion)
    return {};
  QProcess npm;
  npm.start("npm",
            {"install", "--no-audit", "--no-fund", "--prefix", package_dir, QString("openai@") + kOpenAiNpmVersion});
  if (!npm.waitForStarted(30000)) return "npm is not installed";
  npm.waitForFinished(300000);
  if (npm.exitStatus() != QProcess::NormalExit || npm.exitCode() != 0)
    return QString("npm cannot install openai@%1: %2")
        .arg(kOpenAiNpmVersion, QString::fromUtf8(npm.readAllStandardError().right(400)));
  return {};
}

}  // namespace kvchat::test
