#include "ui/elided_label.h"

#include <QPainter>
#include <QStyle>

#include <algorithm>

namespace kvchat::ui {

namespace {
constexpr int kMinimumCharacters = 6;  // "TTFT…" still says which figure it was
}

ElidedLabel::ElidedLabel(QWidget* parent) : QLabel(parent) {
  setSizePolicy(QSizePolicy::Preferred, QSizePolicy::Preferred);
  setTextFormat(Qt::PlainText);
}

void ElidedLabel::setFullText(const QString& text) {
  full_text_ = text;
  QLabel::setText(text);  // for accessibility and text(); painting is ours
  setToolTip(text);
  updateGeometry();
  update();
}

void ElidedLabel::setElidable(bool elidable) {
  elidable_ = elidable;
  updateGeometry();
  update();
}

void ElidedLabel::setReservedText(const QString& text) {
  reserved_text_ = text;
  updateGeometry();
  update();
}

QString ElidedLabel::shownText() const {
  return fontMetrics().elidedText(full_text_, Qt::ElideRight, contentsRect().width());
}

QSize ElidedLabel::sizeHint() const {
  const QMargins margins = contentsMargins();
  const int text_width =
      std::max(fontMetrics().horizontalAdvance(full_text_), fontMetrics().horizontalAdvance(reserved_text_));
  return {text_width + margins.left() + margins.right() + 2, QLabel::sizeHint().height()};
}

QSize ElidedLabel::minimumSizeHint() const {
  if (!elidable_) return sizeHint();
  if (full_text_.isEmpty()) return {0, QLabel::minimumSizeHint().height()};
  const int width = fontMetrics().horizontalAdvance(full_text_.left(kMinimumCharacters) + QChar(0x2026));
  return {std::min(width, sizeHint().width()), QLabel::minimumSizeHint().height()};
}

void ElidedLabel::paintEvent(QPaintEvent* event) {
  (void)event;
  QPainter painter(this);
  drawFrame(&painter);
  style()->drawItemText(&painter, contentsRect(), Qt::AlignVCenter | Qt::AlignLeft, palette(), isEnabled(), shownText(),
                        foregroundRole());
}

}  // namespace kvchat::ui
