// ChatSettings through a QSettings ini file, its mapping onto GenerationConfig, and the stats JSON format.
#include <unistd.h>

#include <QTemporaryDir>
#include <QtTest>
#include "common/test_suite.h"

#include "app/settings.h"
#include "app/store/message_stats_json.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_settings {

using kvchat::app::ChatSettings;
using kvchat::app::ContextOverflowPolicy;

class SettingsTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void defaults_from_an_empty_file();
  void save_load_round_trip();
  void out_of_range_and_garbage_are_clamped_or_ignored();
  void model_path_reads_the_old_model_directory_key();
  void generation_config_mapping();
  void zero_seed_draws_a_fresh_seed_each_turn();
  void cache_budget();
  void settings_json_for_messages();
  void stats_json_round_trip();
  void stats_json_rejects_damaged_records();
};

void SettingsTest::defaults_from_an_empty_file() {
  QTemporaryDir dir;
  QSettings ini(dir.filePath(QStringLiteral("empty.ini")), QSettings::IniFormat);
  const ChatSettings loaded = ChatSettings::load(ini);
  const ChatSettings defaults;
  QCOMPARE(loaded.kv_cache_enabled, true);
  QCOMPARE(loaded.temperature, defaults.temperature);
  QCOMPARE(loaded.top_k, defaults.top_k);
  QCOMPARE(loaded.top_p, defaults.top_p);
  QCOMPARE(loaded.min_p, defaults.min_p);
  QCOMPARE(loaded.repetition_penalty, defaults.repetition_penalty);
  QCOMPARE(loaded.seed, quint64(0));
  QCOMPARE(loaded.max_new_tokens, defaults.max_new_tokens);
  QCOMPARE(loaded.default_system_prompt, QString());
  QCOMPARE(loaded.model_path, QString());
  QCOMPARE(loaded.threads, 0);
  QCOMPARE(loaded.context_limit, 0);
  QCOMPARE(loaded.long_context, false);
  QCOMPARE(loaded.context_overflow, ContextOverflowPolicy::Stop);
  QCOMPARE(loaded.cache_budget_bytes, qint64(0));
}

void SettingsTest::save_load_round_trip() {
  QTemporaryDir dir;
  const QString path = dir.filePath(QStringLiteral("kvchat.ini"));
  ChatSettings saved;
  saved.kv_cache_enabled = false;
  saved.kv_dtype = kvchat::KvDtype::Q8_0;
  saved.speculative = kvchat::SpeculativeMode::DraftModel;
  saved.draft_model_path = QStringLiteral("/models/small, q4.gguf");
  saved.temperature = 1.25;
  saved.top_k = 7;
  saved.top_p = 0.5;
  saved.min_p = 0.125;
  saved.repetition_penalty = 1.3;
  saved.seed = 9223372036854775783ull;  // the largest prime below 2^63: must not pass through a double
  saved.max_new_tokens = 999;
  saved.default_system_prompt = QStringLiteral("Be kind.\nUse \"quotes\", commas, = signs; and ünïcode.");
  saved.model_path = QStringLiteral("/models/My Llama, v2");
  saved.threads = 3;
  saved.context_limit = 2048;
  saved.long_context = true;
  saved.context_overflow = ContextOverflowPolicy::DropOldestTurns;
  saved.cache_budget_bytes = 6LL * 1024 * 1024 * 1024;
  saved.export_directory = QStringLiteral("/home/me/Chats, exported");
  saved.appearance = QStringLiteral("dark");
  {
    QSettings ini(path, QSettings::IniFormat);
    saved.save(ini);
  }
  QSettings ini(path, QSettings::IniFormat);
  const ChatSettings loaded = ChatSettings::load(ini);
  QCOMPARE(loaded.kv_cache_enabled, saved.kv_cache_enabled);
  QCOMPARE(loaded.kv_dtype, kvchat::KvDtype::Q8_0);
  QCOMPARE(loaded.to_generation_config().kv_dtype, kvchat::KvDtype::Q8_0);
  QCOMPARE(loaded.to_json().value(QStringLiteral("kv_cache_dtype")).toString(), QStringLiteral("q8_0"));
  QCOMPARE(loaded.speculative, saved.speculative);
  QCOMPARE(loaded.draft_model_path, saved.draft_model_path);
  QCOMPARE(loaded.temperature, saved.temperature);
  QCOMPARE(loaded.top_k, saved.top_k);
  QCOMPARE(loaded.top_p, saved.top_p);
  QCOMPARE(loaded.min_p, saved.min_p);
  QCOMPARE(loaded.repetition_penalty, saved.repetition_penalty);
  QCOMPARE(loaded.seed, saved.seed);
  QCOMPARE(loaded.max_new_tokens, saved.max_new_tokens);
  QCOMPARE(loaded.default_system_prompt, saved.default_system_prompt);
  QCOMPARE(loaded.model_path, saved.model_path);
  QCOMPARE(loaded.threads, saved.threads);
  QCOMPARE(loaded.context_limit, saved.context_limit);
  QCOMPARE(loaded.long_context, true);
  QCOMPARE(loaded.context_overflow, saved.context_overflow);
  QCOMPARE(loaded.cache_budget_bytes, saved.cache_budget_bytes);
  QCOMPARE(loaded.export_directory, saved.export_directory);
  QCOMPARE(loaded.appearance, saved.appearance);
}

