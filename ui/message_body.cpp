#include "ui/message_body.h"

#include <QLocale>
#include <QRegularExpression>
#include <QStringList>
#include <QTextDocument>
#include <QToolButton>
#include <QVBoxLayout>

#include "ui/code_block_widget.h"
#include "ui/message_text_view.h"

namespace kvchat::ui {

MessageBody::MessageBody(QWidget* parent) : QWidget(parent) {
  setObjectName("messageBody");
  setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);  // never asks for more width than it gets
  layout_ = new QVBoxLayout(this);
  layout_->setContentsMargins(0, 0, 0, 0);
  layout_->setSpacing(6);
}

void MessageBody::setContent(const QString& text, bool markdown) {
  if (text == source_ && markdown == markdown_ && !segment_widgets_.isEmpty()) return;
  source_ = text;
  markdown_ = markdown;
  ++layout_count_;
  QString shown = text;
  if (shown.size() > kMaxShownCharacters) {
    // Laying out megabytes of text would freeze the window; nobody reads that much in a bubble.
    shown =
        shown.left(kMaxShownCharacters) + tr("\n\n[\u2026 %1 more characters not shown; Copy copies the whole message]")
                                              .arg(QLocale().toString(text.size() - kMaxShownCharacters));
  }
  QList<MessageSegment> segments;
  const kvchat::app::ThinkingSplit thinking =
      markdown ? kvchat::app::split_thinking(shown) : kvchat::app::ThinkingSplit{};
  show_thinking(thinking.has_thinking, thinking.closed, thinking.thinking);
  if (thinking.has_thinking) shown = thinking.answer;
  if (markdown)
    segments = split_message_segments(shown);
  else
    segments.push_back({MessageSegment::Kind::Prose, shown, QString()});
  if (segments.isEmpty() && !thinking.has_thinking)
    segments.push_back({MessageSegment::Kind::Prose, QString(), QString()});

  // Same shape (a streaming reply grew): update in place; otherwise rebuild.
  bool same_shape = segments.size() == segments_.size() && (!segment_widgets_.isEmpty() || segments.isEmpty());
  for (int i = 0; same_shape && i < segments.size(); ++i) same_shape = segments[i].kind == segments_[i].kind;
  if (!same_shape) {
    for (QWidget* widget : segment_widgets_) delete widget;
    segment_widgets_.clear();
    for (const MessageSegment& segment : segments) {
      QWidget* widget = make_segment_widget(segment);
      segment_widgets_.push_back(widget);
      layout_->addWidget(widget);
    }
  } else {
    for (int i = 0; i < segments.size(); ++i)
      if (!(segments[i] == segments_[i])) update_segment_widget(segment_widgets_[i], segments[i]);
  }
  segments_ = segments;
}

void MessageBody::show_thinking(bool present, bool closed, const QString& thinking) {
  if (!present) {
    delete thinking_toggle_;
    delete thinking_view_;
    thinking_toggle_ = nullptr;
    thinking_view_ = nullptr;
    return;
  }
  if (thinking_toggle_ == nullptr) {
    thinking_toggle_ = new QToolButton(this);
    thinking_toggle_->setObjectName("thinkingToggle");
    thinking_toggle_->setCheckable(true);
    thinking_toggle_->setToolButtonStyle(Qt::ToolButtonTextBesideIcon);
    thinking_toggle_->setArrowType(Qt::RightArrow);
    thinking_toggle_->setAutoRaise(true);
    thinking_view_ = new MessageTextView(MessageTextView::Mode::Prose, this);
    thinking_view_->setObjectName("thinkingText");
    thinking_view_->setVisible(false);  // folded until asked for
    layout_->insertWidget(0, thinking_toggle_);
    layout_->insertWidget(1, thinking_view_);
    connect(thinking_toggle_, &QToolButton::toggled, this, [this](bool open) {
      thinking_view_->setVisible(open);
      thinking_toggle_->setArrowType(open ? Qt::DownArrow : Qt::RightArrow);
    });
  }
  const int words = thinking.split(QRegularExpression(QStringLiteral("\\s+")), Qt::SkipEmptyParts).size();
  thinking_toggle_->setText(!closed      ? tr("Thinking\u2026")
                            : words == 1 ? tr("Thought for 1 word")
                                         : tr("Thought for %1 words").arg(words));
  thinking_toggle_->setToolTip(tr("The model's reasoning before its answer; click to show or hide it"));
  thinking_view_->setPlainSource(thinking);
}

QWidget* MessageBody::make_segment_widget(const MessageSegment& segment) {
  QWidget* widget = nullptr;
  if (segment.kind == MessageSegment::Kind::Code)
    widget = new CodeBlockWidget(this);
  else
    widget = new MessageTextView(MessageTextView::Mode::Prose, this);
  update_segment_widget(widget, segment);
  return widget;
}

void MessageBody::update_segment_widget(QWidget* widget, const MessageSegment& segment) {
  if (auto* code = qobject_cast<CodeBlockWidget*>(widget)) {
    code->setCode(segment.text, segment.language);
  } else if (auto* prose = qobject_cast<MessageTextView*>(widget)) {
    if (markdown_)
      prose->setMarkdownSource(segment.text);
    else
      prose->setPlainSource(segment.text);
  }
}

QString MessageBody::renderedText() const {
  QStringList parts;
  if (thinking_toggle_ != nullptr) {  // folded, a reader sees the button; open, the thinking too
    parts << thinking_toggle_->text();
    if (thinking_toggle_->isChecked()) parts << thinking_view_->document()->toPlainText();
  }
  for (QWidget* widget : segment_widgets_) {
    if (auto* code = qobject_cast<CodeBlockWidget*>(widget))
      parts << code->code();
    else if (auto* prose = qobject_cast<MessageTextView*>(widget))
      parts << prose->document()->toPlainText();
  }
  return parts.join(QStringLiteral("\n\n"));
}

QList<MessageTextView*> MessageBody::proseViews() const {
  QList<MessageTextView*> views;
  for (QWidget* widget : segment_widgets_)
    if (auto* view = qobject_cast<MessageTextView*>(widget)) views.push_back(view);
  return views;
}

QList<CodeBlockWidget*> MessageBody::codeBlocks() const {
  QList<CodeBlockWidget*> blocks;
  for (QWidget* widget : segment_widgets_)
    if (auto* block = qobject_cast<CodeBlockWidget*>(widget)) blocks.push_back(block);
  return blocks;
}

}  // namespace kvchat::ui
