#pragma once
// One message of the chat view: a header (who; the time on hover), the text (assistant replies rendered as
// Markdown with code blocks that have their own Copy button), the reply's stats or its error under it, and a
// Copy button. A reply cut short says so and, when it is the chat's last, offers Continue; one stopped by the
// context limit offers the two ways out (a new chat, dropping the oldest turns). A reply's tool calls show
// under its text, each with its arguments; a tool's result shows as a block of its own ("Tool result").
// A "marker" message is a divider.
#include <QFrame>
#include <QString>
#include <QTimer>

#include "app/store/conversation_store.h"

class QLabel;
class QPushButton;
class QToolButton;

namespace kvchat::ui {

class MessageBody;

class MessageWidget : public QFrame {
  Q_OBJECT
 public:
  explicit MessageWidget(const kvchat::app::MessageRecord& message, QWidget* parent = nullptr);

  qint64 messageId() const { return message_id_; }
  kvchat::app::MessageRole role() const { return role_; }
  QString text() const { return text_; }
  QString statsText() const;
  // The line under a reply that is cut short ("" when it is not).
  QString cutShortText() const;
  bool isFailed() const { return failed_; }
  MessageBody* body() const { return body_; }
  QPushButton* continueButton() const { return continue_button_; }
  QToolButton* copyButton() const { return copy_button_; }
  QToolButton* deleteButton() const { return delete_button_; }  // user messages and replies only
  QToolButton* editButton() const { return edit_button_; }      // user messages only
  // Under a reply stopped by the context limit (hidden otherwise).
  QPushButton* newChatButton() const { return new_chat_button_; }
  QPushButton* dropOldestTurnsButton() const { return drop_oldest_button_; }
  // The streaming reply's live figures in its header ("decoding 123.4 tok/s · 40 tok"); "" hides them.
  void setLiveFigures(const QString& figures);
  QString liveFigures() const;

  void setRecord(const kvchat::app::MessageRecord& message);  // final text and stats
  void appendText(const QString& chunk);                      // streaming; rendering is coalesced
  void setStreaming(bool streaming);
  // Whether Continue is offered (the chat's last reply, cut short, nothing generating).
  void setContinuable(bool continuable);
  // Whether a reply stopped by the context limit offers "Drop the oldest turns" (not when that is already the
  // policy).
  void setOffersDropOldestTurns(bool offers);
  // This reply is alternative `index` (0-based) of `ids` (its turn's replies, oldest first): "‹ 2/3 ›".
  void setAlternatives(const QList<qint64>& ids, int index);
  QString alternativesText() const;  // "2/3"; "" with a single reply
  // This user message is branch `index` (0-based) of `ids` (the original and its edits, oldest first): "‹ 2/3 ›".
  void setBranches(const QList<qint64>& ids, int index);
  QString branchesText() const;  // "2/3"; "" for a message never edited

 Q_SIGNALS:
  void copied(const QString& text);
  void continueRequested(qint64 message_id);
  void deleteRequested(qint64 message_id);
  void alternativeRequested(qint64 message_id);
  void editRequested(qint64 message_id);
  void branchRequested(qint64 message_id);
  void newChatRequested();
  void dropOldestTurnsRequested();

 private:
  void build_marker();
  void build_bubble(const kvchat::app::MessageRecord& message);
  void render();
  qint64 message_id_ = 0;
  kvchat::app::MessageRole role_;
  QString text_;
  // A reply's tool calls, or the call a tool result answers: shown under or around the text (tool_use.h).
  kvchat::app::MessageRecord tool_use_;
  bool streaming_ = false;
  bool failed_ = false;
  bool complete_ = true;
  bool closed_by_app_ = false;
  bool offers_drop_oldest_ = true;
  QString stop_reason_;
  QLabel* header_ = nullptr;
  MessageBody* body_ = nullptr;
  QLabel* marker_label_ = nullptr;
  QLabel* stats_ = nullptr;
  QLabel* cut_short_ = nullptr;
  QPushButton* continue_button_ = nullptr;
  QPushButton* new_chat_button_ = nullptr;
  QPushButton* drop_oldest_button_ = nullptr;
  QLabel* live_figures_ = nullptr;
  QToolButton* copy_button_ = nullptr;
  QToolButton* delete_button_ = nullptr;
  QToolButton* previous_alternative_ = nullptr;
  QToolButton* next_alternative_ = nullptr;
  QLabel* alternative_label_ = nullptr;
  QList<qint64> alternatives_;
  int alternative_index_ = 0;
  QToolButton* edit_button_ = nullptr;
  QToolButton* previous_branch_ = nullptr;
  QToolButton* next_branch_ = nullptr;
  QLabel* branch_label_ = nullptr;
  QList<qint64> branches_;
  int branch_index_ = 0;
  QTimer render_timer_;
};

}  // namespace kvchat::ui
