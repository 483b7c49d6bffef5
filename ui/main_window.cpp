#include "ui/main_window.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include <QAction>
#include <QActionGroup>
#include <QApplication>
#include <QCloseEvent>
#include <QDockWidget>
#include <QFrame>
#include <QHBoxLayout>
#include <QKeySequence>
#include <QLabel>
#include <QLineEdit>
#include <QListView>
#include <QMenuBar>
#include <QMessageBox>
#include <QProgressBar>
#include <QPushButton>
#include <QSplitter>
#include <QStyledItemDelegate>
#include <QTimer>
#include <QVBoxLayout>

#include "ui/appearance.h"
#include "ui/caches_dialog.h"
#include "ui/chat_generation_dialog.h"
#include "ui/chat_view.h"
#include "ui/decode_chart_panel.h"
#include "ui/elided_label.h"
#include "ui/message_input.h"
#include "ui/message_list_model.h"
#include "ui/message_widget.h"
#include "ui/stats_format.h"
#include "ui/system_prompt_block.h"

namespace kvchat::ui {

using kvchat::app::MessageRole;

using kvchat::app::ChatController;

namespace {
// Small enough for an 800x500 screen corner, large enough that the transcript keeps a readable width.
constexpr int kMinimumWidth = 640;
constexpr int kMinimumHeight = 420;
// The sidebar's share of a narrow window: at most this fraction of it (never under the list's minimum).
constexpr int kSidebarWindowFraction = 5;
// Below this window height the decode-time chart docks beside the chat rather than under it: under it,
// even at its smallest, it would leave the transcript a few lines.
constexpr int kBottomChartMinimumWindowHeight = 640;
// The docked chart's share of the window: at most this fraction of its height (under the chat) or width
// (beside it), so that the transcript keeps the larger part.
constexpr int kChartDockWindowFraction = 3;
// Set on the chart's dock while it is beside the chat only because the window is short.
constexpr const char* kMovedAsideProperty = "movedAsideForShortWindow";

// Moves the chart's dock aside in a short window (and back under the chat when the window is tall again,
// if it was moved for that), then shrinks it to its share; a larger dock the user dragged in a large
// window is left as it is until the window gets too small for it.
void fit_chart_dock(QMainWindow* window, QDockWidget* dock) {
  if (!dock->isVisible() || dock->isFloating()) return;
  const bool short_window = window->height() < kBottomChartMinimumWindowHeight;
  const Qt::DockWidgetArea area = window->dockWidgetArea(dock);
  const bool move_aside = short_window && area == Qt::BottomDockWidgetArea;
  const bool move_back =
      !short_window && area == Qt::RightDockWidgetArea && dock->property(kMovedAsideProperty).toBool();
  if (move_aside || move_back) {
    window->addDockWidget(move_aside ? Qt::RightDockWidgetArea : Qt::BottomDockWidgetArea, dock);
    dock->setProperty(kMovedAsideProperty, move_aside);
    // Sized once the layout has placed it.
    QTimer::singleShot(0, window, [window, dock] { fit_chart_dock(window, dock); });
    return;
  }
  const bool beside = window->dockWidgetArea(dock) != Qt::BottomDockWidgetArea;
  const int cap = beside ? std::max(dock->minimumSizeHint().width(), window->width() / kChartDockWindowFraction)
                         : std::max(dock->minimumSizeHint().height(), window->height() / kChartDockWindowFraction);
  if ((beside ? dock->width() : dock->height()) > cap)
    window->resizeDocks({dock}, {cap}, beside ? Qt::Horizontal : Qt::Vertical);
}

class ListWidthItemDelegate : public QStyledItemDelegate {
 public:
  using QStyledItemDelegate::QStyledItemDelegate;
  QSize sizeHint(const QStyleOptionViewItem& option, const QModelIndex& index) const override {
    QSize size = QStyledItemDelegate::sizeHint(option, index);
    size.setWidth(0);  // the list's width decides; the text elides within it
    return size;
  }

