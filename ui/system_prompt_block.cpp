#include "ui/system_prompt_block.h"

#include <QHBoxLayout>
#include <QLabel>
#include <QToolButton>
#include <QVBoxLayout>

#include "ui/elided_label.h"

namespace kvchat::ui {

SystemPromptBlock::SystemPromptBlock(QWidget* parent) : QFrame(parent) {
  setObjectName("systemPromptBlock");
  setFrameShape(QFrame::StyledPanel);
  setAutoFillBackground(true);
  setBackgroundRole(QPalette::AlternateBase);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(8, 4, 8, 4);
  layout->setSpacing(2);
  auto* row = new QHBoxLayout;
  toggle_ = new QToolButton(this);
  toggle_->setObjectName("systemPromptToggle");
  toggle_->setAutoRaise(true);
  toggle_->setArrowType(Qt::RightArrow);
  toggle_->setToolTip(tr("Show the whole system prompt"));
  toggle_->setFocusPolicy(Qt::TabFocus);
  auto* caption = new QLabel(tr("System prompt:"), this);
  QFont bold = caption->font();
  bold.setBold(true);
  caption->setFont(bold);
  line_ = new ElidedLabel(this);
  line_->setObjectName("systemPromptLine");
  line_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  line_->setTextFormat(Qt::PlainText);
  auto* edit = new QToolButton(this);
  edit->setObjectName("systemPromptEditButton");
  edit->setText(tr("Edit"));
  edit->setAutoRaise(true);
  edit->setFocusPolicy(Qt::NoFocus);  // the System prompt button beside the title does the same from the keyboard
  row->addWidget(toggle_);
  row->addWidget(caption);
  row->addWidget(line_, 1);
  row->addWidget(edit);
  layout->addLayout(row);
  full_ = new QLabel(this);
  full_->setObjectName("systemPromptFullText");
  full_->setTextFormat(Qt::PlainText);
  full_->setWordWrap(true);
  full_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  full_->hide();
  layout->addWidget(full_);
  connect(toggle_, &QToolButton::clicked, this, [this] { setExpanded(!expanded_); });
  connect(edit, &QToolButton::clicked, this, &SystemPromptBlock::editRequested);
  hide();
}

void SystemPromptBlock::setPrompt(const QString& prompt) {
  prompt_ = prompt;
  // One line: its line breaks become spaces.
  line_->setFullText(prompt.simplified());
  line_->setToolTip(prompt);
  full_->setText(prompt);
  setVisible(!prompt.trimmed().isEmpty());
}

void SystemPromptBlock::setExpanded(bool expanded) {
  expanded_ = expanded;
  toggle_->setArrowType(expanded ? Qt::DownArrow : Qt::RightArrow);
  toggle_->setToolTip(expanded ? tr("Show one line of the system prompt") : tr("Show the whole system prompt"));
  line_->setVisible(!expanded);
  full_->setVisible(expanded);
}

QString SystemPromptBlock::shownText() const { return expanded_ ? full_->text() : line_->shownText(); }

}  // namespace kvchat::ui
