#pragma once
// The transcript of one conversation: a view of a MessageListModel, one MessageWidget per row (reading order:
// a context-cut marker just above the first message the model still sees, a regenerated turn's hidden
// alternatives left out but counted in the shown reply's ‹ n/m ›). A widget is made for an inserted row, dropped
// for a removed one and updated for a changed one (a streaming reply's new text appended): nothing is rebuilt.
// Follows the bottom while a reply streams in, unless the reader scrolled up.
#include <QList>
#include <QScrollArea>

class QLabel;
class QVBoxLayout;

namespace kvchat::ui {

class MessageListModel;
class MessageWidget;

class ChatView : public QScrollArea {
  Q_OBJECT
 public:
  explicit ChatView(QWidget* parent = nullptr);

  // What it shows: a model of its own until setModel() gives it another (not owned: it must outlive the view,
  // or be replaced first).
  MessageListModel* model() const { return model_; }
  void setModel(MessageListModel* model);
  // A transient error line at the end of the transcript (cleared when the model's messages are set again).
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

  QList<MessageWidget*> messageWidgets() const { return widgets_; }
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
  MessageWidget* make_message_widget(int row);
  void update_message_widget(int row, const QList<int>& roles);
  void show_groups(MessageWidget* widget, int row);  // its branches or alternatives
  void insert_rows(int first, int last);
  void remove_rows(int first, int last);
  void rebuild();       // every widget made again: a model set, or reset
  void messages_set();  // the model's messages were set again
  void scroll_to_bottom_if_following();
  void refresh_placeholder();
  QWidget* container_ = nullptr;
  QLabel* placeholder_ = nullptr;
  MessageListModel* model_ = nullptr;
  QList<MessageWidget*> widgets_;  // one per row of model_, in its order
  qint64 continuable_message_ = 0;
  bool offers_drop_oldest_ = true;
  QVBoxLayout* layout_ = nullptr;
  bool following_ = true;
  qint64 found_message_ = 0;  // where findText() or showMessage() last went
  int found_view_ = -1;       // and in which of its text views (the transcript's order)
};

}  // namespace kvchat::ui
