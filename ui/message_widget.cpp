#include "ui/message_widget.h"
#include "ui/appearance.h"

#include <QApplication>
#include <QClipboard>
#include <QGuiApplication>
#include <QHBoxLayout>
#include <QLabel>
#include <QLocale>
#include <QPushButton>
#include <QTimer>
#include <QToolButton>
#include <QVBoxLayout>

#include "app/store/chat_history.h"
#include "app/store/tool_use.h"
#include "ui/code_block_widget.h"
#include "ui/message_body.h"
#include "ui/stats_format.h"

namespace kvchat::ui {

using kvchat::app::MessageRole;

namespace {
// Re-rendering Markdown for every token of a fast model would cost more than the model; 20 Hz looks live.
constexpr int kRenderIntervalMs = 50;
}  // namespace

MessageWidget::MessageWidget(const kvchat::app::MessageRecord& message, QWidget* parent)
    : QFrame(parent), message_id_(message.id), role_(message.role), text_(message.text) {
  setObjectName(QStringLiteral("message_%1").arg(message.id));
  // Never wider than the transcript: the body wraps or scrolls inside to whatever width it is given.
  setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  render_timer_.setSingleShot(true);
  render_timer_.setInterval(kRenderIntervalMs);
  connect(&render_timer_, &QTimer::timeout, this, &MessageWidget::render);
  if (role_ == MessageRole::Marker)
    build_marker();
  else
    build_bubble(message);
  setRecord(message);
}

void MessageWidget::build_marker() {
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(10, 6, 10, 6);
  setFrameShape(QFrame::NoFrame);
  marker_label_ = new QLabel(this);
  marker_label_->setObjectName("markerText");
  marker_label_->setAlignment(Qt::AlignCenter);
  marker_label_->setWordWrap(true);
  set_palette_style_sheet(marker_label_, [](const QPalette& palette) {
    return QStringLiteral("color: %1; font-style: italic; border-top: 1px dashed %2; padding-top: 4px;")
        .arg(warning_text_colour(palette).name(), warning_border_colour(palette).name());
  });
  layout->addWidget(marker_label_);
}

void MessageWidget::build_bubble(const kvchat::app::MessageRecord& message) {
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(10, 6, 10, 6);
  layout->setSpacing(3);
  const bool is_user = role_ == MessageRole::User;
  setFrameShape(QFrame::StyledPanel);
  // Tints over the palette's base colour, so that a dark palette gets dark bubbles.
  setStyleSheet(is_user ? "kvchat--ui--MessageWidget { background: rgba(80, 140, 230, 40); border: 1px solid rgba(80, "
                          "140, 230, 110); border-radius: 8px; }"
                        : "kvchat--ui--MessageWidget { background: rgba(128, 128, 128, 22); border: 1px solid "
                          "rgba(128, 128, 128, 80); border-radius: 8px; }");
  auto* header_row = new QHBoxLayout;
  header_ = new QLabel(this);
  header_->setObjectName("messageHeader");
  QString who = is_user                        ? QStringLiteral("You")
                : role_ == MessageRole::System ? QStringLiteral("System")
                : role_ == MessageRole::Tool   ? QStringLiteral("Tool result")
                                               : QStringLiteral("Assistant");
  if (role_ == MessageRole::Tool && !message.tool_name.isEmpty())
    who += QStringLiteral(" \u00b7 ") + message.tool_name;
  else if (!is_user && !message.model.isEmpty())
    who += QStringLiteral(" \u00b7 ") + message.model;
  header_->setText(QStringLiteral("<b>%1</b>").arg(who.toHtmlEscaped()));
  if (message.created_at.isValid())
    header_->setToolTip(QLocale().toString(message.created_at.toLocalTime(), QLocale::LongFormat));
  header_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  header_row->addWidget(header_, 1);
  live_figures_ = new QLabel(this);
  live_figures_->setObjectName("liveFigures");
  live_figures_->hide();
  header_row->addWidget(live_figures_);
  if (!is_user) {
    // "‹ 1/2 ›": the replies Regenerate kept for this turn.
    previous_alternative_ = new QToolButton(this);
    previous_alternative_->setObjectName("previousAlternativeButton");
    previous_alternative_->setText(QStringLiteral("\u2039"));
    previous_alternative_->setToolTip(tr("The previous reply to this message"));
    alternative_label_ = new QLabel(this);
    alternative_label_->setObjectName("alternativeLabel");
    next_alternative_ = new QToolButton(this);
    next_alternative_->setObjectName("nextAlternativeButton");
    next_alternative_->setText(QStringLiteral("\u203a"));
    next_alternative_->setToolTip(tr("The next reply to this message"));
    for (QToolButton* button : {previous_alternative_, next_alternative_}) {
      button->setAutoRaise(true);
      button->setFocusPolicy(Qt::NoFocus);
      button->hide();
    }
    alternative_label_->hide();
    connect(previous_alternative_, &QToolButton::clicked, this, [this] {
      if (alternative_index_ > 0) Q_EMIT alternativeRequested(alternatives_[alternative_index_ - 1]);
    });
    connect(next_alternative_, &QToolButton::clicked, this, [this] {
      if (alternative_index_ + 1 < alternatives_.size())
        Q_EMIT alternativeRequested(alternatives_[alternative_index_ + 1]);
    });
    header_row->addWidget(previous_alternative_);
    header_row->addWidget(alternative_label_);
    header_row->addWidget(next_alternative_);
  } else {
    // "‹ 1/2 ›": the branches editing this message started; each shows its own continuation.
    previous_branch_ = new QToolButton(this);
    previous_branch_->setObjectName("previousBranchButton");
    previous_branch_->setText(QStringLiteral("\u2039"));
    previous_branch_->setToolTip(tr("The previous version of this message, with the chat that followed it"));
    branch_label_ = new QLabel(this);
    branch_label_->setObjectName("branchLabel");
    next_branch_ = new QToolButton(this);
    next_branch_->setObjectName("nextBranchButton");
    next_branch_->setText(QStringLiteral("\u203a"));
    next_branch_->setToolTip(tr("The next version of this message, with the chat that followed it"));
    for (QToolButton* button : {previous_branch_, next_branch_}) {
      button->setAutoRaise(true);
      button->setFocusPolicy(Qt::NoFocus);
      button->hide();
    }
    branch_label_->hide();
    connect(previous_branch_, &QToolButton::clicked, this, [this] {
      if (branch_index_ > 0) Q_EMIT branchRequested(branches_[branch_index_ - 1]);
    });
    connect(next_branch_, &QToolButton::clicked, this, [this] {
      if (branch_index_ + 1 < branches_.size()) Q_EMIT branchRequested(branches_[branch_index_ + 1]);
    });
    header_row->addWidget(previous_branch_);
    header_row->addWidget(branch_label_);
    header_row->addWidget(next_branch_);
  }
  copy_button_ = new QToolButton(this);
  copy_button_->setObjectName("copyButton");
  copy_button_->setText(tr("Copy"));
  copy_button_->setToolTip(tr("Copy this message to the clipboard"));
  copy_button_->setAutoRaise(true);
  // Not a Tab stop: a long transcript would put dozens of them between the input and the other controls.
  copy_button_->setFocusPolicy(Qt::NoFocus);
  connect(copy_button_, &QToolButton::clicked, this, [this] {
    QGuiApplication::clipboard()->setText(text_);
    show_copied(copy_button_, tr("Copy"));
    Q_EMIT copied(text_);
  });
  header_row->addWidget(copy_button_);
  if (is_user) {
    edit_button_ = new QToolButton(this);
    edit_button_->setObjectName("editMessageButton");
    edit_button_->setText(tr("Edit"));
    edit_button_->setToolTip(
        tr("Edit this message: the chat goes on from the edit, and the version before it "
           "is kept (switch with \u2039 \u203a)"));
    edit_button_->setAutoRaise(true);
    edit_button_->setFocusPolicy(Qt::NoFocus);  // as Copy
    connect(edit_button_, &QToolButton::clicked, this, [this] { Q_EMIT editRequested(message_id_); });
    header_row->addWidget(edit_button_);
  }
  if (role_ == MessageRole::User || role_ == MessageRole::Assistant) {
    delete_button_ = new QToolButton(this);
    delete_button_->setObjectName("deleteMessageButton");
    delete_button_->setText(tr("Delete"));
    delete_button_->setToolTip(role_ == MessageRole::User ? tr("Delete this message and the replies to it")
                                                          : tr("Delete this reply"));
    delete_button_->setAutoRaise(true);
    delete_button_->setFocusPolicy(Qt::NoFocus);  // as Copy
    connect(delete_button_, &QToolButton::clicked, this, [this] { Q_EMIT deleteRequested(message_id_); });
    header_row->addWidget(delete_button_);
  }
  layout->addLayout(header_row);

  body_ = new MessageBody(this);
  layout->addWidget(body_);

  stats_ = new QLabel(this);
  stats_->setObjectName("messageStats");
  stats_->setWordWrap(true);
  stats_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  stats_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  layout->addWidget(stats_);

  auto* cut_row = new QHBoxLayout;
  cut_short_ = new QLabel(this);
  cut_short_->setObjectName("cutShortLabel");
  cut_short_->setWordWrap(true);
  set_palette_style_sheet(cut_short_, [](const QPalette& palette) {
    return QStringLiteral("color: %1; font-size: 11px;").arg(warning_text_colour(palette).name());
  });
  cut_short_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  continue_button_ = new QPushButton(tr("Continue"), this);
  continue_button_->setObjectName("continueButton");
  continue_button_->setToolTip(tr("Let the model go on writing this reply"));
  continue_button_->setFocusPolicy(Qt::NoFocus);
  continue_button_->hide();
  connect(continue_button_, &QPushButton::clicked, this, [this] { Q_EMIT continueRequested(message_id_); });
  // The context limit's two ways out.
  new_chat_button_ = new QPushButton(tr("New chat"), this);
  new_chat_button_->setObjectName("contextNewChatButton");
  new_chat_button_->setToolTip(tr("Start a new chat: the whole context is free again"));
  drop_oldest_button_ = new QPushButton(tr("Drop the oldest turns"), this);
  drop_oldest_button_->setObjectName("dropOldestTurnsButton");
  drop_oldest_button_->setToolTip(
      tr("From the next message on, leave out the oldest turns when the context is full "
         "(Settings > When the context is full)"));
  for (QPushButton* button : {new_chat_button_, drop_oldest_button_}) {
    button->setFocusPolicy(Qt::NoFocus);
    button->hide();
  }
  connect(new_chat_button_, &QPushButton::clicked, this, &MessageWidget::newChatRequested);
  connect(drop_oldest_button_, &QPushButton::clicked, this, &MessageWidget::dropOldestTurnsRequested);
  cut_row->addWidget(cut_short_, 1);
  cut_row->addWidget(continue_button_);
  cut_row->addWidget(new_chat_button_);
  cut_row->addWidget(drop_oldest_button_);
  layout->addLayout(cut_row);
}

QString MessageWidget::statsText() const { return stats_ ? stats_->text() : QString(); }

QString MessageWidget::cutShortText() const {
  return cut_short_ && !cut_short_->isHidden() ? cut_short_->text() : QString();
}

void MessageWidget::setRecord(const kvchat::app::MessageRecord& message) {
  text_ = message.text;
  tool_use_.role = message.role;
  tool_use_.tool_calls = message.tool_calls;
  tool_use_.tool_call_id = message.tool_call_id;
  tool_use_.tool_name = message.tool_name;
  failed_ = kvchat::app::is_failed_reply(message);
  complete_ = message.complete;
  stop_reason_ = message.stats.value(QStringLiteral("stop_reason")).toString();
  closed_by_app_ = message.stats.value(kvchat::app::kReplyClosedByAppKey).toBool();
  if (message.complete) setLiveFigures(QString());
  if (stats_) {
    const QString line = format_stored_stats(message.stats);
    stats_->setText(line);
    stats_->setVisible(!line.isEmpty());
    set_palette_style_sheet(stats_, [failed = failed_](const QPalette& palette) {
      return failed ? QStringLiteral("color: %1; font-weight: bold;").arg(error_text_colour(palette).name())
                    : QStringLiteral("color: palette(mid); font-size: 11px;");
    });
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
  if (!streaming) setLiveFigures(QString());
  render();
}

void MessageWidget::setLiveFigures(const QString& figures) {
  if (!live_figures_) return;
  live_figures_->setText(figures);
  live_figures_->setVisible(!figures.isEmpty());
}

QString MessageWidget::liveFigures() const { return live_figures_ ? live_figures_->text() : QString(); }

void MessageWidget::setOffersDropOldestTurns(bool offers) {
  offers_drop_oldest_ = offers;
  render();
}

void MessageWidget::setContinuable(bool continuable) {
  if (continue_button_) continue_button_->setVisible(continuable && !streaming_);
}

void MessageWidget::setAlternatives(const QList<qint64>& ids, int index) {
  if (!alternative_label_) return;
  alternatives_ = ids;
  alternative_index_ = index;
  const bool several = ids.size() > 1;
  alternative_label_->setText(several ? alternativesText() : QString());
  for (QWidget* widget : {static_cast<QWidget*>(previous_alternative_), static_cast<QWidget*>(alternative_label_),
                          static_cast<QWidget*>(next_alternative_)})
    widget->setVisible(several);
  previous_alternative_->setEnabled(index > 0);
  next_alternative_->setEnabled(index + 1 < ids.size());
}

void MessageWidget::setBranches(const QList<qint64>& ids, int index) {
  if (!branch_label_) return;
  branches_ = ids;
  branch_index_ = index;
  const bool several = ids.size() > 1;
  branch_label_->setText(several ? branchesText() : QString());
  for (QWidget* widget : {static_cast<QWidget*>(previous_branch_), static_cast<QWidget*>(branch_label_),
                          static_cast<QWidget*>(next_branch_)})
    widget->setVisible(several);
  previous_branch_->setEnabled(index > 0);
  next_branch_->setEnabled(index + 1 < ids.size());
}

QString MessageWidget::branchesText() const {
  return branches_.size() > 1 ? QStringLiteral("%1/%2").arg(branch_index_ + 1).arg(branches_.size()) : QString();
}

QString MessageWidget::alternativesText() const {
  return alternatives_.size() > 1 ? QStringLiteral("%1/%2").arg(alternative_index_ + 1).arg(alternatives_.size())
                                  : QString();
}

void MessageWidget::render() {
  render_timer_.stop();
  if (role_ == MessageRole::Marker) {
    marker_label_->setText(text_);
    return;
  }
  if (cut_short_) {
    QString note;
    bool context_full = false;
    if (!streaming_ && !failed_ && role_ == MessageRole::Assistant) {
      if (!complete_)
        note = tr("Cut short: the app closed before this reply finished.");
      else if (stop_reason_ == QLatin1String("max_tokens"))
        note = tr("Cut short at the max-tokens setting.");
      else if (stop_reason_ == QLatin1String("stopped") && closed_by_app_)
        note = tr("Cut short: the app was quit during this reply.");
      else if (stop_reason_ == QLatin1String("stopped"))
        note = tr("Stopped before the end.");
      else if (stop_reason_ == QLatin1String("context_full")) {
        context_full = true;
        note = offers_drop_oldest_
                   ? tr("Stopped at the context limit: this chat fills the model's context. To go on, start a new "
                        "chat, or let the oldest turns be dropped to make room.")
                   : tr("Stopped at the context limit: this chat fills the model's context. The next message drops "
                        "the oldest turns to make room; or start a new chat.");
      }
    }
    cut_short_->setText(note);
    cut_short_->setVisible(!note.isEmpty());
    // As visible as the max-tokens note, not only the faint stats line.
    const QString note_style =
        context_full ? QStringLiteral("color: %1; font-weight: bold;") : QStringLiteral("color: %1; font-size: 11px;");
    set_palette_style_sheet(cut_short_, [note_style](const QPalette& palette) {
      return note_style.arg(warning_text_colour(palette).name());
    });
    new_chat_button_->setVisible(context_full);
    drop_oldest_button_->setVisible(context_full && offers_drop_oldest_);
    if (streaming_) continue_button_->hide();
  }
  if (text_.isEmpty() && streaming_) {
    body_->setContent(tr("\u2026"), false);
    return;
  }
  // A failed turn's error is in the stats line; an empty body would only add a blank bubble.
  body_->setVisible(!(failed_ && text_.isEmpty()));
  if (role_ == MessageRole::Tool) {
    tool_use_.text = text_;
    body_->setContent(kvchat::app::tool_result_markdown(tool_use_), true);
  } else if (!tool_use_.tool_calls.isEmpty()) {
    // The calls under the text the reply wrote before them (often none).
    const QString calls = kvchat::app::tool_calls_markdown(tool_use_);
    body_->setContent(text_.isEmpty() ? calls : text_ + QStringLiteral("\n\n") + calls, true);
  } else {
    body_->setContent(text_, role_ != MessageRole::User);
  }
}

}  // namespace kvchat::ui
