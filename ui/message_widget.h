#pragma once
// One message of the chat view: a header (who), the text (assistant replies rendered as Markdown:
// code blocks, lists), the reply's stats under it and a copy button. A "marker" message is a divider.
#include <QFrame>
#include <QString>
#include <QTimer>

#include "app/conversation_store.h"

class QLabel;
class QToolButton;

namespace kvchat::ui {

class MessageWidget : public QFrame {
  Q_OBJECT
 public:
  explicit MessageWidget(const kvchat::app::MessageRecord& message, QWidget* parent = nullptr);

  qint64 messageId() const { return message_id_; }
  QString role() const { return role_; }
  QString text() const { return text_; }
  QString statsText() const;

  void setRecord(const kvchat::app::MessageRecord& message);  // final text and stats
  void appendText(const QString& chunk);                       // streaming; rendering is coalesced
  void setStreaming(bool streaming);

 Q_SIGNALS:
  void copied(const QString& text);

 private:
  void render();
  qint64 message_id_ = 0;
  QString role_;
  QString text_;
  bool streaming_ = false;
  QLabel* header_ = nullptr;
  QLabel* body_ = nullptr;
  QLabel* stats_ = nullptr;
  QToolButton* copy_button_ = nullptr;
  QTimer render_timer_;
};

}  // namespace kvchat::ui
