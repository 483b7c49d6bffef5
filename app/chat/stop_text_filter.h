#pragma once
// Stop texts: a reply ends before the first occurrence of any of them, and that text is neither shown nor kept.
// Used by the OpenAI server (a request's "stop") and by the chat (a conversation's stop sequences). No Qt.
#include <string>
#include <vector>

namespace kvchat::app {

// Cuts a streamed text at the first stop text. push() returns the text that can no longer become part of a
// stop text (a tail that is the start of one is held back); after a match, matched() is true and
// nothing more is returned. finish() returns what is held back when the text ended without a match.
class StopTextFilter {
 public:
  explicit StopTextFilter(std::vector<std::string> stops);
  std::string push(const std::string& chunk);
  std::string finish();
  bool matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool matched_ = false;
};

}  // namespace kvchat::app
