// Opens every GGUF fixture in ../shared/fixtures/gguf and checks it against the references beside it:
// metadata, each tensor's type and shape, and its dequantized values bit for bit (sha256 of the f32s).
#include <QCryptographicHash>
#include <QDir>
#include <QtTest>
#include "common/test_suite.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "common/json_fixture.h"
#include "common/test_paths.h"
#include "engine/gguf/dequantize.h"
#include "engine/gguf/gguf_file.h"
#include "engine/model/model_config.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace gguf_test_gguf_fixtures {

using namespace kvchat;
using kvchat::test::load_json;
using kvchat::test::shared_path;

namespace {

std::string fixture_path(const std::string& file) { return shared_path("fixtures/gguf/" + file); }

QString message(const std::string& text) { return QString::fromStdString(text); }

std::string sha256_hex(const std::vector<float>& values) {
  // The host is little-endian (the library refuses to build otherwise): the bytes are the file's order.
  const QByteArray bytes(reinterpret_cast<const char*>(values.data()),
                         static_cast<qsizetype>(values.size() * sizeof(float)));
  return QCryptographicHash::hash(bytes, QCryptographicHash::Sha256).toHex().toStdString();
}

// general.file_type ids (the file's "mostly" type label) of the fixtures' "general_file_type" names.
std::uint32_t file_type_id(const std::string& name) {
  static const std::map<std::string, std::uint32_t> ids = {
      {"ALL_F32", 0},        {"MOSTLY_F16", 1},     {"MOSTLY_Q4_0", 2},  {"MOSTLY_Q8_0", 7},
      {"MOSTLY_Q4_K_M", 15}, {"MOSTLY_Q5_K_M", 17}, {"MOSTLY_Q6_K", 18}, {"MOSTLY_BF16", 32}};
  auto it = ids.find(name);
  if (it == ids.end()) throw std::runtime_error("no file type id known for " + name);
  return it->second;
}

// Types whose every tensor reproduced the reference sha256, and those with a mismatch.
std::map<std::string, int>& exact_tensors_by_type() {
  static std::map<std::string, int> counts;
  return counts;
}
std::map<std::string, int>& inexact_tensors_by_type() {
  static std::map<std::string, int> counts;
  return counts;
}

}  // namespace

class GgufFixturesTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void model_files_data() {
    QTest::addColumn<QString>("file");
    const QDir dir(QString::fromStdString(fixture_path("")));
    const QStringList files = dir.entryList({"*.gguf"}, QDir::Files, QDir::Name);
    int with_references = 0;
    for (const QString& file : files) {
      if (!dir.exists(QString(file).replace(".gguf", ".json"))) continue;
      QTest::newRow(qPrintable(file)) << file;
      ++with_references;
    }
    QVERIFY2(with_references >= 10, "expected the ten model fixtures with references");
  }

  void model_files() {
    QFETCH(QString, file);
    const std::string path = fixture_path(file.toStdString());
    const nlohmann::json reference = load_json(path.substr(0, path.size() - 5) + ".json");
    const GgufFile gguf(path);
    QCOMPARE(gguf.file_size(), reference["size_bytes"].get<std::uint64_t>());
    QCOMPARE(gguf.version(), 3u);
    QCOMPARE(gguf.alignment(), std::uint64_t(32));
    check_hparams(gguf, reference);

    const nlohmann::json& tensors = reference["tensors"];
    QCOMPARE(gguf.tensors().size(), tensors.size());
    std::map<std::string, int> type_counts;
    for (const GgufTensor& tensor : gguf.tensors()) ++type_counts[to_string(tensor.type)];
    QCOMPARE(nlohmann::json(type_counts), reference["type_counts"]);
    for (const nlohmann::json& expected : tensors) check_tensor(gguf, expected);
  }

  // The README's facts about the Llama 3 vocab-only file.
  void llama3_vocab_only() {
    const GgufFile gguf(fixture_path("llama3-vocab-only.gguf"));
    QVERIFY(gguf.tensors().empty());
    QCOMPARE(gguf.get_string("general.architecture"), std::string_view("llama"));
    QCOMPARE(gguf.get_uint32("llama.block_count"), 16u);
    QCOMPARE(gguf.get_uint32("llama.context_length"), 131072u);
    QCOMPARE(gguf.get_float("llama.rope.freq_base"), 500000.0f);
    QCOMPARE(gguf.get_string("tokenizer.ggml.model"), std::string_view("gpt2"));
    QCOMPARE(gguf.get_string("tokenizer.ggml.pre"), std::string_view("llama-bpe"));

    const std::vector<std::string_view> tokens = gguf.get_string_array("tokenizer.ggml.tokens");
    QCOMPARE(tokens.size(), std::size_t(128256));
    QCOMPARE(gguf.get_array_length("tokenizer.ggml.tokens"), std::uint64_t(128256));
    QCOMPARE(tokens[0], std::string_view("!"));
    QCOMPARE(tokens[128000], std::string_view("<|begin_of_text|>"));
    QCOMPARE(tokens[128009], std::string_view("<|eot_id|>"));
    const std::vector<std::int64_t> types = gguf.get_int_array("tokenizer.ggml.token_type");
    QCOMPARE(types.size(), tokens.size());
    QCOMPARE(std::count(types.begin(), types.end(), 3), std::ptrdiff_t(256));  // CONTROL

    const std::vector<std::string_view> merges = gguf.get_string_array("tokenizer.ggml.merges");
    QCOMPARE(merges.size(), std::size_t(280147));
    QCOMPARE(merges[0], std::string_view("\xC4\xA0 \xC4\xA0"));  // "Ġ Ġ"
    QCOMPARE(gguf.get_uint32("tokenizer.ggml.bos_token_id"), 128000u);
    QCOMPARE(gguf.get_int64("tokenizer.ggml.eos_token_id"), std::int64_t(128001));
    QCOMPARE(gguf.get_bool("tokenizer.ggml.add_bos_token"), true);
    QCOMPARE(gguf.get_bool("tokenizer.ggml.add_eos_token"), false);

    const nlohmann::json config = load_json(shared_path("fixtures/tokenizers/llama3/tokenizer_config.json"));
    const std::string template_text = config["chat_template"].get<std::string>();
    QVERIFY(!template_text.empty());
    QVERIFY(gguf.get_string("tokenizer.chat_template") == template_text);
  }

  void llama_spm_vocab() {
    const GgufFile gguf(fixture_path("ggml-vocab-llama-spm.gguf"));
    QVERIFY(gguf.tensors().empty());
    // This file ends right after its metadata: no padding, as a file without tensors may.
    QCOMPARE(gguf.data_offset() % gguf.alignment(), std::uint64_t(0));
    const auto tokens = gguf.get_string_array("tokenizer.ggml.tokens");
    const auto scores = gguf.get_float_array("tokenizer.ggml.scores");
    const auto types = gguf.get_int_array("tokenizer.ggml.token_type");
    QCOMPARE(tokens.size(), std::size_t(32000));
    QCOMPARE(scores.size(), tokens.size());
    QCOMPARE(types.size(), tokens.size());
    QCOMPARE(tokens[1], std::string_view("<s>"));
    QCOMPARE(types[1], std::int64_t(3));
    QCOMPARE(gguf.get_uint32("tokenizer.ggml.bos_token_id"), 1u);
  }

  // Getters name the key and the problem; integers widen, floats do not pass as integers.
  void metadata_getter_errors() {
    const GgufFile gguf(fixture_path("stories260K-Q8_0.gguf"));
    QCOMPARE(gguf.get_int64("llama.block_count"), std::int64_t(5));
    QCOMPARE(gguf.get_int_array("tokenizer.ggml.token_type").size(), std::size_t(512));
    QVERIFY(gguf.find_metadata("general.name") != nullptr);
    QVERIFY(!gguf.has_metadata("general.alignment"));
    expect_error([&] { gguf.get_string("no.such.key"); }, "metadata 'no.such.key': not found");
    expect_error([&] { gguf.get_uint32("general.name"); }, "metadata 'general.name': is string, not an integer");
    expect_error([&] { gguf.get_float("llama.block_count"); }, "is uint32, not a float");
    expect_error([&] { gguf.get_string("llama.block_count"); }, "is uint32, not string");
    expect_error([&] { gguf.get_bool("llama.rope.freq_base"); }, "is float32, not bool");
    expect_error([&] { gguf.get_string_array("tokenizer.ggml.scores"); }, "is an array of float32, not of strings");
    expect_error([&] { gguf.get_float_array("tokenizer.ggml.tokens"); }, "is an array of string, not of floats");
    expect_error([&] { gguf.get_int_array("tokenizer.ggml.scores"); }, "is an array of float32, not of integers");
    expect_error([&] { gguf.get_array_length("general.name"); }, "is string, not array");
    QVERIFY(gguf.find_tensor("no.such.tensor") == nullptr);
  }

  // A row range decodes to the same values as that slice of the whole tensor, for every type.
  void row_ranges_match_whole_tensor() {
    for (const char* file : {"tiny-llama-k-Q4_K_M.gguf", "tiny-llama-k-Q5_K_M.gguf", "stories260K-Q4_0.gguf",
                             "tiny-llama-k-BF16.gguf", "stories260K-Q8_0.gguf"}) {
      const GgufFile gguf(fixture_path(file));
      for (const GgufTensor& tensor : gguf.tensors()) {
        if (tensor.n_rows() < 5) continue;
        const std::vector<float> whole = dequantize_tensor(tensor);
        std::vector<float> rows(static_cast<std::size_t>(3 * tensor.row_length()));
        dequantize_rows(tensor, 2, 3, rows.data());
        QVERIFY2(std::equal(rows.begin(), rows.end(), whole.begin() + 2 * tensor.row_length()),
                 qPrintable(message(std::string(file) + ": " + tensor.name)));
      }
    }
  }

  void row_range_outside_tensor() {
    const GgufFile gguf(fixture_path("stories260K-Q8_0.gguf"));
    const GgufTensor* tensor = gguf.find_tensor("token_embd.weight");
    QVERIFY(tensor);
    std::vector<float> row(static_cast<std::size_t>(tensor->row_length()));
    QVERIFY_THROWS_EXCEPTION(std::out_of_range, dequantize_rows(*tensor, tensor->n_rows(), 1, row.data()));
    QVERIFY_THROWS_EXCEPTION(std::out_of_range, dequantize_rows(*tensor, -1, 1, row.data()));
    dequantize_rows(*tensor, tensor->n_rows() - 1, 1, row.data());  // the last row is inside
  }

  void cleanupTestCase() {
    for (const auto& [type, count] : exact_tensors_by_type())
      qInfo("%s: %d tensors bit-identical to the reference", type.c_str(), count);
    for (const auto& [type, count] : inexact_tensors_by_type())
      qWarning("%s: %d tensors differ from the reference sha256", type.c_str(), count);
  }

 private:
  template <typename Call>
  void expect_error(Call call, const std::string& fragment) {
    try {
      call();
    } catch (const ModelError& error) {
      QVERIFY2(std::string(error.what()).find(fragment) != std::string::npos,
               qPrintable(message(std::string("'") + error.what() + "' does not mention '" + fragment + "'")));
      return;
    }
    QFAIL(qPrintable(message("expected a ModelError mentioning '" + fragment + "'")));
  }

  void check_hparams(const GgufFile& gguf, const nlohmann::json& reference) {
    const std::string arch = reference["architecture"].get<std::string>();
    QCOMPARE(gguf.get_string("general.architecture"), std::string_view(arch));
    QCOMPARE(gguf.get_uint32("general.file_type"), file_type_id(reference["general_file_type"].get<std::string>()));
    const nlohmann::json& h = reference["hparams"];
    const std::pair<const char*, const char*> integers[] = {{"context_length", "ctx"},
                                                            {"embedding_length", "embd"},
                                                            {"block_count", "n_layer"},
                                                            {"feed_forward_length", "ff"},
                                                            {"attention.head_count", "n_head"},
                                                            {"attention.head_count_kv", "n_kv"},
                                                            {"attention.key_length", "head_dim"},
                                                            {"vocab_size", "n_vocab"}};
    for (const auto& [key, field] : integers) QCOMPARE(gguf.get_int64(arch + "." + key), h[field].get<std::int64_t>());
    QCOMPARE(gguf.get_float(arch + ".attention.layer_norm_rms_epsilon"), h["eps"].get<float>());
    QCOMPARE(gguf.get_float(arch + ".rope.freq_base"), h["rope_base"].get<float>());
    QCOMPARE(gguf.get_array_length("tokenizer.ggml.tokens"), h["n_vocab"].get<std::uint64_t>());
  }

  void check_tensor(const GgufFile& gguf, const nlohmann::json& expected) {
    const std::string name = expected["name"].get<std::string>();
    const GgufTensor* tensor = gguf.find_tensor(name);
    QVERIFY2(tensor, qPrintable(message("missing tensor " + name)));
    QCOMPARE(std::string(to_string(tensor->type)), expected["type"].get<std::string>());
    QCOMPARE(tensor->ne, expected["ne"].get<std::vector<std::int64_t>>());
    QCOMPARE(tensor->n_elements, expected["n_elements"].get<std::int64_t>());
    QVERIFY(tensor->data != nullptr);

    const std::vector<float> values = dequantize_tensor(*tensor);
    const bool exact = sha256_hex(values) == expected["deq_f32_sha256"].get<std::string>();
    ++(exact ? exact_tensors_by_type() : inexact_tensors_by_type())[to_string(tensor->type)];
    QVERIFY2(exact, qPrintable(message(name + " (" + to_string(tensor->type) + "): sha256 of the f32 values differs")));

    double sum = 0.0;
    float abs_max = 0.0f;
    for (float v : values) {
      sum += v;
      abs_max = std::max(abs_max, std::fabs(v));
    }
    // Relative, with a floor of 1 so that a sum near zero is not held to an absurdly small bound.
    const double expected_sum = expected["deq_sum"].get<double>();
    QVERIFY2(std::fabs(sum - expected_sum) <= 1e-6 * std::max(1.0, std::fabs(expected_sum)),
             qPrintable(message(name + ": sum " + std::to_string(sum) + " vs " + std::to_string(expected_sum))));
    QCOMPARE(static_cast<double>(abs_max), expected["deq_abs_max"].get<double>());
    const auto first8 = expected["deq_first8"].get<std::vector<double>>();
    for (std::size_t i = 0; i < first8.size(); ++i) QCOMPARE(static_cast<double>(values[i]), first8[i]);
  }
};

KVCHAT_TEST_APPLESS_MAIN(GgufFixturesTest)

}  // namespace gguf_test_gguf_fixtures

#include "test_gguf_fixtures.moc"
