#include "ui/priority_row_layout.h"

#include <QWidget>

#include <algorithm>
#include <numeric>

namespace kvchat::ui {

PriorityRowLayout::PriorityRowLayout(QWidget* parent) : QLayout(parent) {}

PriorityRowLayout::~PriorityRowLayout() {
  for (const Field& field : fields_) delete field.item;
}

void PriorityRowLayout::addField(QWidget* field, int rank) {
  addChildWidget(field);
  fields_.push_back({new QWidgetItem(field), rank});
  invalidate();
}

void PriorityRowLayout::addItem(QLayoutItem* item) {
  int rank = 0;
  for (const Field& field : fields_) rank = std::max(rank, field.rank + 1);
  fields_.push_back({item, rank});
  invalidate();
}

QLayoutItem* PriorityRowLayout::itemAt(int index) const {
  return index >= 0 && index < fields_.size() ? fields_[index].item : nullptr;
}

QLayoutItem* PriorityRowLayout::takeAt(int index) {
  if (index < 0 || index >= fields_.size()) return nullptr;
  QLayoutItem* item = fields_.takeAt(index).item;
  invalidate();
  return item;
}

QSize PriorityRowLayout::total(bool minimum) const {
  int width = 0, height = 0, shown = 0;
  for (const Field& field : fields_) {
    if (field.item->isEmpty()) continue;
    const QSize size = minimum ? field.item->minimumSize() : field.item->sizeHint();
    width += size.width();
    height = std::max(height, size.height());
    ++shown;
  }
  const QMargins margins = contentsMargins();
  width += std::max(0, shown - 1) * spacing() + margins.left() + margins.right();
  return {width, height + margins.top() + margins.bottom()};
}

QSize PriorityRowLayout::sizeHint() const { return total(false); }

QSize PriorityRowLayout::minimumSize() const { return total(true); }

void PriorityRowLayout::setGeometry(const QRect& rect) {
  QLayout::setGeometry(rect);
  const QRect area = contentsRect();
  QList<int> shown;
  for (int i = 0; i < fields_.size(); ++i)
    if (!fields_[i].item->isEmpty()) shown.push_back(i);
  QList<int> widths(fields_.size(), 0);
  int spare = area.width() - std::max(0, static_cast<int>(shown.size()) - 1) * spacing();
  for (int i : shown) {
    widths[i] = fields_[i].item->minimumSize().width();
    spare -= widths[i];
  }
  QList<int> by_rank = shown;
  std::stable_sort(by_rank.begin(), by_rank.end(), [this](int a, int b) { return fields_[a].rank < fields_[b].rank; });
  for (int i : by_rank) {
    const int wanted = std::max(0, fields_[i].item->sizeHint().width() - widths[i]);
    const int granted = std::clamp(spare, 0, wanted);
    widths[i] += granted;
    spare -= granted;
  }
  int used = std::max(0, static_cast<int>(shown.size()) - 1) * spacing();
  for (int i : shown) used += widths[i];
  int x = area.x() + std::max(0, area.width() - used);
  for (int i : shown) {
    fields_[i].item->setGeometry(QRect(x, area.y(), widths[i], area.height()));
    x += widths[i] + spacing();
  }
}

}  // namespace kvchat::ui
