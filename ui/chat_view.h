#pragma once
// The transcript of one conversation: one MessageWidget per message, in reading order (a context-cut marker
// just above the first message the model still sees, a regenerated turn's hidden alternatives left out but
// counted in the shown reply's ‹ n/m ›). Follows the bottom while a reply streams in,
// unless the reader scrolled up.
#include <QHash>
#include <QList>
#include <QScrollArea>

#include "app/store/conversation_store.h"

class QLabel;
class QVBoxLayout;

namespace kvchat::ui {

class MessageWidget;

class ChatView : public QScrollArea {
  Q_OBJECT
 public:
  explicit ChatView(QWidget* parent = nullptr);

  // Rebuilds the view. `streaming_message_id` (0 = none) is shown as in progress with `streaming_text`.
  void setMessages(const QList<kvchat::app::MessageRecord>& messages, qint64 streaming_message_id = 0,
                   const QString& streaming_text = QString());
  // The branch groups of the user messages (ChatController::currentBranches), for their "‹ 2/3 ›"; applied by
  // the next setMessages().
  void setBranches(const QHash<qint64, QList<qint64>>& branches) { branches_ = branches; }
  void appendToMessage(qint64 message_id, const QString& chunk);
  void updateMessage(const kvchat::app::MessageRecord& message);
  // A transient error line at the end of the transcript (cleared by the next setMessages()).
  void showError(const QString& message);
  // Shown instead of the transcript while the conversation has no messages (what the model is, what to try).
  void setPlaceholder(const QString& text);
  QString placeholderText() const;
  // The message offered Continue (0 = none).
  void setContinuableMessage(qint64 message_id);
  // Whether replies stopped by the context limit offer "Drop the oldest turns" (the policy is still "stop").
  void setOffersDropOldestTurns(bool offers);

  // Selects the next occurrence of `text` (case aside) in the transcript after the last one found, wrapping
  // around, and scrolls to it; from_message (not 0) starts in that message instead. Returns the message it is
  // in (0: nowhere).
  qint64 findText(const QString& text, qint64 from_message = 0);
  // Scrolls to the message (a search hit) and selects `text` in it when it is there as typed.
  void showMessage(qint64 message_id, const QString& text);
  qint64 foundMessageId() const { return found_message_; }

  QList<MessageWidget*> messageWidgets() const;
  MessageWidget* messageWidget(qint64 message_id) const;

 Q_SIGNALS:
  void continueRequested(qint64 message_id);
  void deleteMessageRequested(qint64 message_id);
  void alternativeRequested(qint64 message_id);
  void editMessageRequested(qint64 message_id);
  void branchRequested(qint64 message_id);
  void newChatRequested();
  void dropOldestTurnsRequested();

 protected:
  void changeEvent(QEvent* event) override;  // a new text size goes to every message

 private:
  MessageWidget* make_message_widget(const kvchat::app::MessageRecord& message, qint64 streaming_message_id,
                                     const QString& streaming_text);
  void scroll_to_bottom_if_following();
  void refresh_placeholder();
  QWidget* container_ = nullptr;
  QLabel* placeholder_ = nullptr;
  qint64 continuable_message_ = 0;
  QHash<qint64, QList<qint64>> branches_;
  bool offers_drop_oldest_ = true;
  QVBoxLayout* layout_ = nullptr;
  bool following_ = true;
  qint64 found_message_ = 0;  // where findText() or showMessage() last went
  int found_view_ = -1;       // and in which of its text views (the transcript's order)
};

}  // namespace kvchat::ui