 protected:
  void initStyleOption(QStyleOptionViewItem* option, const QModelIndex& index) const override {
    QStyledItemDelegate::initStyleOption(option, index);
    // A chat that is generating or waiting reads differently at a glance.
    option->font.setItalic(index.data(ConversationListModel::BusyRole).toBool());
  }
};
}  // namespace

MainWindow::MainWindow(ChatController* controller, QWidget* parent)
    : QMainWindow(parent),
      controller_(controller),
      local_server_(&controller->localServerHost()),
      backend_(&controller->backendHost()) {
  setObjectName("mainWindow");
  setWindowTitle("kvchat");
  // Before any widget is built: the colours no palette role names are picked from the palette then.
  apply_appearance(appearance_from_name(controller_->settings().appearance));
  confirm_ = [this](const QString& title, const QString& text) {
    return QMessageBox::question(this, title, text, QMessageBox::Yes | QMessageBox::No, QMessageBox::No) ==
           QMessageBox::Yes;
  };

  QWidget* sidebar = build_sidebar();
  QWidget* chat_panel = build_chat_panel();
  auto* splitter = new QSplitter(this);
  splitter->setObjectName("mainSplitter");
  splitter->addWidget(sidebar);
  splitter->addWidget(chat_panel);
  splitter->setStretchFactor(1, 1);
  splitter->setCollapsible(1, false);
  splitter->setSizes({240, 760});
  setCentralWidget(splitter);

  build_chart_dock();
  build_menus();
  build_status_bar();
  connect_controller();

  input_conversation_ = controller_->currentConversationId();
  refresh_conversations();
  reload_messages();
  refresh_chat_header();
  refresh_cache_gauge();
  refresh_reply_stats();
  if (backend_->isModelLoaded())
    show_model_loaded(backend_->modelInfo());
  else if (backend_->isModelLoading())
    load_busy_->show();
  refresh_model_label();
  refresh_window_title();
  setChatFontSize(controller_->settings().font_point_size);
  setMinimumSize(kMinimumWidth, kMinimumHeight);
  resize(1240, 780);
  input_->setFocus();
}

QWidget* MainWindow::build_sidebar() {
  auto* sidebar = new QWidget(this);
  sidebar->setObjectName("sidebar");
  sidebar->setMinimumWidth(120);  // the splitter may shrink it this far, titles elide
  auto* sidebar_layout = new QVBoxLayout(sidebar);
  sidebar_layout->setContentsMargins(6, 6, 6, 6);
  auto* new_button = new QPushButton(tr("New chat"), sidebar);
  new_button->setObjectName("newChatButton");
  new_button->setToolTip(tr("Start a new chat (Ctrl+N)"));
  search_field_ = new QLineEdit(sidebar);
  search_field_->setObjectName("chatSearchField");
  search_field_->setPlaceholderText(tr("Search chats"));
  search_field_->setClearButtonEnabled(true);
  search_field_->setToolTip(tr("Shows the chats whose messages or title hold every word typed (or its beginning)"));
  conversation_model_ = new ConversationListModel(controller_, this);
  conversation_list_ = new QListView(sidebar);
  conversation_list_->setModel(conversation_model_);
  conversation_list_->setSelectionMode(QAbstractItemView::SingleSelection);
  conversation_list_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  conversation_list_->setObjectName("conversationList");
  conversation_list_->setTextElideMode(Qt::ElideRight);
  // Rows as wide as the list, whatever the title: a long one elides instead of widening the list behind a
  // horizontal scroll bar.
  conversation_list_->setItemDelegate(new ListWidthItemDelegate(conversation_list_));
  conversation_list_->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  conversation_list_->setMinimumWidth(60);
  auto* sidebar_buttons = new QHBoxLayout;
  auto* rename_button = new QPushButton(tr("Rename"), sidebar);
  rename_button->setObjectName("renameButton");
  auto* delete_button = new QPushButton(tr("Delete"), sidebar);
  delete_button->setObjectName("deleteButton");
  for (QPushButton* button : {rename_button, delete_button}) button->setMinimumWidth(40);
  sidebar_buttons->addWidget(rename_button);
  sidebar_buttons->addWidget(delete_button);
  sidebar_layout->addWidget(new_button);
  sidebar_layout->addWidget(search_field_);
  sidebar_layout->addWidget(conversation_list_, 1);
  sidebar_layout->addLayout(sidebar_buttons);
  connect(new_button, &QPushButton::clicked, this, &MainWindow::start_new_conversation);
  connect(rename_button, &QPushButton::clicked, this, &MainWindow::rename_selected_conversation);
  connect(delete_button, &QPushButton::clicked, this, &MainWindow::delete_selected_conversation);
  connect(conversation_list_->selectionModel(), &QItemSelectionModel::currentChanged, this,
          [this](const QModelIndex& current) {
            // The list's own update (a removed row takes the current one with it) selects nothing: the controller's
            // current chat stays, and select_current_conversation_row() shows it afterwards.
            if (updating_conversation_list_) return;
            // Read first: selecting updates the list, and the row may move.
            const qint64 first_match = current.isValid() ? current.data(kFirstMatchRole).toLongLong() : 0;
            if (current.isValid())
              controller_->selectConversation(current.data(ConversationListModel::ConversationIdRole).toLongLong());
            refresh_pin_action();
            // Found by a search: the transcript goes to the first matching message, in whichever branch it is.
            if (first_match > 0) {
              controller_->revealMessage(first_match);
              chat_view_->showMessage(first_match,
                                      search_field_->text().split(QLatin1Char(' '), Qt::SkipEmptyParts).value(0));
            }
          });
  connect(search_field_, &QLineEdit::textChanged, this, [this] {
    refresh_conversations();
    // The chat on screen is among those found: the transcript goes to its first match as the words are typed.
    const QModelIndex current = conversation_list_->currentIndex();
    if (current.isValid() && current.data(kFirstMatchRole).toLongLong() > 0)
      chat_view_->showMessage(current.data(kFirstMatchRole).toLongLong(),
                              search_field_->text().split(QLatin1Char(' '), Qt::SkipEmptyParts).value(0));
  });
  connect(conversation_list_, &QListView::doubleClicked, this, &MainWindow::rename_selected_conversation);
  return sidebar;
}

QWidget* MainWindow::build_chat_panel() {
  auto* chat_panel = new QWidget(this);
  auto* chat_layout = new QVBoxLayout(chat_panel);
  chat_layout->setContentsMargins(6, 6, 6, 6);
  auto* title_row = new QHBoxLayout;
  // Elided (whole in its tooltip) before it reaches the button beside it.
  title_label_ = new ElidedLabel(chat_panel);
  title_label_->setObjectName("conversationTitle");
  title_label_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  QFont title_font = title_label_->font();
  title_font.setBold(true);
  title_label_->setFont(title_font);
  auto* system_prompt_button = new QPushButton(tr("System prompt\u2026"), chat_panel);
  system_prompt_button->setObjectName("systemPromptButton");
  system_prompt_button->setToolTip(tr("This chat's system prompt"));
  // A click leaves the focus where it was (a space typed next must not reopen the dialog); Tab still reaches it.
  system_prompt_button->setFocusPolicy(Qt::TabFocus);
  connect(system_prompt_button, &QPushButton::clicked, this, &MainWindow::openSystemPromptDialog);
  generation_button_ = new QPushButton(chat_panel);
  generation_button_->setObjectName("generationSettingsButton");
  generation_button_->setToolTip(
      tr("This chat's generation settings: a preset, its own values or the global ones "
         "(Ctrl+Shift+G)"));
  // Out of the Tab chain, which stays short: Ctrl+Shift+G opens the same dialog from anywhere.
  generation_button_->setFocusPolicy(Qt::NoFocus);
  connect(generation_button_, &QPushButton::clicked, this, &MainWindow::openChatGenerationDialog);
  title_row->addWidget(title_label_, 1);
  title_row->addWidget(generation_button_);
  title_row->addWidget(system_prompt_button);
  chat_layout->addLayout(title_row);
  system_prompt_block_ = new SystemPromptBlock(chat_panel);
  connect(system_prompt_block_, &SystemPromptBlock::editRequested, this, &MainWindow::openSystemPromptDialog);
  chat_layout->addWidget(system_prompt_block_);
  last_model_bar_ = new QFrame(chat_panel);
  last_model_bar_->setObjectName("lastModelBar");
  static_cast<QFrame*>(last_model_bar_)->setFrameShape(QFrame::StyledPanel);
  auto* last_model_layout = new QHBoxLayout(last_model_bar_);
  last_model_layout->setContentsMargins(8, 2, 8, 2);
  last_model_label_ = new QLabel(last_model_bar_);
  last_model_label_->setObjectName("lastModelLabel");
  last_model_label_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  last_model_button_ = new QPushButton(last_model_bar_);
  last_model_button_->setObjectName("loadLastModelButton");
  last_model_button_->setAutoDefault(false);
  last_model_layout->addWidget(last_model_label_, 1);
  last_model_layout->addWidget(last_model_button_);
  last_model_bar_->hide();
  connect(last_model_button_, &QPushButton::clicked, this, [this] {
    if (last_model_path_.isEmpty()) return;
    last_model_bar_->hide();
    openModel(last_model_path_);
  });
  chat_layout->addWidget(last_model_bar_);
  chat_view_ = new ChatView(chat_panel);
  message_model_ = new MessageListModel(this);
  chat_view_->setModel(message_model_);
  chat_layout->addWidget(chat_view_, 1);
  // Chat > Find in the chat: Return goes to the next occurrence, Esc closes it.
  find_field_ = new QLineEdit(chat_panel);
  find_field_->setObjectName("findInChatField");
  find_field_->setPlaceholderText(tr("Find in this chat (Return: next, Esc: close)"));
  find_field_->setClearButtonEnabled(true);
  find_field_->hide();
  chat_layout->addWidget(find_field_);
  connect(find_field_, &QLineEdit::returnPressed, this, [this] {
    if (chat_view_->findText(find_field_->text()) == 0) show_notice(tr("Not found in this chat."), 3000);
  });

  connect(chat_view_, &ChatView::continueRequested, controller_, [this] { controller_->continueReply(); });
  connect(chat_view_, &ChatView::alternativeRequested, controller_, &ChatController::showAlternative);
  connect(chat_view_, &ChatView::editMessageRequested, this, &MainWindow::start_editing_message);
  connect(chat_view_, &ChatView::branchRequested, controller_, &ChatController::showBranch);
  connect(chat_view_, &ChatView::deleteMessageRequested, this, &MainWindow::delete_message);
  // A reply stopped by the context limit: its two ways out.
  connect(chat_view_, &ChatView::newChatRequested, this, &MainWindow::start_new_conversation);
  connect(chat_view_, &ChatView::dropOldestTurnsRequested, this, [this] {
    kvchat::app::ChatSettings settings = controller_->settings();
    settings.context_overflow = kvchat::app::ContextOverflowPolicy::DropOldestTurns;
    controller_->applySettings(settings);
    show_notice(
        tr("From the next message on, the oldest turns are left out when the context is full "
           "(Settings > When the context is full)."));
    input_->setFocus();
  });
  chat_view_->setOffersDropOldestTurns(controller_->settings().context_overflow ==
                                       kvchat::app::ContextOverflowPolicy::Stop);

  // Passing lines (editing, waiting, notices) have a place of their own, two lines high whether or not
  // anything shows there: the transcript above never moves when one comes or goes, so a click lands where
  // it was aimed.
  auto* transient = new QWidget(chat_panel);
  transient->setObjectName("transientLines");
  auto* transient_layout = new QVBoxLayout(transient);
  transient_layout->setContentsMargins(0, 0, 0, 0);
  transient_layout->setSpacing(0);
  editing_label_ = new QLabel(tr("Editing a message: Resend answers the edit as a new branch of the chat; the "
                                 "version before it is kept (\u2039 \u203a on the message switch back). Esc cancels."),
                              transient);
  editing_label_->setObjectName("editingLabel");
  set_palette_style_sheet(editing_label_, [](const QPalette& palette) {
    return QStringLiteral("color: %1;").arg(warning_text_colour(palette).name());
  });
  editing_label_->setWordWrap(true);
  editing_label_->hide();
  transient_layout->addWidget(editing_label_);
  waiting_label_ = new QLabel(transient);
  waiting_label_->setObjectName("waitingLabel");
  set_palette_style_sheet(waiting_label_, [](const QPalette& palette) {
    return QStringLiteral("color: %1;").arg(warning_text_colour(palette).name());
  });
  waiting_label_->setWordWrap(true);
  waiting_label_->hide();
  transient_layout->addWidget(waiting_label_);
  notice_label_ = new QLabel(transient);
  notice_label_->setObjectName("noticeLabel");
  notice_label_->setWordWrap(true);
  notice_label_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  notice_label_->hide();
  transient_layout->addWidget(notice_label_);
  transient_layout->addStretch(1);
  transient->setFixedHeight(transient->fontMetrics().lineSpacing() * 2 + 2);
  chat_layout->addWidget(transient);
  notice_timer_.setSingleShot(true);
  connect(&notice_timer_, &QTimer::timeout, this, [this] {
    notice_label_->clear();
    notice_label_->hide();
  });
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
  // One line, there whether empty or not (the transcript does not move when typing starts); a warning too
  // long for it elides, whole in its tooltip.
  token_counter_ = new ElidedLabel(chat_panel);
  token_counter_->setObjectName("tokenCounterLabel");
  token_counter_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Fixed);
  token_counter_->setFixedHeight(token_counter_->fontMetrics().lineSpacing() + 2);
  chat_layout->addWidget(token_counter_);
  // Counting is a tokenizer pass over the chat: once typing pauses, not per key.
  token_count_timer_.setSingleShot(true);
  token_count_timer_.setInterval(150);
  connect(&token_count_timer_, &QTimer::timeout, this, &MainWindow::refresh_token_counter);
  connect(input_, &QPlainTextEdit::textChanged, this, [this] { token_count_timer_.start(); });
  connect(input_, &MessageInput::submitted, this, &MainWindow::submit_input);
  connect(send_button_, &QPushButton::clicked, this, [this] {
    if (generating_here() || controller_->isQueued(controller_->currentConversationId()))
      stop_or_cancel();
    else
      submit_input();
  });
  connect(regenerate_button_, &QPushButton::clicked, controller_, &ChatController::regenerate);
  connect(edit_button_, &QPushButton::clicked, this, &MainWindow::start_editing_last_message);
  // Tab walks the controls and the transcript as one stop (arrows and PgUp/PgDn scroll it there); its
  // selectable text and buttons are left out of the chain.
  setTabOrder(system_prompt_button, chat_view_);
  setTabOrder(chat_view_, input_);
  setTabOrder(input_, send_button_);
  setTabOrder(send_button_, regenerate_button_);
  setTabOrder(regenerate_button_, edit_button_);
  return chat_panel;
}

