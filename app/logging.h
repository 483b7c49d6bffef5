#pragma once
// Logging for the app and the engine: spdlog to stderr and to a rotating file in the app-data folder.
#include <QString>

namespace kvchat::app {

// Installs the default spdlog logger: stderr (warnings, or everything with verbose) plus
// `<log_directory>/kvchat.log` rotating at 5 MiB x 3 files. Returns the log file's path
// ("" if the folder could not be created; logging then goes to stderr only).
QString setup_logging(const QString& log_directory, bool verbose);

// The platform's app-data folder for kvchat (QStandardPaths::AppDataLocation), created if missing.
QString app_data_directory();

}  // namespace kvchat::app
