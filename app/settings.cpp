#include "app/settings.h"

#include "app/logging.h"

#include <spdlog/spdlog.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <stdexcept>

#include <QCryptographicHash>
#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QRandomGenerator>

#include "engine/compute/compute_options.h"

namespace kvchat::app {

namespace {

QString read_api_key(const QString& path) {
  QFile file(path);
  if (!file.exists()) return {};
  if (!file.open(QIODevice::ReadOnly)) {
    spdlog::warn("API key file {}: cannot be read ({})", path.toStdString(), file.errorString().toStdString());
    return {};
  }
  // A key file others may read (an older version's, a copy, a umask) is made owner-only as soon as it is seen.
  struct stat status {};
  if (::fstat(file.handle(), &status) == 0 && (status.st_mode & 077) != 0) {
    if (::fchmod(file.handle(), 0600) == 0)
      spdlog::warn("API key file {}: was readable by others (mode {:o}); made readable by its owner only",
                   path.toStdString(), status.st_mode & 0777);
    else
      spdlog::error("API key file {}: is readable by others (mode {:o}) and cannot be changed", path.toStdString(),
                    status.st_mode & 0777);
  }
  return QString::fromUtf8(file.readAll()).trimmed();
}

// Owner-only from the moment it exists: the key is created 0600, never widened and narrowed.
void write_api_key(const QString& path, const QString& key) {
  if (key.isEmpty()) {
    QFile::remove(path);
    return;
  }
  QDir().mkpath(QFileInfo(path).absolutePath());
  const QByteArray bytes = key.toUtf8();
  const int descriptor = ::open(QFile::encodeName(path).constData(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (descriptor < 0 || ::fchmod(descriptor, 0600) != 0 ||
      ::write(descriptor, bytes.constData(), static_cast<size_t>(bytes.size())) != bytes.size()) {
    spdlog::error("API key file {}: cannot be written", path.toStdString());
  }
  if (descriptor >= 0) ::close(descriptor);
}

}  // namespace

const char* to_string(ContextOverflowPolicy policy) {
  switch (policy) {
    case ContextOverflowPolicy::Stop: return "stop";
    case ContextOverflowPolicy::DropOldestTurns: return "drop_oldest_turns";
  }
  return "?";
}

ContextOverflowPolicy context_overflow_policy_from_string(const QString& text) {
  const QString key = text.trimmed().toLower();
  if (key == QLatin1String("stop")) return ContextOverflowPolicy::Stop;
  if (key == QLatin1String("drop_oldest_turns") || key == QLatin1String("drop"))
    return ContextOverflowPolicy::DropOldestTurns;
  throw std::invalid_argument("unknown context overflow policy '" + text.toStdString() +
                              "' (expected stop or drop_oldest_turns)");
}

namespace {

// All keys live under one group so that the GUI's window geometry etc. can share the same file.
const QString kGroup = QStringLiteral("chat");

std::string file_of(const QSettings& settings) { return settings.fileName().toStdString(); }

// Reads a number; a missing key keeps the default, garbage keeps it with a warning, and a value outside
// [low, high] is clamped with a warning.
template <typename T>
T read_clamped(QSettings& settings, const char* key, T fallback, T low, T high) {
  const QVariant value = settings.value(QLatin1String(key));
  if (!value.isValid()) return fallback;
  bool ok = false;
  T parsed{};
  if constexpr (std::is_floating_point_v<T>) {
    parsed = static_cast<T>(value.toString().trimmed().toDouble(&ok));
    if (ok && !(parsed == parsed)) ok = false;  // NaN
  } else if constexpr (std::is_unsigned_v<T>) {
    parsed = static_cast<T>(value.toString().trimmed().toULongLong(&ok));
  } else {
    const qlonglong wide = value.toString().trimmed().toLongLong(&ok);
    // Clamp in the wide type first: an int key holding 1e12 must become `high`, not wrap around.
    if (ok) {
      const qlonglong clamped = std::clamp<qlonglong>(wide, static_cast<qlonglong>(low), static_cast<qlonglong>(high));
      if (clamped != wide)
        spdlog::warn("settings {}: {}/{} = {} is out of range [{}, {}]; using {}", file_of(settings),
                     kGroup.toStdString(), key, wide, low, high, clamped);
      return static_cast<T>(clamped);
    }
  }
  if (!ok) {
    spdlog::warn("settings {}: {}/{} = '{}' is not a number; using the default {}", file_of(settings),
                 kGroup.toStdString(), key, value.toString().toStdString(), fallback);
    return fallback;
  }
  const T clamped = std::clamp(parsed, low, high);
  if (clamped != parsed)
    spdlog::warn("settings {}: {}/{} = {} is out of range [{}, {}]; using {}", file_of(settings), kGroup.toStdString(),
                 key, parsed, low, high, clamped);
  return clamped;
}

bool read_bool(QSettings& settings, const char* key, bool fallback) {
  const QVariant value = settings.value(QLatin1String(key));
  if (!value.isValid()) return fallback;
  const QString text = value.toString().trimmed().toLower();
  if (text == QLatin1String("true") || text == QLatin1String("1") || text == QLatin1String("on") ||
      text == QLatin1String("yes"))
    return true;
  if (text == QLatin1String("false") || text == QLatin1String("0") || text == QLatin1String("off") ||
      text == QLatin1String("no"))
    return false;
  spdlog::warn("settings {}: {}/{} = '{}' is not a boolean; using the default {}", file_of(settings),
               kGroup.toStdString(), key, text.toStdString(), fallback);
  return fallback;
}

}  // namespace

int ChatSettings::max_threads() { return max_compute_threads(); }

ChatSettings ChatSettings::load(QSettings& settings) {
  ChatSettings defaults;
  ChatSettings loaded;
  settings.beginGroup(kGroup);
  loaded.kv_cache_enabled = read_bool(settings, "kv_cache_enabled", defaults.kv_cache_enabled);
  loaded.temperature = read_clamped(settings, "temperature", defaults.temperature, 0.0, 5.0);
  loaded.top_k = read_clamped(settings, "top_k", defaults.top_k, 0, 1 << 20);
  loaded.top_p = read_clamped(settings, "top_p", defaults.top_p, 0.0, 1.0);
  loaded.min_p = read_clamped(settings, "min_p", defaults.min_p, 0.0, 1.0);
  loaded.repetition_penalty = read_clamped(settings, "repetition_penalty", defaults.repetition_penalty, 0.1, 10.0);
  loaded.seed = read_clamped<quint64>(settings, "seed", defaults.seed, 0, ChatSettings::kMaxSeed);
  loaded.max_new_tokens = read_clamped(settings, "max_new_tokens", defaults.max_new_tokens, 1, 1 << 20);
  loaded.default_system_prompt =
      settings.value(QStringLiteral("default_system_prompt"), defaults.default_system_prompt).toString();
  // "model_path" replaced "model_directory" when GGUF files became loadable: a file written before keeps its model.
  const QVariant model_path = settings.value(QStringLiteral("model_path"));
  loaded.model_path =
      (model_path.isValid() ? model_path : settings.value(QStringLiteral("model_directory"), defaults.model_path))
          .toString();
  loaded.threads = read_clamped(settings, "threads", defaults.threads, 0, max_threads());
  loaded.context_limit = read_clamped(settings, "context_limit", defaults.context_limit, 0, 1 << 24);
  loaded.draft_model_path = settings.value(QStringLiteral("draft_model_path"), defaults.draft_model_path).toString();
  const QVariant kv_dtype = settings.value(QStringLiteral("kv_cache_dtype"));
  if (kv_dtype.isValid()) {
    try {
      loaded.kv_dtype = kvchat::kv_dtype_from_string(kv_dtype.toString().toStdString());
    } catch (const std::invalid_argument& error) {
      spdlog::warn("settings {}: {}/kv_cache_dtype: {}; using the default", file_of(settings), kGroup.toStdString(),
                   error.what());
    }
  }
  const QVariant speculative = settings.value(QStringLiteral("speculative_decoding"));
  if (speculative.isValid()) {
    try {
      loaded.speculative = kvchat::speculative_mode_from_string(speculative.toString().toStdString());
    } catch (const std::invalid_argument& error) {
      spdlog::warn("settings {}: {}/speculative_decoding: {}; using the default", file_of(settings),
                   kGroup.toStdString(), error.what());
    }
  }
  const QVariant overflow = settings.value(QStringLiteral("context_overflow"));
  if (overflow.isValid()) {
    try {
      loaded.context_overflow = context_overflow_policy_from_string(overflow.toString());
    } catch (const std::invalid_argument& error) {
      spdlog::warn("settings {}: {}/context_overflow: {}; using the default", file_of(settings), kGroup.toStdString(),
                   error.what());
    }
  }
  loaded.cache_budget_bytes = read_clamped<qint64>(settings, "cache_budget_bytes", defaults.cache_budget_bytes, 0,
                                                   std::numeric_limits<qint64>::max());
  loaded.kv_snapshots_enabled = read_bool(settings, "kv_snapshots_enabled", defaults.kv_snapshots_enabled);
  loaded.model_titles = read_bool(settings, "model_titles", defaults.model_titles);
  loaded.long_context = read_bool(settings, "long_context", defaults.long_context);
  loaded.snapshot_disk_budget_bytes =
      read_clamped<qint64>(settings, "snapshot_disk_budget_bytes", defaults.snapshot_disk_budget_bytes, 0,
                           std::numeric_limits<qint64>::max());
  loaded.snapshot_directory =
      settings.value(QStringLiteral("snapshot_directory"), defaults.snapshot_directory).toString();
  loaded.font_point_size =
      read_clamped<int>(settings, "font_point_size", defaults.font_point_size, 0, ChatSettings::kMaxFontPointSize);
  loaded.export_directory = settings.value(QStringLiteral("export_directory")).toString();
  loaded.appearance = settings.value(QStringLiteral("appearance"), defaults.appearance).toString();
  if (loaded.appearance != QLatin1String("system") && loaded.appearance != QLatin1String("light") &&
      loaded.appearance != QLatin1String("dark")) {
    spdlog::warn("settings {}: appearance '{}' is none of system, light, dark; following the system", file_of(settings),
                 loaded.appearance.toStdString());
    loaded.appearance = defaults.appearance;
  }
  const QString backend = settings.value(QStringLiteral("backend"), QStringLiteral("local")).toString();
  if (backend != QLatin1String("local") && backend != QLatin1String("remote"))
    spdlog::warn("settings {}: backend '{}' is neither local nor remote; using local", file_of(settings),
                 backend.toStdString());
  loaded.backend = backend == QLatin1String("remote") ? BackendKind::Remote : BackendKind::Local;
  loaded.remote_base_url = settings.value(QStringLiteral("remote_base_url")).toString();
  loaded.remote_model = settings.value(QStringLiteral("remote_model")).toString();
  loaded.remote_idle_timeout_s = read_clamped(settings, "remote_idle_timeout_s", defaults.remote_idle_timeout_s, 1,
                                              ChatSettings::kMaxRemoteTimeout);
  loaded.remote_reply_timeout_s = read_clamped(settings, "remote_reply_timeout_s", defaults.remote_reply_timeout_s, 1,
                                               ChatSettings::kMaxRemoteTimeout);
  settings.endGroup();
  loaded.remote_api_key = read_api_key(api_key_path(settings));
  return loaded;
}

void ChatSettings::save(QSettings& settings) const {
  settings.beginGroup(kGroup);
  settings.setValue(QStringLiteral("kv_cache_enabled"), kv_cache_enabled);
  settings.setValue(QStringLiteral("kv_cache_dtype"), QString::fromLatin1(kvchat::to_string(kv_dtype)));
  settings.setValue(QStringLiteral("speculative_decoding"), QString::fromLatin1(kvchat::to_string(speculative)));
  settings.setValue(QStringLiteral("draft_model_path"), draft_model_path);
  settings.setValue(QStringLiteral("temperature"), temperature);
  settings.setValue(QStringLiteral("top_k"), top_k);
  settings.setValue(QStringLiteral("top_p"), top_p);
  settings.setValue(QStringLiteral("min_p"), min_p);
  settings.setValue(QStringLiteral("repetition_penalty"), repetition_penalty);
  // As text: a 64-bit seed must survive formats that only know doubles.
  settings.setValue(QStringLiteral("seed"), QString::number(seed));
  settings.setValue(QStringLiteral("max_new_tokens"), max_new_tokens);
  settings.setValue(QStringLiteral("default_system_prompt"), default_system_prompt);
  settings.setValue(QStringLiteral("model_path"), model_path);
  settings.remove(QStringLiteral("model_directory"));  // superseded by model_path
  settings.setValue(QStringLiteral("threads"), threads);
  settings.setValue(QStringLiteral("context_limit"), context_limit);
  settings.setValue(QStringLiteral("context_overflow"), QString::fromLatin1(to_string(context_overflow)));
  settings.setValue(QStringLiteral("cache_budget_bytes"), QString::number(cache_budget_bytes));
  settings.setValue(QStringLiteral("kv_snapshots_enabled"), kv_snapshots_enabled);
  settings.setValue(QStringLiteral("model_titles"), model_titles);
  settings.setValue(QStringLiteral("long_context"), long_context);
  settings.setValue(QStringLiteral("snapshot_disk_budget_bytes"), QString::number(snapshot_disk_budget_bytes));
  settings.setValue(QStringLiteral("snapshot_directory"), snapshot_directory);
  settings.setValue(QStringLiteral("font_point_size"), font_point_size);
  settings.setValue(QStringLiteral("export_directory"), export_directory);
  settings.setValue(QStringLiteral("appearance"), appearance);
  settings.setValue(QStringLiteral("backend"), QString::fromLatin1(to_string(backend)));
  settings.setValue(QStringLiteral("remote_base_url"), remote_base_url);
  settings.setValue(QStringLiteral("remote_model"), remote_model);
  settings.setValue(QStringLiteral("remote_idle_timeout_s"), remote_idle_timeout_s);
  settings.setValue(QStringLiteral("remote_reply_timeout_s"), remote_reply_timeout_s);
  settings.endGroup();
  write_api_key(api_key_path(settings), remote_api_key);
  settings.sync();
  if (settings.status() != QSettings::NoError)
    spdlog::error("settings {}: could not be written (status {})", file_of(settings),
                  static_cast<int>(settings.status()));
}

kvchat::GenerationConfig ChatSettings::to_generation_config() const {
  kvchat::GenerationConfig config;
  config.max_new_tokens = max_new_tokens;
  config.cache_mode = kv_cache_enabled ? kvchat::KvCacheMode::Contiguous : kvchat::KvCacheMode::Off;
  config.kv_dtype = kv_dtype;
  config.speculative.mode = speculative;
  config.sampling.temperature = static_cast<float>(temperature);
  config.sampling.top_k = top_k;
  config.sampling.top_p = static_cast<float>(top_p);
  config.sampling.min_p = static_cast<float>(min_p);
  config.sampling.repetition_penalty = static_cast<float>(repetition_penalty);
  // Seed 0 means "surprise me": each turn (each call) draws its own, never 0, so the reply can still be
  // reproduced from the seed saved with it.
  config.sampling.seed =
      seed != 0 ? std::min(seed, kMaxSeed) : ((QRandomGenerator::global()->generate64() & kMaxSeed) | 1u);
  return config;
}

namespace {
qint64 read_physical_memory_bytes() {
  QFile meminfo(QStringLiteral("/proc/meminfo"));
  if (meminfo.open(QIODevice::ReadOnly | QIODevice::Text)) {
    while (!meminfo.atEnd()) {
      const QByteArray line = meminfo.readLine();
      if (!line.startsWith("MemTotal:")) continue;
      const QList<QByteArray> fields = line.simplified().split(' ');  // "MemTotal:", "16318412", "kB"
      bool ok = false;
      const qint64 kib = fields.size() >= 2 ? fields[1].toLongLong(&ok) : 0;
      if (ok && kib > 0) return kib * 1024;
    }
  }
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page_size > 0) return static_cast<qint64>(pages) * page_size;
  return 0;
}
}  // namespace

// Read once: the window's gauge asks after every turn, and the machine's memory does not change meanwhile.
qint64 physical_memory_bytes() {
  static const qint64 bytes = read_physical_memory_bytes();
  return bytes;
}

qint64 ChatSettings::effective_cache_budget_bytes() const {
  if (cache_budget_bytes > 0) return cache_budget_bytes;
  // A quarter of RAM leaves room for the weights, the GUI and everything else on the machine.
  const qint64 physical = physical_memory_bytes();
  constexpr qint64 kFallback = qint64(1) << 30;  // 1 GiB when the machine will not say
  return physical > 0 ? physical / 4 : kFallback;
}

QString snapshot_key_prefix(const QString& database_path) {
  const QByteArray identity = QFileInfo(database_path).absoluteFilePath().toUtf8();
  return QStringLiteral("d") +
         QString::fromLatin1(QCryptographicHash::hash(identity, QCryptographicHash::Sha1).toHex().left(12));
}

QString ChatSettings::effective_snapshot_directory() const {
  return snapshot_directory.isEmpty() ? app_data_directory() + QStringLiteral("/kv-snapshots") : snapshot_directory;
}

const char* to_string(BackendKind kind) { return kind == BackendKind::Remote ? "remote" : "local"; }

QString ChatSettings::api_key_path(const QSettings& settings) {
  return QFileInfo(settings.fileName()).absoluteDir().filePath(QStringLiteral("kvchat-api-key"));
}

QString read_key_file(const QString& path) { return read_api_key(path); }
void write_key_file(const QString& path, const QString& key) { write_api_key(path, key); }

QJsonObject ChatSettings::to_json() const {
  QJsonObject json;
  json.insert(QStringLiteral("cache_mode"),
              QString::fromLatin1(
                  kvchat::to_string(kv_cache_enabled ? kvchat::KvCacheMode::Contiguous : kvchat::KvCacheMode::Off)));
  if (kv_dtype != kvchat::KvDtype::F32)
    json.insert(QStringLiteral("kv_cache_dtype"), QString::fromLatin1(kvchat::to_string(kv_dtype)));
  json.insert(QStringLiteral("speculative_decoding"), QString::fromLatin1(kvchat::to_string(speculative)));
  if (speculative == kvchat::SpeculativeMode::DraftModel)
    json.insert(QStringLiteral("draft_model_path"), draft_model_path);
  json.insert(QStringLiteral("temperature"), temperature);
  json.insert(QStringLiteral("top_k"), top_k);
  json.insert(QStringLiteral("top_p"), top_p);
  json.insert(QStringLiteral("min_p"), min_p);
  json.insert(QStringLiteral("repetition_penalty"), repetition_penalty);
  json.insert(QStringLiteral("seed"), QString::number(seed));  // text: JSON numbers lose 64-bit precision
  json.insert(QStringLiteral("max_new_tokens"), max_new_tokens);
  json.insert(QStringLiteral("threads"), threads);
  json.insert(QStringLiteral("context_limit"), context_limit);
  if (long_context) json.insert(QStringLiteral("long_context"), true);  // only where set: older replies stay alike
  json.insert(QStringLiteral("context_overflow"), QString::fromLatin1(to_string(context_overflow)));
  json.insert(QStringLiteral("model_path"), model_path);
  return json;
}

}  // namespace kvchat::app
