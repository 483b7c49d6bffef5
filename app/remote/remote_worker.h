#pragma once
// The remote backend's thread: runs a turn on an OpenAI-compatible server (remote_client.h) and reports it
// with TurnBackend's signals, as EngineWorker does, so the controller streams, saves and shows a remote reply
// exactly as a local one. Before finished() or interrupted(), replyDetails() says which server and model
// answered and which figures the server itself reported.
// Lives on its own QThread (a blocking HTTP stream); the GUI thread stops a turn through its atomic flag,
// which closes the connection.
#include <QJsonObject>
#include <QObject>
#include <QString>

#include "app/chat/turn_backend.h"
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

class RemoteWorker : public TurnBackend {
  Q_OBJECT
 public:
  using TurnBackend::TurnBackend;

  // The extra stats keys above for a finished remote reply.
  static QJsonObject stats_details(const RemoteReply& reply);
  // The server the next turns go to (invoked on the worker's thread before runTurn).
  void setEndpoint(const kvchat::app::RemoteEndpoint& endpoint) { endpoint_ = endpoint; }
  // Runs on the worker's thread (invoked there by the controller), on the endpoint set last.
  void runTurn(const kvchat::app::TurnRequest& request) override;

 private:
  RemoteEndpoint endpoint_;
};

}  // namespace kvchat::app
