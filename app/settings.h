#pragma once
// The user's chat settings, persisted with QSettings. Tests pass their own QSettings(path, IniFormat).
#include <QJsonObject>
#include <QSettings>
#include <QString>

#include "engine/types.h"

namespace kvchat::app {

// What happens when the conversation no longer fits the context window.
enum class ContextOverflowPolicy { Stop, DropOldestTurns };

const char* to_string(ContextOverflowPolicy policy);  // "stop" / "drop_oldest_turns"
// Accepts "stop", "drop_oldest_turns" (or "drop"). Throws std::invalid_argument otherwise.
ContextOverflowPolicy context_overflow_policy_from_string(const QString& text);

// Where replies are generated: the engine on this computer, or an OpenAI-compatible server.
enum class BackendKind { Local, Remote };
const char* to_string(BackendKind kind);  // "local" / "remote"

struct ChatSettings {
  bool kv_cache_enabled = true;
  // How the cache stores keys and values: f32 is exact; bf16/f16/q8_0 round them once (every path alike, so the
  // cache still changes no token) and hold half or about a quarter of the bytes.
  kvchat::KvDtype kv_dtype = kvchat::KvDtype::F32;
  // Speculative decoding (with the cache on): the same reply, sooner when it repeats earlier text.
  kvchat::SpeculativeMode speculative = kvchat::SpeculativeMode::None;
  QString draft_model_path;  // SpeculativeMode::DraftModel's model: a directory or .gguf of the same tokenizer
  double temperature = 0.7;
  int top_k = 40;
  double top_p = 0.95;
  double min_p = 0.05;
  double repetition_penalty = 1.1;
  quint64 seed = 0;  // 0 = a fresh random seed each turn; at most kMaxSeed
  // The signed 64-bit range, so that a seed means the same to the engine and to a server (vLLM's schema
  // refuses larger ones). Drawn seeds stay below it too.
  static constexpr quint64 kMaxSeed = 0x7fffffffffffffffULL;
  int max_new_tokens = 256;
  QString default_system_prompt;
  QString model_path;     // a model directory or a .gguf file; empty = the embedded stories260K
  int threads = 0;        // 0 = the machine's cores
  int context_limit = 0;  // 0 = the model's max_position_embeddings
  // LongRoPE models (Phi-3, Phi-4-mini) opened for their whole context with the long factors
  // (LoadOptions::LongContext::WhereSupported); off: the short factors within the original context.
  bool long_context = false;
  ContextOverflowPolicy context_overflow = ContextOverflowPolicy::Stop;
  qint64 cache_budget_bytes = 0;  // 0 = default: a share of physical memory (see effective_cache_budget_bytes)
  // KV snapshots: each conversation's cache also kept on disk, so it survives evictions and restarts.
  bool kv_snapshots_enabled = true;
  qint64 snapshot_disk_budget_bytes = kDefaultSnapshotDiskBudget;  // 0 = no budget
  QString snapshot_directory;                                      // empty = <app data folder>/kv-snapshots
  static constexpr qint64 kDefaultSnapshotDiskBudget = qint64(2) << 30;
  BackendKind backend = BackendKind::Local;
  QString remote_base_url;  // e.g. http://localhost:8000/v1
  QString remote_model;     // empty = the first model the server lists
  // A remote reply ends as failed (its text kept) after this long without a byte from the server, or this
  // long in all (RemoteEndpoint's idle_timeout_s and total_timeout_s).
  int remote_idle_timeout_s = kDefaultRemoteIdleTimeout;
  int remote_reply_timeout_s = kDefaultRemoteReplyTimeout;
  static constexpr int kDefaultRemoteIdleTimeout = 300;
  static constexpr int kDefaultRemoteReplyTimeout = 3600;
  static constexpr int kMaxRemoteTimeout = 7 * 24 * 3600;
  // Kept out of the settings file and of every reply's saved settings: save() writes it to
  // api_key_path() (permissions 0600), load() reads it from there.
  QString remote_api_key;
  int font_point_size = 0;   // the chat's text size; 0 = the system's (not part of to_json: not a reply's)
  QString export_directory;  // where the last export was written; empty = none yet (not part of to_json)
  QString appearance = QStringLiteral("system");  // "system", "light" or "dark" (not part of to_json)
  // After a new chat's first reply, the local model writes its title (a separate short generation); off: the
  // chat keeps the title made from its first message.
  bool model_titles = false;
  static constexpr int kMinFontPointSize = 6;
  static constexpr int kMaxFontPointSize = 48;

  static int max_threads();                       // the engine's limit: 4x the machine's cores
  static ChatSettings load(QSettings& settings);  // missing keys keep the defaults; out-of-range values clamped, logged
  void save(QSettings& settings) const;
  kvchat::GenerationConfig to_generation_config() const;  // sampling + max tokens + cache mode (Contiguous or Off)
  qint64 effective_cache_budget_bytes() const;
  QString effective_snapshot_directory() const;  // snapshot_directory, or the default
  QJsonObject to_json() const;                   // what gets saved with each assistant message (never the API key)
  // The API key's file: "kvchat-api-key" next to the settings file.
  static QString api_key_path(const QSettings& settings);
};

// A secret kept in a file of its own beside the settings file, never in it: owner-only (0600) from the
// moment it exists; an empty key removes the file. Reading a missing or unreadable file gives "" (logged).
QString read_key_file(const QString& path);
void write_key_file(const QString& path, const QString& key);

// How a database's conversations are named in a snapshot folder that several databases may share
// ("d" + 12 hex digits of the SHA-1 of its absolute path): the app and kvchat-cli agree on it.
QString snapshot_key_prefix(const QString& database_path);

// Physical memory of this machine in bytes (from /proc/meminfo, else sysconf); 0 if unknown.
qint64 physical_memory_bytes();

}  // namespace kvchat::app
