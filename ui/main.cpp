// kvchat, the desktop program's entry point: the composition root that wires ui/ onto app/.
#include <spdlog/spdlog.h>

#include <QApplication>
#include <QCommandLineParser>
#include <QDockWidget>
#include <QIcon>
#include <QMessageBox>
#include <QSettings>
#include <QTimer>

#include <exception>
#include <memory>

#include "app/chat/chat_controller.h"
#include "app/logging.h"
#include "app/store/conversation_store.h"
#include "engine/compute/process_setup.h"
#include "ui/main_window.h"

namespace {

// --send / --screenshot: sends the given messages one after another once the model is loaded, then saves
// a picture of the window (for the README and for checking the window on a machine without a screen).
// With then_cache_off, the KV cache is switched off after the first message (both lines in the chart).
void script_session(kvchat::app::ChatController* controller, kvchat::ui::MainWindow* window, QStringList messages,
                    const QString& screenshot_path, bool then_cache_off) {
  auto remaining = std::make_shared<QStringList>(std::move(messages));
  auto sent = std::make_shared<int>(0);
  auto next = std::make_shared<std::function<void()>>();
  *next = [=] {
    if (!remaining->isEmpty()) {
      if (then_cache_off && (*sent)++ == 1) {
        kvchat::app::ChatSettings settings = controller->settings();
        settings.kv_cache_enabled = false;
        controller->applySettings(settings);
      }
      controller->send(remaining->takeFirst());
      return;
    }
    if (screenshot_path.isEmpty()) return;
    // Let the last reply's Markdown render and the view scroll before taking the picture.
    QTimer::singleShot(400, window, [=] {
      const bool saved = window->grab().save(screenshot_path);
      spdlog::info("screenshot {} {}", screenshot_path.toStdString(), saved ? "saved" : "NOT saved");
      QApplication::exit(saved ? 0 : 1);
    });
  };
  QObject::connect(
      &controller->backendHost(), &kvchat::app::BackendHost::modelLoaded, window, [=] { (*next)(); },
      Qt::SingleShotConnection);
  QObject::connect(controller, &kvchat::app::ChatController::generatingChanged, window, [=](bool generating) {
    if (!generating) QTimer::singleShot(100, window, [=] { (*next)(); });
  });
}

}  // namespace

int main(int argc, char** argv) {
  kvchat::ensure_passive_openmp_threads(argv);
  kvchat::keep_freed_memory_for_reuse();
  QApplication application(argc, argv);
  QApplication::setApplicationName("kvchat");
  QApplication::setApplicationVersion(KVCHAT_VERSION);
  QApplication::setWindowIcon(QIcon(QStringLiteral(":/icons/kvchat.png")));
  QApplication::setDesktopFileName(QStringLiteral("kvchat"));

  QCommandLineParser parser;
  parser.setApplicationDescription("Local Llama chat with a visible KV cache");
  parser.addHelpOption();
  parser.addVersionOption();
  QCommandLineOption verbose_option("verbose", "Log debug output.");
  QCommandLineOption model_option("model",
                                  "Model to load: a Hugging Face directory or a .gguf file (default: the settings', "
                                  "else the embedded stories260K).",
                                  "DIR|FILE.gguf");
  QCommandLineOption db_option("db", "Conversation database (default: kvchat.sqlite3 in the app-data folder).", "PATH");
  QCommandLineOption settings_option("settings", "Read and save settings in this INI file instead of the user's.",
                                     "FILE");
  QCommandLineOption send_option("send", "Send this message once the model is loaded (repeatable).", "TEXT");
  QCommandLineOption screenshot_option("screenshot", "After the --send messages, save the window as PNG and quit.",
                                       "PATH");
  QCommandLineOption size_option("window-size", "Open the window at this size.", "WIDTHxHEIGHT");
  QCommandLineOption chart_option("chart", "Show the decode-time chart.");
  QCommandLineOption cache_off_option(
      "then-cache-off", "Switch the KV cache off after the first --send message (saved in the settings).");
  QCommandLineOption cache_dir_option(
      "cache-dir", "Keep KV snapshots in this folder (default: kv-snapshots in the app-data folder, or the settings').",
      "DIR");
  parser.addOptions({verbose_option, model_option, db_option, settings_option, send_option, screenshot_option,
                     size_option, chart_option, cache_off_option, cache_dir_option});
  parser.process(application);

  const QString log_path = kvchat::app::setup_logging(kvchat::app::app_data_directory(), parser.isSet(verbose_option));
  spdlog::info("kvchat {} starting (log {})", KVCHAT_VERSION, log_path.toStdString());

  std::unique_ptr<QSettings> settings =
      parser.isSet(settings_option)
          ? std::make_unique<QSettings>(parser.value(settings_option), QSettings::IniFormat)
          : std::make_unique<QSettings>(QSettings::IniFormat, QSettings::UserScope, "kvchat", "kvchat");
  const QString database_path =
      parser.isSet(db_option) ? parser.value(db_option) : kvchat::app::ConversationStore::default_database_path();

  std::unique_ptr<kvchat::app::ChatController> controller;
  try {
    controller = std::make_unique<kvchat::app::ChatController>(database_path, settings.get());
  } catch (const std::exception& error) {
    spdlog::critical("cannot open the conversation database {}: {}", database_path.toStdString(), error.what());
    QMessageBox::critical(nullptr, "kvchat", QString("Cannot open the conversation database:\n%1").arg(error.what()));
    return 1;
  }

  if (parser.isSet(cache_dir_option)) controller->setSnapshotDirectoryOverride(parser.value(cache_dir_option));

  kvchat::ui::MainWindow window(controller.get());
  if (parser.isSet(size_option)) {
    const QStringList size = parser.value(size_option).split(QLatin1Char('x'));
    const int width = size.value(0).toInt(), height = size.value(1).toInt();
    if (size.size() != 2 || width <= 0 || height <= 0) {
      spdlog::critical("--window-size wants WIDTHxHEIGHT (e.g. 800x500), not '{}'",
                       parser.value(size_option).toStdString());
      return 2;
    }
    window.resize(width, height);
  }
  if (parser.isSet(chart_option)) window.decodeChartDock()->show();
  if (parser.isSet(send_option) || parser.isSet(screenshot_option))
    script_session(controller.get(), &window, parser.values(send_option), parser.value(screenshot_option),
                   parser.isSet(cache_off_option));
  window.show();
  controller->loadModel(parser.value(model_option));  // empty = the settings' model or the embedded one
  const int result = application.exec();
  controller.reset();  // stops the engine thread before the window goes
  return result;
}
