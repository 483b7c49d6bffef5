#include "engine/generation/generation_stats_json.h"

namespace kvchat {

nlohmann::ordered_json generation_stats_to_json(const GenerationStats& stats) {
  nlohmann::ordered_json json;
  json["prompt_tokens"] = stats.prompt_tokens;
  json["reused_tokens"] = stats.reused_tokens;
  json["restored_tokens"] = stats.restored_tokens;
  json["restore_ms"] = stats.restore_ms;
  if (!stats.restored_from.empty()) json["restored_from"] = stats.restored_from;
  json["prefilled_tokens"] = stats.prefilled_tokens;
  json["generated_tokens"] = stats.generated_tokens;
  json["prefill_ms"] = stats.prefill_ms;
  json["ttft_ms"] = stats.ttft_ms;
  json["decode_ms"] = stats.decode_ms;
  json["prefill_tok_s"] = stats.prefill_tokens_per_second;
  json["decode_tok_s"] = stats.decode_tokens_per_second;
  json["cache_tokens"] = stats.cache_tokens;
  json["cache_bytes"] = stats.cache_bytes;
  json["cache_capacity_tokens"] = stats.cache_capacity_tokens;
  json["cache_mode"] = to_string(stats.cache_mode);
  if (stats.kv_dtype != KvDtype::F32) json["kv_dtype"] = to_string(stats.kv_dtype);
  json["stop_reason"] = to_string(stats.stop_reason);
  if (stats.draft_checks > 0) {  // speculative decoding ran
    json["drafted_tokens"] = stats.drafted_tokens;
    json["accepted_tokens"] = stats.accepted_tokens;
    json["draft_checks"] = stats.draft_checks;
  }
  return json;
}

}  // namespace kvchat