void SettingsTest::out_of_range_and_garbage_are_clamped_or_ignored() {
  QTemporaryDir dir;
  const QString path = dir.filePath(QStringLiteral("bad.ini"));
  {
    QFile file(path);
    QVERIFY(file.open(QIODevice::WriteOnly));
    file.write(
        "[chat]\n"
        "temperature=99\n"
        "top_p=-0.5\n"
        "min_p=abc\n"
        "top_k=-3\n"
        "max_new_tokens=0\n"
        "threads=100000000000\n"
        "kv_cache_enabled=maybe\n"
        "kv_cache_dtype=q3\n"
        "context_overflow=explode\n"
        "cache_budget_bytes=-5\n"
        "seed=not-a-seed\n"
        "appearance=purple\n");
  }
  QSettings ini(path, QSettings::IniFormat);
  const ChatSettings loaded = ChatSettings::load(ini);
  const ChatSettings defaults;
  QCOMPARE(loaded.temperature, 5.0);
  QCOMPARE(loaded.top_p, 0.0);
  QCOMPARE(loaded.min_p, defaults.min_p);
  QCOMPARE(loaded.top_k, 0);
  QCOMPARE(loaded.max_new_tokens, 1);
  QCOMPARE(loaded.kv_dtype, kvchat::KvDtype::F32);
  QCOMPARE(loaded.threads, ChatSettings::max_threads());
  QCOMPARE(loaded.kv_cache_enabled, defaults.kv_cache_enabled);
  QCOMPARE(loaded.context_overflow, ContextOverflowPolicy::Stop);
  QCOMPARE(loaded.cache_budget_bytes, qint64(0));
  QCOMPARE(loaded.seed, quint64(0));
  QCOMPARE(loaded.appearance, QStringLiteral("system"));
}

