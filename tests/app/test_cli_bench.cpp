// kvchat-cli bench: the machine-readable output carries every figure, one line per configuration,
// and its cache-on/cache-off comparisons show identical tokens; --dtype q8_0,q4_k,... makes random weights in
// those GGUF types (exact weight bytes per type). (Speeds are printed, never asserted.)
#include <QtTest>
#include "common/test_suite.h"

#include <QFile>
#include <QTemporaryDir>

#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/cli_runner.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_cli_bench {

using kvchat::test::run_cli;
using kvchat::test::shared_path;

class CliBenchTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void json_lines_cover_every_configuration();
  void bad_options_are_refused_before_measuring();
  void kv_dtype_rows_count_their_bytes();
  void bandwidth_probed_before_every_step();
  void gguf_dtypes_make_random_weights_in_that_type();
  void gguf_dtype_errors();
  void speculative_pairs_report_acceptance_and_identity();
  void batched_decode_reports_each_width();
  void warmup_runs_before_each_row();

 private:
  QString write_tiny_config();
  QTemporaryDir dir_;
};

// hidden 256, intermediate 512: every row a whole number of 256-element K-quant blocks.
QString CliBenchTest::write_tiny_config() {
  const QString path = dir_.filePath("tiny-256.json");
  QFile file(path);
  if (!file.open(QIODevice::WriteOnly)) return QString();
  file.write(R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 64, "vocab_size": 512, "max_position_embeddings": 256, "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": false, "bos_token_id": 1,
    "eos_token_id": 2, "torch_dtype": "float32"})");
  return path;
}

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

// --warmup runs each row's configuration once before it, unmeasured: every row reports the warm-up's time, and the
// measured run is the row's alone (its cache holds its own tokens, cache on and off still agree). Without the flag
// no row warms up.
void CliBenchTest::warmup_runs_before_each_row() {
  for (const bool warmup : {true, false}) {
    QStringList args{"bench",
                     "--model",
                     QString::fromStdString(shared_path("models/tiny-llama3-random")),
                     "--prompt-tokens",
                     "5,20",
                     "--new-tokens",
                     "8",
                     "--kv-cache",
                     "on,off",
                     "--threads",
                     "1",
                     "--json"};
    if (warmup) args << "--warmup";
    auto result = run_cli(args);
    QVERIFY2(result.exit_code == 0, result.err.c_str());
    std::istringstream lines(result.out);
    std::string line;
    int rows = 0, speedups = 0;
    while (std::getline(lines, line)) {
      auto json = nlohmann::json::parse(line);
      if (json.contains("speedup")) {
        QVERIFY2(json["speedup"]["identical_tokens"].get<bool>(), line.c_str());
        ++speedups;
      } else if (json.contains("prompt_tokens")) {
        QVERIFY2(warmup ? json["warmup_ms"].get<double>() > 0.0 : json["warmup_ms"].get<double>() == 0.0, line.c_str());
        const long long prompt = json["prompt_tokens"].get<long long>();
        const long long expected_cache = json["kv_cache"] == "off" ? 0 : 2LL * 4 * 2 * 32 * (prompt + 8 - 1) * 4;
        QCOMPARE(json["cache_bytes"].get<long long>(), expected_cache);
        ++rows;
      }
    }
    QCOMPARE(rows, 4);
    QCOMPARE(speedups, 2);
  }
}

