#include "app/cli/chat_remote.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "app/chat/turn_recorder.h"
#include "app/cli/terminal_output.h"
#include "app/remote/remote_worker.h"
#include "app/store/chat_history.h"
#include "app/store/message_stats_json.h"

namespace kvchat::cli {

// Named, not anonymous: the command files are compiled in batches (unity build).
namespace remote_chat {

// Set by Ctrl-C while a remote turn runs (lock-free, so a signal handler may set it).
std::atomic<bool> interrupt_requested{false};

extern "C" void request_stop_on_interrupt(int) { interrupt_requested.store(true); }

// While a turn runs, Ctrl-C is the app's Stop: the connection is closed and the reply so far kept. Outside
// a turn it ends the program as usual.
class StopOnInterrupt {
 public:
  StopOnInterrupt() {
    interrupt_requested.store(false);
    struct sigaction action {};
    action.sa_handler = request_stop_on_interrupt;
    sigemptyset(&action.sa_mask);
    installed_ = ::sigaction(SIGINT, &action, &previous_) == 0;
  }
  ~StopOnInterrupt() {
    if (installed_) ::sigaction(SIGINT, &previous_, nullptr);
  }
  StopOnInterrupt(const StopOnInterrupt&) = delete;
  StopOnInterrupt& operator=(const StopOnInterrupt&) = delete;
  const std::atomic<bool>* flag() const { return &interrupt_requested; }

 private:
  struct sigaction previous_ {};
  bool installed_ = false;
};

// What the reply's marks say, for stderr (they are stored with the reply too).
void warn_about_marks(const app::RemoteReply& answer) {
  if (answer.invalid_utf8)
    std::fprintf(stderr,
                 "kvchat-cli chat: warning: the server sent bytes that are not UTF-8; they are shown and "
                 "stored as U+FFFD\n");
  if (answer.unreadable_events > 0)
    std::fprintf(stderr,
                 "kvchat-cli chat: warning: %d event(s) of the server's stream were not JSON and were "
                 "skipped: the reply may miss text\n",
                 answer.unreadable_events);
  if (!answer.rejected_figures.empty())
    std::fprintf(stderr, "kvchat-cli chat: warning: the server's figures are not used: %s\n",
                 escaped_for_terminal(answer.rejected_figures).c_str());
}

}  // namespace remote_chat

app::RemoteEndpoint remote_endpoint_from_options(const std::string& base_url, const std::string& api_key_option,
                                                 const std::string& model_option) {
  app::RemoteEndpoint endpoint;
  endpoint.base_url = base_url;
  endpoint.api_key = api_key_option;
  if (endpoint.api_key.empty())
    if (const char* key = std::getenv("KVCHAT_API_KEY")) endpoint.api_key = key;
  endpoint.model = model_option;
  if (endpoint.model.empty()) {
    const std::vector<std::string> models = app::list_remote_models(endpoint);
    if (models.empty())
      throw app::RemoteError("the server at " + app::displayed_base_url(base_url) +
                             " lists no models: name one with --remote-model");
    endpoint.model = models.front();
  }
  std::fprintf(stderr, "backend: %s, model: %s\n", app::displayed_base_url(endpoint.base_url).c_str(),
               escaped_for_terminal(endpoint.model).c_str());
  return endpoint;
}

bool run_remote_turn(app::ConversationStore& store, qint64 conversation_id, const app::RemoteEndpoint& endpoint,
                     const GenerationConfig& generation, const std::string& text) {
  app::TurnRecorder::add_user_message(store, conversation_id, QString::fromStdString(text));
  const auto conversation = store.conversation(conversation_id);
  const std::vector<ChatMessage> messages =
      app::chat_messages_for_engine(*conversation, store.messages(conversation_id));

  app::TurnRecorder recorder(store, conversation_id, app::TurnRecorder::Cadence::CommitterThread);
  app::MessageRecord reply;
  reply.model = QString::fromStdString(endpoint.model);
  reply.backend = QString::fromStdString(app::displayed_base_url(endpoint.base_url));
  recorder.start_reply(reply);

  TerminalText shown(is_terminal(stdout));
  auto on_chunk = [&](std::string_view chunk, int) {
    recorder.append(chunk);
    const std::string printable = shown.feed(chunk);
    std::fwrite(printable.data(), 1, printable.size(), stdout);
    std::fflush(stdout);
  };
  remote_chat::StopOnInterrupt interrupt;
  try {
    const app::RemoteReply answer = app::stream_remote_chat(endpoint, messages, generation, interrupt.flag(), on_chunk);
    std::fputs((shown.finish() + "\n").c_str(), stdout);
    std::fflush(stdout);
    QJsonObject stats = app::stats_to_json(answer.stats);
    const QJsonObject details = app::RemoteWorker::stats_details(answer);
    for (auto it = details.constBegin(); it != details.constEnd(); ++it) stats.insert(it.key(), it.value());
    if (!answer.interruption.empty()) stats.insert(app::kReplyErrorKey, QString::fromStdString(answer.interruption));
    recorder.finish(QString::fromStdString(answer.text), stats);
    store.set_message_origin(recorder.reply_id(), reply.backend, QString::fromStdString(answer.model));
    remote_chat::warn_about_marks(answer);
    if (!answer.interruption.empty()) {
      std::fprintf(stderr, "kvchat-cli chat: %s\n", answer.interruption.c_str());
      return false;
    }
    const GenerationStats& s = answer.stats;
    std::fprintf(
        stderr, "[server %s, model %s: %d prompt tokens%s; %d tokens; TTFT %.1f ms; %.1f tok/s (%s); stop: %s]\n",
        reply.backend.toStdString().c_str(), escaped_for_terminal(answer.model).c_str(), s.prompt_tokens,
        answer.cached_tokens ? (", " + std::to_string(*answer.cached_tokens) + " cached on the server").c_str() : "",
        s.generated_tokens, s.ttft_ms, s.decode_tokens_per_second,
        answer.server_timings ? "server's timings" : "measured here", to_string(s.stop_reason));
    return true;
  } catch (const std::exception& error) {
    const std::string held = shown.finish();
    if (!recorder.utf8_text().empty()) std::fputs((held + "\n").c_str(), stdout);
    recorder.fail(QString::fromUtf8(error.what()));
    std::fprintf(stderr, "kvchat-cli chat: %s\n", error.what());
    return false;
  }
}

}  // namespace kvchat::cli