void SettingsTest::model_path_reads_the_old_model_directory_key() {
  QTemporaryDir dir;
  const QString path = dir.filePath(QStringLiteral("old.ini"));
  {
    QFile file(path);
    QVERIFY(file.open(QIODevice::WriteOnly));
    file.write("[chat]\nmodel_directory=/models/old llama\ntemperature=0.5\n");
  }
  {
    QSettings ini(path, QSettings::IniFormat);
    ChatSettings loaded = ChatSettings::load(ini);
    QCOMPARE(loaded.model_path, QStringLiteral("/models/old llama"));  // a file written before model_path existed
    QCOMPARE(loaded.temperature, 0.5);
    loaded.model_path = QStringLiteral("/models/stories-Q8_0.gguf");
    loaded.save(ini);
  }
  QSettings ini(path, QSettings::IniFormat);
  QCOMPARE(ChatSettings::load(ini).model_path, QStringLiteral("/models/stories-Q8_0.gguf"));
  QCOMPARE(ini.value(QStringLiteral("chat/model_path")).toString(), QStringLiteral("/models/stories-Q8_0.gguf"));
  QVERIFY(!ini.contains(QStringLiteral("chat/model_directory")));  // the old key is gone once saved

  // Both keys present (an older version wrote its key again): the new one wins.
  ini.setValue(QStringLiteral("chat/model_directory"), QStringLiteral("/models/other"));
  QCOMPARE(ChatSettings::load(ini).model_path, QStringLiteral("/models/stories-Q8_0.gguf"));
  // Saved empty (the embedded model) is not replaced by the old key.
  ChatSettings embedded;
  embedded.save(ini);
  ini.setValue(QStringLiteral("chat/model_directory"), QStringLiteral("/models/other"));
  QCOMPARE(ChatSettings::load(ini).model_path, QString());
}

void SettingsTest::generation_config_mapping() {
  ChatSettings settings;
  settings.temperature = 0.8;
  settings.top_k = 12;
  settings.top_p = 0.75;
  settings.min_p = 0.25;
  settings.repetition_penalty = 1.5;
  settings.seed = 4242;
  settings.max_new_tokens = 77;
  kvchat::GenerationConfig on = settings.to_generation_config();
  QCOMPARE(on.cache_mode, kvchat::KvCacheMode::Contiguous);
  QCOMPARE(on.max_new_tokens, 77);
  QCOMPARE(on.sampling.temperature, 0.8f);
  QCOMPARE(on.sampling.top_k, 12);
  QCOMPARE(on.sampling.top_p, 0.75f);
  QCOMPARE(on.sampling.min_p, 0.25f);
  QCOMPARE(on.sampling.repetition_penalty, 1.5f);
  QCOMPARE(on.sampling.seed, std::uint64_t(4242));
  settings.kv_cache_enabled = false;
  QCOMPARE(settings.to_generation_config().cache_mode, kvchat::KvCacheMode::Off);
}

void SettingsTest::zero_seed_draws_a_fresh_seed_each_turn() {
  ChatSettings settings;
  settings.seed = 0;
  QSet<std::uint64_t> seeds;
  for (int i = 0; i < 8; ++i) {
    const std::uint64_t seed = settings.to_generation_config().sampling.seed;
    QVERIFY(seed != 0);
    seeds.insert(seed);
  }
  // 64-bit random draws: eight equal ones would mean the seed is not fresh.
  QVERIFY(seeds.size() > 1);
}

void SettingsTest::cache_budget() {
  ChatSettings settings;
  settings.cache_budget_bytes = 123456789;
  QCOMPARE(settings.effective_cache_budget_bytes(), qint64(123456789));
  settings.cache_budget_bytes = 0;
  // Independent of /proc/meminfo: the C library's own count of physical pages.
  const qint64 physical = static_cast<qint64>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGESIZE);
  QVERIFY(physical > 0);
  QCOMPARE(kvchat::app::physical_memory_bytes(), physical);
  QCOMPARE(settings.effective_cache_budget_bytes(), physical / 4);
}

