#pragma once
// One fenced code block of a message: its language and a Copy button above the code, which is monospace
// and scrolls sideways inside the block (a long line never widens the transcript).
#include <QFrame>

class QLabel;
class QToolButton;

namespace kvchat::ui {

class MessageTextView;

// A Copy button says "Copied" for this long after a click, then its label again.
inline constexpr int kCopiedFeedbackMs = 1500;
void show_copied(QToolButton* button, const QString& label);

class CodeBlockWidget : public QFrame {
  Q_OBJECT
 public:
  explicit CodeBlockWidget(QWidget* parent = nullptr);
  void setCode(const QString& code, const QString& language);
  QString code() const;
  QString language() const { return language_; }
  MessageTextView* view() const { return view_; }
  QToolButton* copyButton() const { return copy_button_; }

 Q_SIGNALS:
  void copied(const QString& code);

 private:
  QString language_;
  QLabel* language_label_ = nullptr;
  QToolButton* copy_button_ = nullptr;
  MessageTextView* view_ = nullptr;
};

}  // namespace kvchat::ui
