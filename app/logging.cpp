#include "app/logging.h"

#include <spdlog/sinks/rotating_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <fcntl.h>

#include <cstdio>

#include <QDir>
#include <QStandardPaths>

#include "engine/gguf/mapped_file.h"

namespace kvchat::app {

QString app_data_directory() {
  QString directory = QStandardPaths::writableLocation(QStandardPaths::AppDataLocation);
  if (directory.isEmpty()) directory = QDir::homePath() + "/.local/share/kvchat";
  QDir().mkpath(directory);
  return directory;
}

QString setup_logging(const QString& log_directory, bool verbose) {
  std::vector<spdlog::sink_ptr> sinks;
  auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  console->set_level(verbose ? spdlog::level::debug : spdlog::level::warn);
  sinks.push_back(console);

  QString log_path;
  if (!log_directory.isEmpty() && QDir().mkpath(log_directory)) {
    log_path = QDir(log_directory).filePath("kvchat.log");
    try {
      auto file = std::make_shared<spdlog::sinks::rotating_file_sink_mt>(log_path.toStdString(), 5 * 1024 * 1024, 3);
      file->set_level(verbose ? spdlog::level::debug : spdlog::level::info);
      sinks.push_back(file);
      // A model file truncated during a turn ends the process from a signal handler, which cannot use
      // spdlog: it writes its report to this descriptor as well as to stderr.
      set_fault_report_descriptor(::open(log_path.toLocal8Bit().constData(), O_WRONLY | O_APPEND | O_CLOEXEC));
    } catch (const spdlog::spdlog_ex& error) {
      std::fprintf(stderr, "kvchat: cannot open log file %s: %s\n", log_path.toLocal8Bit().constData(), error.what());
      log_path.clear();
    }
  }
  auto logger = std::make_shared<spdlog::logger>("kvchat", sinks.begin(), sinks.end());
  logger->set_level(verbose ? spdlog::level::debug : spdlog::level::info);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  return log_path;
}

}  // namespace kvchat::app
