#pragma once
// Chat titles as lists show them: a title that several chats share gets the chat's start date and time, so
// that equal titles ("Once upon a time", twice) can be told apart in the sidebar and the Caches dialog.
#include <QHash>
#include <QList>
#include <QString>

#include "app/store/conversation_store.h"

namespace kvchat::ui {

// By conversation id: the title, or "title · date time" when another chat has the same title (and the id
// too when even the start times agree to the minute).
QHash<qint64, QString> distinguishable_titles(const QList<kvchat::app::ConversationRecord>& conversations);

}  // namespace kvchat::ui
