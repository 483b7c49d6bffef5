#pragma once
// The chat's system prompt at the top of the transcript ("systemPromptBlock"): a block of its own, set apart
// from the messages, one line cut with "…" when collapsed (the whole text in its tooltip) and the whole text
// when expanded; hidden while the chat has no system prompt. "Edit" opens the System prompt dialog.
#include <QFrame>

class QLabel;
class QToolButton;

namespace kvchat::ui {

class ElidedLabel;

class SystemPromptBlock : public QFrame {
  Q_OBJECT
 public:
  explicit SystemPromptBlock(QWidget* parent = nullptr);
  void setPrompt(const QString& prompt);
  QString prompt() const { return prompt_; }
  void setExpanded(bool expanded);
  bool isExpanded() const { return expanded_; }
  // What the block shows now: the one line (as drawn, maybe cut) or the whole text.
  QString shownText() const;

 Q_SIGNALS:
  void editRequested();

 private:
  QString prompt_;
  bool expanded_ = false;
  QToolButton* toggle_ = nullptr;
  ElidedLabel* line_ = nullptr;
  QLabel* full_ = nullptr;
};

}  // namespace kvchat::ui
