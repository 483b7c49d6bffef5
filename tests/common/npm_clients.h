#pragma once
// Client libraries an application talks to `kvchat-cli serve` with, pinned npm packages installed once per build
// folder so later runs need no registry: the official `openai` SDK, the Vercel AI SDK (`ai` with its
// OpenAI-compatible provider), LangChain's OpenAI chat model, and zod for their schemas.
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

// name, version
inline const std::vector<std::pair<QString, QString>>& npm_client_packages() {
  static const std::vector<std::pair<QString, QString>> packages = {{"openai", "7.60.0"},
                                                                    {"ai", "7.0.185"},
                                                                    {"@ai-sdk/openai-compatible", "3.0.97"},
                                                                    {"zod", "4.6.7"},
                                                                    {"@langchain/openai", "1.6.0"},
                                                                    {"@langchain/core", "1.4.0"}};
  return packages;
}

inline QString npm_clients_dir() { return QString::fromStdString(build_dir()) + "/npm-agent-clients"; }

// Installs the packages into npm_clients_dir() unless each is there at its version. Returns why they cannot be
// had (no npm, no registry): the caller skips with it. Empty when the packages are ready.
inline QString install_npm_clients() {
  const QString package_dir = npm_clients_dir();
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
  for (const auto& [name, version] : npm_client_packages()) {
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

}  // namespace kvchat::test
