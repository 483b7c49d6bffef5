#include "app/chat/reply_committer.h"

#include <spdlog/spdlog.h>

#include "app/store/conversation_store.h"

namespace kvchat::app {

ReplyCommitter::ReplyCommitter(QString database_path, qint64 message_id)
    : database_path_(std::move(database_path)), message_id_(message_id), thread_([this] { run(); }) {}

ReplyCommitter::~ReplyCommitter() { stop(); }

void ReplyCommitter::update(const std::string& text) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_ = text;
    dirty_ = true;
  }
  changed_.notify_one();
}

void ReplyCommitter::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_one();
  if (thread_.joinable()) thread_.join();
}

int ReplyCommitter::commits() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return commits_;
}

void ReplyCommitter::run() {
  try {
    // A store connection belongs to the thread that opened it.
    ConversationStore store(database_path_);
    using Clock = std::chrono::steady_clock;
    Clock::time_point last_commit = Clock::now() - kReplyCommitInterval;
    std::unique_lock<std::mutex> lock(mutex_);
    bool failed_before = false;
    while (true) {
      changed_.wait(lock, [&] { return stopping_ || dirty_; });
      if (stopping_) return;
      // Text that arrives right after a commit waits for the rest of the interval, not longer.
      if (changed_.wait_until(lock, last_commit + kReplyCommitInterval, [&] { return stopping_; })) return;
      const std::string text = pending_;
      dirty_ = false;
      lock.unlock();
      last_commit = Clock::now();
      try {
        store.update_message_text(message_id_, QString::fromStdString(text));
        failed_before = false;
        lock.lock();
        ++commits_;
      } catch (const StoreError& error) {
        if (!failed_before) spdlog::error("saving the growing reply failed: {}", error.what());
        failed_before = true;
        lock.lock();
      }
    }
  } catch (const std::exception& error) {
    spdlog::error("the growing reply cannot be saved: {}", error.what());
  }
}

}  // namespace kvchat::app
