#pragma once
// Temporary main window until the chat UI lands: says which model is loaded.
#include <QMainWindow>

namespace kvchat::ui {

class PlaceholderWindow : public QMainWindow {
  Q_OBJECT
 public:
  explicit PlaceholderWindow(const QString& model_description, QWidget* parent = nullptr);
};

}  // namespace kvchat::ui
