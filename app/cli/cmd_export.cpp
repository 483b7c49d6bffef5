// kvchat-cli export: one conversation as Markdown, JSON or plain text.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "app/cli/cli_command.h"
#include "app/cli/store_access.h"
#include "app/cli/terminal_output.h"
#include "app/store/exporter.h"

namespace kvchat::cli {
// Named, not anonymous: the command files are compiled in batches (unity build).
namespace export_command {

int run_export(const std::vector<std::string>& args) {
  ArgParser parser({"db", "conversation", "format", "out"}, {});
  parser.parse(args);
  const std::string db_path = parser.required("db");
  const long long conversation_id = parser.int64_or("conversation", -1);
  if (!parser.has("conversation")) throw UsageError("missing required option --conversation");
  app::ExportFormat format;
  try {
    format = app::export_format_from_string(QString::fromStdString(parser.value_or("format", "md")));
  } catch (const std::invalid_argument& error) {
    throw UsageError(std::string("--format: ") + error.what());
  }

  auto store = open_existing_store(db_path);
  const auto conversation = store->conversation(conversation_id);
  if (!conversation)
    throw std::runtime_error("no conversation " + std::to_string(conversation_id) + " in " +
                             store->path().toStdString());
  const QList<app::MessageRecord> messages = store->messages(conversation_id);
  const QString contents = app::export_conversation(*conversation, messages, format);

  if (const auto out = parser.value("out")) {
    app::write_text_file(QString::fromStdString(*out), contents);
  } else {
    const QByteArray bytes = contents.toUtf8();
    // A title or a message may hold escape sequences: a terminal is shown them, not made to act on them.
    write_for_terminal(stdout, std::string_view(bytes.constData(), static_cast<size_t>(bytes.size())));
    if (std::fflush(stdout) != 0 || std::ferror(stdout))
      throw std::runtime_error(std::string("cannot write to stdout: ") + std::strerror(errno));
  }
  // What a damaged file still gave is written (it may be all that can be saved of the chat), but never as
  // if it were the whole conversation.
  if (!store->damage().isEmpty()) {
    const QString missing = store->missing_messages(conversation_id);
    std::fprintf(
        stderr,
        "kvchat-cli export: error: conversation store %s is damaged (%s). Conversation %lld: %s; the export "
        "holds the %lld message(s) that could be read\n",
        store->path().toUtf8().constData(), store->damage().toUtf8().constData(), conversation_id,
        missing.isEmpty() ? "no message is known to be missing, but others may be" : missing.toUtf8().constData(),
        static_cast<long long>(messages.size()));
    return 1;
  }
  return 0;
}

const CliRegistration kRegistration{CliCommand{
    "export",
    "export a conversation as Markdown, JSON or text",
    "usage: kvchat-cli export --db PATH --conversation ID [--format md|json|txt] [--out FILE]\n\n"
    "Writes the conversation (every message in order with its role, replies with their stats) to FILE,\n"
    "atomically, or to stdout without --out (control characters escaped as \\xNN where stdout is a terminal).\n"
    "The format defaults to md. A damaged database: what could be read is written, what is missing is said\n"
    "on stderr, and the exit status is 1.",
    run_export,
}};

}  // namespace export_command
}  // namespace kvchat::cli
