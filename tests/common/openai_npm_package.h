#pragma once
// The official `openai` npm package, pinned, installed once per build folder so later runs need no registry.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <QDir>
#include <QFile>
#include <QProcess>
#include <QString>
#include <QStringList>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "common/test_paths.h"

namespace kvchat::test {

inline constexpr const char* kOpenAiNpmVersion = "4.95.0";

inline QString openai_npm_package_dir() { return QString::fromStdString(build_dir()) + "/npm-openai"; }

// Installs `packages` (name, version) into `package_dir` unless each is there at its version. Returns why they
// cannot be had (no npm, no registry): the caller skips with it. Empty when the packages are ready.
inline QString install_npm_packages(const QString& package_dir,
                                    const std::vector<std::pair<QString, QString>>& packages) {
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
  bool installed = true;
  QStringList wanted;
  for (const auto& [name, version] : packages) {
    wanted << name + "@" + version;
    QFile manifest(package_dir + "/node_modules/" + name + "/package.json");
    if (!manifest.open(QIODevice::ReadOnly) ||
        nlohmann::json::parse(manifest.readAll().toStdString(), nullptr, false).value("version", "") !=
            version.toStdString())
      installed = false;
  }
  if (installed) return {};
  QProcess npm;
  npm.start("npm", QStringList{"install", "--no-audit", "--no-fund", "--prefix", package_dir} + wanted);
  if (!npm.waitForStarted(30000)) return "npm is not installed";
  npm.waitForFinished(300000);
  if (npm.exitStatus() != QProcess::NormalExit || npm.exitCode() != 0)
    return QString("npm cannot install %1: %2")
        .arg(wanted.join(' '), QString::fromUtf8(npm.readAllStandardError().right(400)));
  return {};
}

// Installs the package into openai_npm_package_dir() unless that version is already there.
inline QString install_openai_npm_package() {
  return install_npm_packages(openai_npm_package_dir(), {{"openai", kOpenAiNpmVersion}});
}

}  // namespace kvchat::test
