#include "app/remote/remote_stream.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <utility>
#include <vector>

#include "engine/text/utf8.h"

namespace kvchat::app {

using json = nlohmann::json;

// Named, not anonymous: the library's sources are compiled in batches (unity build).
namespace server_answers {

constexpr std::size_t kMiB = std::size_t{1} << 20;
// A token's text is at most a few dozen bytes in the vocabularies known (runs of spaces or symbols the
// longest); each streamed token comes wrapped in a JSON event of a few hundred bytes (llama.cpp adds its
// timings to every one).
constexpr std::size_t kTextBytesPerToken = 256;
constexpr std::size_t kTextBytesBase = 64 * 1024;
constexpr std::size_t kStreamBytesPerToken = 4096;
constexpr std::size_t kStreamBytesBase = 4 * kMiB;
constexpr std::size_t kMaxTextBytes = 256 * kMiB;
constexpr std::size_t kMaxStreamBytes = 1024 * kMiB;
constexpr std::size_t kMaxLineBytes = kMiB;
// A server message shown to the user (an error's text, a rejected figure) is cut to this many bytes.
constexpr std::size_t kShownBytes = 300;

// `text` as one line that is safe to print: valid UTF-8, control characters (an escape sequence would act
// on the terminal that shows the error) as \xNN, line breaks as spaces, at most `max_bytes` bytes.
std::string one_line(std::string_view text, std::size_t max_bytes = kShownBytes) {
  const std::string valid = utf8::replace_invalid(text.substr(0, max_bytes + 4));
  std::string out;
  for (std::size_t i = 0; i < valid.size();) {
    const std::size_t start = i;
    const std::uint32_t code = utf8::next_code_point(valid, i);
    std::string piece;
    if (code == '\n' || code == '\r' || code == '\t')
      piece = " ";
    else if (code < 0x20 || (code >= 0x7F && code <= 0x9F)) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", static_cast<unsigned>(code));
      piece = escaped;
    } else
      piece = valid.substr(start, i - start);
    if (out.size() + piece.size() > max_bytes) {
      out += "...";
      break;
    }
    out += piece;
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

// A value the server sent, for a message: compact, cut short.
std::string shown_value(const json& value) {
  return one_line(value.dump(-1, ' ', false, json::error_handler_t::replace), 40);
}

// A token count: a whole number from 0 to INT_MAX (a float outside int converts to nothing defined).
std::optional<int> token_count(const json& value) {
  if (value.is_number_unsigned()) {
    const auto count = value.get<std::uint64_t>();
    if (count <= static_cast<std::uint64_t>(INT_MAX)) return static_cast<int>(count);
  } else if (value.is_number_integer()) {
    const auto count = value.get<std::int64_t>();
    if (count >= 0 && count <= INT_MAX) return static_cast<int>(count);
  } else if (value.is_number_float()) {
    const double count = value.get<double>();
    if (count >= 0 && count <= INT_MAX && std::floor(count) == count) return static_cast<int>(count);
  }
  return std::nullopt;
}

// A duration or a rate: a finite number from 0 up to a year in milliseconds (no honest figure is larger).
std::optional<double> measure(const json& value) {
  if (!value.is_number()) return std::nullopt;
  const double number = value.get<double>();
  if (!std::isfinite(number) || number < 0 || number > 3.2e10) return std::nullopt;
  return number;
}

// Reads the named figures of `object` (those present) through `read`; the first one it refuses is named
// in `problem` (as "<where>.<key> is <value>, <what it should be>") and nothing is taken from the object.
template <typename T, typename Read>
bool read_all(const json& object, const char* where, std::initializer_list<const char*> keys, Read read,
              const char* expected, std::vector<std::pair<const char*, T>>& values, std::string& problem) {
  for (const char* key : keys) {
    auto it = object.find(key);
    if (it == object.end() || it->is_null()) continue;
    const std::optional<T> value = read(*it);
    if (!value) {
      problem = std::string(where) + "." + key + " is " + shown_value(*it) + ", " + expected;
      return false;
    }
    values.emplace_back(key, *value);
  }
  return true;
}

template <typename T>
std::optional<T> value_of(const std::vector<std::pair<const char*, T>>& values, std::string_view key) {
  for (const auto& [name, value] : values)
    if (key == name) return value;
  return std::nullopt;
}

void reject_figures(RemoteReply& reply, const std::string& problem) {
  if (reply.rejected_figures.empty()) {
    spdlog::warn("remote reply: the server's figures are not used: {}", problem);
    reply.rejected_figures = problem;
  }
}

// usage (OpenAI), and "timings": llama.cpp's (prompt_ms, predicted_per_second, ...) or kvchat serve's. A
// figure that is no count or duration is refused with its whole object: the client's own figures stay.
void read_figures(const json& event, RemoteReply& reply) {
  std::string problem;
  if (auto usage = event.find("usage"); usage != event.end() && usage->is_object()) {
    std::vector<std::pair<const char*, int>> counts;
    bool ok = read_all<int>(*usage, "usage", {"prompt_tokens", "completion_tokens"}, token_count, "not a token count",
                            counts, problem);
    std::optional<int> cached;
    if (auto details = usage->find("prompt_tokens_details"); ok && details != usage->end() && details->is_object()) {
      std::vector<std::pair<const char*, int>> detail_counts;
      ok = read_all<int>(*details, "usage.prompt_tokens_details", {"cached_tokens"}, token_count, "not a token count",
                         detail_counts, problem);
      cached = value_of(detail_counts, "cached_tokens");
    }
    if (!ok) {
      reject_figures(reply, problem);
    } else {
      reply.usage_reported = true;
      reply.stats.prompt_tokens = value_of(counts, "prompt_tokens").value_or(0);
      reply.stats.generated_tokens = value_of(counts, "completion_tokens").value_or(0);
      if (cached) reply.cached_tokens = cached;
    }
  }
  if (auto timings = event.find("timings"); timings != event.end() && timings->is_object()) {
    std::vector<std::pair<const char*, double>> measures;
    std::vector<std::pair<const char*, int>> counts;
    const bool ok = read_all<double>(*timings, "timings",
                                     {"ttft_ms", "prompt_ms", "prefill_tokens_per_second", "prompt_per_second",
                                      "decode_tokens_per_second", "predicted_per_second", "predicted_ms"},
                                     measure, "not a duration or rate", measures, problem) &&
                    read_all<int>(*timings, "timings", {"cache_n", "cached_tokens"}, token_count, "not a token count",
                                  counts, problem);
    if (!ok) {
      reject_figures(reply, problem);
      return;
    }
    GenerationStats& stats = reply.stats;
    if (value_of(measures, "ttft_ms") || value_of(measures, "prompt_ms")) reply.server_timings = true;
    stats.ttft_ms = value_of(measures, "ttft_ms").value_or(value_of(measures, "prompt_ms").value_or(stats.ttft_ms));
    stats.prefill_tokens_per_second =
        value_of(measures, "prefill_tokens_per_second")
            .value_or(value_of(measures, "prompt_per_second").value_or(stats.prefill_tokens_per_second));
    stats.decode_tokens_per_second =
        value_of(measures, "decode_tokens_per_second")
            .value_or(value_of(measures, "predicted_per_second").value_or(stats.decode_tokens_per_second));
    stats.decode_ms = value_of(measures, "predicted_ms").value_or(stats.decode_ms);
    if (!reply.cached_tokens) reply.cached_tokens = value_of(counts, "cache_n");
    if (!reply.cached_tokens) reply.cached_tokens = value_of(counts, "cached_tokens");
  }
}

std::string human_bytes(std::size_t bytes) {
  if (bytes >= kMiB && bytes % kMiB == 0) return std::to_string(bytes / kMiB) + " MiB";
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes / 1024) + " KiB";
  return std::to_string(bytes) + " bytes";
}

}  // namespace server_answers

// The deepest nesting of brackets in `text`, outside strings; stops counting past `limit`. Exact for JSON;
// for other text the parser refuses it anyway.
int nesting_depth(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size() && deepest <= limit; ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;  // the escaped character, a quote included
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

json parse_server_json(std::string_view text, std::string* problem) {
  // A deep value would overflow the program's stack wherever it is later copied or printed: the depth is
  // counted first, and a deeper text refused whole. (A plain parse, not the parser's callback that discards
  // values: its bookkeeping is more than this needs.)
  if (nesting_depth(text, kMaxServerJsonDepth) > kMaxServerJsonDepth) {
    if (problem) *problem = "JSON nested more than " + std::to_string(kMaxServerJsonDepth) + " levels deep";
    return json(json::value_t::discarded);
  }
  json parsed = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() && problem) *problem = "not JSON";
  return parsed;
}

std::string server_message(const std::string& body) {
  const json parsed = parse_server_json(body);
  if (parsed.is_object()) {
    if (auto error = parsed.find("error"); error != parsed.end()) {
      if (error->is_string()) return server_answers::one_line(error->get<std::string>());
      if (error->is_object() && error->contains("message") && (*error)["message"].is_string())
        return server_answers::one_line((*error)["message"].get<std::string>());
    }
    if (auto detail = parsed.find("detail"); detail != parsed.end())
      return server_answers::one_line(detail->is_string()
                                          ? detail->get<std::string>()
                                          : detail->dump(-1, ' ', false, json::error_handler_t::replace));
  }
  const std::string text = server_answers::one_line(body);
  return text.empty() ? "no message" : text;
}

ReplyLimits ReplyLimits::for_max_tokens(int max_tokens) {
  using namespace server_answers;
  const std::size_t tokens = static_cast<std::size_t>(std::max(1, max_tokens));
  ReplyLimits limits;
  limits.max_text_bytes = std::min(kMaxTextBytes, kTextBytesBase + tokens * kTextBytesPerToken);
  limits.max_stream_bytes = std::min(kMaxStreamBytes, kStreamBytesBase + tokens * kStreamBytesPerToken);
  limits.max_line_bytes = kMaxLineBytes;
  return limits;
}

ServerEventStream::ServerEventStream(RemoteReply& reply, const RemoteChunkCallback& on_chunk, ReplyLimits limits)
    : reply_(reply), on_chunk_(on_chunk), limits_(limits) {}

bool ServerEventStream::fail(std::string message) {
  if (failure_.empty()) failure_ = std::move(message);
  return false;
}

bool ServerEventStream::feed(const char* data, std::size_t length) {
  if (!failure_.empty() || done_) return false;
  received_bytes_ += length;
  if (received_bytes_ > limits_.max_stream_bytes)
    return fail("the server sent more than " + server_answers::human_bytes(limits_.max_stream_bytes) +
                " for one reply of at most " + server_answers::human_bytes(limits_.max_text_bytes) + " of text");
  pending_.append(data, length);
  // Only the new bytes are searched for line ends: a long line arriving in many pieces costs its length once.
  std::size_t line_start = 0;
  bool more = true;
  for (std::size_t end; more && (end = pending_.find('\n', scanned_)) != std::string::npos;) {
    std::string_view line(pending_.data() + line_start, end - line_start);
    line_start = scanned_ = end + 1;
    if (line.size() > limits_.max_line_bytes) {
      more = fail("the server sent a line of " + server_answers::human_bytes(line.size()) + ", more than the " +
                  server_answers::human_bytes(limits_.max_line_bytes) + " a line of the event stream may have");
      break;
    }
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    more = handle_line(line);
  }
  pending_.erase(0, line_start);
  scanned_ = pending_.size();
  if (more && pending_.size() > limits_.max_line_bytes)
    more = fail("the server sent more than " + server_answers::human_bytes(limits_.max_line_bytes) +
                " without a line break, more than a line of the event stream may have");
  return more;
}

bool ServerEventStream::handle_line(std::string_view line) {
  if (line.substr(0, 5) != "data:") return true;  // comments (keep-alives), event names, ids
  line.remove_prefix(line.size() > 5 && line[5] == ' ' ? 6 : 5);
  return handle_data(line);
}

bool ServerEventStream::handle_data(std::string_view data) {
  if (data == "[DONE]") {
    done_ = true;
    return false;
  }
  if (data.empty()) return true;
  std::string problem;
  json event = parse_server_json(data, &problem);
  if (event.is_discarded() && problem == "not JSON" && !utf8::is_valid(data)) {
    // Bytes that are not UTF-8 make the whole event unreadable JSON: read it with U+FFFD in their place, so
    // that the text around them is kept, and mark the reply.
    event = parse_server_json(utf8::replace_invalid(data), &problem);
    if (!event.is_discarded()) reply_.invalid_utf8 = true;
  }
  if (event.is_discarded()) {
    if (problem != "not JSON") return fail("the server sent an event of " + problem);
    if (reply_.unreadable_events++ == 0)
      spdlog::warn("remote reply: an event is not JSON and was skipped: {}", server_answers::one_line(data, 80));
    return true;
  }
  if (!event.is_object()) return true;
  if (event.contains("error"))
    stream_error_ = server_message(event.dump(-1, ' ', false, json::error_handler_t::replace));
  if (auto model = event.find("model");
      model != event.end() && model->is_string() && !model->get_ref<const std::string&>().empty())
    reply_.model = server_answers::one_line(model->get_ref<const std::string&>(), 200);
  server_answers::read_figures(event, reply_);
  auto choices = event.find("choices");
  if (choices == event.end() || !choices->is_array() || choices->empty()) return true;
  const json& choice = (*choices)[0];
  if (!choice.is_object()) return true;
  if (auto delta = choice.find("delta"); delta != choice.end() && delta->is_object())
    if (auto content = delta->find("content"); content != delta->end() && content->is_string() && !content->empty()) {
      const std::string& text = content->get_ref<const std::string&>();
      if (reply_.text.size() + text.size() > limits_.max_text_bytes)
        return fail("the reply passed " + server_answers::human_bytes(limits_.max_text_bytes) +
                    " of text, more than the requested tokens can make: the server did not stop");
      last_chunk_at_ = Clock::now();
      if (chunks_++ == 0) first_chunk_at_ = last_chunk_at_;
      reply_.text += text;
      if (on_chunk_) on_chunk_(text, chunks_);
    }
  if (auto reason = choice.find("finish_reason"); reason != choice.end() && reason->is_string()) {
    finish_reason_seen_ = true;
    reply_.stats.stop_reason =
        reason->get_ref<const std::string&>() == "length" ? StopReason::MaxTokens : StopReason::Eos;
  }
  return true;
}

}  // namespace kvchat::app
