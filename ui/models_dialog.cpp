#include "ui/models_dialog.h"

#include <spdlog/spdlog.h>

#include <QDialogButtonBox>
#include <QDir>
#include <QFileDialog>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QListWidget>
#include <QPointer>
#include <QPushButton>
#include <QThread>
#include <QTreeWidget>
#include <QVBoxLayout>

#include "app/chat/chat_controller.h"
#include "ui/stats_format.h"

namespace kvchat::ui {

using kvchat::app::ModelDescription;

void fill_model_row(QTreeWidgetItem* item, const ModelDescription& model, const QString& loaded_path) {
  item->setText(ModelsDialog::NameColumn, model.name);
  item->setText(ModelsDialog::FormatColumn, model.format);
  item->setText(ModelsDialog::SizeColumn, model.missing ? QString() : format_bytes(model.size_bytes));
  item->setText(ModelsDialog::ArchitectureColumn, model.architecture);
  item->setText(ModelsDialog::QuantizationColumn, model.quantization);
  QString status;
  if (model.missing)
    status = QObject::tr("Missing");
  else if (!model.error.isEmpty())
    status = QObject::tr("Cannot be read: %1").arg(model.error);
  else if (!loaded_path.isEmpty() && QDir::cleanPath(loaded_path) == QDir::cleanPath(model.path))
    status = QObject::tr("Loaded");
  item->setText(ModelsDialog::StatusColumn, status);
  item->setToolTip(ModelsDialog::NameColumn, model.path);
  item->setToolTip(ModelsDialog::StatusColumn, status);
  item->setData(ModelsDialog::NameColumn, ModelsDialog::kPathRole, model.path);
}

namespace {

QTreeWidget* model_list(const QString& object_name, QWidget* parent) {
  auto* list = new QTreeWidget(parent);
  list->setObjectName(object_name);
  list->setHeaderLabels({QObject::tr("Name"), QObject::tr("Format"), QObject::tr("Size"), QObject::tr("Architecture"),
                         QObject::tr("Quantization"), QObject::tr("Status")});
  list->setRootIsDecorated(false);
  list->setUniformRowHeights(true);
  list->setAllColumnsShowFocus(true);
  list->header()->setStretchLastSection(true);
  return list;
}

}  // namespace

ModelsDialog::ModelsDialog(kvchat::app::ChatController* controller, QWidget* parent)
    : QDialog(parent), controller_(controller) {
  setObjectName("modelsDialog");
  setWindowTitle(tr("Models"));
  auto* layout = new QVBoxLayout(this);
  layout->addWidget(new QLabel(tr("&Recent models (Enter or a double-click loads one):"), this));
  recent_ = model_list(QStringLiteral("recentModelsList"), this);
  qobject_cast<QLabel*>(layout->itemAt(0)->widget())->setBuddy(recent_);
  layout->addWidget(recent_, 1);
  remove_recent_ = new QPushButton(tr("Remove from the list"), this);
  remove_recent_->setObjectName("removeRecentModelButton");
  remove_recent_->setAutoDefault(false);
  auto* recent_buttons = new QHBoxLayout;
  recent_buttons->addStretch(1);
  recent_buttons->addWidget(remove_recent_);
  layout->addLayout(recent_buttons);

  auto* found_label = new QLabel(tr("Models &found in these folders:"), this);
  layout->addWidget(found_label);
  auto* folder_row = new QHBoxLayout;
  folders_ = new QListWidget(this);
  folders_->setObjectName("modelFoldersList");
  folders_->setMaximumHeight(folders_->fontMetrics().lineSpacing() * 4 + 8);
  auto* folder_buttons = new QVBoxLayout;
  auto* add_folder = new QPushButton(tr("&Add folder\u2026"), this);
  add_folder->setObjectName("addModelFolderButton");
  add_folder->setAutoDefault(false);
  auto* remove_folder = new QPushButton(tr("Remove &folder"), this);
  remove_folder->setObjectName("removeModelFolderButton");
  remove_folder->setAutoDefault(false);
  folder_buttons->addWidget(add_folder);
  folder_buttons->addWidget(remove_folder);
  folder_buttons->addStretch(1);
  folder_row->addWidget(folders_, 1);
  folder_row->addLayout(folder_buttons);
  layout->addLayout(folder_row);
  found_ = model_list(QStringLiteral("foundModelsList"), this);
  found_label->setBuddy(found_);
  layout->addWidget(found_, 1);
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Close, this);
  layout->addWidget(buttons);
  connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
  // Enter belongs to the lists (it loads the model there): it must not close the dialog as its default button.
  buttons->button(QDialogButtonBox::Close)->setAutoDefault(false);

