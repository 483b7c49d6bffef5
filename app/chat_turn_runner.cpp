#include "app/chat_turn_runner.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "engine/model_loader.h"
#include "engine/session.h"

namespace kvchat::app {

namespace {

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.size() >= prefix.size() && text.compare(0, prefix.size(), prefix) == 0;
}

std::string too_long_message(size_t prompt_tokens, int limit) {
  return "this conversation is " + std::to_string(prompt_tokens) + " tokens long and the context limit is " +
         std::to_string(limit) +
         " tokens: start a new chat, or set the context overflow policy to drop the oldest turns";
}

}  // namespace

void ConversationTokens::remember(std::vector<TokenId> ids, std::string text) {
  if (text.empty() || ids.empty()) return;
  checkpoints_.erase(std::remove_if(checkpoints_.begin(), checkpoints_.end(),
                                    [&](const TokenCheckpoint& checkpoint) { return checkpoint.text == text; }),
                     checkpoints_.end());
  checkpoints_.push_back({std::move(ids), std::move(text)});
  if (checkpoints_.size() > kMaxCheckpoints) checkpoints_.erase(checkpoints_.begin());
}

const TokenCheckpoint* ConversationTokens::longest_prefix_of(const std::string& text) const {
  const TokenCheckpoint* best = nullptr;
  for (const TokenCheckpoint& checkpoint : checkpoints_)
    if (starts_with(text, checkpoint.text) && (!best || checkpoint.text.size() > best->text.size())) best = &checkpoint;
  return best;
}

ChatTurnRunner::ChatTurnRunner(const LoadedModel& model) : model_(model) {}

int ChatTurnRunner::effective_context_limit(int requested_limit) const {
  const auto model_limit = static_cast<int>(model_.config.max_position_embeddings);
  if (requested_limit <= 0 || requested_limit > model_limit) return model_limit;
  return requested_limit;
}

std::vector<TokenId> ChatTurnRunner::encode_rendered(const std::vector<ChatMessage>& messages,
                                                     const ConversationTokens& known,
                                                     std::string* rendered_text) const {
  if (!model_.tokenizer)
    throw std::invalid_argument("model directory " + model_.directory +
                                " has no tokenizer.json, so it cannot be used for chat");
  const RenderedPrompt prompt = model_.formatter.render_prompt(messages, /*add_generation_prompt=*/true);
  *rendered_text = prompt.text;
  const Tokenizer& tokenizer = *model_.tokenizer;

  // Continue the known ids when the new prompt extends the text they stand for.
  if (const TokenCheckpoint* checkpoint = known.longest_prefix_of(prompt.text)) {
    const size_t offset = checkpoint->text.size();
    const std::string_view rest = std::string_view(prompt.text).substr(offset);
    std::vector<TokenId> ids = checkpoint->ids;
    if (rest.empty()) return ids;
    std::vector<TokenId> rest_ids;
    if (prompt.uses_template) {
      std::vector<std::pair<size_t, size_t>> rest_ranges;
      for (const auto& [first, second] : prompt.content_ranges) {
        if (second <= offset) continue;
        rest_ranges.emplace_back(std::max(first, offset) - offset, second - offset);
      }
      rest_ids = tokenizer.encode_chat(rest, rest_ranges, /*add_special_tokens=*/false);
    } else {
      rest_ids = tokenizer.encode(rest, /*add_special_tokens=*/false, /*parse_special=*/false);
    }
    ids.insert(ids.end(), rest_ids.begin(), rest_ids.end());
    return ids;
  }
  if (prompt.uses_template)
    return tokenizer.encode_chat(prompt.text, prompt.content_ranges, /*add_special_tokens=*/false);
  return tokenizer.encode(prompt.text, /*add_special_tokens=*/true, /*parse_special=*/false);
}

std::vector<TokenId> ChatTurnRunner::encode_messages(const std::vector<ChatMessage>& messages,
                                                     const ConversationTokens& known) const {
  std::string text;
  return encode_rendered(messages, known, &text);
}

