#pragma once
// What the Models dialog knows about models on disk, without loading any weights: a model's format, size,
// architecture and (GGUF) quantization from its metadata alone (the GGUF header, or config.json), the
// recently loaded models and the folders to look for models in (both kept in the settings), and a bounded
// scan of those folders.
#include <QSettings>
#include <QString>
#include <QStringList>

#include <atomic>

namespace kvchat::app {

struct ModelDescription {
  QString path;           // a .gguf file or a model folder
  QString name;           // the file's or the folder's name
  QString format;         // "GGUF", "Hugging Face folder" or "embedded" (the stories260K shipped with the app)
  qint64 size_bytes = 0;  // on disk: the file, or the folder's files (not its subfolders)
  QString architecture;   // GGUF: general.architecture; else config.json's model_type (and architectures[0])
  QString quantization;   // GGUF: its file type ("Q4_K_M", "Q8_0", "F32"); "" for the others
  bool missing = false;   // nothing is there any more
  QString error;          // why its metadata cannot be read (a damaged file); "" when it was read
};

// Never throws: a missing path or damaged file is described as such (missing, error).
ModelDescription describe_model(const QString& path);

// The recently loaded models, most recent first: `path` put first (an earlier entry of the same path removed),
// the list cut to kMaxRecentModels.
inline constexpr int kMaxRecentModels = 12;
QStringList with_recent_model(QStringList recent, const QString& path);
// Settings "models/recent" and "models/folders" (string lists).
QStringList load_recent_models(QSettings& settings);
void save_recent_models(QSettings& settings, const QStringList& recent);
QStringList load_model_folders(QSettings& settings);
void save_model_folders(QSettings& settings, const QStringList& folders);

// The models in `folders`: *.gguf files, and Hugging Face folders (a config.json beside *.safetensors files),
// at most max_depth folders down, at most kMaxScanResults of them, sorted by path. A Hugging Face folder is not
// looked into further. Links to folders are not followed (no cycles). Stops early, with what it found, once
// `stop` is set.
inline constexpr int kModelScanDepth = 4;
inline constexpr int kMaxScanResults = 500;
QStringList scan_model_folders(const QStringList& folders, int max_depth = kModelScanDepth,
                               const std::atomic<bool>* stop = nullptr);

}  // namespace kvchat::app
