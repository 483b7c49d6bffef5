#include "app/remote/remote_worker.h"

#include <spdlog/spdlog.h>

#include <QElapsedTimer>

#include <exception>

namespace kvchat::app {

namespace {
// Streamed text is sent to the GUI thread in batches at most this far apart (as EngineWorker does).
constexpr qint64 kTextBatchMs = 30;
}  // namespace

QJsonObject RemoteWorker::stats_details(const RemoteReply& reply) {
  QJsonObject details;
  details.insert(kStatsBackendKey, QStringLiteral("remote"));
  if (reply.cached_tokens) details.insert(kStatsCachedTokensKey, *reply.cached_tokens);
  details.insert(kStatsFiguresKey, reply.server_timings ? QStringLiteral("server") : QStringLiteral("client"));
  if (!reply.interruption.empty()) details.insert(kStatsInterruptedKey, true);
  if (reply.invalid_utf8) details.insert(kStatsInvalidUtf8Key, true);
  if (reply.unreadable_events > 0) details.insert(kStatsUnreadableEventsKey, reply.unreadable_events);
  if (!reply.rejected_figures.empty())
    details.insert(kStatsRejectedFiguresKey, QString::fromStdString(reply.rejected_figures));
  if (!reply.unsent_settings.empty())
    details.insert(kStatsUnsentSettingsKey, QString::fromStdString(reply.unsent_settings));
  return details;
}

void RemoteWorker::runTurn(const TurnRequest& request) {
  const quint64 turn_id = request.turn_id;
  const RemoteEndpoint endpoint = endpoint_;
  QString batch;
  QElapsedTimer since_batch;
  since_batch.start();
  QElapsedTimer since_start;
  since_start.start();
  qint64 first_chunk_ms = -1;
  auto on_chunk = [&](std::string_view chunk, int chunks_received) {
    batch += QString::fromUtf8(chunk.data(), static_cast<qsizetype>(chunk.size()));
    // The first text goes out at once (the reply visibly starts at the server's first token), later text batched.
    const bool first = first_chunk_ms < 0;
    if (first) first_chunk_ms = since_start.elapsed();
    if (!first && since_batch.elapsed() < kTextBatchMs) return;
    Q_EMIT textReady(turn_id, batch);
    batch.clear();
    since_batch.restart();
    const double decode_seconds = (since_start.elapsed() - first_chunk_ms) / 1000.0;
    Q_EMIT tokenStats(turn_id, chunks_received, decode_seconds > 0 ? (chunks_received - 1) / decode_seconds : 0.0);
  };
  try {
    const RemoteReply reply = stream_remote_chat(endpoint, request.messages, request.generation, request.stop.get(),
                                                 on_chunk, request.reply_format.response_format());
    if (!batch.isEmpty()) Q_EMIT textReady(turn_id, batch);
    Q_EMIT replyDetails(turn_id, QString::fromStdString(displayed_base_url(endpoint.base_url)),
                        QString::fromStdString(reply.model), stats_details(reply));
    if (!reply.interruption.empty())
      Q_EMIT interrupted(turn_id, QString::fromStdString(reply.interruption), reply.stats);
    else
      Q_EMIT finished(turn_id, reply.stats);
  } catch (const std::exception& error) {
    if (!batch.isEmpty()) Q_EMIT textReady(turn_id, batch);
    spdlog::error("remote turn {} failed: {}", turn_id, error.what());
    Q_EMIT failed(turn_id, QString::fromUtf8(error.what()));
  }
}

}  // namespace kvchat::app
