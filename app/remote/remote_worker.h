#pragma once
// The remote backend's thread: runs a turn on an OpenAI-compatible server (remote_client.h) and reports it
// with the same signals as EngineWorker's turn signals (textReady, tokenStats, finished, failed), so the
// controller streams, saves and shows a remote reply exactly as a local one. Before finished() or failed(),
// replyDetails() says which server and model answered and which figures the server itself reported.
// Lives on its own QThread (a blocking HTTP stream); the GUI thread stops a turn through its atomic flag,
// which closes the connection.
#include <QJsonObject>
#include <QObject>
#include <QString>

#include "app/chat/engine_worker.h"
#include "app/remote/remote_client.h"

namespace kvchat::app {

// Keys of a remote reply's stats JSON, next to the GenerationStats ones (stats_json.h).
inline constexpr const char* kStatsBackendKey = "backend";                     // "remote"
inline constexpr const char* kStatsCachedTokensKey = "cached_tokens";          // only when the server reported it
inline constexpr const char* kStatsFiguresKey = "figures";                     // "server" or "client": whose timings
inline constexpr const char* kStatsInterruptedKey = "interrupted";             // true: the reply was cut short
inline constexpr const char* kStatsInvalidUtf8Key = "invalid_utf8";            // true: bytes not UTF-8 became U+FFFD
inline constexpr const char* kStatsUnreadableEventsKey = "unreadable_events";  // events that were not JSON
inline constexpr const char* kStatsRejectedFiguresKey = "rejected_figures";    // why the server's figures were not used
inline constexpr const char* kStatsUnsentSettingsKey = "unsent_settings";      // settings the server refused

class RemoteWorker : public QObject {
  Q_OBJECT
 public:
  using QObject::QObject;

  // The extra stats keys above for a finished remote reply.
  static QJsonObject stats_details(const RemoteReply& reply);
  // Runs on the worker's thread (invoked there by the controller).
  void runTurn(const kvchat::app::TurnRequest& request, const kvchat::app::RemoteEndpoint& endpoint);

 Q_SIGNALS:
  void textReady(quint64 turn_id, const QString& chunk);
  void tokenStats(quint64 turn_id, int generated_tokens, double decode_tokens_per_second);
  // `details`: the stats_details() keys; `backend` the base URL, `model` the model that answered.
  void replyDetails(quint64 turn_id, const QString& backend, const QString& model, const QJsonObject& details);
  void finished(quint64 turn_id, const kvchat::GenerationStats& stats);
  // The reply broke off after text had arrived (that text already went out through textReady).
  void interrupted(quint64 turn_id, const QString& message, const kvchat::GenerationStats& stats);
  void failed(quint64 turn_id, const QString& message);
};

}  // namespace kvchat::app
