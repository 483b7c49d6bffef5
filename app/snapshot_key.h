#pragma once
// This installation's KV snapshot key (engine/cache/kv_snapshot.h): an installation id and a secret that key
// every checksum of a snapshot, so that a snapshot written by another installation, or edited and its
// checksums recomputed by anyone without the secret, is rejected. One key per user's config folder
// ($XDG_CONFIG_HOME/kvchat/kv-snapshot-key, owner-only), made on first use and shared by the desktop app,
// kvchat-cli chat and kvchat-cli serve, so that they continue each other's snapshots in one folder.
#include <QString>

#include <cstdint>
#include <memory>
#include <string>

#include "engine/cache/kv_snapshot.h"
#include "engine/cache/snapshot_store.h"

namespace kvchat {
class LlamaModel;
}

namespace kvchat::app {

QString snapshot_key_path();

// Reads the key file, or makes it (0600) when there is none; a file another process makes at the same
// time wins, and both use it. A file with group or other permissions is narrowed to 0600. Throws
// std::runtime_error naming the file when it cannot be read or made, or is not a key.
SnapshotKey installation_snapshot_key();

// A store for `model` under `directory`, keyed with installation_snapshot_key(). Throws SnapshotError
// (the folder) or std::runtime_error (the key).
// Its snapshots hold caches of `kv_dtype` (a session of another dtype neither restores nor saves there).
std::shared_ptr<SnapshotStore> open_snapshot_store(const std::string& directory, std::int64_t disk_budget_bytes,
                                                   const LlamaModel& model, KvDtype kv_dtype = KvDtype::F32);

}  // namespace kvchat::app
