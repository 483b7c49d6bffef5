// kvchat-cli list: the conversations of a database, most recently updated first.
#include <cstdio>
#include <string>
#include <vector>

#include "app/cli/cli_command.h"
#include "app/cli/store_access.h"

namespace kvchat::cli {
// Named, not anonymous: the command files are compiled in batches (unity build).
namespace list_command {

// A title as one safe field: tabs and line breaks become spaces, and any other control character (an
// escape sequence could recolour or retitle the terminal) is shown as \xNN instead of reaching it raw;
// so are the bidirectional controls (U+202A-U+202E, U+2066-U+2069, U+200E/F, U+061C), which would
// reorder how the rest of the line reads ("Trojan Source"), and the line separators U+2028/U+2029.
QString printable_title(const QString& title) {
  QString out;
  out.reserve(title.size());
  for (const QChar c : title) {
    const char16_t code = c.unicode();
    if (code == '\t' || code == '\n' || code == '\r')
      out += QLatin1Char(' ');
    else if (code < 0x20 || (code >= 0x7F && code <= 0x9F))
      out += QStringLiteral("\\x%1").arg(static_cast<int>(code), 2, 16, QLatin1Char('0'));
    else if ((code >= 0x202A && code <= 0x202E) || (code >= 0x2066 && code <= 0x2069) || code == 0x200E ||
             code == 0x200F || code == 0x061C || code == 0x2028 || code == 0x2029)
      out += QStringLiteral("\\u%1").arg(static_cast<int>(code), 4, 16, QLatin1Char('0'));
    else
      out += c;
  }
  return out;
}

// One conversation per line, tab-separated so that scripts can cut it: id, updated (UTC, ISO 8601),
// message count, title.
int run_list(const std::vector<std::string>& args) {
  ArgParser parser({"db"}, {});
  parser.parse(args);
  auto store = open_existing_store(parser.required("db"));
  const QList<app::ConversationRecord> conversations = store->conversations();
  for (const app::ConversationRecord& conversation : conversations) {
    const QString title = printable_title(conversation.title);
    const QByteArray line = QStringLiteral("%1\t%2\t%3\t%4\n")
                                .arg(conversation.id)
                                .arg(conversation.updated_at.toUTC().toString(Qt::ISODateWithMs))
                                .arg(conversation.message_count)
                                .arg(title)
                                .toUtf8();
    std::fwrite(line.constData(), 1, static_cast<size_t>(line.size()), stdout);
  }
  std::fflush(stdout);
  // A damaged file lists what it can; the counts and the conversations may be wrong, and each one known to
  // miss messages is named.
  if (!store->damage().isEmpty()) {
    std::fprintf(stderr, "kvchat-cli list: error: conversation store %s is damaged (%s); this list may be incomplete\n",
                 store->path().toUtf8().constData(), store->damage().toUtf8().constData());
    for (const app::ConversationRecord& conversation : conversations)
      if (const QString missing = store->missing_messages(conversation.id); !missing.isEmpty())
        std::fprintf(stderr, "kvchat-cli list: conversation %lld: %s\n", static_cast<long long>(conversation.id),
                     missing.toUtf8().constData());
    return 1;
  }
  return 0;
}

const CliRegistration kRegistration{CliCommand{
    "list",
    "list the conversations of a database",
    "usage: kvchat-cli list --db PATH\n\n"
    "Prints one conversation per line, most recently updated first, tab-separated:\n"
    "id, updated time (UTC, ISO 8601), message count, title. A damaged database: what could be read is\n"
    "listed, the damage and the conversations known to miss messages are named on stderr, exit status 1.",
    run_list,
}};

}  // namespace list_command
}  // namespace kvchat::cli
