// kvchat-cli chat: the desktop app's chat in a terminal, over the same conversation store and the same
// turn logic (ChatTurnRunner). With --message: one turn appended to a conversation, the reply streamed to
// stdout. Without: an interactive chat reading one message per line from stdin until EOF.
#include <spdlog/spdlog.h>

#include <QCoreApplication>
#include <QElapsedTimer>

#include <unistd.h>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <string>

#include "app/chat/chat_turn_runner.h"
#include "app/chat/turn_recorder.h"
#include "app/cli/chat_remote.h"
#include "app/cli/cli_command.h"
#include "app/cli/model_options.h"
#include "app/cli/store_access.h"
#include "app/cli/terminal_output.h"
#include "app/snapshot_key.h"
#include "app/store/chat_history.h"
#include "app/store/conversation_store.h"
#include "app/store/message_stats_json.h"
#include "engine/cache/kv_snapshot.h"
#include "engine/cache/session_pool.h"
#include "engine/generation/session.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_loader.h"

namespace kvchat::cli {
// Named, not anonymous: the command files are compiled in batches (unity build).
namespace chat_command {

const char* kUsage =
    "usage: kvchat-cli chat --model DIR|FILE.gguf [--db PATH] [--conversation ID|new] [--message TEXT]\n"
    "                       [--kv-cache on|off] [--kv-dtype f32|bf16|f16|q8_0] [--max-new-tokens N] [--temperature T] "
    "[--seed S]\n"
    "                       [--speculative none|lookup|draft] [--draft-tokens K] [--draft-model PATH]\n"
    "                       [--context-limit N] [--overflow stop|drop_oldest_turns] [--threads N]\n"
    "                       [--system TEXT]\n"
    "Chats in the conversation store the desktop app uses (default: its database). --conversation picks\n"
    "an existing conversation (default: a new one); the id is printed on stderr as `conversation: ID`.\n"
    "With --message, one turn is appended and the reply streamed to stdout. Without it, every line read\n"
    "from stdin is one message, until EOF. Greedy (temperature 0) unless --temperature is given.\n"
    "--system sets the system prompt of a new conversation.\n"
    "KV snapshots (as in the desktop app): after each reply the conversation's cache is written to\n"
    "--cache-dir (default: kv-snapshots in the app-data folder), and a later run continuing the\n"
    "conversation, or a new one sharing its beginning, restores that prefix instead of prefilling it.\n"
    "--kv-snapshots on|off (default on), --snapshot-budget-mib N (default 2048; 0 = no limit).\n"
    "Remote backend: --backend URL (instead of --model) sends each turn to an OpenAI-compatible server, e.g.\n"
    "--backend http://localhost:8000/v1 (vLLM), http://localhost:8080/v1 (llama-server),\n"
    "http://localhost:11434/v1 (Ollama). --api-key KEY (default: $KVCHAT_API_KEY), --remote-model NAME\n"
    "(default: the first model of the server's /v1/models). The server keeps its own cache; --kv-cache,\n"
    "--context-limit, --overflow, --threads and the snapshot options are the local engine's.\n"
    "A remote reply ends as failed, its text kept, after --idle-timeout S seconds without a byte from the\n"
    "server (default 300) or --reply-timeout S seconds in all (default 3600); Ctrl-C stops it (kept too).\n"
    "Where standard output is a terminal, control characters of a reply are shown as \\xNN escapes.";

struct ChatContext {
  app::ConversationStore* store = nullptr;
  qint64 conversation_id = 0;
  const LoadedModel* model = nullptr;
  SessionPool* pool = nullptr;
  app::TurnOptions options;
};

// One turn: store the user message, stream the reply to stdout, store it with its stats.
// Returns false when the turn failed (the error is on stderr and saved with the reply).
bool run_turn(ChatContext& chat, const std::string& text) {
  app::TurnRecorder::add_user_message(*chat.store, chat.conversation_id, QString::fromStdString(text));

  const auto conversation = chat.store->conversation(chat.conversation_id);
  const QList<app::MessageRecord> records = chat.store->messages(chat.conversation_id);
  const std::vector<ChatMessage> messages = app::chat_messages_for_engine(*conversation, records);

  // Printed text reaches the database within kReplyCommitBound, however slow the next token is.
  app::TurnRecorder recorder(*chat.store, chat.conversation_id, app::TurnRecorder::Cadence::CommitterThread);
  std::vector<qint64> prompt_ids;
  for (const app::MessageRecord& record : app::messages_in_context(records)) prompt_ids.push_back(record.id);
  recorder.set_prompt_message_ids(std::move(prompt_ids));
  app::MessageRecord reply;
  reply.model = QString::fromStdString(chat.model->path).section('/', -1, -1, QString::SectionSkipEmpty);
  recorder.start_reply(reply);

  TerminalText shown(is_terminal(stdout));
  auto on_progress = [&](const app::ReplyProgress& progress) {
    if (progress.chunk.empty()) return;
    recorder.append(progress.chunk);
    const std::string printable = shown.feed(progress.chunk);
    std::fwrite(printable.data(), 1, printable.size(), stdout);
    std::fflush(stdout);
  };
  const app::ChatTurnRunner runner(*chat.model);
  try {
    Session& session = chat.pool->acquire(chat.conversation_id, chat.options.generation.cache_mode);
    app::TurnOutcome outcome = runner.run(session, messages, chat.options, nullptr, on_progress);
    chat.pool->save_snapshot(chat.conversation_id);
    std::fputs((shown.finish() + "\n").c_str(), stdout);
    std::fflush(stdout);
    recorder.finish(QString::fromStdString(outcome.reply), app::stats_to_json(outcome.stats), outcome.reply_ids,
                    outcome.reply_vocabulary);
    if (const auto marker = recorder.mark_context_cut(outcome.dropped_messages, outcome.context_limit))
      std::fprintf(stderr, "[%s]\n", marker->text.toUtf8().constData());  // the words of the window and the exports
    const GenerationStats& s = outcome.stats;
    std::fprintf(
        stderr,
        "[%d prompt tokens: %d reused (%d restored from disk in %.1f ms), %d prefilled at %.0f tok/s; TTFT %.1f ms; "
        "%d tokens at %.1f tok/s; cache %lld tokens (%s); stop: %s]\n",
        s.prompt_tokens, s.reused_tokens, s.restored_tokens, s.restore_ms, s.prefilled_tokens,
        s.prefill_tokens_per_second, s.ttft_ms, s.generated_tokens, s.decode_tokens_per_second,
        static_cast<long long>(s.cache_tokens), to_string(s.cache_mode), to_string(s.stop_reason));
    return true;
  } catch (const std::exception& error) {
    recorder.fail(QString::fromUtf8(error.what()));
    std::fprintf(stderr, "kvchat-cli chat: %s\n", error.what());
    return false;
  }
}

// The conversation named by --conversation (its --system applied), or a new one titled by --message.
qint64 open_conversation(const ArgParser& parser, app::ConversationStore& store, const QString& database_path) {
  qint64 conversation_id = 0;
  const std::string conversation_arg = parser.value_or("conversation", "new");
  if (conversation_arg == "new") {
    const std::string message = parser.value_or("message", "");
    QString title = QString::fromStdString(message).simplified().left(40);
    if (title.isEmpty()) title = QStringLiteral("Terminal chat");
    conversation_id = store.create_conversation(title, QString::fromStdString(parser.value_or("system", "")));
  } else {
    bool ok = false;
    conversation_id = QString::fromStdString(conversation_arg).toLongLong(&ok);
    if (!ok || conversation_id <= 0)
      throw UsageError("--conversation must be a conversation id or 'new', not '" + conversation_arg + "'");
    if (!store.conversation(conversation_id))
      throw UsageError("no conversation with id " + conversation_arg + " in " + database_path.toStdString());
    if (parser.value("system"))
      store.set_system_prompt(conversation_id, QString::fromStdString(*parser.value("system")));
  }
  return conversation_id;
}

// --message's one turn, or one turn per line of stdin until EOF. The exit status: 0 when every turn succeeded.
int chat_turns(const ArgParser& parser, const std::function<bool(const std::string&)>& turn) {
  if (auto message = parser.value("message")) return turn(*message) ? 0 : 1;
  const bool interactive = isatty(STDIN_FILENO);
  bool all_ok = true;
  std::string line;
  while (true) {
    if (interactive) std::fputs("> ", stderr);
    if (!std::getline(std::cin, line)) break;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    // A NUL would end the text at the C boundaries below it: keep the rest, mark where it was.
    if (line.find('\0') != std::string::npos) {
      std::string replaced;
      for (char c : line) replaced += c == '\0' ? std::string("\xEF\xBF\xBD") : std::string(1, c);  // U+FFFD
      line = std::move(replaced);
      spdlog::warn("a NUL byte in the message was replaced by U+FFFD");
    }
    all_ok = turn(line) && all_ok;
  }
  return all_ok ? 0 : 1;
}

int run_remote_chat(const ArgParser& parser, const std::string& base_url) {
  for (const char* local_only : {"model", "kv-cache", "kv-dtype", "context-limit", "overflow", "threads", "cache-dir",
                                 "kv-snapshots", "snapshot-budget-mib", "speculative", "draft-tokens", "draft-model"})
    if (parser.value(local_only))
      throw UsageError(std::string("--") + local_only + " is the local engine's: it cannot be used with --backend");
  GenerationConfig generation;
  generation.max_new_tokens = parser.int_or("max-new-tokens", 256);
  if (generation.max_new_tokens < 1) throw UsageError("--max-new-tokens must be at least 1");
  generation.sampling.temperature = static_cast<float>(parser.double_or("temperature", 0.0));
  if (generation.sampling.temperature < 0) throw UsageError("--temperature must be >= 0");
  generation.sampling.seed = static_cast<std::uint64_t>(parser.int64_or("seed", 0));
  try {
    app::check_base_url(base_url);
  } catch (const app::RemoteError& error) {
    throw UsageError(std::string("--backend: ") + error.what());
  }
  ensure_core_application();
  QCoreApplication::setApplicationName("kvchat");
  const QString database_path = parser.value("db") ? QString::fromStdString(*parser.value("db"))
                                                   : app::ConversationStore::default_database_path();
  const int idle_timeout = parser.int_or("idle-timeout", app::RemoteEndpoint::kDefaultIdleTimeoutSeconds);
  const int reply_timeout = parser.int_or("reply-timeout", app::RemoteEndpoint::kDefaultTotalTimeoutSeconds);
  for (const auto& [option, seconds] :
       {std::pair{"idle-timeout", idle_timeout}, std::pair{"reply-timeout", reply_timeout}})
    if (seconds < 1 || seconds > app::ChatSettings::kMaxRemoteTimeout)
      throw UsageError(std::string("--") + option + " must be from 1 to " +
                       std::to_string(app::ChatSettings::kMaxRemoteTimeout) + " seconds");
  app::ConversationStore store(database_path);
  // Asked before anything is stored: a server that is down or refuses the key leaves the database as it was.
  app::RemoteEndpoint endpoint =
      remote_endpoint_from_options(base_url, parser.value_or("api-key", ""), parser.value_or("remote-model", ""));
  endpoint.idle_timeout_s = idle_timeout;
  endpoint.total_timeout_s = reply_timeout;
  const qint64 conversation_id = open_conversation(parser, store, database_path);
  std::fprintf(stderr, "conversation: %lld\n", static_cast<long long>(conversation_id));
  return chat_turns(parser, [&](const std::string& text) {
    return run_remote_turn(store, conversation_id, endpoint, generation, text);
  });
}

int run_chat(const std::vector<std::string>& args) {
  ArgParser parser({"model",          "db",           "conversation", "message",       "kv-cache",
                    "max-new-tokens", "temperature",  "seed",         "context-limit", "overflow",
                    "threads",        "system",       "cache-dir",    "kv-snapshots",  "snapshot-budget-mib",
                    "backend",        "api-key",      "remote-model", "idle-timeout",  "reply-timeout",
                    "speculative",    "draft-tokens", "draft-model",  "kv-dtype"},
                   {});
  parser.parse(args);
  // Checked before anything is created: an empty message must not leave an empty conversation behind.
  if (auto message = parser.value("message"); message && message->find_first_not_of(" \t\r\n") == std::string::npos)
    throw UsageError("--message is empty");
  if (auto backend = parser.value("backend")) return run_remote_chat(parser, *backend);
  for (const char* remote_only : {"api-key", "remote-model", "idle-timeout", "reply-timeout"})
    if (parser.value(remote_only)) throw UsageError(std::string("--") + remote_only + " needs --backend URL");
  const std::string model_directory = parser.required("model");

  app::TurnOptions options;
  options.generation.max_new_tokens = parser.int_or("max-new-tokens", 256);
  if (options.generation.max_new_tokens < 1) throw UsageError("--max-new-tokens must be at least 1");
  try {
    options.generation.cache_mode = kv_cache_mode_from_string(parser.value_or("kv-cache", "on"));
    options.overflow =
        app::context_overflow_policy_from_string(QString::fromStdString(parser.value_or("overflow", "stop")));
  } catch (const std::invalid_argument& error) {
    throw UsageError(error.what());
  }
  options.generation.sampling.temperature = static_cast<float>(parser.double_or("temperature", 0.0));
  if (options.generation.sampling.temperature < 0) throw UsageError("--temperature must be >= 0");
  options.generation.sampling.seed = static_cast<std::uint64_t>(parser.int64_or("seed", 0));
  options.generation.speculative = speculative_from_options(parser);
  options.generation.kv_dtype = kv_dtype_from_option(parser.value_or("kv-dtype", "f32"));
  options.context_limit = parser.int_or("context-limit", 0);
  if (options.context_limit < 0) throw UsageError("--context-limit must be 0 (the model's) or more");
  const int threads = threads_from_option(parser);
  const std::string snapshots_value = parser.value_or("kv-snapshots", "on");
  if (snapshots_value != "on" && snapshots_value != "off") throw UsageError("--kv-snapshots must be on or off");
  const bool snapshots_on = snapshots_value == "on";
  const std::int64_t snapshot_budget_mib = parser.int64_or("snapshot-budget-mib", 2048);
  if (snapshot_budget_mib < 0 || snapshot_budget_mib > (std::int64_t(1) << 40))
    throw UsageError("--snapshot-budget-mib must be 0 (no limit) or a number of MiB");

  const std::optional<std::string> cache_dir = parser.value("cache-dir");
  // Checked before anything is created: a --cache-dir that cannot be used must not leave a conversation behind.
  if (cache_dir && snapshots_on) {
    std::error_code error;
    if (std::filesystem::exists(*cache_dir, error) && !std::filesystem::is_directory(*cache_dir, error))
      throw UsageError("--cache-dir: " + *cache_dir + " is not a folder");
  }

  ensure_core_application();
  // The desktop app's name, so that the default database is the one the app uses.
  QCoreApplication::setApplicationName("kvchat");
  const QString database_path = parser.value("db") ? QString::fromStdString(*parser.value("db"))
                                                   : app::ConversationStore::default_database_path();

  const LoadedModel model = load_model(model_directory, LoadOptions{WeightDtype::Float32, threads});
  load_draft_model(parser, options.generation.speculative, *model.model);
  if (!model.tokenizer)
    throw UsageError("model " + model_directory + " has no tokenizer (tokenizer.json or GGUF tokenizer metadata)");

  std::shared_ptr<SnapshotStore> snapshots;
  if (snapshots_on && options.generation.cache_mode != KvCacheMode::Off) {
    const QString directory =
        cache_dir ? QString::fromStdString(*cache_dir) : app::ChatSettings{}.effective_snapshot_directory();
    try {
      snapshots = app::open_snapshot_store(directory.toStdString(), snapshot_budget_mib << 20, *model.model,
                                           options.generation.kv_dtype);
    } catch (const SnapshotError& error) {
      if (cache_dir) throw UsageError(std::string("--cache-dir: ") + error.what());
      throw;
    }
  }

  // The conversation store is opened once every option has been checked and the model loaded.
  app::ConversationStore store(database_path);
  const qint64 conversation_id = open_conversation(parser, store, database_path);
  std::fprintf(stderr, "conversation: %lld\n", static_cast<long long>(conversation_id));

  SessionPool pool(model.model, snapshots, app::snapshot_key_prefix(database_path).toStdString());
  ChatContext chat;
  chat.store = &store;
  chat.conversation_id = conversation_id;
  chat.model = &model;
  chat.pool = &pool;
  chat.options = options;

  return chat_turns(parser, [&chat](const std::string& text) { return run_turn(chat, text); });
}

const CliRegistration registration({"chat", "chat with a model in a stored conversation", kUsage, run_chat});

}  // namespace chat_command
}  // namespace kvchat::cli
