#include "app/model_catalog.h"

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include <QDir>
#include <QDirIterator>
#include <QFile>
#include <QFileInfo>

#include <algorithm>
#include <exception>
#include <string>

#include "app/model_locator.h"
#include "engine/gguf/gguf_file.h"
#include "engine/model/gguf_model_config.h"
#include "engine/model/model_config.h"

namespace kvchat::app {

namespace {

const QString kRecentKey = QStringLiteral("models/recent");
const QString kFoldersKey = QStringLiteral("models/folders");

bool is_gguf_path(const QString& path) { return path.endsWith(QLatin1String(".gguf"), Qt::CaseInsensitive); }

bool is_hugging_face_folder(const QDir& folder) {
  return folder.exists(QStringLiteral("config.json")) &&
         !folder.entryList({QStringLiteral("*.safetensors")}, QDir::Files).isEmpty();
}

// config.json's architectures[0] ("LlamaForCausalLM"), "" when it has none; the engine's reader has read the
// rest (and refused a file it cannot use).
QString first_listed_architecture(const QString& config_path) {
  QFile file(config_path);
  if (!file.open(QIODevice::ReadOnly)) return {};
  const nlohmann::json json = nlohmann::json::parse(file.readAll().toStdString(), nullptr, /*allow_exceptions=*/false);
  if (!json.is_object() || !json.contains("architectures") || !json["architectures"].is_array() ||
      json["architectures"].empty() || !json["architectures"][0].is_string())
    return {};
  return QString::fromStdString(json["architectures"][0].get<std::string>());
}

}  // namespace

ModelDescription describe_model(const QString& path) {
  ModelDescription description;
  description.path = path;
  const QFileInfo info(path);
  description.name = info.fileName();
  const bool gguf = is_gguf_path(path) || info.isFile();
  description.format = gguf ? QStringLiteral("GGUF")
                       : QDir::cleanPath(path) == QDir::cleanPath(embedded_model_directory())
                           ? QStringLiteral("embedded")
                           : QStringLiteral("Hugging Face folder");
  if (!info.exists()) {
    description.missing = true;
    description.error = QStringLiteral("not found");
    return description;
  }
  try {
    if (gguf) {
      description.size_bytes = info.size();
      // Opening validates the header and the tensor table only: no tensor data is read.
      const GgufFile file(path.toStdString());
      if (file.has_metadata("general.architecture"))
        description.architecture = QString::fromStdString(std::string(file.get_string("general.architecture")));
      description.quantization = QString::fromStdString(gguf_file_type_name(file));
    } else {
      const QDir folder(path);
      for (const QFileInfo& entry : folder.entryInfoList(QDir::Files)) description.size_bytes += entry.size();
      const ModelConfig config = ModelConfig::from_directory(path.toStdString());
      description.architecture = QString::fromStdString(config.model_type);
      const QString listed = first_listed_architecture(folder.filePath(QStringLiteral("config.json")));
      if (!listed.isEmpty()) description.architecture += QStringLiteral(" (%1)").arg(listed);
    }
  } catch (const std::exception& error) {
    description.error = QString::fromStdString(error.what());
    spdlog::warn("model {}: cannot read its metadata: {}", path.toStdString(), error.what());
  }
  return description;
}

QStringList with_recent_model(QStringList recent, const QString& path) {
  const QString key = QDir::cleanPath(path);
  recent.erase(
      std::remove_if(recent.begin(), recent.end(), [&](const QString& entry) { return QDir::cleanPath(entry) == key; }),
      recent.end());
  recent.prepend(key);
  while (recent.size() > kMaxRecentModels) recent.removeLast();
  return recent;
}

QStringList load_recent_models(QSettings& settings) {
  QStringList recent;
  // Merged and capped again: the file may have been edited by hand.
  const QStringList stored = settings.value(kRecentKey).toStringList();
  for (auto it = stored.crbegin(); it != stored.crend(); ++it)
    if (!it->trimmed().isEmpty()) recent = with_recent_model(recent, *it);
  return recent;
}

void save_recent_models(QSettings& settings, const QStringList& recent) {
  settings.setValue(kRecentKey, recent);
  settings.sync();
}

QStringList load_model_folders(QSettings& settings) { return settings.value(kFoldersKey).toStringList(); }

void save_model_folders(QSettings& settings, const QStringList& folders) {
  settings.setValue(kFoldersKey, folders);
  settings.sync();
}

QStringList scan_model_folders(const QStringList& folders, int max_depth, const std::atomic<bool>* stop) {
  QStringList found;
  struct Pending {
    QString path;
    int depth = 0;
  };
  QList<Pending> pending;
  for (const QString& folder : folders) pending.append({QDir::cleanPath(folder), 0});
  while (!pending.isEmpty() && found.size() < kMaxScanResults) {
    if (stop && stop->load()) break;
    const Pending current = pending.takeFirst();
    const QDir folder(current.path);
    if (!folder.exists()) continue;
    if (is_hugging_face_folder(folder)) {
      found << current.path;
      continue;
    }
    for (const QFileInfo& entry :
         folder.entryInfoList({QStringLiteral("*.gguf"), QStringLiteral("*.GGUF")}, QDir::Files | QDir::Readable))
      if (found.size() < kMaxScanResults) found << entry.absoluteFilePath();
    if (current.depth >= max_depth) continue;
    for (const QFileInfo& entry : folder.entryInfoList(QDir::Dirs | QDir::NoDotAndDotDot | QDir::Readable, QDir::Name))
      if (!entry.isSymLink()) pending.append({entry.absoluteFilePath(), current.depth + 1});
  }
  found.removeDuplicates();
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace kvchat::app
