#pragma once
// Opening the conversation store from a kvchat-cli command: read an existing database, never create one.
#include <memory>
#include <string>

#include "app/store/conversation_store.h"

namespace kvchat::cli {

// Qt's SQL driver plugins load only once a QCoreApplication exists; the CLI has none of its own.
// Creates one for the rest of the process if needed.
void ensure_core_application();

// Opens `path` (which must exist and be a kvchat database). Throws app::StoreError naming the path otherwise.
std::unique_ptr<app::ConversationStore> open_existing_store(const std::string& path);

}  // namespace kvchat::cli
