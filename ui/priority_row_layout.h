#pragma once
// A row of fields (the status bar's) that share a width too small for all of them by rank: each field gets at
// least its minimum width, and what is left goes to the fields in rank order, the first rank filled first. So
// when the window narrows, the least important fields elide first and the most important keep their whole
// text. The fields sit at the row's right end, in the order they were added.
#include <QLayout>
#include <QList>

namespace kvchat::ui {

class PriorityRowLayout : public QLayout {
  Q_OBJECT
 public:
  explicit PriorityRowLayout(QWidget* parent = nullptr);
  ~PriorityRowLayout() override;

  // rank 0 is served first; fields of equal rank are served left to right.
  void addField(QWidget* field, int rank);

  void addItem(QLayoutItem* item) override;  // rank: after every field added so far
  QLayoutItem* itemAt(int index) const override;
  QLayoutItem* takeAt(int index) override;
  int count() const override { return static_cast<int>(fields_.size()); }
  QSize sizeHint() const override;
  QSize minimumSize() const override;
  void setGeometry(const QRect& rect) override;

 private:
  struct Field {
    QLayoutItem* item = nullptr;
    int rank = 0;
  };
  QSize total(bool minimum) const;
  QList<Field> fields_;
};

}  // namespace kvchat::ui