void SettingsTest::settings_json_for_messages() {
  ChatSettings settings;
  settings.kv_cache_enabled = false;
  settings.temperature = 0.25;
  settings.top_k = 5;
  settings.seed = 9007199254740993ull;  // 2^53 + 1: not representable as a double
  settings.context_overflow = ContextOverflowPolicy::DropOldestTurns;
  const QJsonObject json = settings.to_json();
  QCOMPARE(json.value(QStringLiteral("cache_mode")).toString(), QStringLiteral("off"));
  QCOMPARE(json.value(QStringLiteral("temperature")).toDouble(), 0.25);
  QCOMPARE(json.value(QStringLiteral("top_k")).toInt(), 5);
  QCOMPARE(json.value(QStringLiteral("seed")).toString(), QStringLiteral("9007199254740993"));
  QCOMPARE(json.value(QStringLiteral("context_overflow")).toString(), QStringLiteral("drop_oldest_turns"));
  QCOMPARE(json.value(QStringLiteral("max_new_tokens")).toInt(), settings.max_new_tokens);
  QCOMPARE(json.value(QStringLiteral("model_path")).toString(), QString());
  QVERIFY(!json.contains(QStringLiteral("long_context")));  // only where set: earlier replies' records stay alike
  settings.long_context = true;
  QCOMPARE(settings.to_json().value(QStringLiteral("long_context")).toBool(), true);
  QCOMPARE(json.value(QStringLiteral("speculative_decoding")).toString(), QStringLiteral("none"));
  settings.speculative = kvchat::SpeculativeMode::Lookup;
  QCOMPARE(settings.to_json().value(QStringLiteral("speculative_decoding")).toString(), QStringLiteral("lookup"));
  QCOMPARE(settings.to_generation_config().speculative.mode, kvchat::SpeculativeMode::Lookup);
  QCOMPARE(kvchat::app::context_overflow_policy_from_string(QStringLiteral("drop_oldest_turns")),
           ContextOverflowPolicy::DropOldestTurns);
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument,
                           kvchat::app::context_overflow_policy_from_string(QStringLiteral("sometimes")));
}

void SettingsTest::stats_json_round_trip() {
  kvchat::GenerationStats stats;
  stats.prompt_tokens = 300;
  stats.reused_tokens = 280;
  stats.restored_tokens = 250;
  stats.restore_ms = 12.5;
  stats.restored_from = "d0123456789ab-7";
  stats.prefilled_tokens = 20;
  stats.generated_tokens = 64;
  stats.prefill_ms = 1.5;
  stats.ttft_ms = 2.25;
  stats.decode_ms = 80.125;
  stats.prefill_tokens_per_second = 13333.5;
  stats.decode_tokens_per_second = 798.75;
  stats.cache_tokens = 364;
  stats.cache_bytes = 5LL * 1024 * 1024 * 1024;  // beyond 32 bits
  stats.cache_capacity_tokens = 512;
  stats.cache_mode = kvchat::KvCacheMode::Naive;
  stats.stop_reason = kvchat::StopReason::ContextFull;
  const QJsonObject json = kvchat::app::stats_to_json(stats);
  const QStringList keys{"prompt_tokens", "reused_tokens",    "restored_tokens",       "restore_ms",
                         "restored_from", "prefilled_tokens", "generated_tokens",      "prefill_ms",
                         "ttft_ms",       "decode_ms",        "prefill_tok_s",         "decode_tok_s",
                         "cache_tokens",  "cache_bytes",      "cache_capacity_tokens", "cache_mode",
                         "stop_reason"};
  QStringList actual_keys = json.keys();
  QStringList expected_keys = keys;
  actual_keys.sort();
  expected_keys.sort();
  QCOMPARE(actual_keys, expected_keys);
  QCOMPARE(json.value(QStringLiteral("cache_mode")).toString(), QStringLiteral("naive"));
  QCOMPARE(json.value(QStringLiteral("stop_reason")).toString(), QStringLiteral("context_full"));
  QCOMPARE(json.value(QStringLiteral("decode_tok_s")).toDouble(), 798.75);

  const kvchat::GenerationStats back = kvchat::app::stats_from_json(json);
  QCOMPARE(back.prompt_tokens, stats.prompt_tokens);
  QCOMPARE(back.reused_tokens, stats.reused_tokens);
  QCOMPARE(back.restored_tokens, stats.restored_tokens);
  QCOMPARE(back.restore_ms, stats.restore_ms);
  QCOMPARE(back.restored_from, stats.restored_from);
  QCOMPARE(back.prefilled_tokens, stats.prefilled_tokens);
  QCOMPARE(back.generated_tokens, stats.generated_tokens);
  QCOMPARE(back.prefill_ms, stats.prefill_ms);
  QCOMPARE(back.ttft_ms, stats.ttft_ms);
  QCOMPARE(back.decode_ms, stats.decode_ms);
  QCOMPARE(back.prefill_tokens_per_second, stats.prefill_tokens_per_second);
  QCOMPARE(back.decode_tokens_per_second, stats.decode_tokens_per_second);
  QCOMPARE(back.cache_tokens, stats.cache_tokens);
  QCOMPARE(back.cache_bytes, stats.cache_bytes);
  QCOMPARE(back.cache_capacity_tokens, stats.cache_capacity_tokens);
  QCOMPARE(back.cache_mode, stats.cache_mode);
  QCOMPARE(back.stop_reason, stats.stop_reason);

  // A speculative run's counts join the record, and come back.
  stats.drafted_tokens = 40;
  stats.accepted_tokens = 31;
  stats.draft_checks = 9;
  const QJsonObject speculative_json = kvchat::app::stats_to_json(stats);
  QCOMPARE(speculative_json.value(QStringLiteral("accepted_tokens")).toInt(), 31);
  const kvchat::GenerationStats speculative_back = kvchat::app::stats_from_json(speculative_json);
  QCOMPARE(speculative_back.drafted_tokens, 40);
  QCOMPARE(speculative_back.accepted_tokens, 31);
  QCOMPARE(speculative_back.draft_checks, 9);
  QVERIFY(kvchat::app::stats_summary(speculative_json)
              .contains(QStringLiteral("lookup: 31 of 40 proposed tokens accepted (78%)")));
  stats.drafted_tokens = stats.accepted_tokens = stats.draft_checks = 0;

  // Every stop reason and cache mode survives.
  for (auto reason : {kvchat::StopReason::Eos, kvchat::StopReason::MaxTokens, kvchat::StopReason::ContextFull,
                      kvchat::StopReason::Stopped}) {
    stats.stop_reason = reason;
    QCOMPARE(kvchat::app::stats_from_json(kvchat::app::stats_to_json(stats)).stop_reason, reason);
  }
  for (auto mode : {kvchat::KvCacheMode::Contiguous, kvchat::KvCacheMode::Naive, kvchat::KvCacheMode::Off}) {
    stats.cache_mode = mode;
    QCOMPARE(kvchat::app::stats_from_json(kvchat::app::stats_to_json(stats)).cache_mode, mode);
  }
  QCOMPARE(kvchat::app::stats_to_json(stats).value(QStringLiteral("cache_mode")).toString(), QStringLiteral("off"));
}

