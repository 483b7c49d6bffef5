// kvchat-cli bench: the machine-readable output carries every figure, one line per configuration,
// and its cache-on/cache-off comparisons show identical tokens. (Speeds are printed, never asserted.)
#include <QtTest>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/cli_runner.h"

using kvchat::test::run_cli;
using kvchat::test::shared_path;

class CliBenchTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void json_lines_cover_every_configuration();
  void bad_options_are_refused_before_measuring();
  void bandwidth_probed_before_every_step();
};

void CliBenchTest::json_lines_cover_every_configuration() {
  auto result = run_cli({"bench", "--model", QString::fromStdString(shared_path("models/tiny-llama3-random")),
                         "--prompt-tokens", "5,20", "--new-tokens", "8", "--kv-cache", "on,naive,off", "--dtype",
                         "f32,bf16", "--threads", "1", "--json"});
  QVERIFY2(result.exit_code == 0, result.err.c_str());
  std::istringstream lines(result.out);
  std::string line;
  int rows = 0, speedups = 0, machines = 0;
  while (std::getline(lines, line)) {
    auto json = nlohmann::json::parse(line);
    if (json.contains("machine") || json.contains("machine_after")) {
      auto& machine = json.contains("machine") ? json["machine"] : json["machine_after"];
      QVERIFY(machine["read_bandwidth_gb_s"].get<double>() > 0);
      QVERIFY(machine["sgemm_gflop_s"].get<double>() > 0);
      ++machines;
    } else if (json.contains("speedup")) {
      QVERIFY2(json["speedup"]["identical_tokens"].get<bool>(), line.c_str());
      ++speedups;
    } else {
      for (const char* field : {"prefill_tok_s", "decode_tok_s", "ttft_ms", "decode_tok_s_start", "decode_tok_s_end",
                                "cache_bytes", "peak_rss_bytes", "read_bandwidth_gb_s", "decode_fraction_of_bandwidth",
                                "prefill_fraction_of_sgemm", "weight_bytes"})
        QVERIFY2(json.contains(field), field);
      const long long prompt = json["prompt_tokens"].get<long long>();
      const long long expected_cache = json["kv_cache"] == "off" ? 0 : 2LL * 4 * 2 * 32 * (prompt + 8 - 1) * 4;
      QCOMPARE(json["cache_bytes"].get<long long>(), expected_cache);
      QVERIFY(json["weight_bytes"].get<long long>() > 0);
      // A model this small is not bound by memory: one probe before the row.
      QCOMPARE(json["bandwidth_probe"].get<std::string>(), std::string("row"));
      ++rows;
    }
  }
  QCOMPARE(machines, 2);
  QCOMPARE(rows, 2 * 2 * 3);
  QCOMPARE(speedups, 2 * 2);
}

void CliBenchTest::bad_options_are_refused_before_measuring() {
  auto result = run_cli({"bench", "--model", QString::fromStdString(shared_path("models/tiny-llama3-random")),
                         "--dtype", "f32,q8"});
  QCOMPARE(result.exit_code, 2);
  QVERIFY2(result.err.find("unknown weight dtype 'q8'") != std::string::npos, result.err.c_str());
  QVERIFY(result.out.empty());  // nothing measured or printed first
}

void CliBenchTest::bandwidth_probed_before_every_step() {
  // Forced on a small model (the default for models of 1 GiB or more): one probe per decode step,
  // and the row's bandwidth and fraction come from them.
  auto result = run_cli({"bench", "--model", QString::fromStdString(shared_path("models/tiny-llama3-random")),
                         "--prompt-tokens", "5", "--new-tokens", "6", "--kv-cache", "on", "--threads", "1",
                         "--bandwidth-probe", "step", "--json"});
  QVERIFY2(result.exit_code == 0, result.err.c_str());
  std::istringstream lines(result.out);
  std::string line;
  int rows = 0;
  while (std::getline(lines, line)) {
    auto json = nlohmann::json::parse(line);
    if (!json.contains("kv_cache")) continue;
    QCOMPARE(json["bandwidth_probe"].get<std::string>(), std::string("step"));
    QCOMPARE(json["bandwidth_probes"].get<int>(), 5);  // before each of the 5 steps after the first token
    QVERIFY(json["read_bandwidth_gb_s"].get<double>() > 0);
    QVERIFY(json["decode_fraction_of_bandwidth"].get<double>() > 0);
    QVERIFY(json["decode_tok_s"].get<double>() > 0);
    ++rows;
  }
  QCOMPARE(rows, 1);

  auto bad = run_cli({"bench", "--model", QString::fromStdString(shared_path("models/tiny-llama3-random")),
                      "--bandwidth-probe", "sometimes"});
  QCOMPARE(bad.exit_code, 2);
  QVERIFY2(bad.err.find("--bandwidth-probe must be auto, step or row") != std::string::npos, bad.err.c_str());
}

QTEST_GUILESS_MAIN(CliBenchTest)
#include "test_cli_bench.moc"