void MainWindow::select_neighbour_conversation(int step) {
  const int count = conversation_model_->rowCount();
  if (count == 0) return;
  const int row = conversation_list_->currentIndex().row();
  select_conversation_at(((row < 0 ? 0 : row + step) % count + count) % count);
}

void MainWindow::select_conversation_at(int row) {
  if (row < 0 || row >= conversation_model_->rowCount()) return;
  controller_->selectConversation(conversation_model_->conversation_at(row));
  input_->setFocus();
}

void MainWindow::start_new_conversation() {
  controller_->newConversation();
  input_->setFocus();  // the next thing anyone does in a new chat is type
}

void MainWindow::connect_controller() {
  connect(controller_, &ChatController::draftMeasured, this, &MainWindow::show_draft_measure);
  // A draft counted before any of these is counted again before it is sent.
  for (auto change :
       {&ChatController::messagesReset, &ChatController::settingsChanged, &ChatController::lastReplyStatsChanged})
    connect(controller_, change, this, [this] { ++draft_revision_; });
  connect(controller_, &ChatController::replyFinished, this, [this] { ++draft_revision_; });
  connect(controller_, &ChatController::replyTextAppended, this, [this](qint64 conversation_id) {
    if (conversation_id == controller_->currentConversationId()) ++draft_revision_;
  });
  connect(backend_, &kvchat::app::BackendHost::modelLoaded, this, [this] { ++draft_revision_; });
  connect(controller_, &ChatController::systemPromptChanged, this, [this] { ++draft_revision_; });
  connect(controller_, &ChatController::chatGenerationSettingsChanged, this, [this] { ++draft_revision_; });
  connect(controller_, &ChatController::conversationsChanged, this, &MainWindow::refresh_conversations);
  connect(controller_, &ChatController::currentConversationChanged, this, [this](qint64 conversation_id) {
    editing_message_id_ = 0;
    switch_drafts(conversation_id);
    select_current_conversation_row();
    reload_messages();
    refresh_chat_header();
  });
  connect(controller_, &ChatController::chatGenerationSettingsChanged, this, &MainWindow::refresh_chat_header);
  connect(controller_, &ChatController::systemPromptChanged, this, &MainWindow::refresh_chat_header);
  connect(controller_, &ChatController::messagesReset, this, &MainWindow::reload_messages);
  connect(controller_, &ChatController::replyTextAppended, this,
          [this](qint64 conversation_id, qint64 message_id, const QString& chunk) {
            if (conversation_id == controller_->currentConversationId()) message_model_->appendText(message_id, chunk);
          });
  connect(controller_, &ChatController::replyFinished, this, [this](const kvchat::app::MessageRecord& reply) {
    if (reply.conversation_id != controller_->currentConversationId()) return;
    message_model_->updateMessage(reply);
    refresh_buttons();
  });
  connect(controller_, &ChatController::generatingChanged, this, [this](bool generating) {
    // Ending a turn ends "Generating…" too: a finished one reports its speed right after, a failed one has none.
    speed_label_->setFullText(generating ? tr("Generating\u2026") : QString());
    if (generating) speed_conversation_ = controller_->generatingConversationId();
    refresh_conversation_states();
    refresh_buttons();
  });
  connect(controller_, &ChatController::decodeSpeedChanged, this, [this](double rate, int tokens) {
    const QString figures = format_live_speed(controller_->isGenerating(), rate, tokens);
    speed_label_->setFullText(figures);
    // The same figures where the reader looks while a reply streams: its header.
    if (generating_here())
      if (MessageWidget* reply = chat_view_->messageWidget(controller_->generatingMessageId()))
        reply->setLiveFigures(figures);
  });
  connect(controller_, &ChatController::turnQueued, this, [this] {
    refresh_conversation_states();
    refresh_buttons();
  });
  connect(
      controller_, &ChatController::replyFailed, this,
      [this](qint64 conversation_id, qint64, const QString& message) { show_reply_failed(conversation_id, message); });
  connect(controller_, &ChatController::lastReplyStatsChanged, this, &MainWindow::refresh_reply_stats);
  connect(controller_, &ChatController::cacheGaugeChanged, this, [this] {
    refresh_cache_gauge();
    refresh_conversation_states();  // the list's tooltips say which chats hold a cache
  });
  connect(controller_, &ChatController::settingsChanged, this, [this] {
    chat_view_->setOffersDropOldestTurns(controller_->settings().context_overflow ==
                                         kvchat::app::ContextOverflowPolicy::Stop);
    refresh_cache_gauge();
    refresh_model_label();
    refresh_window_title();
    refresh_placeholder();
    refresh_buttons();  // a server set (or cleared) changes whether a message can be sent
  });
  connect(controller_, &ChatController::cacheEvicted, this, &MainWindow::show_cache_evicted);
  connect(backend_, &kvchat::app::BackendHost::modelLoading, this, &MainWindow::show_model_loading);
  connect(backend_, &kvchat::app::BackendHost::modelLoaded, this, &MainWindow::show_model_loaded);
  connect(backend_, &kvchat::app::BackendHost::modelLoaded, this, &MainWindow::refresh_chat_header);
  connect(backend_, &kvchat::app::BackendHost::modelLoadFailed, this, &MainWindow::show_model_load_failed);
  const kvchat::app::LocalServer* local_server = &local_server_->server();
  connect(local_server, &kvchat::app::LocalServer::servingChanged, this, [this](bool serving, const QString& url) {
    serving_label_->setText(serving ? tr("Serving on %1").arg(url) : QString());
    serving_label_->setToolTip(serving ? tr("The OpenAI API on the loaded model: base URL %1/v1").arg(url) : QString());
    serving_label_->setVisible(serving);
  });
  connect(local_server, &kvchat::app::LocalServer::failed, this, [this](const QString& message) {
    serving_label_->setText(tr("Not serving"));
    serving_label_->setToolTip(message);
    serving_label_->show();
    chat_view_->showError(message);
  });
  // Shown once, in the chat, where the reader is looking.
  connect(controller_, &ChatController::errorOccurred, this,
          [this](const QString& message) { chat_view_->showError(message); });
}

