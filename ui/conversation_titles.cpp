#include "ui/conversation_titles.h"

#include <QLocale>

namespace kvchat::ui {

QHash<qint64, QString> distinguishable_titles(const QList<kvchat::app::ConversationRecord>& conversations) {
  QHash<QString, int> title_count;
  for (const auto& conversation : conversations) ++title_count[conversation.title];
  QHash<qint64, QString> titles;
  QHash<QString, int> dated_count;
  for (const auto& conversation : conversations) {
    QString title = conversation.title;
    if (title_count.value(conversation.title) > 1)
      title =
          QStringLiteral("%1 \u00b7 %2")
              .arg(conversation.title, QLocale().toString(conversation.created_at.toLocalTime(), QLocale::ShortFormat));
    titles.insert(conversation.id, title);
    ++dated_count[title];
  }
  for (auto it = titles.begin(); it != titles.end(); ++it)
    if (dated_count.value(it.value()) > 1) it.value() += QStringLiteral(" \u00b7 #%1").arg(it.key());
  return titles;
}

}  // namespace kvchat::ui
