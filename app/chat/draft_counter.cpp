#include "app/chat/draft_counter.h"

#include <spdlog/spdlog.h>

#include <exception>

#include "app/chat/chat_turn_runner.h"
#include "engine/model/model_loader.h"

namespace kvchat::app {

std::optional<DraftMeasure> measure_draft(const DraftRequest& request) {
  if (!request.model || !request.model->tokenizer || request.messages.empty()) return std::nullopt;
  const LoadedModel& model = *request.model;
  DraftMeasure measure;
  measure.context_limit = request.context_limit;
  const std::vector<ChatMessage>& messages = request.messages;
  const ChatTurnRunner runner(model);
  try {
    measure.draft_tokens =
        static_cast<int>(model.tokenizer->encode(messages.back().content, /*add_special_tokens=*/false).size());
    // Continuing the conversation's exact ids, as the next turn will: re-encoding the whole chat can differ by
    // a token at each reply boundary.
    measure.prompt_tokens = static_cast<int>(runner.encode_messages(messages).size());
    // The same rules as the turn: "stop" refuses a prompt that fills the window; dropping old turns only fails
    // when the system prompt and this message alone do not fit.
    if (request.overflow == ContextOverflowPolicy::Stop) {
      measure.fits = measure.prompt_tokens < measure.context_limit;
    } else {
      std::vector<ChatMessage> alone;
      if (messages.front().role == "system") alone.push_back(messages.front());
      alone.push_back(messages.back());
      measure.fits = static_cast<int>(runner.encode_messages(alone).size()) < measure.context_limit;
    }
  } catch (const std::exception& error) {
    spdlog::debug("cannot count the draft's tokens: {}", error.what());
    return std::nullopt;
  }
  return measure;
}

void DraftCounter::count(const DraftRequest& request) {
  if (request.id < latest_.load()) return;  // typed over already: a newer request follows
  const std::optional<DraftMeasure> measure = measure_draft(request);
  Q_EMIT counted(request.id, measure.has_value(), measure.value_or(DraftMeasure{}));
}

}  // namespace kvchat::app