void MainWindow::build_menus() {
  QMenu* file = menuBar()->addMenu(tr("&File"));
  QAction* new_chat = file->addAction(tr("&New chat"));
  new_chat->setShortcut(QKeySequence(QStringLiteral("Ctrl+N")));
  connect(new_chat, &QAction::triggered, this, &MainWindow::start_new_conversation);
  QAction* open_file = file->addAction(tr("&Open model file\u2026"));
  open_file->setObjectName("openModelFileAction");
  open_file->setShortcut(QKeySequence::Open);
  connect(open_file, &QAction::triggered, this, &MainWindow::openModelFileDialog);
  QAction* open_directory = file->addAction(tr("Open model &directory\u2026"));
  open_directory->setObjectName("openModelDirectoryAction");
  connect(open_directory, &QAction::triggered, this, &MainWindow::openModelDirectoryDialog);
  QAction* models = file->addAction(tr("&Models\u2026"));
  models->setObjectName("modelsAction");
  models->setShortcut(QKeySequence(QStringLiteral("Ctrl+M")));
  connect(models, &QAction::triggered, this, &MainWindow::openModelsDialog);
  QAction* export_action = file->addAction(tr("&Export\u2026"));
  export_action->setObjectName("exportAction");
  export_action->setShortcut(QKeySequence(QStringLiteral("Ctrl+E")));
  connect(export_action, &QAction::triggered, this, &MainWindow::openExportDialog);
  QAction* export_all = file->addAction(tr("Export &all chats\u2026"));
  export_all->setObjectName("exportAllAction");
  connect(export_all, &QAction::triggered, this, &MainWindow::openExportAllDialog);
  QAction* import_action = file->addAction(tr("&Import chats\u2026"));
  import_action->setObjectName("importAction");
  connect(import_action, &QAction::triggered, this, &MainWindow::openImportDialog);
  file->addSeparator();
  QAction* quit = file->addAction(tr("&Quit"));
  quit->setShortcut(QKeySequence::Quit);
  connect(quit, &QAction::triggered, this, &QWidget::close);

  QMenu* chat = menuBar()->addMenu(tr("&Chat"));
  QAction* continue_action = chat->addAction(tr("&Continue the last reply"));
  continue_action->setObjectName("continueAction");
  continue_action->setShortcut(QKeySequence(QStringLiteral("Ctrl+Shift+Return")));
  connect(continue_action, &QAction::triggered, controller_, [this] { controller_->continueReply(); });
  QAction* regenerate = chat->addAction(tr("&Regenerate the last reply"));
  regenerate->setShortcut(QKeySequence(QStringLiteral("Ctrl+R")));
  connect(regenerate, &QAction::triggered, controller_, &ChatController::regenerate);
  QAction* next_chat = chat->addAction(tr("&Next chat"));
  next_chat->setObjectName("nextChatAction");
  next_chat->setShortcuts({QKeySequence(Qt::CTRL | Qt::Key_PageDown), QKeySequence(Qt::CTRL | Qt::Key_Tab)});
  connect(next_chat, &QAction::triggered, this, [this] { select_neighbour_conversation(1); });
  QAction* previous_chat = chat->addAction(tr("&Previous chat"));
  previous_chat->setObjectName("previousChatAction");
  previous_chat->setShortcuts(
      {QKeySequence(Qt::CTRL | Qt::Key_PageUp), QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_Backtab)});
  connect(previous_chat, &QAction::triggered, this, [this] { select_neighbour_conversation(-1); });
  QAction* clear_cache = chat->addAction(tr("C&lear this chat's cached state"));
  clear_cache->setObjectName("clearCacheAction");
  clear_cache->setToolTip(tr("Drops this chat's KV cache in memory and its snapshot on disk"));
  connect(clear_cache, &QAction::triggered, this, [this] {
    if (controller_->clearCache(controller_->currentConversationId()))
      show_notice(tr("Cached state cleared (memory and disk): the next reply prefills the chat again."));
  });
  QAction* clear_all = chat->addAction(tr("Clear &all cached state"));
  clear_all->setObjectName("clearAllCachedStateAction");
  clear_all->setToolTip(tr("Drops every chat's KV cache in memory and every snapshot on disk"));
  connect(clear_all, &QAction::triggered, this, [this] {
    if (controller_->clearAllCachedState())
      show_notice(tr("All cached state cleared (memory and disk): each chat's next reply prefills it again."));
  });

  QAction* generation = chat->addAction(tr("&Generation settings for this chat\u2026"));
  generation->setObjectName("chatGenerationAction");
  generation->setShortcut(QKeySequence(QStringLiteral("Ctrl+Shift+G")));
  connect(generation, &QAction::triggered, this, &MainWindow::openChatGenerationDialog);
  QAction* caches = chat->addAction(tr("Caches in &memory\u2026"));
  caches->setObjectName("cachesAction");
  connect(caches, &QAction::triggered, this, &MainWindow::openCachesDialog);
  build_keyboard_actions(chat);

  build_view_menu();
  QMenu* settings = menuBar()->addMenu(tr("&Settings"));
  QAction* preferences = settings->addAction(tr("&Settings\u2026"));
  preferences->setShortcut(QKeySequence(QStringLiteral("Ctrl+,")));
  connect(preferences, &QAction::triggered, this, &MainWindow::openSettingsDialog);

  QMenu* help = menuBar()->addMenu(tr("&Help"));
  QAction* shortcuts = help->addAction(tr("&Keyboard shortcuts"));
  shortcuts->setObjectName("keyboardShortcutsAction");
  shortcuts->setShortcut(QKeySequence::HelpContents);
  connect(shortcuts, &QAction::triggered, this, &MainWindow::openShortcutsSheet);
  QAction* about = help->addAction(tr("&About kvchat"));
  about->setObjectName("aboutAction");
  connect(about, &QAction::triggered, this, &MainWindow::openAboutDialog);
}