  for (QTreeWidget* list : {recent_, found_}) connect(list, &QTreeWidget::itemActivated, this, &ModelsDialog::activate);
  connect(remove_recent_, &QPushButton::clicked, this, &ModelsDialog::remove_selected_recent);
  connect(add_folder, &QPushButton::clicked, this, &ModelsDialog::choose_folder);
  connect(remove_folder, &QPushButton::clicked, this, &ModelsDialog::remove_selected_folder);

  refresh_recent();
  folders_->addItems(controller_->backendHost().modelFolders());
  startScan();
  resize(820, 560);
}

ModelsDialog::~ModelsDialog() {
  if (scan_thread_) {
    scan_stop_->store(true);
    scan_thread_->wait();
    delete scan_thread_;  // its finished() handler, which would have, went with this dialog
  }
}

void ModelsDialog::refresh_recent() {
  recent_->clear();
  const QString loaded =
      controller_->backendHost().isModelLoaded() ? controller_->backendHost().modelInfo().path : QString();
  // Read from metadata alone, a few files at most: quick enough to do here.
  for (const QString& path : controller_->backendHost().recentModels()) {
    auto* item = new QTreeWidgetItem(recent_);
    fill_model_row(item, kvchat::app::describe_model(path), loaded);
  }
  if (recent_->topLevelItemCount() > 0) recent_->setCurrentItem(recent_->topLevelItem(0));
  for (int column = 0; column < StatusColumn; ++column) recent_->resizeColumnToContents(column);
}

void ModelsDialog::startScan() {
  if (scan_thread_) {
    rescan_ = true;
    return;
  }
  QStringList folders;
  for (int row = 0; row < folders_->count(); ++row) folders << folders_->item(row)->text();
  scan_stop_ = std::make_shared<std::atomic<bool>>(false);
  auto results = std::make_shared<QList<ModelDescription>>();
  // Reading the folders (and each model's header) can take long on a slow disk: never on the GUI thread.
  scan_thread_ = QThread::create([folders, results, stop = scan_stop_] {
    for (const QString& path : kvchat::app::scan_model_folders(folders, kvchat::app::kModelScanDepth, stop.get())) {
      if (stop->load()) break;
      results->append(kvchat::app::describe_model(path));
    }
  });
  connect(scan_thread_, &QThread::finished, this, [this, results] {
    scan_thread_->deleteLater();
    scan_thread_ = nullptr;
    show_found(*results);
    if (rescan_) {
      rescan_ = false;
      startScan();
      return;
    }
    Q_EMIT scanFinished();
  });
  scan_thread_->start();
}

void ModelsDialog::show_found(const QList<ModelDescription>& models) {
  found_->clear();
  const QString loaded =
      controller_->backendHost().isModelLoaded() ? controller_->backendHost().modelInfo().path : QString();
  for (const ModelDescription& model : models) fill_model_row(new QTreeWidgetItem(found_), model, loaded);
  for (int column = 0; column < StatusColumn; ++column) found_->resizeColumnToContents(column);
  spdlog::info("models dialog: {} models found in {} folders", models.size(), folders_->count());
}

void ModelsDialog::addFolder(const QString& path) {
  const QString folder = QDir::cleanPath(path);
  QStringList folders = controller_->backendHost().modelFolders();
  if (folder.isEmpty() || folders.contains(folder)) return;
  folders << folder;
  controller_->backendHost().setModelFolders(folders);
  folders_->addItem(folder);
  startScan();
}

void ModelsDialog::remove_selected_folder() {
  const QListWidgetItem* item = folders_->currentItem();
  if (!item) return;
  QStringList folders = controller_->backendHost().modelFolders();
  folders.removeAll(item->text());
  controller_->backendHost().setModelFolders(folders);
  delete folders_->takeItem(folders_->row(item));
  startScan();
}

void ModelsDialog::remove_selected_recent() {
  const QTreeWidgetItem* item = recent_->currentItem();
  if (!item) return;
  controller_->backendHost().removeRecentModel(item->data(NameColumn, kPathRole).toString());
  refresh_recent();
}

void ModelsDialog::choose_folder() {
  auto* picker = new QFileDialog(this, tr("Add a folder to scan for models"), QDir::homePath());
  picker->setObjectName("addModelFolderDialog");
  picker->setAttribute(Qt::WA_DeleteOnClose);
  picker->setFileMode(QFileDialog::Directory);
  picker->setOption(QFileDialog::ShowDirsOnly, true);
  connect(picker, &QFileDialog::fileSelected, this, [this](const QString& path) { addFolder(path); });
  picker->open();
}

void ModelsDialog::activate(QTreeWidgetItem* item) {
  if (!item) return;
  const QString status = item->text(StatusColumn);
  if (status == tr("Missing") || status.startsWith(tr("Cannot be read"))) return;  // its row says why
  Q_EMIT loadRequested(item->data(NameColumn, kPathRole).toString());
  accept();
}

}  // namespace kvchat::ui
