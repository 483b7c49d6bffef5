#pragma once
// Chat > Caches in memory: which chats hold a KV cache now, how many tokens and bytes each, against the
// memory budget, with a Clear button per chat. Refreshes itself as the engine reports cache changes.
#include <QDialog>

namespace kvchat::app {
class ChatController;
}

class QLabel;
class QTableWidget;

namespace kvchat::ui {

class CachesDialog : public QDialog {
  Q_OBJECT
 public:
  explicit CachesDialog(kvchat::app::ChatController* controller, QWidget* parent = nullptr);
  QTableWidget* table() const { return table_; }
  QLabel* totalLabel() const { return total_; }

 private:
  void refresh();
  kvchat::app::ChatController* controller_;
  QTableWidget* table_ = nullptr;
  QLabel* total_ = nullptr;
};

}  // namespace kvchat::ui
