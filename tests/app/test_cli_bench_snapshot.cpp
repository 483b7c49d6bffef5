// kvchat-cli bench --snapshot on stories260K: the text names every figure and says the ids after the
// restores equal those after the full prefill; the JSON line carries every figure, with the exact sizes
// of the snapshot files and of the restored prefix; the bench's files are gone afterwards (its temporary
// folder, or its own files in --cache-dir, nothing else). Speeds are printed, never asserted.
#include <QtTest>
#include "common/test_suite.h"

#include <QDirIterator>
#include <QFile>
#include <QTemporaryDir>

#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "common/cli_runner.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_cli_bench_snapshot {

using kvchat::test::run_cli;
using kvchat::test::shared_path;

namespace {

// stories260K: 5 layers x 4 KV heads x head_dim 8, an f32 cache: 2 x 5 x 4 x 8 x 4 = 1,280 bytes a token.
// A file: the 128-byte header and the int32 ids, padded to 64 bytes, then the K/V data.
long long snapshot_file_bytes(long long tokens) {
  const long long header_and_ids = 128 + 4 * tokens;
  return (header_and_ids + 63) / 64 * 64 + 1280 * tokens;
}

QStringList snapshot_bench_arguments() {
  return {"bench",           "--snapshot", "--model",      QString::fromStdString(shared_path("models/stories260K")),
          "--prompt-tokens", "64",         "--new-tokens", "8",
          "--threads",       "1"};
}

QStringList files_under(const QString& folder) {
  QStringList files;
  QDirIterator it(folder, QDir::Files | QDir::Hidden, QDirIterator::Subdirectories);
  while (it.hasNext()) files << it.next();
  return files;
}

}  // namespace

class CliBenchSnapshotTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void text_names_every_figure();
  void json_carries_every_figure_and_cache_dir_keeps_other_files();
  void bad_options_are_refused_before_measuring();
};

void CliBenchSnapshotTest::text_names_every_figure() {
  auto result = run_cli(snapshot_bench_arguments());
  QVERIFY2(result.exit_code == 0, result.err.c_str());
  const std::string& out = result.out;
  for (const char* expected :
       {"snapshot bench: 1 threads, kernels on, load average ",
        "(temporary, removed at the end)",
        "posix_fadvise(DONTNEED), best effort",
        "\nf32 (",
        "a 64-token conversation, then 8 new user tokens and 8-token replies",
        "  full prefill: ttft ",
        " ms, prefill ",
        "  snapshot: 64 tokens, 82304 bytes; capture ",
        " ms on the engine thread; write ",
        " MB/s (checksum, write, fsync, rename)",
        "  restore cold: ttft ",
        "  restore warm: ttft ",
        " ms, restore ",
        "64 tokens restored from snapshot-bench; ",
        "of the file in the page cache before",
        "  speedup (full prefill ttft / restore ttft): cold ",
        "x, warm ",
        "  ids identical: yes (the 8 ids after the cold and the warm restore against those after the full prefill)",
        "  decode: ",
        " tok/s with no write in flight, ",
        " tok/s with a snapshot write in flight (7 steps)",
        "  background write: 87 tokens, 111872 bytes; capture ",
        " on the store's thread; ",
        " of the 7 decode steps ran during it"})
    QVERIFY2(out.find(expected) != std::string::npos, (std::string("missing '") + expected + "' in:\n" + out).c_str());
  QVERIFY2(out.find("warning") == std::string::npos, out.c_str());
  QVERIFY2(out.find("ids identical: no") == std::string::npos, out.c_str());

  // The temporary folder it names is gone.
  const std::string marker = "snapshot folder: ";
  const std::size_t at = out.find(marker);
  QVERIFY(at != std::string::npos);
  const std::size_t end = out.find(" (", at);
  const QString folder = QString::fromStdString(out.substr(at + marker.size(), end - at - marker.size()));
  QVERIFY2(folder.contains("kvchat-snapshot-bench-"), qPrintable(folder));
  QVERIFY2(!QFileInfo::exists(folder), qPrintable(folder));
}

