#pragma once
// The shown chat's transcript as an item model: one row per message in reading order (messages_in_reading_order:
// a context-cut marker just above the first message the model still sees, a regenerated turn's hidden
// alternatives left out but counted in the shown reply's alternatives). The window feeds it from the
// controller's signals and ChatView shows it.
//
// Every change is applied as a difference, never as a reset: setMessages() removes the rows no longer shown,
// inserts the new ones and reports a kept row as changed only when what it shows changed; a streaming reply's
// text grows by appendText() (one row changed per chunk). So a long chat is not re-rendered when a message is
// appended, a marker inserted or a message deleted, and a view keeps its widgets, its scroll position and its
// selections.
#include <QAbstractListModel>
#include <QHash>
#include <QList>

#include "app/store/conversation_store.h"

namespace kvchat::ui {

class MessageListModel : public QAbstractListModel {
  Q_OBJECT
 public:
  // Qt::DisplayRole is the message's text (as far as it has streamed).
  enum Role {
    MessageIdRole = Qt::UserRole + 1,  // qint64
    MessageRoleRole,                   // QString: "user", "assistant", "system", "marker"
    StreamingRole,                     // bool: a reply being generated now
    CompleteRole,                      // bool: MessageRecord::complete
  };

  explicit MessageListModel(QObject* parent = nullptr);

  int rowCount(const QModelIndex& parent = QModelIndex()) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QHash<int, QByteArray> roleNames() const override;

  // The chat's messages as stored (every branch and alternative; the rows are its shown path in reading order).
  // `streaming_message_id` (0 = none) is shown as in progress with `streaming_text` (when not empty: the text
  // streamed so far). `branches` are the user messages' branch groups (ChatController::currentBranches).
  // Applied as a difference; messagesSet() follows.
  void setMessages(const QList<kvchat::app::MessageRecord>& messages, qint64 streaming_message_id = 0,
                   const QString& streaming_text = QString(), const QHash<qint64, QList<qint64>>& branches = {});
  // A streaming reply's next text (nothing when the message is not shown).
  void appendText(qint64 message_id, const QString& chunk);
  // A message as saved (a finished reply: its final text and stats); no longer streaming.
  void updateMessage(const kvchat::app::MessageRecord& message);

  int rowOf(qint64 message_id) const;  // -1: not shown
  const kvchat::app::MessageRecord& record(int row) const { return rows_[row].record; }
  bool isStreaming(int row) const { return rows_[row].streaming; }
  // A user message's branch group and a reply's alternatives (each empty when it has none), with this row's
  // index in it.
  const QList<qint64>& branches(int row) const { return rows_[row].branches; }
  const QList<qint64>& alternatives(int row) const { return rows_[row].alternatives; }

 Q_SIGNALS:
  // After each setMessages(), once its rows are in place: the transcript was set again (a view drops what it
  // showed beside the messages, such as an error line, and follows the bottom again).
  void messagesSet();

 private:
  struct Row {
    kvchat::app::MessageRecord record;
    bool streaming = false;
    QList<qint64> branches;
    QList<qint64> alternatives;
  };
  static bool shows_the_same(const Row& a, const Row& b);
  QList<Row> rows_;
};

}  // namespace kvchat::ui
