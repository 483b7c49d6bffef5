#pragma once
// The engine's thread. An EngineWorker lives on its own QThread: it loads the model and keeps one Session
// (one KV cache) per conversation in a SessionPool, so that returning to a chat resumes without re-reading
// it. Caches live under a memory budget: past it, the least recently used conversation's cache is dropped.
// With snapshots on, every completed reply's cache is also written to disk in the background, so that a
// conversation continued after an eviction, a model reload or a restart of the app restores its prompt
// from disk instead of prefilling it.
//
// Everything crosses threads by value through queued signals. Stopping is the one exception: the worker's
// event loop is busy inside generate(), so the GUI thread sets the turn's atomic stop flag directly.
// Torch stays out of this header (the sessions sit behind a pimpl).
#include <QMetaType>
#include <QObject>
#include <QString>

#include <memory>
#include <vector>

#include "app/chat/chat_turn_runner.h"
#include "app/chat/turn_backend.h"
#include "app/settings.h"
#include "engine/types.h"

namespace kvchat {
struct LoadedModel;
}

namespace kvchat::app {

// The loaded model as the app describes it (names and figures for the window, the logs and the replies'
// settings). Three names, three things: kvchat::LlamaModel is the network (config, weights, the forward);
// kvchat::LoadedModel is what a load returns (that network with its tokenizer, chat formatter and file facts);
// ModelInfo is this description, with the LoadedModel it came from.
struct ModelInfo {
  QString path;             // a Hugging Face model directory or a .gguf file
  QString name;             // the directory's folder name, or the file's name
  QString architecture;     // "llama", "qwen2"
  QString format;           // "safetensors" or "gguf"
  QString weight_format;    // "f32", "bf16", "Q4_K_M", "Q8_0", ...
  qint64 file_bytes = 0;    // of the weights on disk
  qint64 weight_bytes = 0;  // of the weights in memory
  qint64 parameter_count = 0;
  int context_length = 0;  // max_position_embeddings
  int layers = 0;
  qint64 kv_bytes_per_token = 0;
  bool has_chat_template = false;
  double load_seconds = 0.0;
  // The loaded model itself, read-only: its tokenizer and template also count the tokens of a message being
  // typed (on the draft counter's thread). The weights are only ever used by the worker.
  std::shared_ptr<const kvchat::LoadedModel> model;
};

// Where and whether KV snapshots are kept (ChatSettings decides; the worker applies).
struct SnapshotOptions {
  bool enabled = true;
  QString directory;                         // the snapshot folder (every model's snapshots in a subfolder of it)
  qint64 disk_budget_bytes = 0;              // 0 = no budget
  QString key_prefix = QStringLiteral("c");  // tells apart the conversations of different databases
};

class EngineWorker : public TurnBackend {
  Q_OBJECT
 public:
  explicit EngineWorker(QObject* parent = nullptr);
  ~EngineWorker() override;

  // The value types carried by this class's queued signals and slots.
  static void register_meta_types();

 public Q_SLOTS:
  // Loads a model directory or a .gguf file. On failure the previous model (and its caches) stays in use.
  // `long_context`: a LongRoPE model (Phi-3) opened for its whole context with the long factors; other models as
  // they are (LoadOptions::LongContext::WhereSupported).
  void loadModel(const QString& path, int threads, bool long_context = false);
  void runTurn(const kvchat::app::TurnRequest& request) override;
  // A short generation of its own for a chat's title: on a Session made for it and dropped after it, so no
  // conversation's cache (and no snapshot) is read or changed. titleReady() with the text, or titleFailed().
  void generateTitle(qint64 conversation_id, const std::vector<kvchat::ChatMessage>& messages,
                     const kvchat::GenerationConfig& generation, int context_limit);
  // Drops a conversation's cache and snapshot (the conversation was deleted, or its cached state cleared).
  void forgetConversation(qint64 conversation_id);
  // Applies to the next model load; a change of folder or on/off also applies to the loaded model now.
  void configureSnapshots(const kvchat::app::SnapshotOptions& options);
  // Drops every conversation's cache and every snapshot in the folder.
  void clearAllCachedState();
  // Reports (snapshotWritten) the snapshot this model has on disk for the conversation, written by an earlier
  // run: so the window can say a chat's cache waits on disk before its first turn restores it.
  void describeSnapshot(qint64 conversation_id);

 Q_SIGNALS:
  void loaded(const kvchat::app::ModelInfo& info);
  void loadFailed(const QString& directory, const QString& message);

  // A turn's signals are TurnBackend's (text batched every ~30 ms; decodeTimings and replyTokens before finished).
  void titleReady(qint64 conversation_id, const QString& text);
  void titleFailed(qint64 conversation_id, const QString& message);

  // budget_bytes is the budget of the turn that caused the change (0 when no turn did).
  void cacheChanged(qint64 conversation_id, qint64 tokens, qint64 bytes, qint64 total_bytes, qint64 budget_bytes);
  void cacheEvicted(qint64 conversation_id);
  // A snapshot was written (from the store's thread): the conversation's tokens and file bytes (0, 0 when
  // its state was cleared), and what the whole snapshot folder now holds.
  void snapshotWritten(qint64 conversation_id, qint64 tokens, qint64 file_bytes, qint64 folder_bytes,
                       qint64 disk_budget_bytes);

 private:
  struct State;
  void enforce_budget(qint64 active_conversation, qint64 budget_bytes);
  qint64 total_cache_bytes() const;
  void open_snapshots();  // a SessionPool for the loaded model, with a snapshot store when enabled
  std::unique_ptr<State> state_;
};

}  // namespace kvchat::app

Q_DECLARE_METATYPE(kvchat::app::ModelInfo)
Q_DECLARE_METATYPE(kvchat::app::SnapshotOptions)
