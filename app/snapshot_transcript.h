#pragma once
// The transcript a conversation's KV snapshot keeps (the exact ids of its earlier turns), read back for
// a process's first turn of that conversation and checked before it is used. The annotation's checksums
// only say that the file is as it was written; a transcript whose ids this model cannot take (outside
// its vocabulary, more than its context) would make every later turn of the chat fail. Such a transcript
// is not used and the snapshot holding it is deleted: the conversation's text is encoded again instead,
// and the conversation itself is never touched.
#include <optional>
#include <string>
#include <vector>

#include "app/chat_turn_runner.h"
#include "engine/session_pool.h"

namespace kvchat {
struct LoadedModel;
struct ModelConfig;
}  // namespace kvchat

namespace kvchat::app {

// "" when every id is inside the model's vocabulary and there are no more than its context holds; else
// what is wrong, e.g. "token id 1000000 is outside the vocabulary of 512 ids".
std::string transcript_ids_problem(const std::vector<TokenId>& ids, const ModelConfig& config);

// The transcript kept with `conversation`'s snapshot, if there is one and it passes the checks above.
std::optional<ConversationTokens> transcript_from_snapshot(SessionPool& pool, SessionPool::ConversationId conversation,
                                                           const LoadedModel& model);

}  // namespace kvchat::app
