#include "ui/chat_view.h"
#include "ui/appearance.h"

#include <QApplication>
#include <QEvent>
#include <QLabel>
#include <QScrollBar>
#include <QTextBrowser>
#include <QTimer>
#include <QVBoxLayout>

#include "app/store/chat_history.h"
#include "ui/message_list_model.h"
#include "ui/message_widget.h"

namespace kvchat::ui {

using kvchat::app::MessageRole;

ChatView::ChatView(QWidget* parent) : QScrollArea(parent) {
  setObjectName("chatView");
  setWidgetResizable(true);
  setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  // One Tab stop for the whole transcript (arrows and PgUp/PgDn scroll it); what is inside is not in the chain.
  setFocusPolicy(Qt::TabFocus);
  container_ = new QWidget(this);
  // The transcript is exactly as wide as the view: long words wrap, long code lines scroll in their block.
  container_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  layout_ = new QVBoxLayout(container_);
  layout_->setContentsMargins(12, 12, 12, 12);
  layout_->setSpacing(10);
  placeholder_ = new QLabel(container_);
  placeholder_->setObjectName("chatPlaceholder");
  placeholder_->setWordWrap(true);
  placeholder_->setAlignment(Qt::AlignCenter);
  placeholder_->setTextFormat(Qt::RichText);
  placeholder_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  // The text colour itself: the first thing a new user reads must be as legible as a message.
  placeholder_->setStyleSheet("color: palette(text); padding: 24px;");
  placeholder_->hide();
  layout_->addStretch(1);
  setWidget(container_);
  setModel(new MessageListModel(this));
  // Follow new text only while the reader is at the bottom.
  connect(verticalScrollBar(), &QScrollBar::valueChanged, this,
          [this](int value) { following_ = value >= verticalScrollBar()->maximum() - 24; });
  connect(verticalScrollBar(), &QScrollBar::rangeChanged, this, [this](int, int maximum) {
    if (following_) verticalScrollBar()->setValue(maximum);
  });
}

void ChatView::setModel(MessageListModel* model) {
  if (model_) {
    model_->disconnect(this);
    if (model_->parent() == this) model_->deleteLater();  // the view's own, replaced
  }
  model_ = model;
  connect(model_, &QAbstractItemModel::rowsInserted, this,
          [this](const QModelIndex&, int first, int last) { insert_rows(first, last); });
  connect(model_, &QAbstractItemModel::rowsAboutToBeRemoved, this,
          [this](const QModelIndex&, int first, int last) { remove_rows(first, last); });
  connect(model_, &QAbstractItemModel::dataChanged, this,
          [this](const QModelIndex& top, const QModelIndex& bottom, const QList<int>& roles) {
            for (int row = top.row(); row <= bottom.row(); ++row) update_message_widget(row, roles);
          });
  connect(model_, &QAbstractItemModel::modelReset, this, &ChatView::rebuild);
  connect(model_, &QAbstractItemModel::layoutChanged, this, &ChatView::rebuild);
  connect(model_, &QAbstractItemModel::rowsMoved, this, &ChatView::rebuild);
  connect(model_, &MessageListModel::messagesSet, this, &ChatView::messages_set);
  rebuild();
}

void ChatView::rebuild() {
  if (!widgets_.isEmpty()) remove_rows(0, static_cast<int>(widgets_.size()) - 1);
  if (model_->rowCount() > 0) insert_rows(0, model_->rowCount() - 1);
}

void ChatView::insert_rows(int first, int last) {
  if (layout_->indexOf(placeholder_) >= 0) layout_->removeWidget(placeholder_);  // put back by refresh_placeholder()
  // After the widget of the row before (error lines stay at the end, after every message).
  int layout_position = first == 0 ? 0 : layout_->indexOf(widgets_[first - 1]) + 1;
  for (int row = first; row <= last; ++row) {
    MessageWidget* widget = make_message_widget(row);
    layout_->insertWidget(layout_position++, widget);
    widgets_.insert(row, widget);
  }
  // The rows whose groups a new row changes (a new alternative counts in every reply of its turn) are reported
  // changed by the model.
  refresh_placeholder();
  scroll_to_bottom_if_following();
}

void ChatView::remove_rows(int first, int last) {
  for (int row = last; row >= first; --row) {
    MessageWidget* widget = widgets_.takeAt(row);
    // Asked of the widget itself: while rows go, the model's rows and widgets_ do not line up.
    if (widget->messageId() == found_message_) {
      found_message_ = 0;
      found_view_ = -1;
    }
    layout_->removeWidget(widget);
    widget->hide();
    widget->deleteLater();
  }
  refresh_placeholder();
}

void ChatView::update_message_widget(int row, const QList<int>& roles) {
  MessageWidget* widget = widgets_.value(row);
  if (!widget) return;
  const kvchat::app::MessageRecord& record = model_->record(row);
  // Only the text grew: the widget appends it (its rendering is coalesced while it streams).
  if (roles == QList<int>{Qt::DisplayRole} && record.text.startsWith(widget->text())) {
    widget->appendText(record.text.mid(widget->text().size()));
    return;
  }
  widget->setStreaming(model_->isStreaming(row));
  widget->setRecord(record);
  show_groups(widget, row);
  scroll_to_bottom_if_following();
}

void ChatView::show_groups(MessageWidget* widget, int row) {
  if (widget->role() == MessageRole::User) {
    const QList<qint64>& branches = model_->branches(row);
    widget->setBranches(branches, static_cast<int>(branches.indexOf(widget->messageId())));
  }
  if (widget->role() == MessageRole::Assistant) {
    const QList<qint64>& alternatives = model_->alternatives(row);
    widget->setAlternatives(alternatives, static_cast<int>(alternatives.indexOf(widget->messageId())));
  }
}

void ChatView::messages_set() {
  // Error lines belong to the transcript as it was.
  for (int i = layout_->count() - 1; i >= 0; --i) {
    QWidget* item_widget = layout_->itemAt(i)->widget();
    if (!item_widget || item_widget->objectName() != QLatin1String("chatError")) continue;
    delete layout_->takeAt(i);
    item_widget->hide();
    item_widget->deleteLater();
  }
  refresh_placeholder();
  following_ = true;
  found_message_ = 0;
  found_view_ = -1;
  scroll_to_bottom_if_following();
}

MessageWidget* ChatView::make_message_widget(int row) {
  const kvchat::app::MessageRecord& message = model_->record(row);
  auto* widget = new MessageWidget(message, container_);
  widget->setFont(font());  // see changeEvent
  if (model_->isStreaming(row)) widget->setStreaming(true);
  connect(widget, &MessageWidget::continueRequested, this, &ChatView::continueRequested);
  connect(widget, &MessageWidget::deleteRequested, this, &ChatView::deleteMessageRequested);
  connect(widget, &MessageWidget::alternativeRequested, this, &ChatView::alternativeRequested);
  connect(widget, &MessageWidget::editRequested, this, &ChatView::editMessageRequested);
  connect(widget, &MessageWidget::branchRequested, this, &ChatView::branchRequested);
  connect(widget, &MessageWidget::newChatRequested, this, &ChatView::newChatRequested);
  connect(widget, &MessageWidget::dropOldestTurnsRequested, this, &ChatView::dropOldestTurnsRequested);
  widget->setOffersDropOldestTurns(offers_drop_oldest_);
  widget->setContinuable(message.id == continuable_message_);
  show_groups(widget, row);
  return widget;
}

namespace {

struct TextViewOfMessage {
  qint64 message_id = 0;
  QTextBrowser* view = nullptr;
};

// Every text view of the transcript (prose and code), in reading order.
QList<TextViewOfMessage> transcript_text_views(const QList<MessageWidget*>& widgets) {
  QList<TextViewOfMessage> views;
  for (MessageWidget* widget : widgets)
    for (QTextBrowser* view : widget->findChildren<QTextBrowser*>()) views.push_back({widget->messageId(), view});
  return views;
}

}  // namespace

qint64 ChatView::findText(const QString& text, qint64 from_message) {
  if (text.isEmpty()) return 0;
  const QList<TextViewOfMessage> views = transcript_text_views(messageWidgets());
  if (views.isEmpty()) return 0;
  int start = found_view_ >= 0 && found_view_ < views.size() ? found_view_ : 0;
  bool from_cursor = found_view_ >= 0 && found_view_ < views.size() && from_message == 0;
  if (from_message != 0) {
    for (int i = 0; i < views.size(); ++i)
      if (views[i].message_id == from_message) {
        start = i;
        break;
      }
  }
  // Once round the transcript, back to the view it started in (from its beginning).
  for (int step = 0; step <= views.size(); ++step) {
    const int index = (start + step) % views.size();
    QTextBrowser* view = views[index].view;
    const QTextCursor after = step == 0 && from_cursor ? view->textCursor() : QTextCursor(view->document());
    const QTextCursor found = view->document()->find(text, after);
    if (found.isNull()) continue;
    for (const TextViewOfMessage& other : views)
      if (other.view != view) other.view->setTextCursor(QTextCursor(other.view->document()));
    view->setTextCursor(found);
    following_ = false;
    ensureWidgetVisible(view);
    found_view_ = index;
    found_message_ = views[index].message_id;
    return found_message_;
  }
  return 0;
}

void ChatView::showMessage(qint64 message_id, const QString& text) {
  MessageWidget* widget = messageWidget(message_id);
  if (!widget) return;
  following_ = false;
  found_view_ = -1;
  if (findText(text, message_id) == message_id) return;
  ensureWidgetVisible(widget);  // the match was a word's beginning or differed in accents: the message itself
  found_message_ = message_id;
}

void ChatView::showError(const QString& message) {
  auto* label = new QLabel(container_);
  label->setObjectName("chatError");
  label->setWordWrap(true);
  label->setTextInteractionFlags(Qt::TextSelectableByMouse);
  label->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  set_palette_style_sheet(label, [](const QPalette& colours) {
    return QStringLiteral("color: %1; background: %2; border: 1px solid %3; border-radius: 6px; padding: 6px;")
        .arg(error_text_colour(colours).name(), error_background_colour(colours).name(),
             error_border_colour(colours).name());
  });
  label->setText(message);
  layout_->insertWidget(layout_->count() - 1, label);
  scroll_to_bottom_if_following();
}

void ChatView::setPlaceholder(const QString& text) {
  placeholder_->setText(text);
  refresh_placeholder();
}

QString ChatView::placeholderText() const { return placeholder_->isHidden() ? QString() : placeholder_->text(); }

void ChatView::refresh_placeholder() {
  const bool empty = messageWidgets().isEmpty();
  if (empty && layout_->indexOf(placeholder_) < 0) layout_->insertWidget(0, placeholder_);
  if (!empty && layout_->indexOf(placeholder_) >= 0) layout_->removeWidget(placeholder_);
  placeholder_->setVisible(empty && !placeholder_->text().isEmpty());
}

void ChatView::setContinuableMessage(qint64 message_id) {
  continuable_message_ = message_id;
  for (MessageWidget* widget : messageWidgets()) widget->setContinuable(widget->messageId() == message_id);
}

void ChatView::changeEvent(QEvent* event) {
  QScrollArea::changeEvent(event);
  // A bubble has a style sheet, and the widgets under one keep the font they had when they were polished:
  // the transcript's text size (View > Larger text) reaches a message only when given to it and its style
  // sheet is applied again.
  if (event->type() != QEvent::FontChange) return;
  for (MessageWidget* widget : messageWidgets()) {
    widget->setFont(font());
    // The new size on the fonts fixed at polish time (a code view keeps its family), then polish again (a
    // label whose style sheet names a size gets that size back).
    for (QWidget* child : widget->findChildren<QWidget*>()) {
      QFont child_font = child->font();
      child_font.setPointSizeF(font().pointSizeF());
      child->setFont(child_font);
    }
    const QString sheet = widget->styleSheet();
    widget->setStyleSheet(QString());
    widget->setStyleSheet(sheet);
  }
}

void ChatView::setOffersDropOldestTurns(bool offers) {
  if (offers == offers_drop_oldest_) return;
  offers_drop_oldest_ = offers;
  for (MessageWidget* widget : messageWidgets()) widget->setOffersDropOldestTurns(offers);
}

MessageWidget* ChatView::messageWidget(qint64 message_id) const {
  const int row = model_->rowOf(message_id);
  return row >= 0 ? widgets_.value(row) : nullptr;
}

void ChatView::scroll_to_bottom_if_following() {
  if (!following_) return;
  // After the layout has settled, so that the new height is known.
  QTimer::singleShot(0, this, [this] { verticalScrollBar()->setValue(verticalScrollBar()->maximum()); });
}

}  // namespace kvchat::ui
