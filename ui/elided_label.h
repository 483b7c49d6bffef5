#pragma once
// A one-line label for the status bar: when it gets less width than its text needs it shows the text cut
// with "…" (the whole text in its tooltip) instead of being cut mid-figure or drawn over its neighbours.
#include <QLabel>

namespace kvchat::ui {

class ElidedLabel : public QLabel {
  Q_OBJECT
 public:
  explicit ElidedLabel(QWidget* parent = nullptr);
  void setFullText(const QString& text);
  QString fullText() const { return full_text_; }
  // What is drawn at the current width: the full text, or its start and "…".
  QString shownText() const;
  // A field that must stay readable (the live speed): never narrower than its text, so never elided.
  void setElidable(bool elidable);
  bool isElidable() const { return elidable_; }
  // The field keeps at least this text's width whatever it shows (empty included), so that figures which
  // change several times a second do not make it, and its neighbours, jump.
  void setReservedText(const QString& text);

  QSize sizeHint() const override;
  QSize minimumSizeHint() const override;

 protected:
  void paintEvent(QPaintEvent* event) override;

 private:
  QString full_text_;
  QString reserved_text_;
  bool elidable_ = true;
};

}  // namespace kvchat::ui
