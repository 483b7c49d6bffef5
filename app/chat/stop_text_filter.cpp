#include "app/chat/stop_text_filter.h"

#include <algorithm>
#include <utility>

namespace kvchat::app {

StopTextFilter::StopTextFilter(std::vector<std::string> stops) : stops_(std::move(stops)) {}

std::string StopTextFilter::push(const std::string& chunk) {
  if (matched_) return {};
  pending_ += chunk;
  if (stops_.empty()) return std::exchange(pending_, std::string());
  std::size_t first = std::string::npos;
  for (const std::string& stop : stops_) first = std::min(first, pending_.find(stop));
  if (first != std::string::npos) {
    matched_ = true;
    std::string before = pending_.substr(0, first);
    pending_.clear();
    return before;
  }
  // Hold back the longest tail that a stop text starts with.
  std::size_t held = 0;
  for (const std::string& stop : stops_)
    for (std::size_t length = std::min(stop.size() - 1, pending_.size()); length > held; --length)
      if (pending_.compare(pending_.size() - length, length, stop, 0, length) == 0) {
        held = length;
        break;
      }
  std::string ready = pending_.substr(0, pending_.size() - held);
  pending_.erase(0, pending_.size() - held);
  return ready;
}

std::string StopTextFilter::finish() {
  if (matched_) return {};
  return std::exchange(pending_, std::string());
}

}  // namespace kvchat::app
