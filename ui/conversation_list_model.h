#pragma once
// The sidebar's chats as an item model. It is updated in place: a token, a finished turn, a queued turn or
// a cache change alter the rows they concern (dataChanged, a row moved to its new place), and nothing is
// cleared and rebuilt, so the selection, the scroll position and a hover stay where they were.
#include <QAbstractListModel>
#include <QHash>
#include <QList>
#include <QString>
#include <optional>

#include "app/store/conversation_store.h"

namespace kvchat::app {
class ChatController;
}

namespace kvchat::ui {

class ConversationListModel : public QAbstractListModel {
  Q_OBJECT
 public:
  enum Role {
    ConversationIdRole = Qt::UserRole,
    HeldCacheBytesRole = Qt::UserRole + 1,  // 0: no KV cache in memory
    PinnedRole = Qt::UserRole + 2,
    FirstMatchRole = Qt::UserRole + 3,  // with a search: the chat's first matching message
    BusyRole = Qt::UserRole + 4,        // generating or waiting: the view shows it in italics
  };

  // Reads from `controller` (not owned, must outlive the model).
  explicit ConversationListModel(kvchat::app::ChatController* controller, QObject* parent = nullptr);

  int rowCount(const QModelIndex& parent = QModelIndex()) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;

  // Reads the chat list (and, while `search` holds text, the chats it finds) and applies the difference.
  void reload(const QString& search);
  // Re-derives each row's generating/waiting state and held cache from the controller: no store read.
  void refresh_states();

  int row_of(qint64 conversation_id) const;  // -1: not listed
  // Whether the chat was in the store at the last reload, listed or not (a search may hide it), and its record.
  bool knows(qint64 conversation_id) const { return record(conversation_id).has_value(); }
  std::optional<kvchat::app::ConversationRecord> record(qint64 conversation_id) const;
  qint64 conversation_at(int row) const;  // 0: no such row
  static QString pinned_marker() { return QStringLiteral("\u2605 "); }

 private:
  struct Row {
    kvchat::app::ConversationRecord record;
    QString title;  // told apart from equal titles
    QString state;  // "generating…", "waiting…" or empty
    bool held = false;
    qint64 held_tokens = 0;
    qint64 held_bytes = 0;
    qint64 first_match = 0;
    bool operator==(const Row& other) const;
  };
  QString display_text(const Row& row) const;
  QString tooltip(const Row& row) const;
  void fill_states(Row& row) const;
  void apply(QList<Row> wanted);

  kvchat::app::ChatController* controller_;
  QList<Row> rows_;
  QList<kvchat::app::ConversationRecord> conversations_;  // as last read, for refresh_states
  QHash<qint64, qint64> found_;                           // the last search's chats (empty: no search)
  bool searching_ = false;
  bool applying_ = false, again_ = false;
};

}  // namespace kvchat::ui
