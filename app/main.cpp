// kvchat: the desktop program.
#include <spdlog/spdlog.h>

#include <QApplication>
#include <QCommandLineParser>
#include <QDir>
#include <QFileInfo>

#include "app/logging.h"
#include "ui/placeholder_window.h"

int main(int argc, char** argv) {
  QApplication application(argc, argv);
  QApplication::setApplicationName("kvchat");
  QApplication::setApplicationVersion(KVCHAT_VERSION);

  QCommandLineParser parser;
  parser.setApplicationDescription("Local Llama chat with a visible KV cache");
  parser.addHelpOption();
  parser.addVersionOption();
  QCommandLineOption verbose_option("verbose", "Log debug output.");
  QCommandLineOption model_option("model", "Model directory to load.", "DIR");
  parser.addOption(verbose_option);
  parser.addOption(model_option);
  parser.process(application);

  kvchat::app::setup_logging(kvchat::app::app_data_directory(), parser.isSet(verbose_option));
  QString model_directory = parser.value(model_option);
  if (model_directory.isEmpty()) model_directory = KVCHAT_SOURCE_MODEL_DIR;
  spdlog::info("kvchat {} starting, model {}", KVCHAT_VERSION, model_directory.toStdString());

  kvchat::ui::PlaceholderWindow window("Model: " + QFileInfo(model_directory).fileName() + "\n" + model_directory);
  window.show();
  return application.exec();
}
