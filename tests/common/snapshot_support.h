#pragma once
// What the KV snapshot tests share: made-up prompts, greedy configs, a capture of the log (rejections
// must say why) and byte-level edits of snapshot files.
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <QFile>
#include <QtTest/QtTest>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/types.h"

namespace kvchat::test {

// A deterministic prompt of `length` ids in [10, 410), starting with BOS (1).
inline std::vector<TokenId> made_up_prompt(int length, int salt) {
  std::vector<TokenId> ids = {1};
  for (int i = 1; i < length; ++i) ids.push_back(static_cast<TokenId>(10 + (i * 7 + salt * 13 + i * i * salt) % 400));
  return ids;
}

inline GenerationConfig greedy(int max_new_tokens, KvCacheMode mode = KvCacheMode::Contiguous) {
  GenerationConfig config;
  config.max_new_tokens = max_new_tokens;
  config.cache_mode = mode;
  config.stop_token_ids = {-1};  // never stop early: every turn has its full length
  return config;
}

// The next turn's prompt: this one, the reply, and a user's few new tokens.
inline std::vector<TokenId> continued(std::vector<TokenId> prompt, const std::vector<TokenId>& reply, int salt) {
  prompt.insert(prompt.end(), reply.begin(), reply.end());
  const std::vector<TokenId> more = made_up_prompt(9, salt);
  prompt.insert(prompt.end(), more.begin() + 1, more.end());
  return prompt;
}

// Every message logged while it lives (warnings and up, the rejections' level).
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256)) {
    sink_->set_level(spdlog::level::warn);
    spdlog::default_logger()->sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  bool contains(const std::string& text) const {
    for (const std::string& line : sink_->last_formatted())
      if (line.find(text) != std::string::npos) return true;
    return false;
  }
  std::string all() const {
    std::string text;
    for (const std::string& line : sink_->last_formatted()) text += line;
    return text;
  }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
};

inline QByteArray read_bytes(const std::string& path) {
  QFile file(QString::fromStdString(path));
  if (!file.open(QIODevice::ReadOnly)) return {};
  return file.readAll();
}

inline bool write_bytes(const std::string& path, const QByteArray& bytes) {
  QFile file(QString::fromStdString(path));
  return file.open(QIODevice::WriteOnly | QIODevice::Truncate) && file.write(bytes) == bytes.size();
}

}  // namespace kvchat::test
