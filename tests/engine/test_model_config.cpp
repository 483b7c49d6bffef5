// config.json of real Llama-family models: every field the engine uses, read as the file says.
#include <c10/core/InferenceMode.h>

#include <QtTest>
#include <filesystem>
#include "common/test_suite.h"

#include "common/json_fixture.h"
#include "common/test_paths.h"
#include "engine/generation/session.h"
#include "engine/model/llama_model.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace engine_test_model_config {

using namespace kvchat;
using kvchat::test::load_json;
using kvchat::test::shared_path;

class ModelConfigTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void real_configs_data();
  void real_configs();
  void generation_config_eos_wins();
  void qwen_sliding_window_layers();
  void random_weights_of_a_gqa_3_to_1_shape();
  void random_weights_larger_than_memory_are_refused_before_allocating();
};

void ModelConfigTest::real_configs_data() {
  QTest::addColumn<QString>("path");
  for (const auto& entry : std::filesystem::directory_iterator(shared_path("fixtures/configs")))
    QTest::newRow(entry.path().filename().string().c_str()) << QString::fromStdString(entry.path().string());
  QTest::newRow("stories260K") << QString::fromStdString(shared_path("models/stories260K/config.json"));
  QTest::newRow("tiny-llama3") << QString::fromStdString(shared_path("models/tiny-llama3-random/config.json"));
}

void ModelConfigTest::real_configs() {
  QFETCH(QString, path);
  auto raw = load_json(path.toStdString());
  ModelConfig config = ModelConfig::from_file(path.toStdString());
  QCOMPARE(config.hidden_size, raw["hidden_size"].get<int64_t>());
  QCOMPARE(config.num_hidden_layers, raw["num_hidden_layers"].get<int64_t>());
  QCOMPARE(config.num_attention_heads, raw["num_attention_heads"].get<int64_t>());
  QCOMPARE(config.num_key_value_heads, raw["num_key_value_heads"].get<int64_t>());
  QCOMPARE(config.vocab_size, raw["vocab_size"].get<int64_t>());
  QCOMPARE(config.intermediate_size, raw["intermediate_size"].get<int64_t>());
  QCOMPARE(config.max_position_embeddings, raw["max_position_embeddings"].get<int64_t>());
  QCOMPARE(config.rope_theta, raw["rope_theta"].get<double>());
  QCOMPARE(config.rms_norm_eps, raw["rms_norm_eps"].get<double>());
  QCOMPARE(config.tie_word_embeddings, raw.value("tie_word_embeddings", false));
  const int64_t head_dim = raw.contains("head_dim") && !raw["head_dim"].is_null()
                               ? raw["head_dim"].get<int64_t>()
                               : raw["hidden_size"].get<int64_t>() / raw["num_attention_heads"].get<int64_t>();
  QCOMPARE(config.head_dim, head_dim);
  const auto& scaling = raw["rope_scaling"];
  if (scaling.is_object()) {
    QCOMPARE(QString::fromStdString(config.rope_scaling.rope_type),
             QString::fromStdString(scaling["rope_type"].get<std::string>()));
    QCOMPARE(config.rope_scaling.factor, scaling["factor"].get<double>());
    QCOMPARE(config.rope_scaling.original_max_position_embeddings,
             scaling["original_max_position_embeddings"].get<int64_t>());
  } else {
    QCOMPARE(QString::fromStdString(config.rope_scaling.rope_type), QString("default"));
  }
  std::vector<TokenId> eos;
  if (raw["eos_token_id"].is_array())
    eos = raw["eos_token_id"].get<std::vector<TokenId>>();
  else
    eos = {raw["eos_token_id"].get<TokenId>()};
  QVERIFY(config.eos_token_ids == eos);
}