ChatTurnRunner::FittedPrompt ChatTurnRunner::fit_prompt(const std::vector<ChatMessage>& messages,
                                                        const ConversationTokens& known, const TurnOptions& options,
                                                        int context_limit) const {
  FittedPrompt fitted;
  fitted.ids = encode_rendered(messages, known, &fitted.text);
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

  std::vector<ChatMessage> kept = messages;
  size_t first_turn = 0;
  while (first_turn < kept.size() && kept[first_turn].role == "system") ++first_turn;
  const size_t original_count = kept.size();
  const ConversationTokens nothing_known;
  while (fitted.ids.size() > target && kept.size() - first_turn > 1) {
    // Drop whole exchanges: templates expect the first turn after the system prompt to be a user's.
    kept.erase(kept.begin() + static_cast<std::ptrdiff_t>(first_turn));
    while (kept.size() - first_turn > 1 && kept[first_turn].role != "user")
      kept.erase(kept.begin() + static_cast<std::ptrdiff_t>(first_turn));
    fitted.ids = encode_rendered(kept, nothing_known, &fitted.text);
  }
  fitted.dropped_messages = static_cast<int>(original_count - kept.size());
  if (fitted.ids.size() >= limit)
    throw ContextLimitError("the last message alone is " + std::to_string(fitted.ids.size()) +
                            " tokens long and the context limit is " + std::to_string(context_limit) +
                            " tokens: shorten it or raise the context limit");
  spdlog::info("context limit {}: left out the {} oldest messages, prompt now {} tokens", context_limit,
               fitted.dropped_messages, fitted.ids.size());
  return fitted;
}

TurnOutcome ChatTurnRunner::run(Session& session, ConversationTokens& transcript,
                                const std::vector<ChatMessage>& messages, const TurnOptions& options,
                                const std::atomic<bool>* stop, const ReplyProgressCallback& on_progress) const {
  if (messages.empty()) throw std::invalid_argument("a chat turn needs at least one message");
  TurnOutcome outcome;
  outcome.context_limit = effective_context_limit(options.context_limit);
  FittedPrompt fitted = fit_prompt(messages, transcript, options, outcome.context_limit);
  outcome.dropped_messages = fitted.dropped_messages;
  outcome.prompt_ids = fitted.ids;

  GenerationConfig config = options.generation;
  const int room = outcome.context_limit - static_cast<int>(fitted.ids.size());
  const bool capped_by_context = config.max_new_tokens > room;
  config.max_new_tokens = std::min(config.max_new_tokens, room);

  StreamingDecoder decoder(*model_.tokenizer, /*skip_special_tokens=*/true);
  using Clock = std::chrono::steady_clock;
  Clock::time_point first_token_time;
  int generated = 0;
  auto on_token = [&](TokenId token) {
    const std::string chunk = decoder.push(token);
    outcome.reply += chunk;
    ++generated;
    const auto now = Clock::now();
    if (generated == 1) first_token_time = now;
    ReplyProgress progress;
    progress.chunk = chunk;
    progress.generated_tokens = generated;
    const double seconds = std::chrono::duration<double>(now - first_token_time).count();
    if (generated > 1 && seconds > 0) progress.decode_tokens_per_second = (generated - 1) / seconds;
    if (on_progress) on_progress(progress);
  };
  GenerationResult result = session.generate(fitted.ids, config, stop, on_token);
  const std::string tail = decoder.finish();
  if (!tail.empty()) {
    outcome.reply += tail;
    if (on_progress) {
      ReplyProgress progress;
      progress.chunk = tail;
      progress.generated_tokens = generated;
      progress.decode_tokens_per_second = result.stats.decode_tokens_per_second;
      on_progress(progress);
    }
  }
  outcome.generated_ids = result.generated;
  outcome.stats = result.stats;
  if (capped_by_context && outcome.stats.stop_reason == StopReason::MaxTokens)
    outcome.stats.stop_reason = StopReason::ContextFull;

  // The next turn's text carries the reply but not the stop token (a template writes its own turn end),
  // so the transcript's ids end with the reply's last real token.
  std::vector<TokenId> reply_ids = result.generated;
  if (outcome.stats.stop_reason == StopReason::Eos && !reply_ids.empty()) reply_ids.pop_back();
  std::vector<TokenId> turn_ids = fitted.ids;
  turn_ids.insert(turn_ids.end(), reply_ids.begin(), reply_ids.end());
  // Drop a cached stop token so the cache holds exactly what the next prompt starts with.
  const auto& history = session.history();
  if (session.cache_mode() != KvCacheMode::Off && history.size() > turn_ids.size() &&
      std::equal(turn_ids.begin(), turn_ids.end(), history.begin())) {
    session.truncate(static_cast<std::int64_t>(turn_ids.size()));
  }
  // The prompt alone serves a regenerate; prompt + reply serves the next turn and an edit after it.
  transcript.remember(fitted.ids, fitted.text);
  transcript.remember(std::move(turn_ids), fitted.text + outcome.reply);
  outcome.stats.cache_tokens = session.cache_tokens();
  outcome.stats.cache_bytes = session.cache_bytes();
  outcome.stats.cache_capacity_tokens = session.cache_capacity_tokens();
  return outcome;
}

}  // namespace kvchat::app
