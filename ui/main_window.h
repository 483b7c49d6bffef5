#pragma once
// The main window: conversations on the left, the chat in the middle, the input box below it, live speed
// and cache gauges in the status bar. Every action goes through the ChatController; the window only shows
// what it reports. Dialogs that would block are opened non-modally (or injectable) so tests can see them.
#include <QMainWindow>

#include <functional>

#include "app/chat_controller.h"

class QFileDialog;
class QLabel;
class QListWidget;
class QProgressBar;
class QPushButton;

namespace kvchat::ui {

class ChatView;
class MessageInput;
class SettingsDialog;

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
  bool exportCurrentConversation(const QString& path);  // format from the extension (.md, .json, .txt)
  SettingsDialog* openSettingsDialog();                 // non-blocking; applied when accepted

  ChatView* chatView() const { return chat_view_; }
  MessageInput* messageInput() const { return input_; }
  QListWidget* conversationList() const { return conversation_list_; }
  QLabel* speedLabel() const { return speed_label_; }
  QLabel* replyStatsLabel() const { return reply_stats_label_; }
  QLabel* cacheLabel() const { return cache_label_; }
  QLabel* modelLabel() const { return model_label_; }
  QProgressBar* cacheBar() const { return cache_bar_; }

 protected:
  void closeEvent(QCloseEvent* event) override;

 private:
  QWidget* build_sidebar();     // the conversation list and its buttons
  QWidget* build_chat_panel();  // title row, transcript, input box and its buttons
  void build_shortcuts();
  void build_menus();
  void build_status_bar();
  void connect_controller();  // controller -> window
  void show_cache_evicted(qint64 conversation_id);
  void show_model_loading(const QString& path);
  void show_model_loaded(const kvchat::app::ModelInfo& info);
  void show_model_load_failed(const QString& path, const QString& message);
  void submit_input();
  void start_editing_last_message();
  void refresh_conversations();
  void reload_messages();
  void refresh_buttons();
  void refresh_cache_gauge();
  void refresh_reply_stats();
  void show_error_dialog(const QString& title, const QString& text, const QString& object_name);
  void rename_selected_conversation();
  void delete_selected_conversation();
  void edit_system_prompt();
  qint64 selected_conversation_id() const;

  kvchat::app::ChatController* controller_;
  ConfirmHandler confirm_;
  bool editing_last_message_ = false;

  QListWidget* conversation_list_ = nullptr;
  QLabel* title_label_ = nullptr;
  ChatView* chat_view_ = nullptr;
  MessageInput* input_ = nullptr;
  QPushButton* send_button_ = nullptr;
  QPushButton* regenerate_button_ = nullptr;
  QPushButton* edit_button_ = nullptr;
  QLabel* editing_label_ = nullptr;

  QLabel* model_label_ = nullptr;
  QProgressBar* load_busy_ = nullptr;
  QLabel* speed_label_ = nullptr;
  QLabel* reply_stats_label_ = nullptr;
  QProgressBar* cache_bar_ = nullptr;
  QLabel* cache_label_ = nullptr;
};

}  // namespace kvchat::ui
