#pragma once
// One chat turn, start to finish: render the messages, encode them, fit them into the context window,
// generate on the conversation's Session and stream the reply as text. Shared by the desktop app's
// engine worker and `kvchat-cli chat`, so the render -> encode -> generate -> stream path exists once.
// No Qt widgets, no torch in this header.
#include <atomic>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "app/settings.h"
#include "engine/types.h"

namespace kvchat {
struct LoadedModel;
class Session;
}  // namespace kvchat

namespace kvchat::app {

// The conversation cannot be fitted into the context window (policy Stop, or a single message that is
// longer than the window on its own). The message says how many tokens were needed and the limit.
struct ContextLimitError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The exact tokens a conversation's session has been given and the prompt text they stand for, at the
// last few turn boundaries. Re-encoding a whole transcript after every reply would not give back the ids
// the model sampled (BPE merges differently across the reply boundary, the decoder strips a leading
// space), so a new turn appends only the encoding of its new text to the ids of the longest remembered
// text its prompt starts with: the cache is reused to the last token, also after an edit or a regenerate.
struct TokenCheckpoint {
  std::vector<TokenId> ids;
  std::string text;
};

class ConversationTokens {
 public:
  static constexpr size_t kMaxCheckpoints = 8;
  void remember(std::vector<TokenId> ids, std::string text);
  // The remembered text that is the longest prefix of `text` (null when none is).
  const TokenCheckpoint* longest_prefix_of(const std::string& text) const;
  const std::vector<TokenCheckpoint>& checkpoints() const { return checkpoints_; }
  void clear() { checkpoints_.clear(); }

 private:
  std::vector<TokenCheckpoint> checkpoints_;  // oldest first
};

struct TurnOptions {
  GenerationConfig generation;
  int context_limit = 0;  // 0 = the model's max_position_embeddings; never more than it
  ContextOverflowPolicy overflow = ContextOverflowPolicy::Stop;
};

// Called for every sampled token. `chunk` is the newly completed reply text (valid UTF-8, may be empty
// while a multi-byte character is incomplete or the token is a special one).
struct ReplyProgress {
  std::string_view chunk;
  int generated_tokens = 0;
  double decode_tokens_per_second = 0.0;  // since the first token; 0 until the second
};
using ReplyProgressCallback = std::function<void(const ReplyProgress& progress)>;

struct TurnOutcome {
  std::string reply;                  // the whole reply text (concatenation of every chunk)
  std::vector<TokenId> prompt_ids;    // what was given to Session::generate
  std::vector<TokenId> generated_ids; // sampled ids (a final stop token included)
  GenerationStats stats;              // cache figures as they are after the turn's bookkeeping
  int context_limit = 0;              // the effective limit this turn ran under
  int dropped_messages = 0;           // leading non-system messages left out to fit the window
};

class ChatTurnRunner {
 public:
  // Keeps a reference: `model` must outlive the runner.
  explicit ChatTurnRunner(const LoadedModel& model);

  int effective_context_limit(int requested_limit) const;

  // The prompt ids for `messages` (the generation prompt added), continuing `known` when the rendered
  // text extends the text `known` stands for.
  std::vector<TokenId> encode_messages(const std::vector<ChatMessage>& messages,
                                       const ConversationTokens& known) const;

  // Runs one turn. `messages` ends with the new user message. Throws ContextLimitError,
  // std::invalid_argument (no tokenizer, empty prompt) and whatever the engine throws; on success
  // `transcript` describes the session's tokens for the next turn.
  TurnOutcome run(Session& session, ConversationTokens& transcript, const std::vector<ChatMessage>& messages,
                  const TurnOptions& options, const std::atomic<bool>* stop,
                  const ReplyProgressCallback& on_progress) const;

 private:
  struct FittedPrompt {
    std::vector<TokenId> ids;
    std::string text;
    int dropped_messages = 0;
  };
  FittedPrompt fit_prompt(const std::vector<ChatMessage>& messages, const ConversationTokens& known,
                          const TurnOptions& options, int context_limit) const;
  std::vector<TokenId> encode_rendered(const std::vector<ChatMessage>& messages, const ConversationTokens& known,
                                       std::string* rendered_text) const;

  const LoadedModel& model_;
};

}  // namespace kvchat::app
