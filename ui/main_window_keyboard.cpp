// The main window's keyboard: the Chat menu's actions on the transcript and the chat list, the window's own
// keys, and the shortcuts sheet that lists them all from the actions themselves.
#include "ui/main_window.h"

#include <QAction>
#include <QDialog>
#include <QDialogButtonBox>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QListView>
#include <QMenu>
#include <QMenuBar>
#include <QPushButton>
#include <QScrollBar>
#include <QTableWidget>
#include <QToolButton>
#include <QVBoxLayout>

#include "ui/chat_view.h"
#include "ui/code_block_widget.h"
#include "ui/message_input.h"
#include "ui/message_widget.h"

namespace kvchat::ui {

using kvchat::app::MessageRole;

using kvchat::app::ChatController;

MessageWidget* MainWindow::last_reply_widget() const {
  const QList<MessageWidget*> widgets = chat_view_->messageWidgets();
  for (auto it = widgets.crbegin(); it != widgets.crend(); ++it)
    if ((*it)->role() == MessageRole::Assistant) return *it;
  return nullptr;
}

void MainWindow::stop_or_cancel() {
  const qint64 current = controller_->currentConversationId();
  if (find_field_->hasFocus()) {  // Esc closes the find field first (it has no other use there)
    find_field_->hide();
    input_->setFocus();
  } else if (generating_here()) {
    controller_->stop();
  } else if (controller_->isQueued(current)) {
    const auto text = controller_->cancelQueued(current);
    // The withdrawn message goes back where it was typed, unless something new is being typed there.
    if (text && input_->toPlainText().trimmed().isEmpty()) input_->setPlainText(*text);
    show_notice(tr("Not sent: the waiting message is back in the message box."));
    refresh_buttons();
  } else if (editing_message_id_ != 0) {
    editing_message_id_ = 0;
    input_->clear();
    refresh_buttons();
  }
}

void MainWindow::build_keyboard_actions(QMenu* chat) {
  chat->addSeparator();
  QAction* stop = chat->addAction(tr("&Stop the reply / withdraw the waiting message"));
  stop->setObjectName("stopAction");
  stop->setShortcut(QKeySequence(Qt::Key_Escape));
  connect(stop, &QAction::triggered, this, &MainWindow::stop_or_cancel);
  // Pressed again while editing, it goes one message up: any earlier message can be edited from the keys.
  QAction* edit_last = chat->addAction(tr("&Edit the last message (again: the one before)"));
  edit_last->setObjectName("editLastAction");
  edit_last->setShortcut(QKeySequence(QStringLiteral("Ctrl+Shift+E")));
  connect(edit_last, &QAction::triggered, this, [this] {
    if (!edit_button_->isEnabled()) return;
    const qint64 before = editing_message_id_ != 0 ? user_message_before(editing_message_id_) : 0;
    if (before != 0)
      start_editing_message(before);
    else if (editing_message_id_ == 0)
      start_editing_last_message();
  });
  QAction* previous_branch = chat->addAction(tr("Previous version of the edited message"));
  previous_branch->setObjectName("previousBranchAction");
  previous_branch->setShortcut(QKeySequence(Qt::ALT | Qt::SHIFT | Qt::Key_Left));
  connect(previous_branch, &QAction::triggered, this, [this] { step_branch(-1); });
  QAction* next_branch = chat->addAction(tr("Next version of the edited message"));
  next_branch->setObjectName("nextBranchAction");
  next_branch->setShortcut(QKeySequence(Qt::ALT | Qt::SHIFT | Qt::Key_Right));
  connect(next_branch, &QAction::triggered, this, [this] { step_branch(+1); });
  QAction* previous_version = chat->addAction(tr("Pre&vious version of the last reply"));
  previous_version->setObjectName("previousVersionAction");
  previous_version->setShortcut(QKeySequence(Qt::ALT | Qt::Key_Left));
  connect(previous_version, &QAction::triggered, this, [this] {
    if (MessageWidget* reply = last_reply_widget())
      if (auto* button = reply->findChild<QToolButton*>("previousAlternativeButton"); button && button->isEnabled())
        button->click();
  });
  QAction* next_version = chat->addAction(tr("Ne&xt version of the last reply"));
  next_version->setObjectName("nextVersionAction");
  next_version->setShortcut(QKeySequence(Qt::ALT | Qt::Key_Right));
  connect(next_version, &QAction::triggered, this, [this] {
    if (MessageWidget* reply = last_reply_widget())
      if (auto* button = reply->findChild<QToolButton*>("nextAlternativeButton"); button && button->isEnabled())
        button->click();
  });
  QAction* copy_reply = chat->addAction(tr("C&opy the last reply"));
  copy_reply->setObjectName("copyLastReplyAction");
  copy_reply->setShortcut(QKeySequence(QStringLiteral("Ctrl+Shift+C")));
  connect(copy_reply, &QAction::triggered, this, [this] {
    if (MessageWidget* reply = last_reply_widget()) {
      reply->copyButton()->click();
      show_notice(tr("Copied the last reply."), 3000);
    }
  });
  QAction* copy_code = chat->addAction(tr("Copy the last &code block"));
  copy_code->setObjectName("copyLastCodeBlockAction");
  copy_code->setShortcut(QKeySequence(QStringLiteral("Ctrl+Shift+K")));
  connect(copy_code, &QAction::triggered, this, [this] {
    const QList<MessageWidget*> widgets = chat_view_->messageWidgets();
    for (auto it = widgets.crbegin(); it != widgets.crend(); ++it) {
      const QList<CodeBlockWidget*> blocks = (*it)->findChildren<CodeBlockWidget*>();
      if (blocks.isEmpty()) continue;
      blocks.back()->copyButton()->click();
      show_notice(tr("Copied the last code block."), 3000);
      return;
    }
    show_notice(tr("No code block in this chat."), 3000);
  });

  QAction* find = chat->addAction(tr("&Find in the chat\u2026"));
  find->setObjectName("findInChatAction");
  find->setShortcut(QKeySequence::Find);
  connect(find, &QAction::triggered, this, [this] {
    find_field_->show();
    find_field_->setFocus();
    find_field_->selectAll();
  });
  QAction* search = chat->addAction(tr("&Search all chats"));
  search->setObjectName("searchChatsAction");
  search->setShortcut(QKeySequence(QStringLiteral("Ctrl+Shift+F")));
  connect(search, &QAction::triggered, this, [this] {
    search_field_->setFocus();
    search_field_->selectAll();
  });

  chat->addSeparator();
  QAction* rename = chat->addAction(tr("Re&name the chat\u2026"));
  rename->setObjectName("renameChatAction");
  rename->setShortcut(QKeySequence(Qt::Key_F2));
  connect(rename, &QAction::triggered, this, &MainWindow::rename_selected_conversation);
  pin_action_ = chat->addAction(tr("&Pin the chat"));
  pin_action_->setObjectName("pinChatAction");
  pin_action_->setShortcut(QKeySequence(QStringLiteral("Ctrl+Shift+P")));
  connect(pin_action_, &QAction::triggered, this, &MainWindow::toggle_pin_of_selected_conversation);
  QAction* duplicate = chat->addAction(tr("D&uplicate the chat"));
  duplicate->setObjectName("duplicateChatAction");
  duplicate->setShortcut(QKeySequence(QStringLiteral("Ctrl+Shift+D")));
  connect(duplicate, &QAction::triggered, this, &MainWindow::duplicate_selected_conversation);
  // Delete only from the chat list: in the message box the key deletes a character.
  QAction* remove = chat->addAction(tr("&Delete the chat\u2026"));
  remove->setObjectName("deleteChatAction");
  remove->setShortcut(QKeySequence(QKeySequence::Delete));
  remove->setShortcutContext(Qt::WidgetWithChildrenShortcut);
  // The chat list's context menu: the same actions as the Chat menu, for the chat under the pointer (a right
  // click selects it first).
  conversation_list_->addAction(rename);
  conversation_list_->addAction(pin_action_);
  conversation_list_->addAction(duplicate);
  conversation_list_->addAction(remove);
  conversation_list_->setContextMenuPolicy(Qt::ActionsContextMenu);
  connect(remove, &QAction::triggered, this, &MainWindow::delete_selected_conversation);

  // The window's own keys, actions too (not in a menu) so that the sheet lists them.
  const auto add = [this](const QString& text, const QKeySequence& keys, std::function<void()> run) {
    auto* action = new QAction(text, this);
    action->setShortcut(keys);
    action->setShortcutContext(Qt::WindowShortcut);
    connect(action, &QAction::triggered, this, std::move(run));
    addAction(action);
  };
  // Alt+PgUp / Alt+PgDn scroll the transcript from wherever the focus is.
  add(tr("Scroll the transcript up"), QKeySequence(Qt::ALT | Qt::Key_PageUp),
      [this] { chat_view_->verticalScrollBar()->triggerAction(QAbstractSlider::SliderPageStepSub); });
  add(tr("Scroll the transcript down"), QKeySequence(Qt::ALT | Qt::Key_PageDown),
      [this] { chat_view_->verticalScrollBar()->triggerAction(QAbstractSlider::SliderPageStepAdd); });
  for (int digit = 1; digit <= 9; ++digit)
    add(tr("Go to chat %1 of the list").arg(digit), QKeySequence(Qt::CTRL | static_cast<Qt::Key>(Qt::Key_0 + digit)),
        [this, digit] { select_conversation_at(digit - 1); });
}

QDialog* MainWindow::openShortcutsSheet() {
  auto* sheet = new QDialog(this);
  sheet->setObjectName("shortcutsSheet");
  sheet->setAttribute(Qt::WA_DeleteOnClose);
  sheet->setWindowTitle(tr("Keyboard shortcuts"));
  auto* layout = new QVBoxLayout(sheet);
  auto* table = new QTableWidget(0, 3, sheet);
  table->setObjectName("shortcutsTable");
  table->setHorizontalHeaderLabels({tr("Where"), tr("Action"), tr("Keys")});
  table->verticalHeader()->hide();
  table->setEditTriggers(QAbstractItemView::NoEditTriggers);
  table->setSelectionBehavior(QAbstractItemView::SelectRows);
  const auto add_row = [table](const QString& where, const QAction* action) {
    if (action->shortcuts().isEmpty() || action->isSeparator()) return;
    QStringList keys;
    for (const QKeySequence& sequence : action->shortcuts()) keys << sequence.toString(QKeySequence::NativeText);
    QString what = action->text();
    what.remove(QLatin1Char('&'));
    if (action->shortcutContext() == Qt::WidgetWithChildrenShortcut) what += tr(" (in the chat list)");
    const int row = table->rowCount();
    table->insertRow(row);
    table->setItem(row, 0, new QTableWidgetItem(where));
    table->setItem(row, 1, new QTableWidgetItem(what));
    table->setItem(row, 2, new QTableWidgetItem(keys.join(tr(" or "))));
  };
  // The same actions the menus trigger: the sheet cannot disagree with them.
  for (QAction* menu_action : menuBar()->actions()) {
    QMenu* menu = menu_action->menu();
    if (!menu) continue;
    QString where = menu_action->text();
    where.remove(QLatin1Char('&'));
    for (QAction* action : menu->actions()) add_row(where, action);
  }
  for (QAction* action : actions()) add_row(tr("Window"), action);
  // Keys of the message box itself, which has no actions for them.
  const std::pair<QString, QString> typing_keys[] = {
      {tr("Send the message"), tr("Return")},
      {tr("New line in the message"), tr("Shift+Return")},
      {tr("Move between the controls and the transcript"), tr("Tab, Shift+Tab")}};
  for (const auto& [what, keys] : typing_keys) {
    const int row = table->rowCount();
    table->insertRow(row);
    table->setItem(row, 0, new QTableWidgetItem(tr("Message box")));
    table->setItem(row, 1, new QTableWidgetItem(what));
    table->setItem(row, 2, new QTableWidgetItem(keys));
  }
  table->resizeColumnsToContents();
  table->horizontalHeader()->setStretchLastSection(true);
  layout->addWidget(table);
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Close, sheet);
  connect(buttons, &QDialogButtonBox::rejected, sheet, &QDialog::reject);
  layout->addWidget(buttons);
  sheet->resize(620, 520);
  sheet->show();
  return sheet;
}

}  // namespace kvchat::ui