// One row per KV dtype; each counts its own bytes per token (4 layers x K and V x 2 KV heads x a row of 32
// values: 4, 2 and 34 bytes), and cache on and off give the same tokens in every dtype.
void CliBenchTest::kv_dtype_rows_count_their_bytes() {
  auto result = run_cli({"bench", "--model", QString::fromStdString(shared_path("models/tiny-llama3-random")),
                         "--prompt-tokens", "20", "--new-tokens", "8", "--kv-cache", "on,off", "--kv-dtype",
                         "f32,bf16,q8_0", "--threads", "1", "--json"});
  QVERIFY2(result.exit_code == 0, result.err.c_str());
  std::istringstream lines(result.out);
  std::string line;
  std::map<std::string, long long> bytes_per_token;
  int speedups = 0;
  while (std::getline(lines, line)) {
    auto json = nlohmann::json::parse(line);
    if (json.contains("speedup")) {
      QVERIFY2(json["speedup"]["identical_tokens"].get<bool>(), line.c_str());
      ++speedups;
    } else if (json.contains("kv_cache") && json["kv_cache"] == "on") {
      bytes_per_token[json["kv_dtype"].get<std::string>()] = json["kv_bytes_per_token"].get<long long>();
      QCOMPARE(json["cache_bytes"].get<long long>(), json["kv_bytes_per_token"].get<long long>() * (20 + 8 - 1));
    }
  }
  QCOMPARE(speedups, 3);
  const std::map<std::string, long long> expected{
      {"f32", 4 * 2 * 2 * 128}, {"bf16", 4 * 2 * 2 * 64}, {"q8_0", 4 * 2 * 2 * 34}};
  QCOMPARE(bytes_per_token, expected);
  auto bad = run_cli(
      {"bench", "--model", QString::fromStdString(shared_path("models/tiny-llama3-random")), "--kv-dtype", "q4"});
  QCOMPARE(bad.exit_code, 2);
  QVERIFY2(bad.err.find("unknown kv cache dtype 'q4' (expected f32, bf16, f16 or q8_0)") != std::string::npos,
           bad.err.c_str());
}

void CliBenchTest::bad_options_are_refused_before_measuring() {
  auto result = run_cli(
      {"bench", "--model", QString::fromStdString(shared_path("models/tiny-llama3-random")), "--dtype", "f32,q8"});
  QCOMPARE(result.exit_code, 2);
  QVERIFY2(result.err.find("unknown weight dtype 'q8'") != std::string::npos, result.err.c_str());
  QVERIFY(result.out.empty());  // nothing measured or printed first
}

