// The cache stores the compact GQA K/V ([num_key_value_heads, tokens, head_dim]) and counts its bytes
// as 2 x layers x kv_heads x head_dim x tokens x element size, for real model shapes.
#include <c10/core/InferenceMode.h>

#include <QtTest>
#include "common/test_suite.h"

#include "common/test_paths.h"
#include "engine/model/llama_model.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace engine_test_kv_cache {

using namespace kvchat;
using kvchat::test::shared_path;

class KvCacheTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void compact_shapes_and_bytes_data();
  void compact_shapes_and_bytes();
  void model_writes_compact_kv();
  void contiguous_grows_geometrically_and_truncates();
  void naive_and_contiguous_hold_the_same_values();
};

void KvCacheTest::compact_shapes_and_bytes_data() {
  QTest::addColumn<QString>("config");
  QTest::addColumn<qint64>("layers");
  QTest::addColumn<qint64>("kv_heads");
  QTest::addColumn<qint64>("head_dim");
  // Expected shapes are the configs' own numbers, read here to show what the test checks.
  QTest::newRow("stories260K") << "models/stories260K/config.json" << qint64(5) << qint64(4) << qint64(8);
  QTest::newRow("tiny-llama3") << "models/tiny-llama3-random/config.json" << qint64(4) << qint64(2) << qint64(32);
  QTest::newRow("llama-3.2-1b") << "fixtures/configs/llama-3.2-1b.json" << qint64(16) << qint64(8) << qint64(64);
}

void KvCacheTest::compact_shapes_and_bytes() {
  QFETCH(QString, config);
  QFETCH(qint64, layers);
  QFETCH(qint64, kv_heads);
  QFETCH(qint64, head_dim);
  ModelConfig model_config = ModelConfig::from_file(shared_path(config.toStdString()));
  QVERIFY(model_config.num_key_value_heads < model_config.num_attention_heads);  // GQA: the point of the check
  KvCacheShape shape{model_config.num_hidden_layers,
                     model_config.num_key_value_heads,
                     model_config.head_dim,
                     model_config.max_position_embeddings,
                     KvDtype::F32,
                     {}};
  c10::InferenceMode guard;
  for (KvCacheMode mode : {KvCacheMode::Contiguous, KvCacheMode::Naive}) {
    auto cache = make_kv_cache(mode, shape);
    const int64_t tokens = 7;
    at::Tensor k = at::randn({kv_heads, tokens, head_dim}), v = at::randn({kv_heads, tokens, head_dim});
    for (int64_t layer = 0; layer < layers; ++layer) {
      auto [keys, values] = cache->append(layer, k, v);
      QCOMPARE(keys.sizes().vec(), (std::vector<int64_t>{kv_heads, tokens, head_dim}));
      QCOMPARE(values.sizes().vec(), (std::vector<int64_t>{kv_heads, tokens, head_dim}));
    }
    cache->commit(tokens);
    QCOMPARE(cache->size(), tokens);
    QCOMPARE(cache->bytes(), 2 * layers * kv_heads * head_dim * tokens * int64_t(sizeof(float)));
    QCOMPARE(cache->bytes(), model_config.kv_bytes_per_token() * tokens);
    // Repeating K/V per query head would cost num_attention_heads / num_key_value_heads times more.
    auto [keys, values] = cache->view(layers - 1, tokens);
    QCOMPARE(keys.size(0), model_config.num_key_value_heads);
  }
}

void KvCacheTest::model_writes_compact_kv() {
  std::string directory = shared_path("models/tiny-llama3-random");
  auto model = LlamaModel::from_checkpoint(directory, ModelConfig::from_directory(directory));
  c10::InferenceMode guard;
  auto cache = make_kv_cache(KvCacheMode::Contiguous, model->cache_shape());
  model->forward({1, 2, 3, 4, 5}, 0, cache.get());
  model->forward({6}, 5, cache.get());
  QCOMPARE(cache->size(), int64_t(6));
  auto [keys, values] = cache->view(0, 6);
  QCOMPARE(keys.sizes().vec(), (std::vector<int64_t>{2, 6, 32}));
  QCOMPARE(cache->bytes(), int64_t(2 * 4 * 2 * 32 * 6 * 4));
}

void KvCacheTest::contiguous_grows_geometrically_and_truncates() {
  KvCacheShape shape{2, 2, 4, 1000, KvDtype::F32, {}};
  ContiguousKvCache cache(shape, 16);
  c10::InferenceMode guard;
  QCOMPARE(cache.capacity(), int64_t(16));
  std::vector<int64_t> capacities;
  for (int step = 0; step < 100; ++step) {
    at::Tensor k = at::full({2, 1, 4}, float(step)), v = at::full({2, 1, 4}, float(-step));
    for (int layer = 0; layer < 2; ++layer) cache.append(layer, k, v);
    cache.commit(1);
    if (capacities.empty() || capacities.back() != cache.capacity()) capacities.push_back(cache.capacity());
  }
  QCOMPARE(capacities, (std::vector<int64_t>{16, 32, 64, 128}));
  auto [keys, values] = cache.view(1, 100);
  QCOMPARE(keys[0][57][2].item<float>(), 57.0f);
  QCOMPARE(values[1][99][0].item<float>(), -99.0f);
  cache.truncate(40);
  QCOMPARE(cache.size(), int64_t(40));
  QCOMPARE(cache.bytes(), int64_t(2 * 2 * 2 * 4 * 40 * 4));
  // Capacity is capped at the context limit.
  KvCacheShape small{1, 1, 2, 20, KvDtype::F32, {}};
  ContiguousKvCache capped(small, 16);
  capped.append(0, at::zeros({1, 18, 2}), at::zeros({1, 18, 2}));
  capped.commit(18);
  QCOMPARE(capped.capacity(), int64_t(20));
  QVERIFY_THROWS_EXCEPTION(std::length_error, capped.append(0, at::zeros({1, 3, 2}), at::zeros({1, 3, 2})));
}

void KvCacheTest::naive_and_contiguous_hold_the_same_values() {
  KvCacheShape shape{3, 2, 4, 64, KvDtype::F32, {}};
  NaiveKvCache naive(shape);
  ContiguousKvCache contiguous(shape, 2);
  c10::InferenceMode guard;
  for (int64_t steps : {5, 1, 1, 3, 1}) {
    at::Tensor k = at::randn({2, steps, 4}), v = at::randn({2, steps, 4});
    for (int layer = 0; layer < 3; ++layer) {
      auto [nk, nv] = naive.append(layer, k, v);
      auto [ck, cv] = contiguous.append(layer, k, v);
      QVERIFY(at::equal(nk, ck) && at::equal(nv, cv));
    }
    naive.commit(steps);
    contiguous.commit(steps);
  }
  naive.truncate(4);
  contiguous.truncate(4);
  for (int layer = 0; layer < 3; ++layer)
    QVERIFY(at::equal(naive.view(layer, 4).first, contiguous.view(layer, 4).first));
  QCOMPARE(naive.bytes(), contiguous.bytes());
}

KVCHAT_TEST_APPLESS_MAIN(KvCacheTest)

}  // namespace engine_test_kv_cache

#include "test_kv_cache.moc"
