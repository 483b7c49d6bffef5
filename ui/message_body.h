#pragma once
// The text of one message: prose (Markdown for replies, plain text for the user's words) interleaved with
// code blocks that have their own Copy button. Updating it while a reply streams keeps the widgets of the
// segments that did not change. Very long messages are shown cut (Copy and export still have all of it).
#include <QList>
#include <QWidget>

#include "ui/markdown_blocks.h"

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
  bool isMarkdown() const { return markdown_; }
  // What a reader sees, segment after segment (prose as rendered, code as written), blank-line separated.
  QString renderedText() const;
  QList<MessageTextView*> proseViews() const;
  QList<CodeBlockWidget*> codeBlocks() const;

 private:
  QWidget* make_segment_widget(const MessageSegment& segment);
  void update_segment_widget(QWidget* widget, const MessageSegment& segment);
  QString source_;
  bool markdown_ = false;
  QList<MessageSegment> segments_;
  QList<QWidget*> segment_widgets_;
  QVBoxLayout* layout_ = nullptr;
};

}  // namespace kvchat::ui
