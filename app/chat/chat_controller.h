#pragma once
// The chat's brain on the GUI thread (Qt Core only): owns the conversation store, turns user actions (send, stop,
// regenerate, edit, conversation management, export) into store writes and turns, and exposes what the window
// shows (live speed, last reply's stats, cache gauges). Two concerns beside the chat are objects of their own
// that it holds and the window observes directly: BackendHost (the engine's, the remote backend's and the draft
// counter's threads, the loaded model) and LocalServerHost (the local OpenAI server). Widgets only observe them,
// through their signals and queries (records by value, never the store itself); tests drive them directly.
//
// One class, implemented in three files: chat_controller.cpp (settings, model choice, cache gauge, draft counts),
// chat_controller_conversations.cpp (create, select, rename, delete, list, export) and chat_controller_turns.cpp
// (send, stop, regenerate, edit, streaming, stats). Conversations and turns are not two classes, because the
// halves share state both ways: deleting a conversation ends its turn and drops its cache figures, a turn
// creates and retitles conversations and reports only for the selected one. Two classes would need
// back-references and forwarded signals, and the window would still want one object to observe.
#include <QHash>
#include <QJsonObject>
#include <QList>
#include <QObject>
#include <QSet>
#include <QString>
#include <QTimer>

#include <atomic>
#include <memory>
#include <optional>
#include <vector>

#include "app/chat/backend_host.h"
#include "app/chat/draft_counter.h"
#include "app/chat/engine_worker.h"
#include "app/chat/generation_preset.h"
#include "app/chat/reply_format.h"
#include "app/chat/stop_text_filter.h"
#include "app/chat/turn_recorder.h"
#include "app/server/local_server_host.h"
#include "app/settings.h"
#include "app/store/chat_history.h"
#include "app/store/conversation_store.h"
#include "app/store/exporter.h"
#include "engine/types.h"

class QSettings;

namespace kvchat::app {

// What the cache gauge shows for the current conversation and for all of them.
struct CacheGauge {
  bool cache_enabled = true;
  bool on_server = false;  // the remote backend: the cache lives on the server (reused_tokens = its cached_tokens)
  qint64 conversation_tokens = 0;
  qint64 conversation_bytes = 0;
  kvchat::KvDtype kv_dtype = kvchat::KvDtype::F32;  // how the cache stores K/V (the settings')
  int context_limit = 0;                            // effective: the settings' limit, or the model's
  int reused_tokens = 0;                            // the current conversation's last turn
  int prefilled_tokens = 0;
  int restored_tokens = 0;  // of reused_tokens, restored from a snapshot on disk
  double restore_ms = 0.0;
  bool has_turn = false;   // whether reused/prefilled/restored describe a turn of this conversation
  qint64 total_bytes = 0;  // every conversation's cache
  qint64 budget_bytes = 0;
  bool snapshots_enabled = true;
  qint64 snapshot_tokens = 0;  // the current conversation's snapshot on disk (as written by this app)
  qint64 snapshot_bytes = 0;
  qint64 disk_bytes = 0;  // every snapshot in the folder (-1: not known yet)
  qint64 disk_budget_bytes = 0;
};

class ChatController : public QObject {
  Q_OBJECT
 public:
  // Opens (creating if needed) the database and reads the settings from `settings_storage` (not owned,
  // must outlive the controller). Starts the engine thread; no model is loaded until loadModel().
  // Throws StoreError when the database cannot be opened.
  ChatController(const QString& database_path, QSettings* settings_storage, QObject* parent = nullptr);
  ~ChatController() override;

  const ChatSettings& settings() const { return settings_; }
  // Saves the settings; they apply from the next turn. A changed model path is loaded.
  void applySettings(const ChatSettings& settings);
  // The local server (Settings -> "Serve the loaded model on localhost:PORT"), a concern of its own: the
  // window holds it apart from the chat. The controller tells it what to serve: the loaded model, the
  // sessions' budget and the threads, again on every model load and settings change.
  LocalServerHost& localServerHost() const { return *local_server_; }
  // Saves only the chat's text size (a display choice: no reload, nothing for the next turn).
  void setFontPointSize(int points);
  // Saves only the folder of the last export (where the next export dialog starts, also after a restart).
  void setExportDirectory(const QString& directory);
  // Saves only the appearance ("system", "light" or "dark"; a display choice like the text size).
  void setAppearance(const QString& appearance);

