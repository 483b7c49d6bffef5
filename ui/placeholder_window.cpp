#include "ui/placeholder_window.h"

#include <QLabel>

namespace kvchat::ui {

PlaceholderWindow::PlaceholderWindow(const QString& model_description, QWidget* parent) : QMainWindow(parent) {
  setWindowTitle("kvchat");
  auto* label = new QLabel(model_description, this);
  label->setAlignment(Qt::AlignCenter);
  setCentralWidget(label);
  resize(640, 400);
}

}  // namespace kvchat::ui