void MainWindow::build_chart_dock() {
  chart_panel_ = new DecodeChartPanel(this);
  chart_dock_ = new QDockWidget(tr("Decode time per token"), this);
  chart_dock_->setObjectName("decodeChartDock");
  chart_dock_->setWidget(chart_panel_);
  // Below the chat, as wide as the window: positions run along the x axis. It gives way to the transcript:
  // beside the chat in a short window, and a short panel drops its repeated title and moves its legend aside.
  addDockWidget(Qt::BottomDockWidgetArea, chart_dock_);
  connect(chart_dock_, &QDockWidget::visibilityChanged, this, [this](bool visible) {
    if (!visible) return;
    // Plotted while hidden, the chart would cost every reply its redraw for nobody: it catches up when shown.
    chart_panel_->setTimings(controller_->lastDecodeTimings(), controller_->previousDecodeTimings());
    // After the layout has given the newly shown dock its first height.
    QTimer::singleShot(0, this, [this] { fit_chart_dock(this, chart_dock_); });
  });
  chart_dock_->hide();  // View > Decode-time chart
  connect(controller_, &ChatController::decodeTimingsChanged, this, [this] {
    if (chart_dock_->isVisible())
      chart_panel_->setTimings(controller_->lastDecodeTimings(), controller_->previousDecodeTimings());
  });
}

