#pragma once
// File > Models ("modelsDialog", non-modal): the recently loaded models ("recentModelsList", most recent
// first; a missing one says so and can be removed) and the models found in the folders to scan
// ("modelFoldersList", added and removed here, kept in the settings; "foundModelsList"). Each row gives the
// model's format, size on disk, architecture and GGUF quantization, read from its metadata without loading it;
// a file that cannot be read says why in its row. Enter or a double-click loads the model.
#include <QDialog>

#include <atomic>
#include <memory>

#include "app/model_catalog.h"

class QListWidget;
class QPushButton;
class QThread;
class QTreeWidget;
class QTreeWidgetItem;

namespace kvchat::app {
class ChatController;
}

namespace kvchat::ui {

class ModelsDialog : public QDialog {
  Q_OBJECT
 public:
  enum Column { NameColumn, FormatColumn, SizeColumn, ArchitectureColumn, QuantizationColumn, StatusColumn };
  static constexpr int kPathRole = Qt::UserRole;

  ModelsDialog(kvchat::app::ChatController* controller, QWidget* parent = nullptr);
  ~ModelsDialog() override;

  QTreeWidget* recentList() const { return recent_; }
  QTreeWidget* foundList() const { return found_; }
  QListWidget* foldersList() const { return folders_; }
  // Adds a folder to scan (saved in the settings) and scans again.
  void addFolder(const QString& path);
  // Scans the folders on a thread of its own; scanFinished() when the list is filled.
  void startScan();
  bool isScanning() const { return scan_thread_ != nullptr; }

 Q_SIGNALS:
  void loadRequested(const QString& path);
  void scanFinished();

 private:
  void refresh_recent();
  void show_found(const QList<kvchat::app::ModelDescription>& models);
  void remove_selected_recent();
  void remove_selected_folder();
  void choose_folder();
  void activate(QTreeWidgetItem* item);

  kvchat::app::ChatController* controller_;
  QTreeWidget* recent_ = nullptr;
  QTreeWidget* found_ = nullptr;
  QListWidget* folders_ = nullptr;
  QPushButton* remove_recent_ = nullptr;
  QThread* scan_thread_ = nullptr;
  std::shared_ptr<std::atomic<bool>> scan_stop_;
  bool rescan_ = false;  // the folders changed during a scan: scan again after it
};

// One row of the lists, as the dialog fills it (exposed for the tests).
void fill_model_row(QTreeWidgetItem* item, const kvchat::app::ModelDescription& model, const QString& loaded_path);

}  // namespace kvchat::ui
