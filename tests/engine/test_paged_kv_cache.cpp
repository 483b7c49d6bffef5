// The model over a paged KV cache (blocks of a KvBlockPool) gives the same greedy tokens as over the contiguous
// cache, with the rows in f32 and in f16; a sequence forked from another after a common prompt goes on as a fresh
// sequence of the same tokens would, while the prompt's blocks are held once.
#include <c10/core/InferenceMode.h>

#include <QtTest>
#include "common/test_suite.h"

#include <memory>
#include <vector>

#include "common/test_models.h"
#include "engine/cache/paged_kv_cache.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace engine_test_paged_kv_cache {

using namespace kvchat;

class PagedKvCacheTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void greedy_tokens_equal_the_contiguous_cache_data();
  void greedy_tokens_equal_the_contiguous_cache();
  void a_fork_continues_as_a_fresh_sequence_data();
  void a_fork_continues_as_a_fresh_sequence();
  void a_full_pool_refuses_the_step();
};

TokenId greedy_token(const at::Tensor& logits) { return static_cast<TokenId>(logits.argmax().item<std::int64_t>()); }

// The prompt, then `count` greedy tokens, one forward each, on `cache`.
std::vector<TokenId> greedy(const LlamaModel& model, KvCache& cache, const std::vector<TokenId>& prompt, int count) {
  std::vector<TokenId> out;
  TokenId next = greedy_token(model.forward(prompt, cache.size(), &cache));
  for (int i = 0; i < count; ++i) {
    out.push_back(next);
    next = greedy_token(model.forward({next}, cache.size(), &cache));
  }
  return out;
}

std::vector<TokenId> prompt_of(std::int64_t length, std::int64_t vocab) {
  std::vector<TokenId> prompt;
  for (std::int64_t i = 0; i < length; ++i) prompt.push_back(static_cast<TokenId>(1 + (i * 37 + 11) % (vocab - 1)));
  return prompt;
}

void add_models() {
  QTest::addColumn<QString>("model");
  QTest::addColumn<int>("dtype");
  for (const char* model : {"models/stories260K", "models/tiny-llama3-random", "qwen2-random-f32"})
    for (KvDtype dtype : {KvDtype::F32, KvDtype::F16})
      QTest::newRow(qPrintable(QString("%1 %2").arg(model, dtype == KvDtype::F32 ? "f32" : "f16")))
          << QString(model) << int(dtype);
}

void PagedKvCacheTest::greedy_tokens_equal_the_contiguous_cache_data() { add_models(); }

void PagedKvCacheTest::greedy_tokens_equal_the_contiguous_cache() {
  QFETCH(QString, model);
  QFETCH(int, dtype);
  const auto loaded = test::load_test_model(model.toStdString());
  c10::InferenceMode guard;
  const KvCacheShape shape = loaded->cache_shape(KvDtype(dtype));
  const std::vector<TokenId> prompt = prompt_of(21, loaded->config().vocab_size);
  auto contiguous = make_kv_cache(KvCacheMode::Contiguous, shape);
  const std::vector<TokenId> expected = greedy(*loaded, *contiguous, prompt, 60);
  // Blocks of 16 positions: the 81 positions end inside the sixth block.
  KvBlockPool pool(shape, 16, 32);
  PagedKvCache paged(pool);
  QCOMPARE(greedy(*loaded, paged, prompt, 60), expected);
  QCOMPARE(paged.size(), contiguous->size());
  QCOMPARE(pool.blocks_in_use(), std::int64_t{(81 + 15) / 16});
  // The stored rows themselves are the contiguous cache's, byte for byte.
  for (std::int64_t layer = 0; layer < shape.layers; ++layer) {
    const auto [keys, values] = paged.view(layer, paged.size());
    const auto [expected_keys, expected_values] = contiguous->view(layer, contiguous->size());
    QVERIFY(at::equal(keys, expected_keys.contiguous()));
    QVERIFY(at::equal(values, expected_values.contiguous()));
  }
}

void PagedKvCacheTest::a_fork_continues_as_a_fresh_sequence_data() { add_models(); }

// A common 40-token prompt (2.5 blocks), then a second sequence forked from the first that writes into the
// shared third block: each goes on exactly as a fresh contiguous cache over its own tokens.
void PagedKvCacheTest::a_fork_continues_as_a_fresh_sequence() {
  QFETCH(QString, model);
  QFETCH(int, dtype);
  const auto loaded = test::load_test_model(model.toStdString());
  c10::InferenceMode guard;
  const KvCacheShape shape = loaded->cache_shape(KvDtype(dtype));
  const std::int64_t vocab = loaded->config().vocab_size;
  const std::vector<TokenId> prompt = prompt_of(40, vocab);
  KvBlockPool pool(shape, 16, 32);
  PagedKvCache first(pool);
  loaded->forward(prompt, 0, &first);
  std::unique_ptr<PagedKvCache> second = first.fork();
  QCOMPARE(pool.blocks_in_use(), std::int64_t{3});
  QCOMPARE(pool.shared_blocks(), std::int64_t{3});

  const std::vector<TokenId> first_turn = {static_cast<TokenId>(5 % vocab), static_cast<TokenId>(9 % vocab)};
  const std::vector<TokenId> second_turn = {static_cast<TokenId>(7 % vocab)};
  const std::vector<TokenId> first_tokens = greedy(*loaded, first, first_turn, 30);
  const std::vector<TokenId> second_tokens = greedy(*loaded, *second, second_turn, 30);
  QCOMPARE(pool.copies_made(), std::int64_t{1});  // the third block, when the first wrote position 40
  QCOMPARE(pool.shared_blocks(), std::int64_t{2});

  for (const auto& [turn, tokens] : {std::pair{first_turn, first_tokens}, std::pair{second_turn, second_tokens}}) {
    std::vector<TokenId> whole = prompt;
    whole.insert(whole.end(), turn.begin(), turn.end());
    auto fresh = make_kv_cache(KvCacheMode::Contiguous, shape);
    loaded->forward(prompt, 0, fresh.get());
    QCOMPARE(greedy(*loaded, *fresh, turn, 30), tokens);
  }
}

void PagedKvCacheTest::a_full_pool_refuses_the_step() {
  const auto loaded = test::load_test_model("models/stories260K");
  c10::InferenceMode guard;
  KvBlockPool pool(loaded->cache_shape(), 16, 2);
  PagedKvCache cache(pool);
  loaded->forward(prompt_of(30, loaded->config().vocab_size), 0, &cache);
  QVERIFY_THROWS_EXCEPTION(std::length_error, loaded->forward(prompt_of(3, 100), 30, &cache));
  QCOMPARE(cache.size(), std::int64_t{30});  // the refused step left the cache as it was
  loaded->forward({5, 6}, 30, &cache);       // room for two more positions in the second block
  QCOMPARE(cache.size(), std::int64_t{32});
}

KVCHAT_TEST_APPLESS_MAIN(PagedKvCacheTest)

}  // namespace engine_test_paged_kv_cache

#include "test_paged_kv_cache.moc"
