#pragma once
// The main window: conversations on the left, the chat in the middle, the input box below it, live speed
// and cache gauges in the status bar. Every action goes through the ChatController; the window only shows
// what it reports. Dialogs that would block are opened non-modally (or injectable) so tests can see them.
//
// One class in three files: main_window.cpp (building the window, shortcuts, menus, the controller's
// signals), main_window_state.cpp (what the panels and the status bar show, drafts per chat) and
// main_window_dialogs.cpp (model pickers, export, settings, about, rename/delete, system prompt).
#include <QHash>
#include <QMainWindow>
#include <QTimer>

#include <functional>
#include <optional>

#include "app/chat/chat_controller.h"
#include "ui/conversation_list_model.h"

class QAction;
class QDialog;
class QDockWidget;
class QFileDialog;
class QLabel;
class QMenu;
class QLineEdit;
class QListView;
class QMessageBox;
class QProgressBar;
class QPushButton;

namespace kvchat::ui {

class CachesDialog;
class ChatGenerationDialog;
class ChatView;
class DecodeChartPanel;
class ElidedLabel;
class MessageInput;
class MessageListModel;
class MessageWidget;
class ModelsDialog;
class SettingsDialog;
class SystemPromptBlock;

class MainWindow : public QMainWindow {
  Q_OBJECT
 public:
  explicit MainWindow(kvchat::app::ChatController* controller, QWidget* parent = nullptr);

  // Asked before deleting a conversation; returns whether to go ahead. Default: a Yes/No message box.
  using ConfirmHandler = std::function<bool(const QString& title, const QString& text)>;
  void setConfirmHandler(ConfirmHandler handler) { confirm_ = std::move(handler); }

  // A model directory or a .gguf file; the model stays if the new one fails to load. A loaded one is remembered.
  void openModel(const QString& path);
  // File > Open model file / Open model directory: non-modal pickers (object names "openModelFileDialog",
  // "openModelDirectoryDialog"); the chosen path goes to openModel().
  QFileDialog* openModelFileDialog();
  QFileDialog* openModelDirectoryDialog();
  // File > Models ("modelsDialog", non-modal): recent models and the models in the folders to scan; the one
  // chosen (Enter or a double-click) goes to openModel().
  ModelsDialog* openModelsDialog();
  // "This chat last used X — Load X" ("lastModelBar"): shown for a chat whose last reply came from another local
  // model than the loaded one; nothing is loaded until its button is pressed.
  QWidget* lastModelBar() const { return last_model_bar_; }
  bool exportCurrentConversation(const QString& path);  // format from the extension (.md, .json, .txt)
  // File > Export: a non-modal save dialog ("exportDialog") that starts in the last export folder (kept in
  // the settings, so also after a restart; else Documents, else home) and says what the export holds
  // ("exportContentsLabel"); a name without an extension gets the chosen type's.
  QFileDialog* openExportDialog();
  // File > Export all chats / Import chats: each a non-modal file dialog ("exportAllDialog", "importDialog")
  // starting in the last export folder; the chosen path goes to the function after it. A failure is an error
  // dialog ("exportErrorDialog", "importErrorDialog") saying what is wrong; an import adds nothing then.
  QFileDialog* openExportAllDialog();
  bool exportAllConversations(const QString& path);
  QFileDialog* openImportDialog();
  bool importConversations(const QString& path);
  SettingsDialog* openSettingsDialog();  // non-blocking; applied when accepted
  QMessageBox* openAboutDialog();        // Help > About ("aboutDialog")
  CachesDialog* openCachesDialog();      // Chat > Caches in memory (non-modal)
  // Help > Keyboard shortcuts ("shortcutsSheet", non-modal): every action of the menus and the window that
  // has keys, read from the actions themselves.
  QDialog* openShortcutsSheet();
  // The chat's system prompt ("systemPromptDialog", non-modal): saved when accepted; the input box has the
  // focus again when it closes.
  QDialog* openSystemPromptDialog();
  // Chat > Generation settings for this chat ("chatGenerationDialog", non-modal; also the chat header's
  // "generationSettingsButton", which names the chat's preset): applied to the chat when accepted.
  ChatGenerationDialog* openChatGenerationDialog();
  // The current chat's system prompt at the top of the transcript.
  SystemPromptBlock* systemPromptBlock() const { return system_prompt_block_; }
  QPushButton* generationSettingsButton() const { return generation_button_; }
  DecodeChartPanel* decodeChart() const { return chart_panel_; }  // View > Decode-time chart (a dock)
  QDockWidget* decodeChartDock() const { return chart_dock_; }
  // View > Larger / Smaller / Default text size: the chat's font, saved in the settings (0 = the system's).
  void setChatFontSize(int points);