void CliBenchSnapshotTest::json_carries_every_figure_and_cache_dir_keeps_other_files() {
  QTemporaryDir cache;
  QVERIFY(cache.isValid());
  QFile other(cache.filePath("not-the-bench.txt"));
  QVERIFY(other.open(QIODevice::WriteOnly));
  other.write("stays");
  other.close();

  QStringList arguments = snapshot_bench_arguments();
  arguments << "--dtype"
            << "f32,bf16"
            << "--cache-dir" << cache.path() << "--json";
  auto result = run_cli(arguments);
  QVERIFY2(result.exit_code == 0, result.err.c_str());
  std::istringstream lines(result.out);
  std::vector<nlohmann::json> runs;
  int machines = 0;
  for (std::string line; std::getline(lines, line);) {
    auto json = nlohmann::json::parse(line);
    if (json.contains("snapshot_machine")) {
      QCOMPARE(json["snapshot_machine"]["folder"].get<std::string>(), cache.path().toStdString());
      QCOMPARE(json["snapshot_machine"]["temporary_folder"].get<bool>(), false);
      QCOMPARE(json["snapshot_machine"]["load_average"].size(), std::size_t(3));
      ++machines;
    } else {
      runs.push_back(json.at("snapshot_bench"));
    }
  }
  QCOMPARE(machines, 1);
  QCOMPARE(runs.size(), std::size_t(2));
  QCOMPARE(runs[0]["dtype"].get<std::string>(), std::string("f32"));
  QCOMPARE(runs[1]["dtype"].get<std::string>(), std::string("bf16"));
  for (const nlohmann::json& run : runs) {
    for (const char* field :
         {"prefill_ttft_ms", "prefill_tok_s", "capture_ms", "write_ms", "write_mb_s", "decode_tok_s_idle",
          "decode_tok_s_writing", "background_capture_ms", "background_write_ms"})
      QVERIFY2(run.at(field).get<double>() > 0, field);
    QVERIFY(run.contains("decode_tok_s_during_write") && run.contains("background_write_mb_s") &&
            run.contains("cache_drop"));
    QCOMPARE(run["snapshot_tokens"].get<long long>(), 64LL);
    QCOMPARE(run["file_bytes"].get<long long>(), snapshot_file_bytes(64));
    QCOMPARE(run["ids_identical"].get<bool>(), true);
    for (const char* phase : {"restore_cold", "restore_warm"}) {
      const nlohmann::json& restore = run.at(phase);
      QVERIFY2(restore["ids_identical"].get<bool>(), phase);
      QCOMPARE(restore["restored_tokens"].get<int>(), 64);
      QCOMPARE(restore["restored_from"].get<std::string>(), std::string("snapshot-bench"));
      for (const char* field : {"ttft_ms", "restore_ms", "restore_mb_s", "speedup", "resident_before"})
        QVERIFY2(restore.contains(field), field);
    }
    // After the warm restore's reply (64 + 8 + 7 fed) and one more reply (8 more fed): 87 tokens.
    QCOMPARE(run["background_tokens"].get<long long>(), 87LL);
    QCOMPARE(run["background_file_bytes"].get<long long>(), snapshot_file_bytes(87));
    QCOMPARE(run["decode_steps"].get<int>(), 7);
  }
  // The bench's snapshots are deleted; what was there before stays.
  QCOMPARE(files_under(cache.path()), QStringList{cache.filePath("not-the-bench.txt")});
}

void CliBenchSnapshotTest::bad_options_are_refused_before_measuring() {
  QStringList with_cache_mode = snapshot_bench_arguments();
  with_cache_mode << "--kv-cache"
                  << "on";
  auto cache_mode = run_cli(with_cache_mode);
  QCOMPARE(cache_mode.exit_code, 2);
  QVERIFY2(cache_mode.err.find("--kv-cache does not apply to --snapshot") != std::string::npos, cache_mode.err.c_str());
  QVERIFY(cache_mode.out.empty());

  auto cache_dir_alone = run_cli(
      {"bench", "--model", QString::fromStdString(shared_path("models/stories260K")), "--cache-dir", "/nonexistent"});
  QCOMPARE(cache_dir_alone.exit_code, 2);
  QVERIFY2(cache_dir_alone.err.find("--cache-dir is for --snapshot only") != std::string::npos,
           cache_dir_alone.err.c_str());

  // stories260K's context is 512 tokens: 500 + 8 + 3 x 8 does not fit.
  auto too_long = run_cli({"bench", "--snapshot", "--model", QString::fromStdString(shared_path("models/stories260K")),
                           "--prompt-tokens", "500", "--new-tokens", "8"});
  QCOMPARE(too_long.exit_code, 2);
  QVERIFY2(too_long.err.find("(532) does not fit the model's context of 512") != std::string::npos,
           too_long.err.c_str());
  QVERIFY(too_long.out.empty());
}

KVCHAT_TEST_GUILESS_MAIN(CliBenchSnapshotTest)

}  // namespace app_test_cli_bench_snapshot

#include "test_cli_bench_snapshot.moc"
