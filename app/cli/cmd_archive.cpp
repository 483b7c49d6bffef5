// kvchat-cli export-all / import: every conversation in one JSON file, and such a file (or one chat's JSON
// export) added back as new conversations.
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "app/cli/cli_command.h"
#include "app/cli/store_access.h"
#include "app/store/chat_archive.h"
#include "app/store/exporter.h"

namespace kvchat::cli {
// Named, not anonymous: the command files are compiled in batches (unity build).
namespace archive_command {

int run_export_all(const std::vector<std::string>& args) {
  ArgParser parser({"db", "out"}, {});
  parser.parse(args);
  const std::string db_path = parser.required("db");
  const std::string out = parser.required("out");
  auto store = open_existing_store(db_path);
  if (!store->damage().isEmpty())
    throw std::runtime_error("conversation store " + store->path().toStdString() + " is damaged (" +
                             store->damage().toStdString() + "); export the chats one by one with `kvchat-cli export`");
  const QList<app::ImportedConversation> conversations = app::all_conversations(*store);
  app::write_text_file(QString::fromStdString(out), app::export_chat_archive(conversations));
  std::fprintf(stdout, "exported %lld conversation(s) to %s\n", static_cast<long long>(conversations.size()),
               out.c_str());
  return 0;
}

int run_import(const std::vector<std::string>& args) {
  ArgParser parser({"db", "in"}, {});
  parser.parse(args);
  const std::string db_path = parser.required("db");
  const std::string in = parser.required("in");
  // Read and checked whole before the database is opened for writing.
  const QList<app::ImportedConversation> conversations = app::read_chat_archive(QString::fromStdString(in));
  ensure_core_application();
  app::ConversationStore store(QString::fromStdString(db_path));
  const QList<qint64> ids = store.import_conversations(conversations);
  std::fprintf(stdout, "imported %lld conversation(s) from %s:", static_cast<long long>(ids.size()), in.c_str());
  for (const qint64 id : ids) std::fprintf(stdout, " %lld", static_cast<long long>(id));
  std::fprintf(stdout, "\n");
  return 0;
}

const CliRegistration kExportAll{CliCommand{
    "export-all",
    "export every conversation to one JSON file",
    "usage: kvchat-cli export-all --db PATH --out FILE\n\n"
    "Writes every conversation (title, system prompt, pinned, every message with its role, settings and stats,\n"
    "regenerated replies and edited branches) to FILE, atomically, in the kvchat-chats format (version 1, see\n"
    "docs/DESIGN.md). `kvchat-cli import` reads it back.",
    run_export_all,
}};

const CliRegistration kImport{CliCommand{
    "import",
    "add the conversations of an export as new ones",
    "usage: kvchat-cli import --db PATH --in FILE\n\n"
    "Reads FILE (an `export-all` file, or one chat's JSON export) and adds its conversations to the database\n"
    "(created if missing) as new ones; nothing is overwritten. All or nothing: a file that is not valid (cut\n"
    "short, another version, an unknown role) adds nothing, and the error says what is wrong and where.\n"
    "Prints the new conversations' ids.",
    run_import,
}};

}  // namespace archive_command
}  // namespace kvchat::cli
