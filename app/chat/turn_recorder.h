#pragma once
// How one turn is written to the conversation store, the same for the desktop app, `kvchat-cli chat` and its
// remote backend: the user message, an incomplete reply that grows (committed at most kReplyCommitInterval
// behind what was shown), then its end: finished with its stats and exact ids, or failed with the error and
// the text that did arrive. A context cut leaves a marker before the first message the model still saw.
//
// The growing reply is committed either by a timer on the caller's thread (the app: its event loop runs
// while the reply streams) or by a committer thread with its own store connection (the CLI: its decode loop
// blocks the thread, and a slow token must not hold back the text before it).
#include <QJsonObject>
#include <QString>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "app/store/conversation_store.h"
#include "engine/types.h"

class QTimer;

namespace kvchat::app {

class ReplyCommitter;

class TurnRecorder {
 public:
  enum class Cadence {
    EventLoopTimer,   // a timer on the calling thread, whose event loop must run while the reply grows
    CommitterThread,  // ReplyCommitter: a thread and a store connection of its own
  };

  // `store` must outlive the recorder and be used from the calling thread only.
  TurnRecorder(ConversationStore& store, qint64 conversation_id, Cadence cadence);
  // Stops committing. An unfinished reply stays as last committed, incomplete (as after a crash).
  ~TurnRecorder();
  TurnRecorder(const TurnRecorder&) = delete;
  TurnRecorder& operator=(const TurnRecorder&) = delete;

  // The user's message, committed. A chat may hold a message before its turn starts (the app queues one
  // behind another chat's reply), so this needs no recorder.
  static qint64 add_user_message(ConversationStore& store, qint64 conversation_id, const QString& text);

  // A new reply: `reply`'s model, backend and settings, saved incomplete and empty. Returns its id.
  qint64 start_reply(MessageRecord reply);
  // Going on with an existing reply (Continue): it grows in place from its text; should the turn fail, its
  // text, figures and ids are put back as they were (plus any text that did arrive).
  void continue_reply(const MessageRecord& reply);
  // The ids of the prompt's non-system messages, in order: a context cut is recorded against them.
  void set_prompt_message_ids(std::vector<qint64> ids) { prompt_message_ids_ = std::move(ids); }

  // New text of the reply (UTF-8 split on character boundaries).
  void append(std::string_view chunk);
  void append(const QString& chunk) { append(std::string_view(chunk.toStdString())); }
  QString text() const { return QString::fromStdString(text_); }
  const std::string& utf8_text() const { return text_; }
  qint64 reply_id() const { return reply_id_; }
  bool continuing() const { return continuing_; }
  const QJsonObject& continued_stats() const { return continued_stats_; }  // the continued reply's figures before
  // Commits the text now if it changed since the last commit (the timer calls it; so may the caller).
  void commit();
  int commits() const;  // how many growing-text commits were made
  // Told why a timer commit failed (it is retried at the next tick; the final write reports its own error).
  void set_commit_error_handler(std::function<void(const QString&)> handler) { commit_error_ = std::move(handler); }

  // The oldest `dropped_messages` of the prompt were left out to fit `context_limit`: the marker is saved (and
  // returned), unless nothing or everything would be cut.
  std::optional<MessageRecord> mark_context_cut(int dropped_messages, int context_limit);

  // The reply is complete: `text` (the whole reply), its stats and exact ids. Throws StoreError.
  void finish(const QString& text, const QJsonObject& stats, const std::vector<TokenId>& token_ids = {},
              quint64 token_vocabulary = 0);
  void finish(const QJsonObject& stats, const std::vector<TokenId>& token_ids = {}, quint64 token_vocabulary = 0) {
    finish(text(), stats, token_ids, token_vocabulary);
  }
  // The turn failed with `message`: a new reply is saved with the text that arrived and `stats` plus the error
  // (is_failed_reply); a continued one is put back as it was, with any text that arrived. Throws StoreError.
  void fail(const QString& message, QJsonObject stats = {});

 private:
  void start_committing();
  void stop_committing();

  ConversationStore& store_;
  qint64 conversation_id_;
  Cadence cadence_;
  qint64 reply_id_ = 0;
  std::string text_;
  std::string committed_text_;
  int commits_ = 0;
  bool continuing_ = false;
  std::string continued_text_;
  QJsonObject continued_stats_;
  std::vector<TokenId> continued_ids_;
  quint64 continued_vocabulary_ = 0;
  std::vector<qint64> prompt_message_ids_;
  std::function<void(const QString&)> commit_error_;
  std::unique_ptr<QTimer> timer_;
  std::unique_ptr<ReplyCommitter> committer_;
};

}  // namespace kvchat::app
