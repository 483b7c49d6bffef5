#pragma once
// The text of one message: prose (Markdown for replies, plain text for the user's words) interleaved with
// code blocks that have their own Copy button. Updating it while a reply streams keeps the widgets of the
// segments that did not change. Very long messages are shown cut (Copy and export still have all of it). A reply
// that opens with <think>…</think> shows that part folded under a "Thinking…" button, expandable.
#include <QList>
#include <QWidget>

#include "ui/markdown_blocks.h"

class QToolButton;
class QVBoxLayout;

namespace kvchat::ui {

class CodeBlockWidget;
class MessageTextView;

class MessageBody : public QWidget {
  Q_OBJECT
 public:
  // Longer texts are shown up to this many characters, with a note saying how much is left out.
  static constexpr int kMaxShownCharacters = 20000;

  explicit MessageBody(QWidget* parent = nullptr);
  void setContent(const QString& text, bool markdown);

  QString source() const { return source_; }
  // How many times the text changed and was laid out again (a streaming reply's renders are coalesced).
  int layoutCount() const { return layout_count_; }
  bool isMarkdown() const { return markdown_; }
  // What a reader sees, segment after segment (prose as rendered, code as written), blank-line separated.
  QString renderedText() const;
  QList<MessageTextView*> proseViews() const;
  QList<CodeBlockWidget*> codeBlocks() const;
  // The fold of a reply's thinking (null when it has none) and the view it opens.
  QToolButton* thinkingToggle() const { return thinking_toggle_; }
  MessageTextView* thinkingView() const { return thinking_view_; }

 private:
  QWidget* make_segment_widget(const MessageSegment& segment);
  void update_segment_widget(QWidget* widget, const MessageSegment& segment);
  QString source_;
  bool markdown_ = false;
  int layout_count_ = 0;
  QList<MessageSegment> segments_;
  QList<QWidget*> segment_widgets_;
  void show_thinking(bool present, bool closed, const QString& thinking);
  QVBoxLayout* layout_ = nullptr;
  QToolButton* thinking_toggle_ = nullptr;
  MessageTextView* thinking_view_ = nullptr;
};

}  // namespace kvchat::ui