  // `path` is a model directory or a .gguf file; empty = the settings' model (or the embedded one). With
  // remember, a successful load becomes the settings' model path, so the next start opens it again
  // (File > Open model file / Open model directory). Its progress: backendHost()'s signals.
  void loadModel(const QString& path, bool remember = false);
  // The engine's, the remote backend's and the draft counter's threads, and the loaded model (modelInfo(),
  // modelLoaded(), the recent models): held apart from the chat, like the local server.
  BackendHost& backendHost() const { return *backend_; }
  // Whether a turn can be sent: the local model is loaded, or the remote backend has a server address.
  bool isBackendReady() const;
  bool usesRemoteBackend() const { return settings_.backend == BackendKind::Remote; }
  // The local model the chat's last reply came from (its settings' kReplyModelPathKey), with its name; nullopt
  // when no reply of the chat records one (no reply yet, remote replies, replies older than the key).
  struct ModelUse {
    QString path;
    QString name;
  };
  std::optional<ModelUse> lastModelOf(qint64 conversation_id) const;

  qint64 currentConversationId() const { return current_conversation_; }
  QList<ConversationRecord> conversations() const;
  std::optional<ConversationRecord> conversation(qint64 conversation_id) const;  // nullopt: no such conversation
  // The chats holding every word of `query` (ConversationStore::search); none (and errorOccurred) on failure.
  QList<SearchHit> searchConversations(const QString& query);
  // The current chat's shown path (messages_on_shown_path: hidden branches left out, hidden alternatives kept).
  QList<MessageRecord> currentMessages() const;
  // The branch groups on the current chat's shown path: each shown user message that has been edited (or is an
  // edit) -> its group (branch_siblings: the original, then its edits), for the window's "‹ 2/3 ›".
  QHash<qint64, QList<qint64>> currentBranches() const;
  // The chat messages the engine gets for a conversation: its system prompt, then every user/assistant
  // message after the last context cut (markers and empty replies left out).
  std::vector<ChatMessage> engineMessages(qint64 conversation_id) const;

  bool isGenerating() const { return active_.has_value(); }
  // Conversations whose last message waits for the reply being generated in another chat to finish
  // (sent while that one streamed), first to be answered first.
  QList<qint64> queuedConversationIds() const { return queued_conversations_; }
  bool isQueued(qint64 conversation_id) const { return queued_conversations_.contains(conversation_id); }
  qint64 generatingConversationId() const { return active_ ? active_->conversation_id : 0; }
  qint64 generatingMessageId() const { return active_ ? active_->message_id : 0; }
  QString generatingText() const { return active_ ? active_->recorder->text() : QString(); }
  // The current chat's last reply in this run (none after switching chats or loading a model).
  std::optional<GenerationStats> lastReplyStats() const { return last_stats_; }
  // Whether lastReplyStats() came from the remote backend (the server prefilled; no prefill speed is known).
  bool lastReplyFromServer() const { return last_stats_from_server_; }
  CacheGauge cacheGauge() const;
  // The per-step decode times of the last reply and of the one before it (any chat): the decode-time chart.
  std::optional<DecodeTimings> lastDecodeTimings() const { return last_timings_; }
  std::optional<DecodeTimings> previousDecodeTimings() const { return previous_timings_; }
  // Conversations whose KV cache is held in memory now, with its size (figures the engine reported).
  struct HeldCache {
    qint64 conversation_id = 0;
    qint64 tokens = 0;
    qint64 bytes = 0;
  };
  QList<HeldCache> heldCaches() const;
  // What sending `draft` in the current chat would give the model, counted with its tokenizer and template (on
  // the draft counter's thread: this one waits). With replacing_last_message, as editLastUserMessage(draft)
  // would: the last user message and everything after it are left out. nullopt: no model loaded, or the
  // remote backend (a server counts with its own tokenizer).
  using DraftMeasure = kvchat::app::DraftMeasure;
  std::optional<DraftMeasure> measureDraft(const QString& draft, bool replacing_last_message = false) const;
  // As editMessage(message_id, draft) would: the shown messages before that user message, then the draft.
  std::optional<DraftMeasure> measureEdit(const QString& draft, qint64 message_id) const;
  // The same count without waiting: measureDraft(draft), or measureEdit(draft, editing_message_id) when that is
  // not 0, answered by draftMeasured() with the id returned here. A newer request makes the older ones moot.
  quint64 requestDraftMeasure(const QString& draft, qint64 editing_message_id = 0);
  // The current chat's last reply when it can be continued (see is_continuable_reply), else nullopt.
  std::optional<MessageRecord> continuableReply() const;

