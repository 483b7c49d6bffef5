#include "app/cli/store_access.h"

#include <QCoreApplication>
#include <QString>

namespace kvchat::cli {

void ensure_core_application() {
  if (QCoreApplication::instance()) return;
  // QCoreApplication keeps references to argc/argv: both must outlive it, hence static.
  static int argc = 1;
  static char name[] = "kvchat-cli";
  static char* argv[] = {name, nullptr};
  static QCoreApplication application(argc, argv);
}

std::unique_ptr<app::ConversationStore> open_existing_store(const std::string& path) {
  ensure_core_application();
  return std::make_unique<app::ConversationStore>(QString::fromStdString(path), app::StoreOpenMode::ReadOnly);
}

}  // namespace kvchat::cli
