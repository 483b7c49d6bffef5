#include "app/chat/chat_turn_runner.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "engine/generation/session.h"
#include "engine/model/model_loader.h"
#include "engine/text/chat_prompt.h"
#include "engine/text/constraint/token_constraint.h"

namespace kvchat::app {

namespace {

std::string too_long_message(size_t prompt_tokens, int limit) {
  return "this conversation is " + std::to_string(prompt_tokens) + " tokens long and the context limit is " +
         std::to_string(limit) +
         " tokens: start a new chat, or set the context overflow policy to drop the oldest turns";
}

// Raising the limit helps only below the model's own maximum.
std::string last_message_too_long(size_t prompt_tokens, int limit, int model_limit) {
  return "the last message alone is " + std::to_string(prompt_tokens) + " tokens long and the context limit is " +
         std::to_string(limit) + " tokens" +
         (limit < model_limit
              ? ": shorten it or raise the context limit (the model reads up to " + std::to_string(model_limit) + ")"
              : ", the model's maximum: shorten it");
}

}  // namespace

ChatTurnRunner::ChatTurnRunner(const LoadedModel& model) : model_(model) {}

int ChatTurnRunner::effective_context_limit(int requested_limit) const {
  const auto model_limit = static_cast<int>(model_.config.max_position_embeddings);
  if (requested_limit <= 0 || requested_limit > model_limit) return model_limit;
  return requested_limit;
}

std::vector<TokenId> ChatTurnRunner::encode_messages(const std::vector<ChatMessage>& messages, bool continue_reply,
                                                     const std::string& tools_json) const {
  if (!model_.tokenizer)
    throw std::invalid_argument("model " + model_.path + " has no tokenizer, so it cannot be used for chat");
  nlohmann::ordered_json extra_context = nlohmann::ordered_json::object();
  if (!tools_json.empty()) extra_context["tools"] = nlohmann::ordered_json::parse(tools_json);
  ChatPrompt prompt =
      encode_chat_prompt(model_.formatter, *model_.tokenizer, messages,
                         continue_reply ? PromptEnd::ContinueLastMessage : PromptEnd::GenerationPrompt, extra_context);
  return std::move(prompt.ids);
}

ChatTurnRunner::FittedPrompt ChatTurnRunner::fit_prompt(const std::vector<ChatMessage>& messages,
                                                        const TurnOptions& options, int context_limit) const {
  FittedPrompt fitted;
  fitted.ids = encode_messages(messages, options.continue_reply);
  const size_t limit = static_cast<size_t>(context_limit);
  if (options.overflow == ContextOverflowPolicy::Stop) {
    if (fitted.ids.size() >= limit) throw ContextLimitError(too_long_message(fitted.ids.size(), context_limit));
    return fitted;
  }

  // Room kept for the reply; once trimming is needed, a further quarter of the window is freed so that
  // the next few turns fit without cutting (and re-prefilling) again.
  const size_t reply_room =
      static_cast<size_t>(std::max(1, std::min(options.generation.max_new_tokens, context_limit / 4)));
  if (fitted.ids.size() + reply_room <= limit) return fitted;
  const size_t target = limit > reply_room + limit / 4 ? limit - reply_room - limit / 4 : 1;
  fitted = drop_oldest_turns(messages, target, options.continue_reply);
  if (fitted.ids.size() >= limit)
    throw ContextLimitError(last_message_too_long(fitted.ids.size(), context_limit,
                                                  static_cast<int>(model_.config.max_position_embeddings)));
  spdlog::info("context limit {}: left out the {} oldest messages, prompt now {} tokens", context_limit,
               fitted.dropped_messages, fitted.ids.size());
  return fitted;
}

// The fewest oldest messages (after the system prompt) to leave out for the prompt to take at most
// `target` tokens, or all but the last message when nothing smaller fits. Whole exchanges go: templates
// expect the first turn after the system prompt to be a user's, so the kept turns start at a user
// message (or at the last message). Leaving out more never lengthens the prompt, so the cut is found
// by bisection: a few renders of the conversation, not one per message.
ChatTurnRunner::FittedPrompt ChatTurnRunner::drop_oldest_turns(const std::vector<ChatMessage>& messages,
                                                               std::size_t target, bool continue_reply) const {
  std::size_t first_turn = 0;
  while (first_turn < messages.size() && messages[first_turn].role == "system") ++first_turn;
  std::vector<std::size_t> cuts;  // where the kept turns may start, ascending
  for (std::size_t i = first_turn + 1; i < messages.size(); ++i)
    if (messages[i].role == "user" || i + 1 == messages.size()) cuts.push_back(i);

  auto fitted_from = [&](std::size_t cut) {
    std::vector<ChatMessage> kept(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(first_turn));
    kept.insert(kept.end(), messages.begin() + static_cast<std::ptrdiff_t>(cut), messages.end());
    FittedPrompt fitted;
    fitted.ids = encode_messages(kept, continue_reply);
    fitted.dropped_messages = static_cast<int>(cut - first_turn);
    return fitted;
  };
  if (cuts.empty()) return fitted_from(first_turn);
  // Invariant: cuts[high] is the answer if nothing before it fits.
  std::size_t low = 0, high = cuts.size() - 1;
  FittedPrompt best = fitted_from(cuts[high]);
  while (low < high) {
    const std::size_t middle = low + (high - low) / 2;
    FittedPrompt candidate = fitted_from(cuts[middle]);
    if (candidate.ids.size() <= target) {
      best = std::move(candidate);
      high = middle;
    } else {
      low = middle + 1;
    }
  }
  return best;
}

TurnOutcome ChatTurnRunner::run(Session& session, const std::vector<ChatMessage>& messages, const TurnOptions& options,
                                const std::atomic<bool>* stop, const ReplyProgressCallback& on_progress) const {
  if (messages.empty()) throw std::invalid_argument("a chat turn needs at least one message");
  if (options.continue_reply && messages.back().role != "assistant")
    throw std::invalid_argument("there is no reply to continue: the conversation ends with a " + messages.back().role +
                                " message");
  TurnOutcome outcome;
  outcome.context_limit = effective_context_limit(options.context_limit);
  FittedPrompt fitted = fit_prompt(messages, options, outcome.context_limit);
  outcome.dropped_messages = fitted.dropped_messages;
  outcome.prompt_ids = fitted.ids;

  GenerationConfig config = options.generation;
  config.context_limit = outcome.context_limit;                // the engine stops the reply there (ContextFull)
  config.sampled_vocabulary = model_.tokenizer->vocab_size();  // every sampled id has text
  // The constraint follows a reply from its first byte; the part written before would have to be replayed into it.
  if (config.grammar && options.continue_reply)
    throw std::invalid_argument(
        "a reply in JSON cannot be continued: regenerate it (or raise max tokens) to get a whole JSON reply");
  if (config.grammar && !config.grammar_vocabulary) config.grammar_vocabulary = model_.constraint_vocabulary();

  // A constrained reply is exactly the text the constraint allowed: no clean-up of spaces.
  StreamingDecoder decoder(*model_.tokenizer, /*skip_special_tokens=*/true,
                           config.grammar ? std::optional<bool>(false) : std::nullopt);
  if (options.continue_reply) {
    // The reply goes on mid-text: the decoder must not treat its first token as the start of a text (it
    // would strip that token's leading space), so it first sees the last ids of the reply so far.
    constexpr std::size_t kContextIds = 8;
    const std::size_t from = fitted.ids.size() > kContextIds ? fitted.ids.size() - kContextIds : 0;
    for (std::size_t i = from; i < fitted.ids.size(); ++i) decoder.push(fitted.ids[i]);
  }
  DecodeProgress last_progress;
  using Clock = std::chrono::steady_clock;
  Clock::time_point previous_token;
  auto on_token = [&](TokenId token, const DecodeProgress& progress) {
    const Clock::time_point now = Clock::now();
    if (progress.generated_tokens > 1) {
      outcome.decode_step_ms.push_back(std::chrono::duration<double, std::milli>(now - previous_token).count());
      outcome.decode_step_from_proposal.push_back(progress.from_checked_row);
    }
    previous_token = now;
    const std::string chunk = decoder.push(token);
    outcome.reply += chunk;
    last_progress = progress;
    if (on_progress) on_progress(ReplyProgress{chunk, progress.generated_tokens, progress.decode_tokens_per_second});
  };
  GenerationResult result = session.generate(fitted.ids, config, stop, on_token);
  const std::string tail = decoder.finish();
  if (!tail.empty()) {
    outcome.reply += tail;
    if (on_progress)
      on_progress(ReplyProgress{tail, last_progress.generated_tokens, result.stats.decode_tokens_per_second});
  }
  outcome.generated_ids = result.generated;
  outcome.stats = result.stats;

  std::vector<TokenId> reply_ids = result.generated;
  if (outcome.stats.stop_reason == StopReason::Eos && !reply_ids.empty()) reply_ids.pop_back();

  // The reply's exact ids, for the next prompt to use in place of its text. A continued reply's are the
  // ids it already had and the new ones, known only when the first part's were.
  const ChatMessage& last = messages.back();
  const std::uint64_t vocabulary = model_.tokenizer->vocabulary_fingerprint();
  if (!options.continue_reply) {
    outcome.reply_ids = std::move(reply_ids);
  } else if (!last.token_ids.empty() && last.token_vocabulary == vocabulary) {
    outcome.reply_ids = last.token_ids;
    outcome.reply_ids.insert(outcome.reply_ids.end(), reply_ids.begin(), reply_ids.end());
  }
  if (!outcome.reply_ids.empty()) outcome.reply_vocabulary = vocabulary;
  return outcome;
}

}  // namespace kvchat::app