void MainWindow::build_view_menu() {
  QMenu* view = menuBar()->addMenu(tr("&View"));
  QAction* chart = chart_dock_->toggleViewAction();
  chart->setText(tr("&Decode-time chart"));
  chart->setObjectName("decodeChartAction");
  chart->setShortcut(QKeySequence(QStringLiteral("Ctrl+T")));
  view->addAction(chart);
  view->addSeparator();
  QMenu* appearance = view->addMenu(tr("&Appearance"));
  auto* appearances = new QActionGroup(appearance);
  const Appearance chosen = appearance_from_name(controller_->settings().appearance);
  const std::pair<Appearance, QString> choices[] = {{Appearance::System, tr("Follow the &system")},
                                                    {Appearance::Light, tr("&Light")},
                                                    {Appearance::Dark, tr("&Dark")}};
  for (const auto& [choice, label] : choices) {
    QAction* action = appearance->addAction(label);
    const QString name = appearance_name(choice);
    action->setObjectName(QStringLiteral("appearance%1Action").arg(name.left(1).toUpper() + name.mid(1)));
    action->setCheckable(true);
    action->setChecked(choice == chosen);
    appearances->addAction(action);
    connect(action, &QAction::triggered, this, [this, choice = choice] {
      apply_appearance(choice);
      controller_->setAppearance(appearance_name(choice));
    });
  }
  view->addSeparator();
  const auto current_size = [this] { return chat_view_->font().pointSize(); };
  QAction* larger = view->addAction(tr("&Larger text"));
  larger->setShortcuts({QKeySequence::ZoomIn, QKeySequence(QStringLiteral("Ctrl+="))});
  connect(larger, &QAction::triggered, this, [this, current_size] { setChatFontSize(current_size() + 1); });
  QAction* smaller = view->addAction(tr("&Smaller text"));
  smaller->setShortcut(QKeySequence::ZoomOut);
  connect(smaller, &QAction::triggered, this, [this, current_size] { setChatFontSize(current_size() - 1); });
  QAction* reset = view->addAction(tr("&Default text size"));
  reset->setShortcut(QKeySequence(QStringLiteral("Ctrl+0")));
  connect(reset, &QAction::triggered, this, [this] { setChatFontSize(0); });
}