void CliBenchTest::bandwidth_probed_before_every_step() {
  // Forced on a small model (the default for models of 1 GiB or more): one probe per decode step,
  // and the row's bandwidth and fraction come from them.
  auto result =
      run_cli({"bench", "--model", QString::fromStdString(shared_path("models/tiny-llama3-random")), "--prompt-tokens",
               "5", "--new-tokens", "6", "--kv-cache", "on", "--threads", "1", "--bandwidth-probe", "step", "--json"});
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

void CliBenchTest::gguf_dtypes_make_random_weights_in_that_type() {
  const QString config = write_tiny_config();
  QVERIFY(!config.isEmpty());
  auto result = run_cli({"bench", "--random-weights", config, "--prompt-tokens", "5", "--new-tokens", "4", "--kv-cache",
                         "on", "--dtype", "Q8_0,q4_k,f32", "--threads", "1", "--json"});
  QVERIFY2(result.exit_code == 0, result.err.c_str());
  std::map<std::string, nlohmann::json> rows;
  std::istringstream lines(result.out);
  for (std::string line; std::getline(lines, line);) {
    auto json = nlohmann::json::parse(line);
    if (json.contains("kv_cache")) rows[json["dtype"].get<std::string>()] = json;
  }
  QCOMPARE(rows.size(), std::size_t(3));
  QVERIFY(rows.count("q8_0") && rows.count("q4_k") && rows.count("f32"));  // the names, lower case
  QCOMPARE(rows["q8_0"]["weight_types"].get<std::string>(), std::string("Q8_0"));
  QCOMPARE(rows["q4_k"]["weight_types"].get<std::string>(), std::string("Q4_K"));
  QCOMPARE(rows["f32"]["weight_types"].get<std::string>(), std::string("f32"));
  // Weights in memory: every matrix in its block type (the norms are 256-element f32 vectors).
  // Matrices: embedding + lm_head 2 x 512 x 256, per layer q/o 256x256, k/v 128x256, gate/up/down 512x256.
  const long long matrix_elements = 2LL * 512 * 256 + 2LL * (2 * 256 * 256 + 2 * 128 * 256 + 3 * 512 * 256);
  const long long norm_bytes = (2LL * 2 + 1) * 256 * 4;
  QCOMPARE(rows["q8_0"]["weight_bytes"].get<long long>(), matrix_elements / 32 * 34 + norm_bytes);
  QCOMPARE(rows["q4_k"]["weight_bytes"].get<long long>(), matrix_elements / 256 * 144 + norm_bytes);
  QCOMPARE(rows["f32"]["weight_bytes"].get<long long>(), matrix_elements * 4 + norm_bytes);
  QVERIFY(rows["q4_k"]["weight_bytes"].get<long long>() < rows["q8_0"]["weight_bytes"].get<long long>());
  QVERIFY(rows["q8_0"]["peak_rss_bytes"].get<long long>() > rows["q8_0"]["weight_bytes"].get<long long>());
  // The model's resident memory holds at least its weights (made in the run's own process).
  QVERIFY(rows["q8_0"]["model_resident_bytes"].get<long long>() >= rows["q8_0"]["weight_bytes"].get<long long>());

  // The text table: one row per dtype, its name in the first column.
  auto table = run_cli({"bench", "--random-weights", config, "--prompt-tokens", "5", "--new-tokens", "2", "--kv-cache",
                        "on", "--dtype", "q6_k", "--threads", "1"});
  QVERIFY2(table.exit_code == 0, table.err.c_str());
  QVERIFY2(table.out.find("\nq6_k   on ") != std::string::npos, table.out.c_str());
  QVERIFY(table.out.find("weights MiB") != std::string::npos);
}

void CliBenchTest::gguf_dtype_errors() {
  const QString config = write_tiny_config();
  auto unknown = run_cli({"bench", "--random-weights", config, "--dtype", "q8_0,q3_k"});
  QCOMPARE(unknown.exit_code, 2);
  QCOMPARE(QString::fromStdString(unknown.err),
           QStringLiteral("kvchat-cli bench: unknown weight dtype 'q3_k' (accepted: f32, bf16, f16, q8_0, q4_0, q4_1, "
                          "q5_0, q5_1, q4_k, q5_k, q6_k)\n"));
  QVERIFY(unknown.out.empty());

  auto with_model =
      run_cli({"bench", "--model", QString::fromStdString(shared_path("fixtures/gguf/stories260K-Q8_0.gguf")),
               "--dtype", "q4_k"});
  QCOMPARE(with_model.exit_code, 2);
  QVERIFY2(with_model.err.find("--dtype q4_k is for --random-weights only") != std::string::npos,
           with_model.err.c_str());
  QVERIFY(with_model.out.empty());

  // A row length that is not a whole number of blocks: the engine's error, before anything is printed per row.
  auto odd =
      run_cli({"bench", "--random-weights", QString::fromStdString(shared_path("models/stories260K/config.json")),
               "--dtype", "q4_k", "--prompt-tokens", "5", "--new-tokens", "2", "--kv-cache", "on", "--threads", "1"});
  QCOMPARE(odd.exit_code, 1);
  QVERIFY2(odd.err.find("kvchat-cli bench: error: ") == 0, odd.err.c_str());
}

KVCHAT_TEST_GUILESS_MAIN(CliBenchTest)

// --speculative lookup: per prompt length, interleaved plain/lookup pairs with the acceptance, the speed-up and
// identical tokens, and the cost of a pass over 1, 2, 4, 8 and 9 rows.
void CliBenchTest::speculative_pairs_report_acceptance_and_identity() {
  auto result = run_cli({"bench", "--model", QString::fromStdString(shared_path("models/stories260K")),
                         "--prompt-tokens", "70", "--new-tokens", "60", "--kv-cache", "on", "--speculative", "lookup",
                         "--pairs", "2", "--prompt-kind", "repeating", "--threads", "1", "--json"});
  QVERIFY2(result.exit_code == 0, result.err.c_str());
  std::istringstream lines(result.out);
  std::string line;
  int comparisons = 0;
  while (std::getline(lines, line)) {
    auto json = nlohmann::json::parse(line);
    if (!json.contains("speculative")) continue;
    const auto& row = json["speculative"];
    QCOMPARE(row["mode"].get<std::string>(), std::string("lookup"));
    QCOMPARE(row["prompt_kind"].get<std::string>(), std::string("repeating"));
    QCOMPARE(row["pairs"].get<int>(), 2);
    QVERIFY2(row["identical_tokens"].get<bool>(), line.c_str());
    QVERIFY2(row["drafted_tokens"].get<int>() > 0, line.c_str());
    QVERIFY(row["accepted_tokens"].get<int>() <= row["drafted_tokens"].get<int>());
    QVERIFY(row["plain_decode_tok_s"].get<double>() > 0 && row["speculative_decode_tok_s"].get<double>() > 0);
    for (const char* rows : {"1", "2", "4", "8", "9"}) QVERIFY(row["pass_ms_by_rows"][rows].get<double>() > 0);
    ++comparisons;
  }
  QCOMPARE(comparisons, 1);
  auto bad = run_cli(
      {"bench", "--model", QString::fromStdString(shared_path("models/stories260K")), "--prompt-kind", "looping"});
  QCOMPARE(bad.exit_code, 2);
  QVERIFY2(bad.err.find("--prompt-kind must be random or repeating") != std::string::npos, bad.err.c_str());
}

// --batch 1,3: per width the aggregate and per-sequence decode rates, TTFT p50/p99, and the first sequence's tokens
// equal to its tokens alone.
void CliBenchTest::batched_decode_reports_each_width() {
  auto result =
      run_cli({"bench", "--model", QString::fromStdString(shared_path("models/stories260K")), "--prompt-tokens", "40",
               "--new-tokens", "30", "--kv-cache", "on", "--batch", "1,3", "--pairs", "1", "--threads", "1", "--json"});
  QVERIFY2(result.exit_code == 0, result.err.c_str());
  std::istringstream lines(result.out);
  std::string line;
  std::vector<long long> widths;
  while (std::getline(lines, line)) {
    auto json = nlohmann::json::parse(line);
    if (!json.contains("batch")) continue;
    const auto& row = json["batch"];
    QVERIFY2(row["identical_tokens"].get<bool>(), line.c_str());
    QVERIFY(row["aggregate_decode_tok_s"].get<double>() > 0);
    QCOMPARE(row["aggregate_decode_tok_s"].get<double>(),
             row["per_sequence_decode_tok_s"].get<double>() * row["batch"].get<double>());
    // 40-token prompts sharing their first 20, 30 tokens each (29 written): each sequence's 69 positions span five
    // blocks of 16. The first (common) block is held once by all; the second (the common 16-19, then each sequence's
    // own) is copied by every sequence writing into it while another still holds it, all but the last.
    const long long batch = row["batch"].get<long long>();
    QVERIFY2(row["paged_kv"].get<bool>(), line.c_str());
    QCOMPARE(row["kv_block_tokens"].get<long long>(), 16LL);
    QCOMPARE(row["kv_blocks_used"].get<long long>(), 1 + 4 * batch);
    QCOMPARE(row["kv_blocks_shared"].get<long long>(), batch > 1 ? 1LL : 0LL);
    QCOMPARE(row["kv_block_copies"].get<long long>(), batch - 1);
    // Time to first token over the round's sequences (nearest rank): one sequence gives one value, p50 = p99; of
    // three, prefilled one after another, p50 is the second's and p99 the last's, which came after it.
    const double ttft_p50 = row["ttft_p50_ms"].get<double>(), ttft_p99 = row["ttft_p99_ms"].get<double>();
    QVERIFY2(ttft_p50 > 0, line.c_str());
    if (batch == 1)
      QCOMPARE(ttft_p99, ttft_p50);
    else
      QVERIFY2(ttft_p99 >= ttft_p50, line.c_str());
    widths.push_back(batch);
  }
  QVERIFY(widths == std::vector<long long>({1, 3}));
  auto bad = run_cli({"bench", "--model", QString::fromStdString(shared_path("models/stories260K")), "--batch", "0"});
  QCOMPARE(bad.exit_code, 2);
  QVERIFY2(bad.err.find("--batch sizes must be from 1 to 256") != std::string::npos, bad.err.c_str());
}

}  // namespace app_test_cli_bench

#include "test_cli_bench.moc"