void SettingsTest::stats_json_rejects_damaged_records() {
  QJsonObject bad_mode{{QStringLiteral("cache_mode"), QStringLiteral("turbo")}};
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument, kvchat::app::stats_from_json(bad_mode));
  QJsonObject bad_reason{{QStringLiteral("stop_reason"), QStringLiteral("bored")}};
  try {
    kvchat::app::stats_from_json(bad_reason);
    QFAIL("an unknown stop reason was accepted");
  } catch (const std::invalid_argument& error) {
    QVERIFY2(QString::fromUtf8(error.what()).contains(QStringLiteral("'bored'")), error.what());
  }
  QJsonObject text_number{{QStringLiteral("generated_tokens"), QStringLiteral("12")}};
  try {
    kvchat::app::stats_from_json(text_number);
    QFAIL("a string token count was accepted");
  } catch (const std::invalid_argument& error) {
    QVERIFY2(QString::fromUtf8(error.what()).contains(QStringLiteral("generated_tokens")), error.what());
  }
  // An empty object is a reply without stats: defaults, and an empty summary line.
  QCOMPARE(kvchat::app::stats_from_json(QJsonObject()).generated_tokens, 0);
  QCOMPARE(kvchat::app::stats_summary(QJsonObject()), QString());
}

KVCHAT_TEST_GUILESS_MAIN(SettingsTest)

}  // namespace app_test_settings

#include "test_settings.moc"
