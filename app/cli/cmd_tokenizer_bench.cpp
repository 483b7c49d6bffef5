// kvchat-cli tokenizer-bench: encode/decode throughput on ~N MB of mixed corpus text, and the
// time to encode 100 KB runs of one character (the case a quadratic BPE would choke on).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/cli/cli_command.h"
#include "app/cli/tokenizer_source.h"
#include "engine/text/tokenizer.h"

namespace kvchat::cli {
// Named, not anonymous: the command files are compiled in batches (unity build).
namespace tokenizer_bench_command {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

std::string default_corpus_path() {
  const char* shared = std::getenv("KVCHAT_SHARED_DIR");
  return std::string(shared && *shared ? shared : "../shared") + "/fixtures/tokenizers/corpus.json";
}

// Every string of the corpus (cases and conversation messages), in file order.
std::vector<std::string> corpus_strings(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("cannot open corpus '" + path + "' (use --corpus)");
  std::stringstream buffer;
  buffer << in.rdbuf();
  nlohmann::json corpus;
  try {
    corpus = nlohmann::json::parse(buffer.str());
  } catch (const nlohmann::json::parse_error& e) {
    throw UsageError(path + ": invalid JSON: " + e.what());
  }
  std::vector<std::string> strings;
  for (const auto& item : corpus.value("cases", nlohmann::json::array()))
    if (item.contains("text") && item["text"].is_string() && !item["text"].get<std::string>().empty())
      strings.push_back(item["text"].get<std::string>());
  for (const auto& conversation : corpus.value("chats", nlohmann::json::array())) {
    const auto& messages =
        conversation.is_object() ? conversation.value("messages", nlohmann::json::array()) : conversation;
    for (const auto& message : messages)
      if (message.is_object() && message.contains("content") && message["content"].is_string())
        strings.push_back(message["content"].get<std::string>());
  }
  if (strings.empty()) throw UsageError(path + ": no strings found under 'cases' or 'chats'");
  return strings;
}

void report_run(const Tokenizer& tokenizer, const char* label, char unit) {
  std::string text(100 * 1024, unit);
  auto start = Clock::now();
  auto ids = tokenizer.encode(text, false);
  double elapsed = seconds_since(start);
  std::printf("100 KB of %-7s encode %8.2f ms  (%zu tokens)\n", label, elapsed * 1e3, ids.size());
}

int run_tokenizer_bench(const std::vector<std::string>& args) {
  ArgParser parser({"tokenizer", "megabytes", "corpus"}, {});
  parser.parse(args);
  const double megabytes = parser.double_or("megabytes", 1.0);
  if (!(megabytes > 0.0) || megabytes > 1024.0) throw UsageError("--megabytes must be in (0, 1024]");

  auto load_start = Clock::now();
  Tokenizer tokenizer = tokenizer_from_path(parser.required("tokenizer"));
  std::printf("load            %8.2f ms  (vocabulary %d)\n", seconds_since(load_start) * 1e3, tokenizer.vocab_size());

  const auto strings = corpus_strings(parser.value_or("corpus", default_corpus_path()));
  const std::size_t target = static_cast<std::size_t>(megabytes * 1024 * 1024);
  std::string text;
  text.reserve(target + 4096);
  for (std::size_t i = 0; text.size() < target; ++i) {
    text += strings[i % strings.size()];
    text += (i % 7 == 6) ? "\n\n" : " ";
  }

  // One long text (what a pasted document costs) and line by line (what chat turns cost).
  auto start = Clock::now();
  auto ids = tokenizer.encode(text, false);
  double whole = seconds_since(start);
  std::printf("encode whole    %8.2f MB/s  %10.0f tokens/s  (%.2f MB, %zu tokens, %.1f ms)\n",
              text.size() / whole / (1024 * 1024), ids.size() / whole, text.size() / (1024.0 * 1024), ids.size(),
              whole * 1e3);

  std::size_t piece_tokens = 0, piece_bytes = 0;
  start = Clock::now();
  for (std::size_t i = 0; piece_bytes < target; ++i) {
    const std::string& s = strings[i % strings.size()];
    piece_tokens += tokenizer.encode(s, false).size();
    piece_bytes += s.size();
  }
  double pieces = seconds_since(start);
  std::printf("encode strings  %8.2f MB/s  %10.0f tokens/s\n", piece_bytes / pieces / (1024 * 1024),
              piece_tokens / pieces);

  start = Clock::now();
  std::string decoded = tokenizer.decode(ids, false, false);
  double decode = seconds_since(start);
  std::printf("decode          %8.2f MB/s  %10.0f tokens/s\n", decoded.size() / decode / (1024 * 1024),
              ids.size() / decode);

  StreamingDecoder streaming(tokenizer, false, false);
  std::size_t streamed_bytes = 0;
  start = Clock::now();
  for (TokenId id : ids) streamed_bytes += streaming.push(id).size();
  streamed_bytes += streaming.finish().size();
  double stream = seconds_since(start);
  std::printf("stream decode   %8.2f us/token  (%s decode)\n", stream / ids.size() * 1e6,
              streamed_bytes == decoded.size() ? "same bytes as" : "DIFFERENT bytes from");

  report_run(tokenizer, "'a'", 'a');
  report_run(tokenizer, "' '", ' ');
  report_run(tokenizer, "'\\n'", '\n');
  return 0;
}

const CliRegistration kRegistration{CliCommand{
    "tokenizer-bench",
    "measure tokenizer encode/decode throughput",
    "usage: kvchat-cli tokenizer-bench --tokenizer DIR|FILE.gguf [--megabytes 1] [--corpus PATH]\n\n"
    "Builds about --megabytes MB of mixed text by repeating the strings of --corpus (default\n"
    "$KVCHAT_SHARED_DIR or ../shared, fixtures/tokenizers/corpus.json) and prints encode\n"
    "throughput (MB/s, tokens/s), decode and streaming-decode cost, and the time to encode 100 KB\n"
    "of one repeated character.",
    run_tokenizer_bench,
}};

}  // namespace tokenizer_bench_command
}  // namespace kvchat::cli