  // The chat's own generation settings; nullopt = it follows the global settings (also for an unreadable
  // value, logged).
  std::optional<GenerationPreset> chatGenerationSettings(qint64 conversation_id) const;
  // What a turn of the chat runs with: the global settings with the chat's own over them.
  ChatSettings turnSettings(qint64 conversation_id) const;
  // The chat's reply format: free text unless the chat asks for JSON (also for an unreadable value, logged). A
  // JSON format constrains every local reply token by token and is asked of a server as `response_format`.
  ReplyFormat chatReplyFormat(qint64 conversation_id) const;
  // The built-in presets, then the user's.
  QList<GenerationPreset> presets() const;
  QList<GenerationPreset> userPresets() const { return user_presets_; }

  // The default title of a new conversation; the first message replaces it.
  static QString newConversationTitle();

 public Q_SLOTS:
  // Selects an existing empty "New chat" rather than saving another one; else creates one.
  qint64 newConversation();
  void selectConversation(qint64 conversation_id);
  void renameConversation(qint64 conversation_id, const QString& title);
  // Pinned chats are listed first (ConversationStore::conversations).
  void setPinned(qint64 conversation_id, bool pinned);
  void deleteConversation(qint64 conversation_id);
  // A copy of the chat, messages and all (ConversationStore::duplicate_conversation), selected. 0 (and
  // errorOccurred) when it cannot be copied.
  qint64 duplicateConversation(qint64 conversation_id);
  // Deletes one message of the current chat: a user message with the replies to it (every alternative), or a
  // single reply (when it was the one shown, the newest remaining alternative is shown instead). Not while the
  // chat generates or waits to. The chat's KV cache needs no other care: the next prompt is encoded from what
  // remains, and the session keeps only the prefix it shares with that prompt (as after an edit).
  bool deleteMessage(qint64 message_id);
  void setSystemPrompt(qint64 conversation_id, const QString& system_prompt);
  // Saves the chat's own generation settings (nullopt: it follows the global settings again); they apply from
  // its next turn.
  void setChatGenerationSettings(qint64 conversation_id, const std::optional<kvchat::app::GenerationPreset>& settings);
  // Saves the chat's reply format, from its next turn on. Returns "" when saved, else why not (what in the schema
  // the constraint cannot take, or that it is not JSON), and nothing is saved.
  QString setChatReplyFormat(qint64 conversation_id, const kvchat::app::ReplyFormat& format);
  // Saves a preset of the user's, replacing one of the same name. A built-in preset's name or an empty one is
  // refused (false, and errorOccurred says why).
  bool saveUserPreset(const kvchat::app::GenerationPreset& preset);
  // Why `name` cannot name a preset of the user's ("" when it can): empty, or a built-in preset's name.
  QString presetNameProblem(const QString& name) const;
  void removeUserPreset(const QString& name);
  // Clears the conversation's cached state: its KV cache in memory and its snapshot on disk (its next
  // turn prefills the chat again). Not while it is generating.
  bool clearCache(qint64 conversation_id);
  // The same for every conversation, and every snapshot in the snapshot folder. Not while generating.
  bool clearAllCachedState();
  // Where KV snapshots are kept for this run, over the settings' folder (the --cache-dir option).
  void setSnapshotDirectoryOverride(const QString& directory);
  QString snapshotDirectory() const;

  // Each returns false (and emits errorOccurred with the reason) when it cannot start a turn now.
  // While another chat's reply streams, send() saves the message and queues its turn (turnQueued): it
  // starts when that reply ends.
  bool send(const QString& text);
  // A new reply to the last message; the one it replaces is kept as an alternative (showAlternative).
  bool regenerate();
  // Shows that reply of its turn instead of the others (and gives it to the model from the next turn on).
  bool showAlternative(qint64 message_id);
  // Goes on writing the last reply where it was cut short (max tokens, Stop, the app closing mid-reply):
  // the model continues its own text, and the new text is appended to the same message.
  bool continueReply();
  // Edits a user message of the shown path: forks the chat there (ConversationStore::fork_message). The edit
  // starts a new branch, shown from now on, and is answered; the message and everything after it are kept as
  // the branch it was, which showBranch() brings back. The model is given only the shown path; the engine
  // session reuses the prefix it shares with the previous turn.
  bool editMessage(qint64 message_id, const QString& text);
  bool editLastUserMessage(const QString& text);  // editMessage() on the shown path's last user message
  // Shows branch `message_id` (a member of a branch group, see currentBranches) with its whole continuation.
  // Not while the chat generates or waits to.
  bool showBranch(qint64 message_id);
  // Shows the branches that hide message `message_id` of the current chat (a search hit in another branch),
  // so that the transcript holds it. True when it is on the shown path afterwards.
  bool revealMessage(qint64 message_id);
  void stop();
  // Stops the reply because the app is being quit: saved like a stopped one, marked kReplyClosedByAppKey so the
  // window says so rather than "stopped".
  void stopForQuit();
  // Withdraws the conversation's waiting message (send() queued it behind another chat's reply): it is
  // removed from the chat and returned, so the window can put it back in the input box. nullopt when
  // nothing of that conversation waits.
  std::optional<QString> cancelQueued(qint64 conversation_id);

