// The model over a paged KV cache (blocks of a KvBlockPool) gives the same greedy tokens as over the contiguous
// cache, with the rows in f32 and in f16; a sequence forked from another after a common prompt goes on as a fresh
// sequence of the same tokens would, while the prompt's blocks are held once.
#include <c10/core/InferenceMode.h>

#include <QtTest>
#include "common/test_suite.h"

#include <memory>
#include <thread>
#include <vector>

#include "common/test_models.h"
#include "engine/cache/paged_kv_cache.h"
#include "engine/generation/decode_batcher.h"
#include "engine/generation/session.h"

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
  void sessions_hold_a_copied_prefix_once();
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

// Sessions over one block pool: a conversation that copies another's 200-token prefix (copy_prefix_from, as the
// server does for a shared system prompt) holds its whole blocks once and copies only the block the prefix ends in;
// both replies, generated together through a batcher, equal those of sessions with contiguous caches.
void PagedKvCacheTest::sessions_hold_a_copied_prefix_once() {
  const auto model = kvchat::test::load_test_model("models/stories260K");
  if (!model->rows_match_decode_steps()) QSKIP("the model's products do not run on the engine kernels");
  const std::vector<TokenId> shared = prompt_of(200, 500);
  std::vector<TokenId> first = shared, second = shared;
  for (int i = 0; i < 20; ++i) {
    first.push_back(static_cast<TokenId>(10 + i));
    second.push_back(static_cast<TokenId>(300 + i));
  }
  GenerationConfig config;
  config.max_new_tokens = 40;
  config.stop_token_ids = {-1};
  std::vector<TokenId> expected_first, expected_second;
  {
    Session a(model, KvCacheMode::Contiguous), b(model, KvCacheMode::Contiguous);
    expected_first = a.generate(first, config).generated;
    b.copy_prefix_from(a, 200);
    expected_second = b.generate(second, config).generated;
  }
  auto pool = std::make_shared<KvBlockPool>(model->cache_shape(), 16, 64);
  Session a(model, KvCacheMode::Contiguous), b(model, KvCacheMode::Contiguous);
  a.set_block_pool(pool);
  b.set_block_pool(pool);
  QVERIFY(a.paged() && b.paged());
  QCOMPARE(a.generate(first, config).generated, expected_first);
  const std::int64_t held_by_first = pool->blocks_in_use();  // 259 positions: 17 blocks
  QCOMPARE(held_by_first, std::int64_t(17));
  QCOMPARE(b.copy_prefix_from(a, 200), std::int64_t(200));
  QCOMPARE(pool->blocks_in_use(), held_by_first);  // nothing copied yet: 13 blocks shared
  QCOMPARE(pool->shared_blocks(), std::int64_t(13));
  // Both go on at once, batched; the second's first write falls into block 12 (positions 192-207), its only copy.
  auto batcher = std::make_shared<DecodeBatcher>(model, 2);
  a.set_decode_batcher(batcher);
  b.set_decode_batcher(batcher);
  std::vector<TokenId> more_first = first;
  more_first.insert(more_first.end(), expected_first.begin(), expected_first.end() - 1);
  std::vector<TokenId> second_reply;
  std::thread other([&] { second_reply = b.generate(second, config).generated; });
  a.generate(more_first, config);
  other.join();
  QCOMPARE(second_reply, expected_second);
  QCOMPARE(pool->copies_made(), std::int64_t(1));
  QCOMPARE(pool->shared_blocks(), std::int64_t(12));
  a.clear();
  b.clear();
  QCOMPARE(pool->blocks_in_use(), std::int64_t(0));
}

KVCHAT_TEST_APPLESS_MAIN(PagedKvCacheTest)

}  // namespace engine_test_paged_kv_cache

#include "test_paged_kv_cache.moc"