  ChatView* chatView() const { return chat_view_; }
  MessageInput* messageInput() const { return input_; }
  QListView* conversationList() const { return conversation_list_; }  // over a ConversationListModel
  QLineEdit* chatSearchField() const { return search_field_; }        // filters the chat list ("chatSearchField")
  QLineEdit* findInChatField() const { return find_field_; }          // Chat > Find in the chat ("findInChatField")
  // A chat list row's first matching message while the list is filtered (0: only the title matched).
  static constexpr int kFirstMatchRole = ConversationListModel::FirstMatchRole;
  // A chat list row's pinned flag (bool), and the marker its text starts with when pinned.
  static constexpr int kPinnedRole = ConversationListModel::PinnedRole;
  static QString pinnedMarker() { return ConversationListModel::pinned_marker(); }
  QLabel* speedLabel() const;
  QLabel* replyStatsLabel() const;
  QLabel* cacheLabel() const;
  QLabel* modelLabel() const;
  QLabel* noticeLabel() const;
  // "Serving on http://127.0.0.1:PORT" while the local server runs, or why it could not start.
  QLabel* servingLabel() const {
    return serving_label_;
  }  // passing messages, above the input (errors are shown in the chat)
  // Under the input: the typed message's tokens against the room left in the context, red when it won't fit.
  QLabel* tokenCounterLabel() const;
  QProgressBar* cacheBar() const { return cache_bar_; }

 protected:
  void closeEvent(QCloseEvent* event) override;
  void resizeEvent(QResizeEvent* event) override;  // a narrow window shrinks the sidebar

 private:
  // main_window.cpp
  QWidget* build_sidebar();     // the conversation list and its buttons
  QWidget* build_chat_panel();  // title row, transcript, input box and its buttons
  void build_menus();
  void build_view_menu();
  void build_chart_dock();
  void connect_controller();                     // controller -> window
  void select_neighbour_conversation(int step);  // Ctrl+PgDn / Ctrl+PgUp
  void select_conversation_at(int row);          // Ctrl+1..9
  void start_new_conversation();
  void submit_input();
  void start_editing_last_message();
  // Puts user message `message_id` in the message box: Resend answers the edit as a new branch.
  void start_editing_message(qint64 message_id);
  // The user message of the shown path before `message_id` (0: the last one; 0 returned when there is none).
  qint64 user_message_before(qint64 message_id) const;
  // Shows the previous (step -1) or next (+1) branch of the message being edited, else of the last edited
  // message on the shown path.
  void step_branch(int step);

  // main_window_keyboard.cpp
  // The Chat menu's actions for the transcript and the chat list (rename, delete, edit, stop, versions, copy)
  // and the window's own keys (scrolling, Ctrl+1..9), each a QAction so the shortcuts sheet lists it.
  void build_keyboard_actions(QMenu* chat);
  void stop_or_cancel();  // Esc: stops the reply, withdraws a waiting message, or ends editing
  MessageWidget* last_reply_widget() const;

  // main_window_state.cpp
  void build_status_bar();
  void show_notice(const QString& text, int milliseconds = 8000);
  void show_cache_evicted(qint64 conversation_id);
  void show_model_loading(const QString& path);
  void show_model_loaded(const kvchat::app::ModelInfo& info);
  void show_model_load_failed(const QString& path, const QString& message);
  void show_reply_failed(qint64 conversation_id, const QString& message);
  void switch_drafts(qint64 conversation_id);  // the input keeps one draft per chat
  void refresh_conversations();                // reads the chat list (a store change): the list updates in place
  void refresh_conversation_states();          // generating, waiting, caches held: no store read
  void select_current_conversation_row();
  void reload_messages();
  void refresh_buttons();
  void refresh_model_label();  // the loaded model, or the server and model replies come from
  void refresh_cache_gauge();
  void clear_speed();  // the live speed field, when what it showed no longer applies
  void refresh_reply_stats();
  void refresh_placeholder();
  void refresh_window_title();   // names what answers: the loaded model, or the server's
  bool generating_here() const;  // the current chat is the one generating
  // The typed message's token count, asked for once typing pauses and shown when the answer comes.
  struct DraftKey {
    QString text;
    qint64 editing_message_id = 0;
    qint64 conversation_id = 0;
    quint64 revision = 0;  // draft_revision_ when asked
    bool operator==(const DraftKey& other) const {
      return text == other.text && editing_message_id == other.editing_message_id &&
             conversation_id == other.conversation_id && revision == other.revision;
    }
  };
  DraftKey draft_key() const;
  void refresh_token_counter();
  void show_draft_measure(quint64 request_id, bool measured, const kvchat::app::DraftMeasure& measure);
  void show_token_count(const DraftKey& key, const std::optional<kvchat::app::DraftMeasure>& measure);
  // The system prompt block, the generation settings button and the last-model bar of the current chat.
  void refresh_chat_header();
  bool draft_fits();  // false (and says why) when the typed message cannot fit the context