// Qwen2's and Qwen3's use_sliding_window: the layers from max_window_layers on (transformers' default 28) attend
// through the window; off, or without a window, every layer attends to every position. SmolLM3's is refused.
void ModelConfigTest::qwen_sliding_window_layers() {
  const auto config_of = [](const std::string& model_type, int layers, const std::string& extra) {
    return ModelConfig::from_json_text(
        R"({"model_type": ")" + model_type +
            R"(", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": )" + std::to_string(layers) +
            R"(, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 32, "max_position_embeddings": 256,
                "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "eos_token_id": 2)" +
            extra + "}",
        "config.json");
  };
  const auto windows = [](const ModelConfig& config) {
    std::vector<std::int64_t> windows;
    for (std::int64_t layer = 0; layer < config.num_hidden_layers; ++layer)
      windows.push_back(config.layer_window(layer));
    return windows;
  };
  using Windows = std::vector<std::int64_t>;
  const std::string on = R"(, "use_sliding_window": true, "sliding_window": 32)";
  QCOMPARE(windows(config_of("qwen2", 3, on + R"(, "max_window_layers": 1)")), (Windows{0, 32, 32}));
  QCOMPARE(windows(config_of("qwen3", 3, on + R"(, "max_window_layers": 0)")), (Windows{32, 32, 32}));
  QCOMPARE(windows(config_of("qwen2", 3, on + R"(, "max_window_layers": 3)")), (Windows{0, 0, 0}));
  const Windows default_split = windows(config_of("qwen2", 30, on));  // max_window_layers 28
  QCOMPARE(std::count(default_split.begin(), default_split.end(), 32), std::ptrdiff_t(2));
  QCOMPARE(default_split[27], std::int64_t(0));
  QCOMPARE(default_split[28], std::int64_t(32));
  QCOMPARE(
      windows(config_of("qwen2", 3, R"(, "use_sliding_window": false, "sliding_window": 32, "max_window_layers": 0)")),
      (Windows{0, 0, 0}));
  QCOMPARE(windows(config_of("qwen2", 3, R"(, "use_sliding_window": true, "sliding_window": null)")),
           (Windows{0, 0, 0}));
  // layer_types, where the file has them, say which layers slide.
  QCOMPARE(windows(config_of("qwen2", 3,
                             on + R"(, "max_window_layers": 0, "layer_types": ["full_attention", "sliding_attention",
                                   "full_attention"])")),
           (Windows{0, 32, 0}));
  const auto error_of = [&](const std::string& model_type, const std::string& extra) {
    try {
      config_of(model_type, 3, extra);
    } catch (const ModelError& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  QCOMPARE(QString::fromStdString(error_of("qwen2", on + R"(, "max_window_layers": -1)")),
           QString("config.json: field 'max_window_layers' must not be negative, got -1"));
  QCOMPARE(QString::fromStdString(error_of("smollm3", on)),
           QString("config.json: use_sliding_window is true: SmolLM3's sliding-window attention is not supported"));
}

void ModelConfigTest::generation_config_eos_wins() {
  // config.json says 2; generation_config.json says [1, 2] (stories end with BOS).
  ModelConfig config = ModelConfig::from_directory(shared_path("models/stories260K"));
  auto generation = load_json(shared_path("models/stories260K/generation_config.json"));
  QVERIFY(config.eos_token_ids == generation["eos_token_id"].get<std::vector<TokenId>>());
}

// A billion layers of a 1B model's shape: refused with the size, before a byte is allocated.
void ModelConfigTest::random_weights_larger_than_memory_are_refused_before_allocating() {
  ModelConfig config = ModelConfig::from_file(shared_path("fixtures/configs/llama-3.2-1b.json"));
  config.num_hidden_layers = 1000000000;
  try {
    LlamaModel::random(config, 1);
    QFAIL("weights larger than memory must be refused");
  } catch (const ModelError& error) {
    QVERIFY2(QString(error.what()).contains("GiB, more than this machine's"), error.what());
  }
}

// SmolLM2's shape (9 query heads over 3 KV heads, head_dim from hidden/heads), scaled down in depth
// and vocabulary so it runs quickly: cached and uncached greedy decoding agree exactly.
void ModelConfigTest::random_weights_of_a_gqa_3_to_1_shape() {
  ModelConfig config = ModelConfig::from_file(shared_path("fixtures/configs/smollm2-135m-instruct.json"));
  config.num_hidden_layers = 2;
  config.vocab_size = 2048;
  auto model = LlamaModel::random(config, 5);
  QCOMPARE(model->cache_shape().kv_heads, int64_t(3));
  QCOMPARE(model->cache_shape().head_dim, int64_t(64));
  GenerationConfig generation;
  generation.max_new_tokens = 12;
  generation.stop_token_ids = {-1};
  std::vector<std::vector<TokenId>> outputs;
  for (KvCacheMode mode : {KvCacheMode::Off, KvCacheMode::Contiguous, KvCacheMode::Naive}) {
    generation.cache_mode = mode;
    Session session(model, mode);
    outputs.push_back(session.generate({1, 100, 200, 300, 400}, generation).generated);
  }
  QVERIFY(outputs[0] == outputs[1]);
  QVERIFY(outputs[0] == outputs[2]);
}

KVCHAT_TEST_APPLESS_MAIN(ModelConfigTest)

}  // namespace engine_test_model_config

#include "test_model_config.moc"
