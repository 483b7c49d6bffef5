#include "ui/message_widget.h"

#include <QClipboard>
#include <QGuiApplication>
#include <QHBoxLayout>
#include <QLabel>
#include <QToolButton>
#include <QVBoxLayout>

#include "ui/stats_format.h"

namespace kvchat::ui {

namespace {
// Re-rendering Markdown for every token of a fast model would cost more than the model; 20 Hz looks live.
constexpr int kRenderIntervalMs = 50;
}  // namespace

MessageWidget::MessageWidget(const kvchat::app::MessageRecord& message, QWidget* parent)
    : QFrame(parent), message_id_(message.id), role_(message.role), text_(message.text) {
  setObjectName(QStringLiteral("message_%1").arg(message.id));
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(10, 6, 10, 6);
  layout->setSpacing(3);

  if (role_ == "marker") {
    setFrameShape(QFrame::NoFrame);
    body_ = new QLabel(this);
    body_->setObjectName("messageBody");
    body_->setAlignment(Qt::AlignCenter);
    body_->setWordWrap(true);
    body_->setStyleSheet("color: #8a6d00; font-style: italic; border-top: 1px dashed #c9a400; padding-top: 4px;");
    layout->addWidget(body_);
    render();
    return;
  }

  const bool is_user = role_ == "user";
  setFrameShape(QFrame::StyledPanel);
  setStyleSheet(is_user ? "kvchat--ui--MessageWidget { background: #e3efff; border: 1px solid #b8d0f0; border-radius: 8px; }"
                        : "kvchat--ui--MessageWidget { background: #f6f6f6; border: 1px solid #dddddd; border-radius: 8px; }");
  auto* header_row = new QHBoxLayout;
  header_ = new QLabel(this);
  header_->setObjectName("messageHeader");
  QString who = is_user ? QStringLiteral("You") : role_ == "system" ? QStringLiteral("System") : QStringLiteral("Assistant");
  if (!is_user && !message.model.isEmpty()) who += QStringLiteral(" \u00b7 ") + message.model;
  header_->setText(QStringLiteral("<b>%1</b>").arg(who.toHtmlEscaped()));
  header_row->addWidget(header_);
  header_row->addStretch();
  copy_button_ = new QToolButton(this);
  copy_button_->setObjectName("copyButton");
  copy_button_->setText(tr("Copy"));
  copy_button_->setToolTip(tr("Copy this message to the clipboard"));
  copy_button_->setAutoRaise(true);
  connect(copy_button_, &QToolButton::clicked, this, [this] {
    QGuiApplication::clipboard()->setText(text_);
    Q_EMIT copied(text_);
  });
  header_row->addWidget(copy_button_);
  layout->addLayout(header_row);

  body_ = new QLabel(this);
  body_->setObjectName("messageBody");
  body_->setWordWrap(true);
  body_->setTextInteractionFlags(Qt::TextSelectableByMouse | Qt::TextSelectableByKeyboard | Qt::LinksAccessibleByMouse);
  body_->setOpenExternalLinks(true);
  body_->setTextFormat(is_user ? Qt::PlainText : Qt::MarkdownText);
  layout->addWidget(body_);

  stats_ = new QLabel(this);
  stats_->setObjectName("messageStats");
  stats_->setWordWrap(true);
  stats_->setStyleSheet("color: #666666; font-size: 11px;");
  stats_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  layout->addWidget(stats_);

  render_timer_.setSingleShot(true);
  render_timer_.setInterval(kRenderIntervalMs);
  connect(&render_timer_, &QTimer::timeout, this, &MessageWidget::render);
  setRecord(message);
}

QString MessageWidget::statsText() const { return stats_ ? stats_->text() : QString(); }

void MessageWidget::setRecord(const kvchat::app::MessageRecord& message) {
  text_ = message.text;
  if (stats_) {
    const QString line = format_stored_stats(message.stats);
    stats_->setText(line);
    stats_->setVisible(!line.isEmpty());
    if (message.stats.contains("error")) stats_->setStyleSheet("color: #b00020; font-size: 11px;");
  }
  streaming_ = !message.complete && streaming_;
  render();
}

void MessageWidget::appendText(const QString& chunk) {
  text_ += chunk;
  if (!render_timer_.isActive()) render_timer_.start();
}

void MessageWidget::setStreaming(bool streaming) {
  streaming_ = streaming;
  render();
}

void MessageWidget::render() {
  render_timer_.stop();
  if (role_ == "marker") {
    body_->setText(text_);
    return;
  }
  if (text_.isEmpty() && streaming_) {
    body_->setTextFormat(Qt::PlainText);
    body_->setText(tr("\u2026"));
    return;
  }
  body_->setTextFormat(role_ == "user" ? Qt::PlainText : Qt::MarkdownText);
  body_->setText(text_);
}

}  // namespace kvchat::ui