void MainWindow::setChatFontSize(int points) {
  using kvchat::app::ChatSettings;
  if (points != 0) points = std::clamp(points, ChatSettings::kMinFontPointSize, ChatSettings::kMaxFontPointSize);
  QFont font = QApplication::font();
  if (points > 0) font.setPointSize(points);
  // The transcript and the input box; the menus and the status bar keep the system's size.
  chat_view_->setFont(font);
  input_->setFont(font);
  controller_->setFontPointSize(points);
}

void MainWindow::submit_input() {
  if (generating_here() || controller_->isQueued(controller_->currentConversationId())) return;
  const QString text = input_->toPlainText();
  if (text.trimmed().isEmpty()) return;
  if (!draft_fits()) return;
  const bool accepted =
      editing_message_id_ != 0 ? controller_->editMessage(editing_message_id_, text) : controller_->send(text);
  if (accepted) {
    input_->clear();
    editing_message_id_ = 0;
  }
  refresh_buttons();
}

void MainWindow::start_editing_last_message() {
  if (const qint64 last = user_message_before(0)) start_editing_message(last);
}

void MainWindow::start_editing_message(qint64 message_id) {
  if (controller_->isGenerating() || controller_->isQueued(controller_->currentConversationId())) {
    show_notice(tr("A reply is being generated: a message can be edited once it ends."), 3000);
    return;
  }
  for (const auto& message : controller_->currentMessages()) {
    if (message.id != message_id || message.role != MessageRole::User) continue;
    input_->setPlainText(message.text);
    input_->setFocus();
    editing_message_id_ = message_id;
    refresh_buttons();
    return;
  }
}