  // main_window_dialogs.cpp
  void show_error_dialog(const QString& title, const QString& text, const QString& object_name);
  void rename_selected_conversation();
  void delete_selected_conversation();
  void toggle_pin_of_selected_conversation();
  void duplicate_selected_conversation();
  void delete_message(qint64 message_id);  // asks first
  void refresh_pin_action();               // "Pin" or "Unpin", as the selected chat is
  qint64 selected_conversation_id() const;

  kvchat::app::ChatController* controller_;
  kvchat::app::LocalServerHost* local_server_;  // the local server: a concern of its own, beside the chat
  kvchat::app::BackendHost* backend_;  // the model and the threads that answer turns: observed, not driven, here
  ConfirmHandler confirm_;
  qint64 editing_message_id_ = 0;  // the user message the message box edits (0: none)
  qint64 input_conversation_ = 0;  // the chat the input box's text belongs to
  QHash<qint64, QString> drafts_;  // unsent text of the other chats
  qint64 speed_conversation_ = 0;  // the chat whose reply the speed field shows (0: none)

  ConversationListModel* conversation_model_ = nullptr;
  bool updating_conversation_list_ = false;  // the model's rows change: the view's current row is not a choice
  QListView* conversation_list_ = nullptr;
  QLineEdit* search_field_ = nullptr;
  QLineEdit* find_field_ = nullptr;
  QAction* pin_action_ = nullptr;
  ElidedLabel* title_label_ = nullptr;
  QPushButton* generation_button_ = nullptr;
  SystemPromptBlock* system_prompt_block_ = nullptr;
  QWidget* last_model_bar_ = nullptr;
  QLabel* last_model_label_ = nullptr;
  QPushButton* last_model_button_ = nullptr;
  QString last_model_path_;                    // what the bar's button loads
  MessageListModel* message_model_ = nullptr;  // the shown chat's transcript, fed from the controller's signals
  ChatView* chat_view_ = nullptr;              // shows message_model_
  MessageInput* input_ = nullptr;
  QPushButton* send_button_ = nullptr;
  QPushButton* regenerate_button_ = nullptr;
  QPushButton* edit_button_ = nullptr;
  QLabel* editing_label_ = nullptr;
  QLabel* waiting_label_ = nullptr;
  ElidedLabel* token_counter_ = nullptr;
  QTimer token_count_timer_;
  quint64 draft_request_id_ = 0;  // the count asked for and not answered yet (0: none)
  DraftKey draft_request_key_;
  std::optional<DraftKey> shown_measure_key_;  // what the counter shows is for
  std::optional<kvchat::app::DraftMeasure> shown_measure_;
  // Counts the changes to what a draft is counted against (the chat's messages, its settings, the model).
  quint64 draft_revision_ = 0;

  DecodeChartPanel* chart_panel_ = nullptr;
  QDockWidget* chart_dock_ = nullptr;

  QLabel* notice_label_ = nullptr;
  QTimer notice_timer_;
  ElidedLabel* model_label_ = nullptr;
  QProgressBar* load_busy_ = nullptr;
  ElidedLabel* speed_label_ = nullptr;
  ElidedLabel* reply_stats_label_ = nullptr;
  QProgressBar* cache_bar_ = nullptr;
  ElidedLabel* cache_label_ = nullptr;
  QLabel* serving_label_ = nullptr;
};

}  // namespace kvchat::ui
