#include "app/snapshot_transcript.h"

#include <spdlog/spdlog.h>

#include "engine/model_loader.h"

namespace kvchat::app {

std::string transcript_ids_problem(const std::vector<TokenId>& ids, const ModelConfig& config) {
  if (static_cast<std::int64_t>(ids.size()) > config.max_position_embeddings)
    return "it holds " + std::to_string(ids.size()) + " token ids, more than the model's context of " +
           std::to_string(config.max_position_embeddings);
  for (const TokenId id : ids)
    if (id < 0 || id >= config.vocab_size)
      return "token id " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(config.vocab_size) + " ids";
  return {};
}

std::optional<ConversationTokens> transcript_from_snapshot(SessionPool& pool, SessionPool::ConversationId conversation,
                                                           const LoadedModel& model) {
  const std::optional<std::string> saved = pool.snapshot_annotation(conversation);
  if (!saved) return std::nullopt;
  std::optional<ConversationTokens> transcript = ConversationTokens::deserialize(*saved);
  const std::string problem = transcript ? transcript_ids_problem(transcript->ids(), model.config) : "it is unreadable";
  if (problem.empty()) return transcript;
  spdlog::warn("the transcript kept with conversation {}'s KV snapshot is not used ({}); its text is encoded again",
               conversation, problem);
  if (SnapshotStore* store = pool.snapshots()) store->discard(pool.snapshot_key(conversation), "its transcript: " + problem);
  return std::nullopt;
}

}  // namespace kvchat::app
