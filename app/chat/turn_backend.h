#pragma once
// What answers a turn: the local engine (EngineWorker) or an OpenAI-compatible server (RemoteWorker). Each lives
// on a thread of its own and reports a turn with the one set of signals below, so the controller connects to
// them once and streams, saves and shows a reply the same way whichever backend wrote it. Everything crosses
// threads by value through queued signals; stopping is the one exception (the turn's atomic stop flag).
#include <QJsonObject>
#include <QList>
#include <QMetaType>
#include <QObject>
#include <QString>

#include <atomic>
#include <memory>
#include <vector>

#include "app/chat/reply_format.h"
#include "app/settings.h"
#include "engine/types.h"

namespace kvchat::app {

struct TurnRequest {
  quint64 turn_id = 0;
  qint64 conversation_id = 0;
  std::vector<ChatMessage> messages;  // system prompt first (if any), ending with the new user message
  GenerationConfig generation;
  int context_limit = 0;  // 0 = the model's
  ContextOverflowPolicy overflow = ContextOverflowPolicy::Stop;
  qint64 cache_budget_bytes = 0;            // total K/V bytes all conversations may keep
  int threads = 0;                          // 0 = the machine's cores
  std::shared_ptr<std::atomic<bool>> stop;  // set by the GUI thread to stop this turn
  bool continue_reply = false;              // messages end with a cut-short reply to go on with (TurnOptions)
  QString draft_model_path;                 // speculative decoding's draft model (SpeculativeMode::DraftModel)
  ReplyFormat reply_format;                 // the chat's: a JSON one constrains the reply
};

// How long each decode step of one reply took, measured on the engine thread (ChatTurnRunner): the points
// of the decode-time chart. With the cache a step costs about the same at every position; without it each
// step recomputes the whole prefix, so the time climbs with the position.
struct DecodeTimings {
  int first_position = 0;  // positions attended over by the first step timed
  QList<double> step_ms;   // step i attended over first_position + i positions
  // Steps whose token came with an earlier speculative pass (a proposal that held): their time is only sampling.
  QList<bool> from_proposal;
  KvCacheMode cache_mode = KvCacheMode::Contiguous;
};

// A finished reply's exact token ids (ChatMessage::token_ids), for the store to keep with its text.
struct ReplyTokens {
  std::vector<TokenId> ids;  // empty: not known
  quint64 vocabulary = 0;    // the tokenizer's vocabulary fingerprint
};

class TurnBackend : public QObject {
  Q_OBJECT
 public:
  using QObject::QObject;

 public Q_SLOTS:
  // Runs on the backend's thread (invoked there, queued): reports through the signals below, ending with
  // exactly one of finished(), interrupted() or failed().
  virtual void runTurn(const kvchat::app::TurnRequest& request) = 0;

 Q_SIGNALS:
  // The reply's new text, batched (the first at once, later ones every ~30 ms).
  void textReady(quint64 turn_id, const QString& chunk);
  void tokenStats(quint64 turn_id, int generated_tokens, double decode_tokens_per_second);
  // The oldest `dropped_messages` non-system messages of the request were left out to fit the window (local).
  void contextTrimmed(quint64 turn_id, int dropped_messages, int context_limit);
  // Just before finished(): the reply's per-step decode times, and its exact ids (local).
  void decodeTimings(quint64 turn_id, const kvchat::app::DecodeTimings& timings);
  void replyTokens(quint64 turn_id, const kvchat::app::ReplyTokens& tokens);
  // Before finished() or interrupted(): which server and model answered, and the stats keys of the server's
  // figures (remote; `backend` the base URL as shown).
  void replyDetails(quint64 turn_id, const QString& backend, const QString& model, const QJsonObject& details);
  void finished(quint64 turn_id, const kvchat::GenerationStats& stats);
  // The reply broke off after text had arrived (that text already went out through textReady; remote).
  void interrupted(quint64 turn_id, const QString& message, const kvchat::GenerationStats& stats);
  void failed(quint64 turn_id, const QString& message);
};

}  // namespace kvchat::app

Q_DECLARE_METATYPE(kvchat::app::TurnRequest)
Q_DECLARE_METATYPE(kvchat::app::DecodeTimings)
Q_DECLARE_METATYPE(kvchat::app::ReplyTokens)
Q_DECLARE_METATYPE(kvchat::GenerationStats)
