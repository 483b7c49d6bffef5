#pragma once
// GenerationStats <-> the JSON object stored with each assistant message and written by exports.
#include <QJsonObject>
#include <QString>

#include "engine/types.h"

namespace kvchat::app {

// Keys: prompt_tokens, reused_tokens, prefilled_tokens, generated_tokens, prefill_ms, ttft_ms, decode_ms,
// prefill_tok_s, decode_tok_s, cache_tokens, cache_bytes, cache_capacity_tokens,
// cache_mode ("on"/"naive"/"off"), stop_reason ("eos"/"max_tokens"/"context_full"/"stopped").
QJsonObject stats_to_json(const kvchat::GenerationStats& stats);
// Missing keys keep GenerationStats' defaults; an unknown cache_mode/stop_reason throws std::invalid_argument.
kvchat::GenerationStats stats_from_json(const QJsonObject& json);

// One human line for a reply's stats, e.g. "42 tokens · 118.3 tok/s · TTFT 12 ms · prompt 96 (80 reused) ·
// cache on 138 tokens, 69.0 KiB · stop: eos". Empty for an empty object.
QString stats_summary(const QJsonObject& json);

}  // namespace kvchat::app
