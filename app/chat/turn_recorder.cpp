#include "app/chat/turn_recorder.h"

#include <spdlog/spdlog.h>

#include <QTimer>

#include "app/chat/reply_committer.h"
#include "app/store/chat_history.h"

namespace kvchat::app {

TurnRecorder::TurnRecorder(ConversationStore& store, qint64 conversation_id, Cadence cadence)
    : store_(store), conversation_id_(conversation_id), cadence_(cadence) {}

TurnRecorder::~TurnRecorder() { stop_committing(); }

qint64 TurnRecorder::add_user_message(ConversationStore& store, qint64 conversation_id, const QString& text) {
  MessageRecord user;
  user.conversation_id = conversation_id;
  user.role = MessageRole::User;
  user.text = text;
  user.complete = true;
  return store.add_message(user);
}

qint64 TurnRecorder::start_reply(MessageRecord reply) {
  reply.conversation_id = conversation_id_;
  reply.role = MessageRole::Assistant;
  reply.text.clear();
  reply.complete = false;
  reply_id_ = store_.add_message(reply);
  text_.clear();
  committed_text_.clear();
  continuing_ = false;
  start_committing();
  return reply_id_;
}

void TurnRecorder::continue_reply(const MessageRecord& reply) {
  reply_id_ = reply.id;
  text_ = reply.text.toStdString();
  committed_text_ = text_;
  continuing_ = true;
  continued_text_ = text_;
  continued_stats_ = reply.stats;
  continued_ids_ = reply.token_ids;
  continued_vocabulary_ = reply.token_vocabulary;
  start_committing();
}

void TurnRecorder::start_committing() {
  if (cadence_ == Cadence::CommitterThread) {
    committer_ = std::make_unique<ReplyCommitter>(store_.path(), reply_id_);
    return;
  }
  timer_ = std::make_unique<QTimer>();
  timer_->setInterval(kReplyCommitInterval);
  QObject::connect(timer_.get(), &QTimer::timeout, timer_.get(), [this] { commit(); });
  timer_->start();
}

void TurnRecorder::append(std::string_view chunk) {
  if (chunk.empty()) return;
  text_.append(chunk);
  if (committer_) committer_->update(text_);
}

void TurnRecorder::commit() {
  if (reply_id_ == 0) return;
  if (committer_) return;  // the committer thread keeps the reply committed
  if (text_ == committed_text_) return;
  try {
    store_.update_message_text(reply_id_, QString::fromStdString(text_));
    committed_text_ = text_;
    ++commits_;
  } catch (const std::exception& error) {
    // Retried at the next tick; the reply's final write is what reports an error.
    spdlog::error("cannot save the growing reply: {}", error.what());
    if (commit_error_) commit_error_(QString::fromStdString(error.what()));
  }
}

int TurnRecorder::commits() const { return committer_ ? committer_->commits() : commits_; }

void TurnRecorder::stop_committing() {
  if (timer_) timer_->stop();
  if (committer_) {
    committer_->stop();
    commits_ = committer_->commits();
  }
}

std::optional<MessageRecord> TurnRecorder::mark_context_cut(int dropped_messages, int context_limit) {
  const auto& ids = prompt_message_ids_;
  if (dropped_messages <= 0 || static_cast<size_t>(dropped_messages) >= ids.size()) return std::nullopt;
  MessageRecord marker =
      context_cut_marker(conversation_id_, ids[static_cast<size_t>(dropped_messages)], dropped_messages, context_limit);
  marker.id = store_.add_message(marker);
  spdlog::info("conversation {}: context cut before message {}", conversation_id_,
               ids[static_cast<size_t>(dropped_messages)]);
  return marker;
}

void TurnRecorder::finish(const QString& text, const QJsonObject& stats, const std::vector<TokenId>& token_ids,
                          quint64 token_vocabulary) {
  stop_committing();
  store_.finish_message(reply_id_, text, stats, token_ids, token_vocabulary);
}

void TurnRecorder::fail(const QString& message, QJsonObject stats) {
  stop_committing();
  if (continuing_) {
    // Going on with a reply failed: the reply stands as it was (plus any text that did arrive; then its ids no
    // longer cover its text).
    const bool unchanged = text_ == continued_text_;
    store_.finish_message(reply_id_, text(), continued_stats_, unchanged ? continued_ids_ : std::vector<TokenId>{},
                          continued_vocabulary_);
    return;
  }
  stats.insert(kReplyErrorKey, message);
  store_.finish_message(reply_id_, text(), stats);
}

}  // namespace kvchat::app
