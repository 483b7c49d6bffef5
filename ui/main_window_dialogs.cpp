// MainWindow, its dialogs: model pickers, export, settings, about, rename, delete, the system prompt. All are
// opened with open(), not exec(): the engine's signals keep arriving, and tests can find them.
#include "ui/main_window.h"

#include <spdlog/spdlog.h>

#include <QDialogButtonBox>
#include <QDir>
#include <QFileDialog>
#include <QFileInfo>
#include <QGridLayout>
#include <QInputDialog>
#include <QLabel>
#include <QListView>
#include <QMessageBox>
#include <QPlainTextEdit>
#include <QRegularExpression>
#include <QStandardPaths>
#include <QTreeWidget>
#include <QVBoxLayout>

#include "app/store/exporter.h"
#include "app/third_party.h"
#include "ui/caches_dialog.h"
#include "ui/chat_generation_dialog.h"
#include "ui/local_server_group.h"
#include "ui/message_input.h"
#include "ui/models_dialog.h"
#include "ui/settings_dialog.h"
#include "ui/stats_format.h"

namespace kvchat::ui {

using kvchat::app::MessageRole;

namespace {

// Where a picker starts: the current model's folder (a file's own folder).
QString picker_start(const kvchat::app::ModelInfo& info) {
  const QFileInfo current(info.path);
  return current.isFile() ? current.absolutePath() : info.path;
}

// The export types, each with its extension (the first one is the default).
struct ExportType {
  const char* filter;
  const char* extension;
};
constexpr ExportType kExportTypes[] = {{"Markdown (*.md)", "md"}, {"JSON (*.json)", "json"}, {"Text (*.txt)", "txt"}};

// A name typed without one of the known extensions gets the chosen type's ("chat1_text" + Text -> .txt).
QString with_export_extension(const QString& path, const QString& name_filter) {
  const QString suffix = QFileInfo(path).suffix().toLower();
  for (const char* known : {"md", "markdown", "json", "txt", "text"})
    if (suffix == QLatin1String(known)) return path;
  QString extension = QString::fromLatin1(kExportTypes[0].extension);
  for (const ExportType& type : kExportTypes)
    if (name_filter == QLatin1String(type.filter)) extension = QString::fromLatin1(type.extension);
  return path + QLatin1Char('.') + extension;
}

}  // namespace

void MainWindow::show_error_dialog(const QString& title, const QString& text, const QString& object_name) {
  auto* box = new QMessageBox(QMessageBox::Warning, title, text, QMessageBox::Ok, this);
  box->setObjectName(object_name);
  box->setAttribute(Qt::WA_DeleteOnClose);
  box->open();
}

void MainWindow::openModel(const QString& path) {
  spdlog::info("opening model {}", path.toStdString());
  controller_->loadModel(path, /*remember=*/true);
}

QFileDialog* MainWindow::openModelFileDialog() {
  auto* dialog = new QFileDialog(this, tr("Open model file"), picker_start(backend_->modelInfo()));
  dialog->setObjectName("openModelFileDialog");
  dialog->setAttribute(Qt::WA_DeleteOnClose);
  dialog->setFileMode(QFileDialog::ExistingFile);
  dialog->setNameFilters({tr("GGUF models (*.gguf)"), tr("All files (*)")});
  connect(dialog, &QFileDialog::fileSelected, this, [this](const QString& path) {
    if (!path.isEmpty()) openModel(path);
  });
  dialog->open();
  return dialog;
}

ModelsDialog* MainWindow::openModelsDialog() {
  auto* dialog = new ModelsDialog(controller_, this);
  dialog->setAttribute(Qt::WA_DeleteOnClose);
  connect(dialog, &ModelsDialog::loadRequested, this, &MainWindow::openModel);
  dialog->show();
  dialog->recentList()->setFocus();
  return dialog;
}

QFileDialog* MainWindow::openModelDirectoryDialog() {
  auto* dialog = new QFileDialog(this, tr("Open model directory"), picker_start(backend_->modelInfo()));
  dialog->setObjectName("openModelDirectoryDialog");
  dialog->setAttribute(Qt::WA_DeleteOnClose);
  dialog->setFileMode(QFileDialog::Directory);
  dialog->setOption(QFileDialog::ShowDirsOnly, true);
  connect(dialog, &QFileDialog::fileSelected, this, [this](const QString& path) {
    if (!path.isEmpty()) openModel(path);
  });
  dialog->open();
  return dialog;
}

bool MainWindow::exportCurrentConversation(const QString& path) {
  try {
    const QString suffix = QFileInfo(path).suffix();
    const auto format = kvchat::app::export_format_from_string(suffix.isEmpty() ? QStringLiteral("md") : suffix);
    controller_->exportConversation(controller_->currentConversationId(), path, format);
    controller_->setExportDirectory(QFileInfo(path).absolutePath());
    show_notice(tr("Exported to %1").arg(path), 5000);
    return true;
  } catch (const std::exception& error) {
    show_error_dialog(tr("Export failed"), QString::fromUtf8(error.what()), "exportErrorDialog");
    return false;
  }
}

namespace {

// Where an export or import dialog starts: the last export's folder, else Documents, else home.
QString export_folder(const kvchat::app::ChatController* controller) {
  QString folder = controller->settings().export_directory;
  if (folder.isEmpty() || !QFileInfo(folder).isDir())
    folder = QStandardPaths::writableLocation(QStandardPaths::DocumentsLocation);
  if (folder.isEmpty() || !QFileInfo(folder).isDir()) folder = QDir::homePath();
  return folder;
}

}  // namespace

bool MainWindow::exportAllConversations(const QString& path) {
  try {
    controller_->exportAllConversations(path);
    controller_->setExportDirectory(QFileInfo(path).absolutePath());
    show_notice(tr("Exported every chat to %1").arg(path), 5000);
    return true;
  } catch (const std::exception& error) {
    show_error_dialog(tr("Export failed"), QString::fromUtf8(error.what()), "exportErrorDialog");
    return false;
  }
}

QFileDialog* MainWindow::openExportAllDialog() {
  auto* dialog = new QFileDialog(this, tr("Export all chats"),
                                 QDir(export_folder(controller_)).filePath(QStringLiteral("kvchat-chats.json")));
  dialog->setObjectName("exportAllDialog");
  dialog->setAttribute(Qt::WA_DeleteOnClose);
  dialog->setAcceptMode(QFileDialog::AcceptSave);
  dialog->setFileMode(QFileDialog::AnyFile);
  dialog->setNameFilters({tr("kvchat chats (*.json)")});
  dialog->setDefaultSuffix(QStringLiteral("json"));
  connect(dialog, &QFileDialog::fileSelected, this, [this](const QString& path) {
    if (!path.isEmpty()) exportAllConversations(path);
  });
  dialog->open();
  return dialog;
}

bool MainWindow::importConversations(const QString& path) {
  try {
    const int imported = controller_->importConversations(path);
    show_notice(imported == 1 ? tr("Imported 1 chat from %1").arg(path)
                              : tr("Imported %1 chats from %2").arg(imported).arg(path),
                5000);
    return true;
  } catch (const std::exception& error) {
    show_error_dialog(tr("Import failed"), tr("Nothing was imported. %1").arg(QString::fromUtf8(error.what())),
                      "importErrorDialog");
    return false;
  }
}

QFileDialog* MainWindow::openImportDialog() {
  auto* dialog = new QFileDialog(this, tr("Import chats"), export_folder(controller_));
  dialog->setObjectName("importDialog");
  dialog->setAttribute(Qt::WA_DeleteOnClose);
  dialog->setAcceptMode(QFileDialog::AcceptOpen);
  dialog->setFileMode(QFileDialog::ExistingFile);
  dialog->setNameFilters({tr("kvchat exports (*.json)"), tr("All files (*)")});
  connect(dialog, &QFileDialog::fileSelected, this, [this](const QString& path) {
    if (!path.isEmpty()) importConversations(path);
  });
  dialog->open();
  return dialog;
}

QFileDialog* MainWindow::openExportDialog() {
  if (controller_->currentConversationId() <= 0) return nullptr;
  QString title = QStringLiteral("chat");
  if (const auto record = controller_->conversation(controller_->currentConversationId())) title = record->title;
  title.replace(QRegularExpression(QStringLiteral("[^A-Za-z0-9 _-]")), QStringLiteral("_"));
  // Not the process's working directory: the last export's folder, else Documents, else home.
  const QString folder = export_folder(controller_);
  auto* dialog = new QFileDialog(this, tr("Export chat"), QDir(folder).filePath(title + QStringLiteral(".md")));
  dialog->setObjectName("exportDialog");
  // What the file will hold, before the user picks a name: all of it, regenerated replies included.
  const kvchat::app::ExportContents contents = kvchat::app::export_contents(controller_->currentMessages());
  const QString messages = contents.messages == 1 ? tr("1 message") : tr("%1 messages").arg(contents.messages);
  const QString versions =
      contents.other_versions == 1 ? tr("1 other version") : tr("%1 other versions").arg(contents.other_versions);
  QString summary = tr("Exports all %1 of this chat as it reads, each reply with its model and figures").arg(messages);
  if (contents.other_versions > 0) {
    summary += tr(", and the %1 of regenerated replies, each marked as such (in JSON, a reply's "
                  "\u201calternatives\u201d).")
                   .arg(versions);
    dialog->setWindowTitle(tr("Export chat: %1 and %2 of replies").arg(messages, versions));
  } else {
    summary += tr(". No reply was regenerated: there are no other versions.");
    dialog->setWindowTitle(tr("Export chat: %1").arg(messages));
  }
  if (auto* grid = qobject_cast<QGridLayout*>(dialog->layout())) {  // the dialog's own widgets, not a native one
    auto* label = new QLabel(summary, dialog);
    label->setObjectName("exportContentsLabel");
    label->setWordWrap(true);
    grid->addWidget(label, grid->rowCount(), 0, 1, grid->columnCount());
  }
  dialog->setAttribute(Qt::WA_DeleteOnClose);
  dialog->setAcceptMode(QFileDialog::AcceptSave);
  dialog->setFileMode(QFileDialog::AnyFile);
  QStringList filters;
  for (const ExportType& type : kExportTypes) filters << QString::fromLatin1(type.filter);
  dialog->setNameFilters(filters);
  connect(dialog, &QFileDialog::fileSelected, this, [this, dialog](const QString& path) {
    if (!path.isEmpty()) exportCurrentConversation(with_export_extension(path, dialog->selectedNameFilter()));
  });
  dialog->open();
  return dialog;
}

SettingsDialog* MainWindow::openSettingsDialog() {
  auto* dialog = new SettingsDialog(controller_->settings(), this);
  dialog->setAttribute(Qt::WA_DeleteOnClose);
  if (backend_->isModelLoaded()) dialog->setModelContextLength(backend_->modelInfo().context_length);
  auto* local_server = new LocalServerGroup(local_server_->settings(), dialog);
  dialog->addSection(local_server);
  connect(dialog, &QDialog::accepted, this, [this, dialog, local_server] {
    const auto settings = dialog->settings();
    controller_->applySettings(settings);
    local_server_->applySettings(local_server->settings());
    show_notice(tr("Settings saved; they apply from the next reply."), 5000);
  });
  dialog->open();
  return dialog;
}

QMessageBox* MainWindow::openAboutDialog() {
  QString model = tr("No model is loaded.");
  if (backend_->isModelLoaded()) {
    const kvchat::app::ModelInfo& info = backend_->modelInfo();
    model = tr("Model: %1<br>%2").arg(format_model_summary(info).toHtmlEscaped(), info.path.toHtmlEscaped());
  }
  const QString text = tr("<h3>kvchat %1</h3>"
                          "<p>A local Llama chat that makes its KV cache visible.</p>"
                          "<p>%2</p>"
                          "<p><b>Licences</b> (Qt %3)<br>%4<br>"
                          "stories260K (the embedded model, from karpathy's tinyllamas) \u2014 MIT</p>")
                           .arg(QStringLiteral(KVCHAT_VERSION), model, QString::fromLatin1(qVersion()),
                                kvchat::app::third_party_licences_html());
  auto* box = new QMessageBox(QMessageBox::NoIcon, tr("About kvchat"), text, QMessageBox::Ok, this);
  box->setObjectName("aboutDialog");
  box->setTextFormat(Qt::RichText);
  box->setAttribute(Qt::WA_DeleteOnClose);
  box->open();
  return box;
}

CachesDialog* MainWindow::openCachesDialog() {
  auto* dialog = new CachesDialog(controller_, this);
  dialog->setAttribute(Qt::WA_DeleteOnClose);
  dialog->open();
  return dialog;
}

void MainWindow::rename_selected_conversation() {
  const qint64 id = selected_conversation_id();
  if (id <= 0) return;
  const auto record = controller_->conversation(id);
  bool ok = false;
  const QString title = QInputDialog::getText(this, tr("Rename chat"), tr("Title:"), QLineEdit::Normal,
                                              record ? record->title : QString(), &ok);
  if (ok) controller_->renameConversation(id, title);
}

void MainWindow::toggle_pin_of_selected_conversation() {
  const qint64 id = selected_conversation_id();
  if (id <= 0) return;
  const auto record = controller_->conversation(id);
  if (record) controller_->setPinned(id, !record->pinned);
}

void MainWindow::duplicate_selected_conversation() {
  const qint64 id = selected_conversation_id();
  if (id > 0 && controller_->duplicateConversation(id) > 0) show_notice(tr("Copied the chat: this is the copy."), 5000);
}

void MainWindow::delete_message(qint64 message_id) {
  kvchat::app::MessageRole role = kvchat::app::MessageRole::Assistant;
  for (const auto& message : controller_->currentMessages())
    if (message.id == message_id) role = message.role;
  const QString question = role == MessageRole::User
                               ? tr("Delete this message and the replies to it? This cannot be undone.")
                               : tr("Delete this reply? This cannot be undone.");
  if (!confirm_(tr("Delete message"), question)) return;
  controller_->deleteMessage(message_id);
}

void MainWindow::refresh_pin_action() {
  if (!pin_action_) return;
  const auto record = conversation_model_->record(selected_conversation_id());  // as last read: no store read
  pin_action_->setEnabled(record.has_value());
  pin_action_->setText(record && record->pinned ? tr("Un&pin the chat") : tr("&Pin the chat"));
}

void MainWindow::delete_selected_conversation() {
  const qint64 id = selected_conversation_id();
  if (id <= 0) return;
  const auto record = controller_->conversation(id);
  const QString title = record ? record->title : QString::number(id);
  if (!confirm_(tr("Delete chat"), tr("Delete \u201c%1\u201d and all its messages? This cannot be undone.").arg(title)))
    return;
  controller_->deleteConversation(id);
}

QDialog* MainWindow::openSystemPromptDialog() {
  qint64 id = controller_->currentConversationId();
  if (id <= 0) id = controller_->newConversation();
  if (id <= 0) return nullptr;
  const auto record = controller_->conversation(id);
  auto* dialog = new QDialog(this);
  dialog->setObjectName("systemPromptDialog");
  dialog->setAttribute(Qt::WA_DeleteOnClose);
  dialog->setWindowTitle(tr("System prompt"));
  auto* layout = new QVBoxLayout(dialog);
  layout->addWidget(new QLabel(tr("This chat's system prompt (applies from the next reply):"), dialog));
  auto* editor = new QPlainTextEdit(dialog);
  editor->setObjectName("systemPromptEditor");
  editor->setTabChangesFocus(true);
  // The cursor at the end, nothing selected: typing adds to the saved prompt rather than replacing it.
  editor->setPlainText(record ? record->system_prompt : QString());
  editor->moveCursor(QTextCursor::End);
  layout->addWidget(editor);
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel, dialog);
  connect(buttons, &QDialogButtonBox::accepted, dialog, &QDialog::accept);
  connect(buttons, &QDialogButtonBox::rejected, dialog, &QDialog::reject);
  layout->addWidget(buttons);
  connect(dialog, &QDialog::accepted, this,
          [this, id, editor] { controller_->setSystemPrompt(id, editor->toPlainText()); });
  // Back to the message box, whichever way it closed.
  connect(dialog, &QDialog::finished, this, [this] { input_->setFocus(); });
  dialog->setWindowModality(Qt::WindowModal);
  dialog->resize(520, 300);
  dialog->show();
  editor->setFocus();
  return dialog;
}

ChatGenerationDialog* MainWindow::openChatGenerationDialog() {
  qint64 id = controller_->currentConversationId();
  if (id <= 0) id = controller_->newConversation();
  if (id <= 0) return nullptr;
  auto* dialog = new ChatGenerationDialog(controller_, id, this);
  dialog->setAttribute(Qt::WA_DeleteOnClose);
  connect(dialog, &QDialog::finished, this, [this] { input_->setFocus(); });
  dialog->setWindowModality(Qt::WindowModal);
  dialog->show();
  return dialog;
}

qint64 MainWindow::selected_conversation_id() const {
  const QModelIndex current = conversation_list_->currentIndex();
  return current.isValid() ? current.data(ConversationListModel::ConversationIdRole).toLongLong()
                           : controller_->currentConversationId();
}

}  // namespace kvchat::ui
