#include "app/model_locator.h"

#include <QCoreApplication>
#include <QDir>
#include <QFileInfo>
#include <QStringList>

namespace kvchat::app {

QString embedded_model_directory() {
  QStringList candidates;
  if (QCoreApplication::instance()) {
    const QString executable_directory = QCoreApplication::applicationDirPath();
    candidates << executable_directory + "/models/stories260K"
               << executable_directory + "/../share/kvchat/models/stories260K";
  }
  candidates << QStringLiteral(KVCHAT_INSTALLED_MODEL_DIR) << QStringLiteral(KVCHAT_SOURCE_MODEL_DIR);
  for (const QString& candidate : candidates) {
    if (QFileInfo::exists(candidate + "/config.json")) return QDir::cleanPath(candidate);
  }
  return QStringLiteral(KVCHAT_SOURCE_MODEL_DIR);
}

QString resolve_model_path(const QString& configured) {
  return configured.trimmed().isEmpty() ? embedded_model_directory() : configured;
}

}  // namespace kvchat::app