  // Throws std::runtime_error / std::invalid_argument naming the problem.
  void exportConversation(qint64 conversation_id, const QString& path, ExportFormat format) const;
  // File > Export all chats: every conversation, every message (all branches and alternatives) in one file
  // (chat_archive.h), written atomically. Throws std::runtime_error naming the problem.
  void exportAllConversations(const QString& path) const;
  // File > Import chats: the conversations of an archive or of a single chat's JSON export, added as new chats
  // in one transaction (nothing is added when anything is wrong). Returns how many; throws ArchiveError or
  // StoreError saying what is wrong.
  int importConversations(const QString& path);

 Q_SIGNALS:
  void conversationsChanged();
  void currentConversationChanged(qint64 conversation_id);
  void messagesReset();  // the current conversation's message list changed: reload it
  void replyTextAppended(qint64 conversation_id, qint64 message_id, const QString& chunk);
  void replyFinished(const kvchat::app::MessageRecord& reply);  // as saved: final text and stats
  void generatingChanged(bool generating);
  void decodeSpeedChanged(double tokens_per_second, int generated_tokens);
  void lastReplyStatsChanged();
  void cacheGaugeChanged();
  void decodeTimingsChanged();
  void cacheEvicted(qint64 conversation_id);
  void errorOccurred(const QString& message);
  // A turn failed (see is_failed_reply): the reply was saved with the error, which replyFinished also carries.
  void replyFailed(qint64 conversation_id, qint64 message_id, const QString& message);
  // The conversation's message waits for `waiting_for`'s reply to finish.
  void turnQueued(qint64 conversation_id, qint64 waiting_for);
  void settingsChanged();
  void chatGenerationSettingsChanged(qint64 conversation_id);
  void systemPromptChanged(qint64 conversation_id);
  // The model's title for the chat was asked for (ChatSettings::model_titles) and has been dealt with: `title`
  // is the chat's title now (the model's, or the one it had when the model gave nothing usable or the user
  // renamed the chat meanwhile).
  void conversationTitled(qint64 conversation_id, const QString& title);
  void presetsChanged();
  // The answer to requestDraftMeasure(`request_id`); `measured` false as measureDraft's nullopt.
  void draftMeasured(quint64 request_id, bool measured, const kvchat::app::DraftMeasure& measure);

 private:
  struct ActiveTurn {
    quint64 turn_id = 0;
    qint64 conversation_id = 0;
    qint64 message_id = 0;
    // Writes the turn to the store: the growing reply, committed as it grows, and its end.
    std::unique_ptr<TurnRecorder> recorder;
    std::shared_ptr<std::atomic<bool>> stop;
    bool continuing = false;     // continueReply(): message_id is an existing reply that grows
    bool quitting = false;       // stopped because the app is being quit (stopForQuit)
    bool remote = false;         // sent to the remote backend
    QJsonObject remote_details;  // a remote reply's extra stats keys (RemoteWorker::replyDetails)
    QJsonObject failure_stats;   // saved with the error when the turn fails (an interrupted reply's figures)
    ReplyTokens reply_tokens;    // the local engine's exact ids of the finished reply
    // The chat's stop texts: the reply is cut before the first of them (and the turn stopped there).
    std::shared_ptr<StopTextFilter> stop_filter;
  };

  // chat_controller_turns.cpp
  void set_up_turns();  // the worker's turn signals and the turn timers (constructor)
  // A new reply, or (continued) going on with that existing reply.
  bool start_turn(qint64 conversation_id, const MessageRecord* continued = nullptr);
  bool can_start_turn();     // false (and errorOccurred says why) while a turn cannot start
  void start_queued_turn();  // the next queued conversation's turn, once none is running
  void end_turn();
  void emit_reply_finished(qint64 message_id);
  void on_text_ready(quint64 turn_id, const QString& text);
  void flush_stop_filter();  // the text a stop filter held back, once the turn has ended without a match
  // The global settings with a chat's own (chatGenerationSettings) over them: turnSettings() without the
  // store read, for a caller that has them already.
  ChatSettings settings_with(const std::optional<GenerationPreset>& own) const;
  void on_token_stats(quint64 turn_id, int generated_tokens, double tokens_per_second);
  void on_context_trimmed(quint64 turn_id, int dropped_messages, int context_limit);
  void on_finished(quint64 turn_id, const kvchat::GenerationStats& stats);
  void on_failed(quint64 turn_id, const QString& message);
  void on_interrupted(quint64 turn_id, const QString& message, const kvchat::GenerationStats& stats);
  void dispatch_turn(const TurnRequest& request);  // to the engine or the server, as the settings say
  // After a new chat's first local reply, with model titles on: asks the engine for a title (on_title_ready).
  void request_model_title(qint64 conversation_id);
  void on_title_ready(qint64 conversation_id, const QString& text);

