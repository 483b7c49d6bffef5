// kvchat-cli list: the conversations of a database, most recently updated first.
#include <cstdio>
#include <string>
#include <vector>

#include "app/cli/cli_command.h"
#include "app/cli/store_access.h"

namespace kvchat::cli {
namespace {

// One conversation per line, tab-separated so that scripts can cut it: id, updated (UTC, ISO 8601),
// message count, title (tabs and line breaks in the title become spaces).
int run_list(const std::vector<std::string>& args) {
  ArgParser parser({"db"}, {});
  parser.parse(args);
  auto store = open_existing_store(parser.required("db"));
  for (const app::ConversationRecord& conversation : store->conversations()) {
    QString title = conversation.title;
    title.replace(QLatin1Char('\t'), QLatin1Char(' ')).replace(QLatin1Char('\n'), QLatin1Char(' '))
        .replace(QLatin1Char('\r'), QLatin1Char(' '));
    const QByteArray line = QStringLiteral("%1\t%2\t%3\t%4\n")
                                .arg(conversation.id)
                                .arg(conversation.updated_at.toUTC().toString(Qt::ISODateWithMs))
                                .arg(conversation.message_count)
                                .arg(title)
                                .toUtf8();
    std::fwrite(line.constData(), 1, static_cast<size_t>(line.size()), stdout);
  }
  std::fflush(stdout);
  return 0;
}

const CliRegistration kRegistration{CliCommand{
    "list",
    "list the conversations of a database",
    "usage: kvchat-cli list --db PATH\n\n"
    "Prints one conversation per line, most recently updated first, tab-separated:\n"
    "id, updated time (UTC, ISO 8601), message count, title.",
    run_list,
}};

}  // namespace
}  // namespace kvchat::cli
