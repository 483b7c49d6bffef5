#include "ui/stats_format.h"

#include <QJsonArray>
#include <QStringList>

#include <stdexcept>

#include "app/store/chat_history.h"
#include "app/store/message_stats_json.h"

namespace kvchat::ui {

QString format_bytes(qint64 bytes) {
  if (bytes < 1024) return QStringLiteral("%1 B").arg(bytes);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes) / 1024.0;
  int unit = 0;
  while (value >= 1024.0 && unit < 3) {
    value /= 1024.0;
    ++unit;
  }
  return QStringLiteral("%1 %2").arg(value, 0, 'f', value < 10 ? 2 : 1).arg(units[unit]);
}

QString format_rate(double tokens_per_second) {
  return QStringLiteral("%1 tok/s").arg(tokens_per_second, 0, 'f', tokens_per_second < 100 ? 1 : 0);
}

QString format_live_speed(bool decoding, double tokens_per_second, int generated_tokens) {
  return QStringLiteral("%1 %2 \u00b7 %3 tok")
      .arg(decoding ? QStringLiteral("decoding") : QStringLiteral("decode"), format_rate(tokens_per_second))
      .arg(generated_tokens);
}

QString format_reply_stats(const kvchat::GenerationStats& stats) {
  QStringList parts;
  parts << QStringLiteral("prefill %1").arg(format_rate(stats.prefill_tokens_per_second));
  parts << QStringLiteral("TTFT %1 ms").arg(stats.ttft_ms, 0, 'f', stats.ttft_ms < 10 ? 1 : 0);
  parts << QStringLiteral("decode %1").arg(format_rate(stats.decode_tokens_per_second));
  parts << QStringLiteral("%1 tokens").arg(stats.generated_tokens);
  if (stats.cache_mode == kvchat::KvCacheMode::Off)
    parts << QStringLiteral("cache off: %1 tokens recomputed").arg(stats.prompt_tokens);
  else if (stats.restored_tokens > 0)
    parts << QStringLiteral("%1 restored from disk in %2 ms / %3 reused in memory / %4 prefilled")
                 .arg(stats.restored_tokens)
                 .arg(stats.restore_ms, 0, 'f', stats.restore_ms < 10 ? 1 : 0)
                 .arg(stats.reused_tokens - stats.restored_tokens)
                 .arg(stats.prefilled_tokens);
  else
    parts << QStringLiteral("%1 reused / %2 prefilled").arg(stats.reused_tokens).arg(stats.prefilled_tokens);
  switch (stats.stop_reason) {
    case kvchat::StopReason::Stopped: parts << QStringLiteral("stopped"); break;
    case kvchat::StopReason::ContextFull: parts << QStringLiteral("context limit reached"); break;
    case kvchat::StopReason::MaxTokens: parts << QStringLiteral("max tokens"); break;
    case kvchat::StopReason::Eos: break;
  }
  return parts.join(QStringLiteral(" \u00b7 "));
}

QString format_model_summary(const kvchat::app::ModelInfo& info) {
  QStringList parts{info.name};
  if (!info.architecture.isEmpty()) parts << info.architecture;
  if (!info.weight_format.isEmpty()) parts << info.weight_format;
  const qint64 size = info.file_bytes > 0 ? info.file_bytes : info.weight_bytes;
  if (size > 0) parts << format_bytes(size);
  return parts.join(QStringLiteral(" \u00b7 "));
}

QString format_model_details(const kvchat::app::ModelInfo& info) {
  QStringList lines{info.path};
  lines << QStringLiteral("%1, %2 weights (%3): %4 on disk, %5 in memory")
               .arg(info.architecture.isEmpty() ? QStringLiteral("unknown architecture") : info.architecture,
                    info.weight_format, info.format, format_bytes(info.file_bytes), format_bytes(info.weight_bytes));
  lines << QStringLiteral("%1 parameters, %2 layers, context %3 tokens, %4 of K/V per token")
               .arg(info.parameter_count)
               .arg(info.layers)
               .arg(info.context_length)
               .arg(format_bytes(info.kv_bytes_per_token));
  return lines.join(QLatin1Char('\n'));
}

namespace {
// A remote reply: what the server reported (usage, cached_tokens, timings), or what was measured here.
QString format_remote_stats(const QJsonObject& json) {
  const kvchat::GenerationStats stats = kvchat::app::stats_from_json(json);
  const bool measured_here = json.value("figures").toString() != QLatin1String("server");
  QStringList parts;
  parts << QStringLiteral("server");
  parts << QStringLiteral("%1 tokens").arg(stats.generated_tokens);
  parts << QStringLiteral("TTFT %1 ms").arg(stats.ttft_ms, 0, 'f', 0);
  parts << QStringLiteral("decode %1").arg(format_rate(stats.decode_tokens_per_second));
  if (measured_here) parts.last() += QStringLiteral(" (measured here)");
  if (json.contains("cached_tokens"))
    parts << QStringLiteral("prompt %1 (%2 cached on the server)")
                 .arg(stats.prompt_tokens)
                 .arg(json.value("cached_tokens").toInt());
  else if (stats.prompt_tokens > 0)
    parts << QStringLiteral("prompt %1").arg(stats.prompt_tokens);
  parts << QString::fromLatin1(kvchat::to_string(stats.stop_reason));
  if (json.contains("unsent_settings"))
    parts << QStringLiteral("the server refused %1: not applied").arg(json.value("unsent_settings").toString());
  return parts.join(QStringLiteral(" \u00b7 "));
}
}  // namespace

QString format_stored_stats(const QJsonObject& stats) {
  if (stats.isEmpty()) return QString();
  if (stats.value("interrupted").toBool())
    return QStringLiteral("Interrupted: %1").arg(stats.value("error").toString());
  if (stats.contains("error")) return QStringLiteral("Error: %1").arg(stats.value("error").toString());
  try {
    if (stats.value("backend").toString() == QLatin1String("remote")) return format_remote_stats(stats);
    const QJsonArray earlier = stats.value(kvchat::app::kReplyEarlierPartsKey).toArray();
    if (earlier.isEmpty()) return format_reply_stats(kvchat::app::stats_from_json(stats));
    // A reply written in several turns (Continue): the sum, then each part's own figures.
    QList<kvchat::GenerationStats> parts;
    for (const QJsonValue& part : earlier) parts << kvchat::app::stats_from_json(part.toObject());
    parts << kvchat::app::stats_from_json(stats);
    QStringList counts, lines;
    int total = 0;
    for (const kvchat::GenerationStats& part : parts) {
      total += part.generated_tokens;
      counts << QString::number(part.generated_tokens);
      lines << QStringLiteral("part %1: %2").arg(lines.size() + 1).arg(format_reply_stats(part));
    }
    lines.prepend(QStringLiteral("%1 tokens in %2 parts (%3)").arg(total).arg(parts.size()).arg(counts.join(" + ")));
    return lines.join(QLatin1Char('\n'));
  } catch (const std::invalid_argument& error) {
    return QStringLiteral("(unreadable stats: %1)").arg(QString::fromUtf8(error.what()));
  }
}

}  // namespace kvchat::ui