  // chat_controller_conversations.cpp
  // The current chat's messages as stored (every branch and alternative): read once when first needed, then kept
  // in step with this controller's own writes, so that a send, a streaming reply and the window's refreshes
  // read no message list again.
  const QList<MessageRecord>& current_records() const;
  // A conversation's messages as stored: the current chat's from current_records(), another's from the store.
  QList<MessageRecord> stored_messages(qint64 conversation_id) const;
  // After this controller wrote message `message_id` of the conversation: its row is read back into
  // current_records() when that is the conversation's.
  void cache_message(qint64 conversation_id, qint64 message_id);
  void cache_record(const MessageRecord& record);  // a row just read back (it replaces or joins the cached one)
  // After a write that reshapes the conversation (an edit, a branch shown or deleted, messages deleted): read again
  // at the next use.
  void forget_records(qint64 conversation_id);
  MessageRecord* cached_record(qint64 conversation_id, qint64 message_id);  // nullptr: not cached

  // chat_controller.cpp
  // The prompt a draft would make (nullopt: nothing to count it with).
  std::optional<DraftRequest> draft_request(const QString& draft, bool replacing_last_message,
                                            qint64 replacing_message_id) const;
  std::optional<DraftMeasure> measure_on_counter_thread(const std::optional<DraftRequest>& request) const;
  void on_cache_changed(qint64 conversation_id, qint64 tokens, qint64 bytes, qint64 total_bytes, qint64 budget_bytes);
  void on_cache_evicted(qint64 conversation_id);
  void on_snapshot_written(qint64 conversation_id, qint64 tokens, qint64 file_bytes, qint64 folder_bytes,
                           qint64 budget);
  void configure_snapshots();  // sends the settings' snapshot options to the worker
  // Asks the worker once per model about the conversation's snapshot on disk (one an earlier run wrote).
  void describe_snapshot(qint64 conversation_id);

  std::unique_ptr<ConversationStore> store_;
  QSettings* settings_storage_;
  ChatSettings settings_;
  QList<GenerationPreset> user_presets_;
  QHash<qint64, QString> titles_awaited_;    // chats waiting for the model's title, with the title they had then
  LocalServerHost* local_server_ = nullptr;  // a child: stopped before the engine thread ends
  void apply_local_server();

  BackendHost* backend_ = nullptr;  // a child: its threads are ended by the destructor, before the last replies
  EngineWorker* engine() const { return backend_->engine(); }
  quint64 next_draft_request_ = 1;
  QString remember_model_path_;  // a user-chosen directory or file to save once it has loaded

  qint64 current_conversation_ = 0;
  mutable std::optional<QList<MessageRecord>> current_records_;  // see current_records()
  mutable qint64 current_records_conversation_ = 0;              // whose they are
  std::optional<ActiveTurn> active_;
  QList<qint64> queued_conversations_;
  quint64 next_turn_id_ = 1;
  QTimer speed_timer_;
  double live_decode_rate_ = 0.0;
  int live_generated_ = 0;
  std::optional<GenerationStats> last_stats_;
  bool last_stats_from_server_ = false;
  std::optional<DecodeTimings> last_timings_;
  std::optional<DecodeTimings> previous_timings_;

  struct ConversationCacheFigures {
    qint64 tokens = 0;
    qint64 bytes = 0;
    int reused_tokens = 0;
    int prefilled_tokens = 0;
    int restored_tokens = 0;
    double restore_ms = 0.0;
    bool has_turn = false;
    bool turn_on_server = false;  // the last turn's figures are the remote server's (its cached_tokens)
    qint64 snapshot_tokens = 0;
    qint64 snapshot_bytes = 0;
  };
  QHash<qint64, ConversationCacheFigures> cache_figures_;
  qint64 total_cache_bytes_ = 0;
  QString snapshot_key_prefix_;  // this database's conversations in a shared snapshot folder
  QString snapshot_directory_override_;
  qint64 snapshot_folder_bytes_ = -1;  // -1: no snapshot written or cleared yet in this run
  QSet<qint64> snapshots_described_;   // conversations describe_snapshot asked about for the loaded model
};

}  // namespace kvchat::app
