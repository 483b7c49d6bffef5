#include "ui/main_window.h"

#include <spdlog/spdlog.h>

#include <QAction>
#include <QApplication>
#include <QCloseEvent>
#include <QFileDialog>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QInputDialog>
#include <QKeySequence>
#include <QLabel>
#include <QListWidget>
#include <QMenuBar>
#include <QMessageBox>
#include <QProgressBar>
#include <QRegularExpression>
#include <QPushButton>
#include <QShortcut>
#include <QSplitter>
#include <QStatusBar>
#include <QVBoxLayout>

#include "ui/chat_view.h"
#include "ui/message_input.h"
#include "ui/message_widget.h"
#include "ui/settings_dialog.h"
#include "ui/stats_format.h"

namespace kvchat::ui {

using kvchat::app::ChatController;

MainWindow::MainWindow(ChatController* controller, QWidget* parent) : QMainWindow(parent), controller_(controller) {
  setObjectName("mainWindow");
  setWindowTitle("kvchat");
  confirm_ = [this](const QString& title, const QString& text) {
    return QMessageBox::question(this, title, text, QMessageBox::Yes | QMessageBox::No, QMessageBox::No) ==
           QMessageBox::Yes;
  };

  QWidget* sidebar = build_sidebar();
  QWidget* chat_panel = build_chat_panel();
  auto* splitter = new QSplitter(this);
  splitter->addWidget(sidebar);
  splitter->addWidget(chat_panel);
  splitter->setStretchFactor(1, 1);
  splitter->setSizes({240, 760});
  setCentralWidget(splitter);

  build_shortcuts();
  build_menus();
  build_status_bar();
  connect_controller();

  refresh_conversations();
  reload_messages();
  refresh_cache_gauge();
  refresh_reply_stats();
  if (controller_->isModelLoaded()) show_model_loaded(controller_->modelInfo());
  else if (controller_->isModelLoading()) load_busy_->show();
  resize(1240, 780);
  input_->setFocus();
}

QWidget* MainWindow::build_sidebar() {
  auto* sidebar = new QWidget(this);
  auto* sidebar_layout = new QVBoxLayout(sidebar);
  sidebar_layout->setContentsMargins(6, 6, 6, 6);
  auto* new_button = new QPushButton(tr("New chat"), sidebar);
  new_button->setObjectName("newChatButton");
  conversation_list_ = new QListWidget(sidebar);
  conversation_list_->setObjectName("conversationList");
  auto* sidebar_buttons = new QHBoxLayout;
  auto* rename_button = new QPushButton(tr("Rename"), sidebar);
  rename_button->setObjectName("renameButton");
  auto* delete_button = new QPushButton(tr("Delete"), sidebar);
  delete_button->setObjectName("deleteButton");
  sidebar_buttons->addWidget(rename_button);
  sidebar_buttons->addWidget(delete_button);
  sidebar_layout->addWidget(new_button);
  sidebar_layout->addWidget(conversation_list_, 1);
  sidebar_layout->addLayout(sidebar_buttons);
  connect(new_button, &QPushButton::clicked, controller_, &ChatController::newConversation);
  connect(rename_button, &QPushButton::clicked, this, &MainWindow::rename_selected_conversation);
  connect(delete_button, &QPushButton::clicked, this, &MainWindow::delete_selected_conversation);
  connect(conversation_list_, &QListWidget::currentItemChanged, this, [this](QListWidgetItem* item) {
    if (item) controller_->selectConversation(item->data(Qt::UserRole).toLongLong());
  });
  connect(conversation_list_, &QListWidget::itemDoubleClicked, this, &MainWindow::rename_selected_conversation);
  return sidebar;
}

QWidget* MainWindow::build_chat_panel() {
  auto* chat_panel = new QWidget(this);
  auto* chat_layout = new QVBoxLayout(chat_panel);
  chat_layout->setContentsMargins(6, 6, 6, 6);
  auto* title_row = new QHBoxLayout;
  title_label_ = new QLabel(chat_panel);
  title_label_->setObjectName("conversationTitle");
  auto* system_prompt_button = new QPushButton(tr("System prompt\u2026"), chat_panel);
  system_prompt_button->setObjectName("systemPromptButton");
  system_prompt_button->setToolTip(tr("This chat's system prompt"));
  connect(system_prompt_button, &QPushButton::clicked, this, &MainWindow::edit_system_prompt);
  title_row->addWidget(title_label_, 1);
  title_row->addWidget(system_prompt_button);
  chat_layout->addLayout(title_row);
  chat_view_ = new ChatView(chat_panel);
  chat_layout->addWidget(chat_view_, 1);

  editing_label_ = new QLabel(tr("Editing your last message: Send replaces it and everything after it "
                                 "(Esc cancels)."),
                              chat_panel);
  editing_label_->setStyleSheet("color: #8a6d00;");
  editing_label_->hide();
  chat_layout->addWidget(editing_label_);
  auto* input_row = new QHBoxLayout;
  input_ = new MessageInput(chat_panel);
  input_row->addWidget(input_, 1);
  auto* button_column = new QVBoxLayout;
  send_button_ = new QPushButton(tr("Send"), chat_panel);
  send_button_->setObjectName("sendButton");
  send_button_->setDefault(true);
  regenerate_button_ = new QPushButton(tr("Regenerate"), chat_panel);
  regenerate_button_->setObjectName("regenerateButton");
  edit_button_ = new QPushButton(tr("Edit last"), chat_panel);
  edit_button_->setObjectName("editButton");
  button_column->addWidget(send_button_);
  button_column->addWidget(regenerate_button_);
  button_column->addWidget(edit_button_);
  button_column->addStretch();
  input_row->addLayout(button_column);
  chat_layout->addLayout(input_row);
  connect(input_, &MessageInput::submitted, this, &MainWindow::submit_input);
  connect(send_button_, &QPushButton::clicked, this, [this] {
    if (controller_->isGenerating()) controller_->stop();
    else submit_input();
  });
  connect(regenerate_button_, &QPushButton::clicked, controller_, &ChatController::regenerate);
  connect(edit_button_, &QPushButton::clicked, this, &MainWindow::start_editing_last_message);
  return chat_panel;
}

void MainWindow::build_shortcuts() {
  auto* escape = new QShortcut(QKeySequence(Qt::Key_Escape), this);
  escape->setContext(Qt::WindowShortcut);
  connect(escape, &QShortcut::activated, this, [this] {
    if (controller_->isGenerating()) {
      controller_->stop();
    } else if (editing_last_message_) {
      editing_last_message_ = false;
      input_->clear();
      refresh_buttons();
    }
  });
}

void MainWindow::connect_controller() {
  connect(controller_, &ChatController::conversationsChanged, this, &MainWindow::refresh_conversations);
  connect(controller_, &ChatController::currentConversationChanged, this, [this] {
    editing_last_message_ = false;
    refresh_conversations();
    reload_messages();
  });
  connect(controller_, &ChatController::messagesReset, this, &MainWindow::reload_messages);
  connect(controller_, &ChatController::replyTextAppended, this,
          [this](qint64 conversation_id, qint64 message_id, const QString& chunk) {
            if (conversation_id == controller_->currentConversationId()) chat_view_->appendToMessage(message_id, chunk);
          });
  connect(controller_, &ChatController::replyFinished, this, [this](const kvchat::app::MessageRecord& reply) {
    if (reply.conversation_id != controller_->currentConversationId()) return;
    chat_view_->updateMessage(reply);
    refresh_buttons();
  });
  connect(controller_, &ChatController::generatingChanged, this, [this](bool generating) {
    if (generating) speed_label_->setText(tr("Generating\u2026"));
    refresh_buttons();
  });
  connect(controller_, &ChatController::decodeSpeedChanged, this, [this](double rate, int tokens) {
    const QString prefix = controller_->isGenerating() ? tr("decoding") : tr("decode");
    speed_label_->setText(QStringLiteral("%1 %2 \u00b7 %3 tok").arg(prefix, format_rate(rate)).arg(tokens));
  });
  connect(controller_, &ChatController::lastReplyStatsChanged, this, &MainWindow::refresh_reply_stats);
  connect(controller_, &ChatController::cacheGaugeChanged, this, &MainWindow::refresh_cache_gauge);
  connect(controller_, &ChatController::settingsChanged, this, &MainWindow::refresh_cache_gauge);
  connect(controller_, &ChatController::cacheEvicted, this, &MainWindow::show_cache_evicted);
  connect(controller_, &ChatController::modelLoading, this, &MainWindow::show_model_loading);
  connect(controller_, &ChatController::modelLoaded, this, &MainWindow::show_model_loaded);
  connect(controller_, &ChatController::modelLoadFailed, this, &MainWindow::show_model_load_failed);
  connect(controller_, &ChatController::errorOccurred, this, [this](const QString& message) {
    chat_view_->showError(message);
    statusBar()->showMessage(message, 8000);
  });
}

void MainWindow::show_cache_evicted(qint64 conversation_id) {
  QString title = QString::number(conversation_id);
  if (const auto record = controller_->conversation(conversation_id)) title = record->title;
  statusBar()->showMessage(tr("The cache of \u201c%1\u201d was dropped to stay within the memory budget; "
                              "it is rebuilt on that chat's next turn.")
                               .arg(title),
                           8000);
}

void MainWindow::show_model_loading(const QString& path) {
  load_busy_->show();
  model_label_->setText(tr("Loading %1\u2026").arg(QFileInfo(path).fileName()));
  refresh_buttons();
}

void MainWindow::show_model_loaded(const kvchat::app::ModelInfo& info) {
  load_busy_->hide();
  model_label_->setText(format_model_summary(info));
  model_label_->setToolTip(format_model_details(info));
  setWindowTitle(QStringLiteral("kvchat \u2014 %1").arg(info.name));
  refresh_buttons();
  refresh_cache_gauge();
}

void MainWindow::show_model_load_failed(const QString& path, const QString& message) {
  load_busy_->hide();
  model_label_->setText(controller_->isModelLoaded() ? format_model_summary(controller_->modelInfo()) : tr("No model"));
  refresh_buttons();
  QString text = tr("Could not load the model\n%1\n\n%2").arg(path, message);
  if (controller_->isModelLoaded()) text += tr("\n\nStill using %1.").arg(controller_->modelInfo().directory);
  show_error_dialog(tr("Model not loaded"), text, "modelLoadErrorDialog");
}

void MainWindow::build_menus() {
  QMenu* file = menuBar()->addMenu(tr("&File"));
  QAction* new_chat = file->addAction(tr("&New chat"));
  new_chat->setShortcut(QKeySequence(QStringLiteral("Ctrl+N")));
  connect(new_chat, &QAction::triggered, controller_, &ChatController::newConversation);
  QAction* open_file = file->addAction(tr("&Open model file\u2026"));
  open_file->setObjectName("openModelFileAction");
  open_file->setShortcut(QKeySequence::Open);
  connect(open_file, &QAction::triggered, this, &MainWindow::openModelFileDialog);
  QAction* open_directory = file->addAction(tr("Open model &directory\u2026"));
  open_directory->setObjectName("openModelDirectoryAction");
  connect(open_directory, &QAction::triggered, this, &MainWindow::openModelDirectoryDialog);
  QAction* export_action = file->addAction(tr("&Export\u2026"));
  export_action->setShortcut(QKeySequence(QStringLiteral("Ctrl+E")));
  connect(export_action, &QAction::triggered, this, [this] {
    if (controller_->currentConversationId() <= 0) return;
    QString title = QStringLiteral("chat");
    if (const auto record = controller_->conversation(controller_->currentConversationId()))
      title = record->title;
    title.replace(QRegularExpression(QStringLiteral("[^A-Za-z0-9 _-]")), QStringLiteral("_"));
    const QString path = QFileDialog::getSaveFileName(this, tr("Export chat"), title + ".md",
                                                      tr("Markdown (*.md);;JSON (*.json);;Text (*.txt)"));
    if (!path.isEmpty()) exportCurrentConversation(path);
  });
  file->addSeparator();
  QAction* quit = file->addAction(tr("&Quit"));
  quit->setShortcut(QKeySequence::Quit);
  connect(quit, &QAction::triggered, this, &QWidget::close);

  QMenu* settings = menuBar()->addMenu(tr("&Settings"));
  QAction* preferences = settings->addAction(tr("&Settings\u2026"));
  preferences->setShortcut(QKeySequence(QStringLiteral("Ctrl+,")));
  connect(preferences, &QAction::triggered, this, &MainWindow::openSettingsDialog);
}

void MainWindow::build_status_bar() {
  model_label_ = new QLabel(tr("No model"), this);
  model_label_->setObjectName("modelLabel");
  load_busy_ = new QProgressBar(this);
  load_busy_->setObjectName("loadBusy");
  load_busy_->setRange(0, 0);  // indeterminate: loading has no measurable steps
  load_busy_->setMaximumWidth(90);
  load_busy_->hide();
  speed_label_ = new QLabel(this);
  speed_label_->setObjectName("speedLabel");
  reply_stats_label_ = new QLabel(this);
  reply_stats_label_->setObjectName("replyStatsLabel");
  cache_bar_ = new QProgressBar(this);
  cache_bar_->setObjectName("cacheGauge");
  cache_bar_->setFixedWidth(130);
  cache_bar_->setTextVisible(true);
  cache_label_ = new QLabel(this);
  cache_label_->setObjectName("cacheLabel");
  statusBar()->addPermanentWidget(model_label_);
  statusBar()->addPermanentWidget(load_busy_);
  statusBar()->addPermanentWidget(speed_label_);
  statusBar()->addPermanentWidget(reply_stats_label_);
  statusBar()->addPermanentWidget(cache_bar_);
  statusBar()->addPermanentWidget(cache_label_);
}

void MainWindow::submit_input() {
  if (controller_->isGenerating()) return;
  const QString text = input_->toPlainText();
  if (text.trimmed().isEmpty()) return;
  const bool accepted = editing_last_message_ ? controller_->editLastUserMessage(text) : controller_->send(text);
  if (accepted) {
    input_->clear();
    editing_last_message_ = false;
  }
  refresh_buttons();
}

void MainWindow::start_editing_last_message() {
  const auto messages = controller_->currentMessages();
  for (auto it = messages.crbegin(); it != messages.crend(); ++it) {
    if (it->role != "user") continue;
    input_->setPlainText(it->text);
    input_->setFocus();
    editing_last_message_ = true;
    refresh_buttons();
    return;
  }
}

void MainWindow::refresh_conversations() {
  const QSignalBlocker blocker(conversation_list_);
  conversation_list_->clear();
  const qint64 current = controller_->currentConversationId();
  for (const auto& conversation : controller_->conversations()) {
    auto* item = new QListWidgetItem(conversation.title, conversation_list_);
    item->setData(Qt::UserRole, conversation.id);
    item->setToolTip(tr("%1 messages, last active %2")
                         .arg(conversation.message_count)
                         .arg(QLocale().toString(conversation.updated_at.toLocalTime(), QLocale::ShortFormat)));
    if (conversation.id == current) {
      conversation_list_->setCurrentItem(item);
      title_label_->setText(QStringLiteral("<b>%1</b>").arg(conversation.title.toHtmlEscaped()));
    }
  }
  if (current <= 0) title_label_->setText(tr("<b>New chat</b>"));
}

void MainWindow::reload_messages() {
  const bool streaming_here =
      controller_->isGenerating() && controller_->generatingConversationId() == controller_->currentConversationId();
  chat_view_->setMessages(controller_->currentMessages(), streaming_here ? controller_->generatingMessageId() : 0,
                          streaming_here ? controller_->generatingText() : QString());
  refresh_buttons();
  refresh_cache_gauge();
}

void MainWindow::refresh_buttons() {
  const bool generating = controller_->isGenerating();
  const bool ready = controller_->isModelLoaded();
  send_button_->setText(generating ? tr("Stop") : editing_last_message_ ? tr("Resend") : tr("Send"));
  send_button_->setEnabled(generating || ready);
  editing_label_->setVisible(editing_last_message_);
  bool has_reply = false;
  bool has_user_message = false;
  const auto messages = controller_->currentMessages();
  for (auto it = messages.crbegin(); it != messages.crend(); ++it) {
    if (it->role == "marker") continue;
    has_reply = it->role == "assistant";
    break;
  }
  for (const auto& message : messages) has_user_message = has_user_message || message.role == "user";
  regenerate_button_->setEnabled(!generating && ready && has_reply);
  edit_button_->setEnabled(!generating && ready && has_user_message);
}

void MainWindow::refresh_cache_gauge() {
  const kvchat::app::CacheGauge gauge = controller_->cacheGauge();
  cache_bar_->setRange(0, std::max(1, gauge.context_limit));
  if (!gauge.cache_enabled) {
    cache_bar_->setValue(0);
    cache_bar_->setFormat(tr("cache off"));
    cache_label_->setText(tr("KV cache off: recomputing"));
    return;
  }
  cache_bar_->setValue(static_cast<int>(std::min<qint64>(gauge.conversation_tokens, std::max(1, gauge.context_limit))));
  cache_bar_->setFormat(QStringLiteral("%1/%2 tok").arg(gauge.conversation_tokens).arg(gauge.context_limit));
  cache_bar_->setToolTip(tr("This chat's KV cache: %1 of the %2-token context")
                             .arg(gauge.conversation_tokens)
                             .arg(gauge.context_limit));
  QString text = tr("KV %1").arg(format_bytes(gauge.conversation_bytes));
  if (gauge.has_turn)
    text += tr(" \u00b7 %1 reused / %2 prefilled").arg(gauge.reused_tokens).arg(gauge.prefilled_tokens);
  text += tr(" \u00b7 all chats %1 of %2").arg(format_bytes(gauge.total_bytes), format_bytes(gauge.budget_bytes));
  cache_label_->setText(text);
}

void MainWindow::refresh_reply_stats() {
  const auto stats = controller_->lastReplyStats();
  if (!stats) {
    reply_stats_label_->clear();
    return;
  }
  reply_stats_label_->setText(tr("last: prefill %1 \u00b7 TTFT %2 ms \u00b7 %3 tok")
                                  .arg(format_rate(stats->prefill_tokens_per_second))
                                  .arg(stats->ttft_ms, 0, 'f', 1)
                                  .arg(stats->generated_tokens));
}

void MainWindow::show_error_dialog(const QString& title, const QString& text, const QString& object_name) {
  // open(), not exec(): the window (and the engine's signals) keep running while it is shown.
  auto* box = new QMessageBox(QMessageBox::Warning, title, text, QMessageBox::Ok, this);
  box->setObjectName(object_name);
  box->setAttribute(Qt::WA_DeleteOnClose);
  box->open();
}

void MainWindow::openModel(const QString& path) {
  spdlog::info("opening model {}", path.toStdString());
  controller_->loadModel(path, /*remember=*/true);
}

namespace {

// Where a picker starts: the current model's folder (a file's own folder).
QString picker_start(const kvchat::app::ModelInfo& info) {
  const QFileInfo current(info.directory);
  return current.isFile() ? current.absolutePath() : info.directory;
}

}  // namespace

QFileDialog* MainWindow::openModelFileDialog() {
  // open(), not exec(): the engine's signals keep arriving, and tests can find the dialog.
  auto* dialog = new QFileDialog(this, tr("Open model file"), picker_start(controller_->modelInfo()));
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

QFileDialog* MainWindow::openModelDirectoryDialog() {
  auto* dialog = new QFileDialog(this, tr("Open model directory"), picker_start(controller_->modelInfo()));
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
    statusBar()->showMessage(tr("Exported to %1").arg(path), 5000);
    return true;
  } catch (const std::exception& error) {
    show_error_dialog(tr("Export failed"), QString::fromUtf8(error.what()), "exportErrorDialog");
    return false;
  }
}

SettingsDialog* MainWindow::openSettingsDialog() {
  auto* dialog = new SettingsDialog(controller_->settings(), this);
  dialog->setAttribute(Qt::WA_DeleteOnClose);
  connect(dialog, &QDialog::accepted, this, [this, dialog] {
    const auto settings = dialog->settings();
    controller_->applySettings(settings);
    statusBar()->showMessage(tr("Settings saved; they apply from the next reply."), 5000);
  });
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

void MainWindow::delete_selected_conversation() {
  const qint64 id = selected_conversation_id();
  if (id <= 0) return;
  const auto record = controller_->conversation(id);
  const QString title = record ? record->title : QString::number(id);
  if (!confirm_(tr("Delete chat"), tr("Delete \u201c%1\u201d and all its messages? This cannot be undone.").arg(title)))
    return;
  controller_->deleteConversation(id);
}

void MainWindow::edit_system_prompt() {
  qint64 id = controller_->currentConversationId();
  if (id <= 0) id = controller_->newConversation();
  if (id <= 0) return;
  const auto record = controller_->conversation(id);
  bool ok = false;
  const QString prompt = QInputDialog::getMultiLineText(this, tr("System prompt"),
                                                        tr("This chat's system prompt (applies from the next reply):"),
                                                        record ? record->system_prompt : QString(), &ok);
  if (ok) controller_->setSystemPrompt(id, prompt);
}

qint64 MainWindow::selected_conversation_id() const {
  const QListWidgetItem* item = conversation_list_->currentItem();
  return item ? item->data(Qt::UserRole).toLongLong() : controller_->currentConversationId();
}

void MainWindow::closeEvent(QCloseEvent* event) {
  // The partial reply is kept (the controller commits it as the turn ends).
  if (controller_->isGenerating()) controller_->stop();
  QMainWindow::closeEvent(event);
}

}  // namespace kvchat::ui