qint64 MainWindow::user_message_before(qint64 message_id) const {
  const auto messages = controller_->currentMessages();
  for (auto it = messages.crbegin(); it != messages.crend(); ++it)
    if (it->role == MessageRole::User && (message_id == 0 || it->id < message_id)) return it->id;
  return 0;
}

void MainWindow::step_branch(int step) {
  const QHash<qint64, QList<qint64>> branches = controller_->currentBranches();
  qint64 shown = branches.contains(editing_message_id_) ? editing_message_id_ : 0;
  if (shown == 0)
    for (auto it = branches.cbegin(); it != branches.cend(); ++it) shown = std::max(shown, it.key());
  if (shown == 0) return;
  const QList<qint64> group = branches.value(shown);
  const qsizetype index = group.indexOf(shown) + step;
  if (index < 0 || index >= group.size()) return;
  const bool was_editing = editing_message_id_ == shown;
  if (!controller_->showBranch(group[index])) return;
  // Editing follows the message to its other version.
  if (was_editing) start_editing_message(group[index]);
}

void MainWindow::resizeEvent(QResizeEvent* event) {
  QMainWindow::resizeEvent(event);
  // Docks move only once the resize is done.
  QTimer::singleShot(0, this, [this] { fit_chart_dock(this, chart_dock_); });
  // A narrow window gives its width to the chat: the sidebar shrinks with it (a wide window keeps the
  // sidebar's width as the user set it).
  auto* splitter = qobject_cast<QSplitter*>(centralWidget());
  if (!splitter || splitter->count() < 2) return;
  QList<int> sizes = splitter->sizes();
  QWidget* sidebar = splitter->widget(0);
  const int cap =
      std::max({sidebar->minimumWidth(), sidebar->minimumSizeHint().width(), width() / kSidebarWindowFraction});
  if (sizes[0] <= cap) return;
  sizes[1] += sizes[0] - cap;
  sizes[0] = cap;
  splitter->setSizes(sizes);
}

void MainWindow::closeEvent(QCloseEvent* event) {
  // The partial reply is kept (the controller commits it as the turn ends).
  if (controller_->isGenerating()) controller_->stopForQuit();
  QMainWindow::closeEvent(event);
}

}  // namespace kvchat::ui
