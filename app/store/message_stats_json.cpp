#include "app/store/message_stats_json.h"

#include "engine/generation/generation_stats_json.h"

#include <stdexcept>
#include <string>

#include <QJsonDocument>
#include <QJsonValue>
#include <QStringList>

namespace kvchat::app {

namespace {

kvchat::StopReason stop_reason_from_string(const std::string& text) {
  for (auto reason : {StopReason::Eos, StopReason::MaxTokens, StopReason::ContextFull, StopReason::Stopped})
    if (text == kvchat::to_string(reason)) return reason;
  throw std::invalid_argument("stats: unknown stop_reason '" + text +
                              "' (expected eos, max_tokens, context_full or stopped)");
}

// A present key must hold a number: a string or object there means the record is damaged, not "zero".
double number_or(const QJsonObject& json, const char* key, double fallback) {
  const QJsonValue value = json.value(QLatin1String(key));
  if (value.isUndefined() || value.isNull()) return fallback;
  if (!value.isDouble()) throw std::invalid_argument(std::string("stats: key '") + key + "' is not a number");
  return value.toDouble();
}

}  // namespace

QJsonObject stats_to_json(const kvchat::GenerationStats& stats) {
  // The engine owns the field names (kvchat-cli prints the same object); this is its Qt form.
  const std::string text = kvchat::generation_stats_to_json(stats).dump();
  return QJsonDocument::fromJson(QByteArray::fromStdString(text)).object();
}

kvchat::GenerationStats stats_from_json(const QJsonObject& json) {
  kvchat::GenerationStats stats;
  stats.prompt_tokens = static_cast<int>(number_or(json, "prompt_tokens", stats.prompt_tokens));
  stats.reused_tokens = static_cast<int>(number_or(json, "reused_tokens", stats.reused_tokens));
  stats.restored_tokens = static_cast<int>(number_or(json, "restored_tokens", stats.restored_tokens));
  stats.restore_ms = number_or(json, "restore_ms", stats.restore_ms);
  if (json.contains(QStringLiteral("restored_from"))) {
    if (!json.value(QStringLiteral("restored_from")).isString())
      throw std::invalid_argument("stats: key 'restored_from' is not a string");
    stats.restored_from = json.value(QStringLiteral("restored_from")).toString().toStdString();
  }
  stats.prefilled_tokens = static_cast<int>(number_or(json, "prefilled_tokens", stats.prefilled_tokens));
  stats.generated_tokens = static_cast<int>(number_or(json, "generated_tokens", stats.generated_tokens));
  stats.prefill_ms = number_or(json, "prefill_ms", stats.prefill_ms);
  stats.ttft_ms = number_or(json, "ttft_ms", stats.ttft_ms);
  stats.decode_ms = number_or(json, "decode_ms", stats.decode_ms);
  stats.prefill_tokens_per_second = number_or(json, "prefill_tok_s", stats.prefill_tokens_per_second);
  stats.decode_tokens_per_second = number_or(json, "decode_tok_s", stats.decode_tokens_per_second);
  stats.cache_tokens = static_cast<std::int64_t>(number_or(json, "cache_tokens", 0));
  stats.cache_bytes = static_cast<std::int64_t>(number_or(json, "cache_bytes", 0));
  stats.cache_capacity_tokens = static_cast<std::int64_t>(number_or(json, "cache_capacity_tokens", 0));
  if (json.contains(QStringLiteral("cache_mode")))
    stats.cache_mode =
        kvchat::kv_cache_mode_from_string(json.value(QStringLiteral("cache_mode")).toString().toStdString());
  if (json.contains(QStringLiteral("stop_reason")))
    stats.stop_reason = stop_reason_from_string(json.value(QStringLiteral("stop_reason")).toString().toStdString());
  stats.drafted_tokens = static_cast<int>(number_or(json, "drafted_tokens", 0));
  stats.accepted_tokens = static_cast<int>(number_or(json, "accepted_tokens", 0));
  stats.draft_checks = static_cast<int>(number_or(json, "draft_checks", 0));
  return stats;
}

}  // namespace kvchat::app

namespace kvchat::app {

namespace {
QString byte_size(qint64 bytes) {
  if (bytes < 1024) return QStringLiteral("%1 B").arg(bytes);
  if (bytes < 1024 * 1024) return QStringLiteral("%1 KiB").arg(bytes / 1024.0, 0, 'f', 1);
  if (bytes < qint64(1024) * 1024 * 1024) return QStringLiteral("%1 MiB").arg(bytes / (1024.0 * 1024.0), 0, 'f', 1);
  return QStringLiteral("%1 GiB").arg(bytes / (1024.0 * 1024.0 * 1024.0), 0, 'f', 2);
}
}  // namespace

QString stats_summary(const QJsonObject& json) {
  if (json.isEmpty()) return {};
  const kvchat::GenerationStats stats = stats_from_json(json);
  QStringList parts;
  parts << QStringLiteral("%1 tokens").arg(stats.generated_tokens);
  parts << QStringLiteral("%1 tok/s").arg(stats.decode_tokens_per_second, 0, 'f', 1);
  parts << QStringLiteral("TTFT %1 ms").arg(stats.ttft_ms, 0, 'f', 0);
  if (stats.restored_tokens > 0)
    parts << QStringLiteral("prompt %1 (%2 reused, %3 of them restored from disk in %4 ms)")
                 .arg(stats.prompt_tokens)
                 .arg(stats.reused_tokens)
                 .arg(stats.restored_tokens)
                 .arg(stats.restore_ms, 0, 'f', 0);
  else
    parts << QStringLiteral("prompt %1 (%2 reused)").arg(stats.prompt_tokens).arg(stats.reused_tokens);
  if (json.value(QStringLiteral("backend")).toString() == QLatin1String("remote"))
    parts << (json.contains(QStringLiteral("cached_tokens"))
                  ? QStringLiteral("cache on the server, %1 tokens cached")
                        .arg(json.value(QStringLiteral("cached_tokens")).toInt())
                  : QStringLiteral("cache on the server"));
  else if (stats.cache_mode == kvchat::KvCacheMode::Off)
    parts << QStringLiteral("cache off");
  else
    parts << QStringLiteral("cache %1 %2 tokens, %3")
                 .arg(QString::fromLatin1(kvchat::to_string(stats.cache_mode)))
                 .arg(stats.cache_tokens)
                 .arg(byte_size(stats.cache_bytes));
  if (stats.draft_checks > 0)
    parts << QStringLiteral("lookup: %1 of %2 proposed tokens accepted (%3%)")
                 .arg(stats.accepted_tokens)
                 .arg(stats.drafted_tokens)
                 .arg(stats.drafted_tokens > 0 ? 100.0 * stats.accepted_tokens / stats.drafted_tokens : 0.0, 0, 'f', 0);
  parts << (json.value(QStringLiteral("stop_text")).toBool()
                ? QStringLiteral("stop: stop text")
                : QStringLiteral("stop: %1").arg(QString::fromLatin1(kvchat::to_string(stats.stop_reason))));
  if (json.contains(QStringLiteral("unsent_settings")))
    parts << QStringLiteral("the server refused %1: not applied")
                 .arg(json.value(QStringLiteral("unsent_settings")).toString());
  return parts.join(QStringLiteral(" · "));
}

}  // namespace kvchat::app
