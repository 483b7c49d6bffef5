#pragma once
// Keeps a streaming reply committed while it grows, so that a crash or kill -9 loses at most
// kReplyCommitInterval of shown text. The promise is about time, not tokens: a slow token must not
// hold back the text before it, and a fast stream must not cost a commit per token.
#include <QString>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace kvchat::app {

// How long shown text may stay uncommitted, at most: one interval of waiting plus one commit. The
// desktop app's timer and the CLI's committer thread both use it.
constexpr std::chrono::milliseconds kReplyCommitInterval{250};
// The bound the documentation promises (the interval plus room for a commit on a busy machine).
constexpr std::chrono::milliseconds kReplyCommitBound{500};

// For a caller whose decode loop runs on its own thread (the CLI): a thread of its own, with its own
// store connection, commits the latest text handed to it, at most one interval after it arrived.
// The decode loop never waits for the disk. Commit failures are logged and retried at the next
// change; the caller's final write of the reply is what reports an error.
class ReplyCommitter {
 public:
  // `database_path`: the conversation store; `message_id`: the incomplete reply to keep updated.
  ReplyCommitter(QString database_path, qint64 message_id);
  ~ReplyCommitter();  // stop()
  ReplyCommitter(const ReplyCommitter&) = delete;
  ReplyCommitter& operator=(const ReplyCommitter&) = delete;

  // The reply's whole text so far (cheap: a copy under a lock).
  void update(const std::string& text);
  // Ends the thread without a last commit: the caller writes the final text itself.
  void stop();
  int commits() const;  // how many commits were made (for tests and logs)

 private:
  void run();

  QString database_path_;
  qint64 message_id_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::string pending_;
  bool dirty_ = false;
  bool stopping_ = false;
  int commits_ = 0;
  std::thread thread_;
};

}  // namespace kvchat::app
