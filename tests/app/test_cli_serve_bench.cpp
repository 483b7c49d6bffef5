// kvchat-cli serve-bench, small (2 clients x 3 requests on stories260K): every figure is there, in
// JSON and in text, and no request failed. Figures are printed, never compared with a time.
#include <QtTest>
#include "common/test_suite.h"

#include <nlohmann/json.hpp>

#include "common/cli_runner.h"
#include "common/test_paths.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_cli_serve_bench {

using nlohmann::json;

namespace {
QStringList small_run() {
  return {"serve-bench", "--model",   QString::fromStdString(kvchat::test::shared_path("models/stories260K")),
          "--clients",   "2",         "--requests",
          "3",           "--threads", "1"};
}
}  // namespace

class TestCliServeBench : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void json_has_every_figure_and_no_failure() {
    const auto result = kvchat::test::run_cli(small_run() << "--json");
    QVERIFY2(result.exit_code == 0, result.err.c_str());
    const json out = json::parse(result.out);
    qInfo("%s", result.out.c_str());
    QCOMPARE(out["requests"].get<int>(), 6);
    QCOMPARE(out["failed"].get<int>(), 0);
    QCOMPARE(out["clients"].get<int>(), 2);
    for (const char* key : {"requests_per_s", "generated_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "cached_share",
                            "peak_rss_mib", "kv_cache_peak_mib", "kv_cache_budget_mib", "wall_s"})
      QVERIFY2(out.contains(key) && out[key].is_number(), key);
    QVERIFY(out["generated_tokens"].get<int>() > 0);
    // Turns 2 and 3 of each conversation continue its cache.
    QVERIFY2(out["cached_tokens"].get<int>() > 0 && out["cached_share"].get<double>() > 0.0, result.out.c_str());
    QVERIFY(out["ttft_p99_ms"].get<double>() >= out["ttft_p50_ms"].get<double>());
    // The default --parallel 2: two clients' decode steps go through the batcher (every token but each reply's last
    // is a row of a step).
    QVERIFY2(out["batched_decode_rows"].get<int>() > 0, result.out.c_str());
    QVERIFY(out["batched_decode_steps"].get<int>() <= out["batched_decode_rows"].get<int>());
    QVERIFY(out["largest_decode_batch"].get<int>() >= 1 && out["largest_decode_batch"].get<int>() <= 2);
  }

  void text_names_every_figure() {
    const auto result = kvchat::test::run_cli(small_run());
    QVERIFY2(result.exit_code == 0, result.err.c_str());
    for (const char* line : {"requests: 6, failed 0,", "throughput: ", " requests/s, ", " generated tokens/s",
                             "ttft: p50 ", "cached tokens: ", "memory: peak RSS ", " budget ", "decode batches: "})
      QVERIFY2(result.out.find(line) != std::string::npos, (std::string(line) + " missing in:\n" + result.out).c_str());
  }

  void bad_option_is_a_clear_error() {
    const auto result = kvchat::test::run_cli({"serve-bench", "--clients", "0"});
    QVERIFY(result.exit_code != 0);
    QVERIFY2(result.err.find("--clients must be at least 1") != std::string::npos, result.err.c_str());
  }
};

KVCHAT_TEST_GUILESS_MAIN(TestCliServeBench)

}  // namespace app_test_cli_serve_bench

#include "test_cli_serve_bench.moc"
