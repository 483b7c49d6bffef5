#include "ui/code_block_widget.h"

#include <QClipboard>
#include <QGuiApplication>
#include <QHBoxLayout>
#include <QLabel>
#include <QTimer>
#include <QToolButton>
#include <QVBoxLayout>

#include "ui/message_text_view.h"

namespace kvchat::ui {

void show_copied(QToolButton* button, const QString& label) {
  button->setText(QObject::tr("Copied"));
  // Long enough to be read, short enough that the next click finds the usual label.
  QTimer::singleShot(kCopiedFeedbackMs, button, [button, label] { button->setText(label); });
}

CodeBlockWidget::CodeBlockWidget(QWidget* parent) : QFrame(parent) {
  setObjectName("codeBlock");
  setFrameShape(QFrame::StyledPanel);
  setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Fixed);  // as wide as the bubble, whatever the code
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(4, 2, 4, 4);
  layout->setSpacing(0);
  auto* header = new QHBoxLayout;
  language_label_ = new QLabel(this);
  language_label_->setObjectName("codeLanguage");
  language_label_->setStyleSheet("color: palette(mid); font-size: 11px;");
  copy_button_ = new QToolButton(this);
  copy_button_->setObjectName("copyCodeButton");
  copy_button_->setText(tr("Copy code"));
  copy_button_->setToolTip(tr("Copy this code block to the clipboard"));
  copy_button_->setAutoRaise(true);
  copy_button_->setFocusPolicy(Qt::NoFocus);  // not a Tab stop (see MessageWidget)
  connect(copy_button_, &QToolButton::clicked, this, [this] {
    QGuiApplication::clipboard()->setText(code());
    show_copied(copy_button_, tr("Copy code"));
    Q_EMIT copied(code());
  });
  header->addWidget(language_label_, 1);
  header->addWidget(copy_button_);
  layout->addLayout(header);
  view_ = new MessageTextView(MessageTextView::Mode::Code, this);
  view_->setObjectName("codeView");
  layout->addWidget(view_);
}

void CodeBlockWidget::setCode(const QString& code, const QString& language) {
  language_ = language;
  language_label_->setText(language);
  view_->setPlainSource(code);
}

QString CodeBlockWidget::code() const { return view_->source(); }

}  // namespace kvchat::ui
