// SessionPool: one session per conversation, least recently used caches evicted first under a memory
// budget (never the active one), and an evicted conversation continues with exactly the tokens it
// would have produced with its cache.
#include <QtTest/QtTest>
#include "common/test_suite.h"

#include "common/test_paths.h"
#include "engine/cache/session_pool.h"
#include "engine/model/model_loader.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace engine_test_session_pool {

using kvchat::GenerationConfig;
using kvchat::KvCacheMode;
using kvchat::LoadedModel;
using kvchat::SessionPool;
using kvchat::TokenId;

namespace {

std::vector<TokenId> prompt_of(int length, int salt) {
  std::vector<TokenId> ids = {1};
  for (int i = 1; i < length; ++i) ids.push_back(static_cast<TokenId>(10 + (i * 7 + salt * 13) % 400));
  return ids;
}

std::vector<std::int64_t> ids_of(const std::vector<SessionPool::Resident>& resident) {
  std::vector<std::int64_t> ids;
  for (const auto& r : resident) ids.push_back(r.conversation);
  return ids;
}

}  // namespace

class SessionPoolTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void initTestCase() { loaded_ = kvchat::load_model(kvchat::test::shared_path("models/stories260K")); }

  void sessions_are_kept_per_conversation_in_use_order() {
    SessionPool pool(loaded_.model);
    GenerationConfig config;
    config.max_new_tokens = 3;
    kvchat::Session& a = pool.acquire(1, KvCacheMode::Contiguous);
    a.generate(prompt_of(20, 1), config);
    pool.acquire(2, KvCacheMode::Contiguous).generate(prompt_of(30, 2), config);
    QCOMPARE(&pool.acquire(1, KvCacheMode::Contiguous), &a);  // the same session, now the most recent
    QCOMPARE(ids_of(pool.resident()), (std::vector<std::int64_t>{1, 2}));
    QCOMPARE(pool.resident()[0].tokens, std::int64_t{22});  // prompt + 2 fed tokens (the last is never fed)
    QCOMPARE(pool.total_tokens(), std::int64_t{22 + 32});
    QCOMPARE(pool.total_bytes(), pool.resident()[0].bytes + pool.resident()[1].bytes);
    QVERIFY(pool.forget(2));
    QVERIFY(!pool.forget(2));
    QVERIFY(pool.find(2) == nullptr);
    QCOMPARE(ids_of(pool.resident()), (std::vector<std::int64_t>{1}));
  }

  // Four conversations of growing size; the budget fits about two. Eviction takes the least recently
  // used first, spares the active one, and the total stays within the budget plus the active session.
  void the_budget_evicts_the_least_recently_used() {
    SessionPool pool(loaded_.model);
    GenerationConfig config;
    config.max_new_tokens = 2;
    for (int conversation = 1; conversation <= 4; ++conversation)
      pool.acquire(conversation, KvCacheMode::Contiguous).generate(prompt_of(40 * conversation, conversation), config);
    pool.acquire(1, KvCacheMode::Contiguous);  // 1 is now the most recent; LRU order: 2, 3, 4, 1
    const std::int64_t bytes_3 = pool.find(3)->cache_bytes(), bytes_4 = pool.find(4)->cache_bytes();
    const std::int64_t budget = bytes_3 + bytes_4 + 1;  // fits 1 + 4 (1 is the smallest), not 1 + 3 + 4
    const auto evicted = pool.enforce_budget(budget, 4);
    QCOMPARE(evicted.size(), std::size_t{2});
    QCOMPARE(evicted[0].conversation, std::int64_t{2});
    QCOMPARE(evicted[1].conversation, std::int64_t{3});
    QCOMPARE(evicted[1].bytes, bytes_3);
    QCOMPARE(ids_of(pool.resident()), (std::vector<std::int64_t>{1, 4}));
    QVERIFY(pool.total_bytes() <= budget);
    QCOMPARE(pool.find(2)->cache_tokens(), std::int64_t{0});
    // A budget below the active session alone evicts everything else and keeps the active one.
    const auto rest = pool.enforce_budget(1, 4);
    QCOMPARE(rest.size(), std::size_t{1});
    QCOMPARE(pool.total_bytes(), bytes_4);
    QVERIFY(pool.enforce_budget(0, 4).empty());  // 0: no budget
  }

  // Eviction changes nothing observable: the evicted conversation's next turn gives the same ids as a
  // session that kept its cache.
  void an_evicted_conversation_continues_identically() {
    SessionPool pool(loaded_.model);
    kvchat::Session kept(loaded_.model, KvCacheMode::Contiguous);
    GenerationConfig config;
    config.max_new_tokens = 24;
    std::vector<TokenId> prompt = prompt_of(50, 5);
    const auto first = pool.acquire(7, KvCacheMode::Contiguous).generate(prompt, config);
    QCOMPARE(kept.generate(prompt, config).generated, first.generated);
    prompt.insert(prompt.end(), first.generated.begin(), first.generated.end());
    prompt.push_back(13);
    pool.acquire(8, KvCacheMode::Contiguous).generate(prompt_of(10, 8), config);
    QCOMPARE(pool.enforce_budget(1, 8).size(), std::size_t{1});
    const auto continued = pool.acquire(7, KvCacheMode::Contiguous).generate(prompt, config);
    QCOMPARE(continued.stats.reused_tokens, 0);
    const auto reference = kept.generate(prompt, config);
    QVERIFY(reference.stats.reused_tokens > 0);
    QCOMPARE(continued.generated, reference.generated);
  }

 private:
  LoadedModel loaded_;
};

KVCHAT_TEST_GUILESS_MAIN(SessionPoolTest)

}  // namespace engine_test_session_pool

#include "test_session_pool.moc"
