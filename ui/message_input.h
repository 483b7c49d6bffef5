#pragma once
// The message box: Enter sends, Shift+Enter starts a new line.
#include <QPlainTextEdit>

namespace kvchat::ui {

class MessageInput : public QPlainTextEdit {
  Q_OBJECT
 public:
  explicit MessageInput(QWidget* parent = nullptr);

 Q_SIGNALS:
  void submitted();

 protected:
  void keyPressEvent(QKeyEvent* event) override;
  QSize sizeHint() const override;
};

}  // namespace kvchat::ui
