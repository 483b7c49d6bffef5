#include "ui/message_input.h"

#include <QKeyEvent>

namespace kvchat::ui {

MessageInput::MessageInput(QWidget* parent) : QPlainTextEdit(parent) {
  setObjectName("messageInput");
  setPlaceholderText(tr("Message (Enter sends, Shift+Enter for a new line)"));
  setTabChangesFocus(true);
}

void MessageInput::keyPressEvent(QKeyEvent* event) {
  const bool enter = event->key() == Qt::Key_Return || event->key() == Qt::Key_Enter;
  if (enter && !(event->modifiers() & Qt::ShiftModifier)) {
    Q_EMIT submitted();
    event->accept();
    return;
  }
  if (enter) {
    // A real new paragraph, not Qt's U+2028 soft line break for Shift+Enter.
    insertPlainText(QStringLiteral("\n"));
    event->accept();
    return;
  }
  QPlainTextEdit::keyPressEvent(event);
}

QSize MessageInput::sizeHint() const {
  const QSize base = QPlainTextEdit::sizeHint();
  return {base.width(), fontMetrics().lineSpacing() * 3 + 16};
}

}  // namespace kvchat::ui
