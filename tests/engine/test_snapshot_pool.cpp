// The SessionPool with snapshots on disk: a conversation continued from a snapshot gives the same greedy
// ids as one continued in memory and as a fresh full prefill (stories260K and the bf16 Llama-3-layout
// model; contiguous and naive caches); a new chat sharing a long system prompt with a snapshotted one
// prefills only its own tokens; memory and disk budgets evict the least recently used and exceed their
// limit by at most one session.
#include <QTemporaryDir>
#include <QtTest/QtTest>
#include "common/test_suite.h"

#include <chrono>
#include <filesystem>
#include <thread>

#include "common/snapshot_support.h"
#include "common/test_paths.h"
#include "engine/cache/kv_snapshot.h"
#include "engine/cache/session_pool.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_loader.h"

Q_DECLARE_METATYPE(kvchat::KvCacheMode)

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace engine_test_snapshot_pool {

using kvchat::GenerationResult;
using kvchat::KvCacheMode;
using kvchat::SessionPool;
using kvchat::SnapshotStore;
using kvchat::TokenId;
namespace test = kvchat::test;

class SnapshotPoolTest : public QObject {
  Q_OBJECT

 private:
  std::shared_ptr<SnapshotStore> make_store(const QTemporaryDir& folder, const kvchat::LoadedModel& loaded,
                                            std::int64_t disk_budget = 0) const {
    return std::make_shared<SnapshotStore>(folder.path().toStdString(), disk_budget,
                                           kvchat::fingerprint_model(*loaded.model), loaded.model->cache_shape());
  }

  kvchat::LoadedModel& model_named(const QString& name) { return name == "stories260K" ? stories_ : llama3_; }

 private Q_SLOTS:
  void initTestCase() {
    stories_ = kvchat::load_model(test::shared_path("models/stories260K"));
    llama3_ = kvchat::load_model(test::shared_path("models/tiny-llama3-random"));
  }

  void restored_conversations_continue_identically_data() {
    QTest::addColumn<QString>("model");
    QTest::addColumn<KvCacheMode>("mode");
    for (const char* model : {"stories260K", "tiny-llama3-random"}) {
      QTest::addRow("%s contiguous", model) << QString(model) << KvCacheMode::Contiguous;
      QTest::addRow("%s naive", model) << QString(model) << KvCacheMode::Naive;
    }
  }

  // Three turns: turn 1 in one pool, its snapshot written, the pool and store gone (nothing of them
  // left in memory); turns 2 and 3 in a new pool restored from disk. The same three turns in memory,
  // and each turn's prompt prefilled from scratch, give exactly the same ids.
  void restored_conversations_continue_identically() {
    QFETCH(QString, model);
    QFETCH(KvCacheMode, mode);
    const kvchat::LoadedModel& loaded = model_named(model);
    const auto config = test::greedy(16, mode);
    QTemporaryDir folder;

    std::vector<TokenId> prompt = test::made_up_prompt(48, 5);
    SessionPool in_memory(loaded.model);
    GenerationResult reference = in_memory.acquire(1, mode).generate(prompt, config);
    {
      auto store = make_store(folder, loaded);
      SessionPool first_process(loaded.model, store);
      QCOMPARE(first_process.acquire(1, mode).generate(prompt, config).generated, reference.generated);
      QVERIFY(first_process.save_snapshot(1));
      QVERIFY(!first_process.save_snapshot(1));  // nothing new since the last one
    }                                            // the store's destructor finishes the write

    SessionPool second_process(loaded.model, make_store(folder, loaded));
    for (int turn = 2; turn <= 3; ++turn) {
      prompt = test::continued(prompt, reference.generated, turn);
      reference = in_memory.acquire(1, mode).generate(prompt, config);
      const GenerationResult restored = second_process.acquire(1, mode).generate(prompt, config);
      kvchat::Session fresh(loaded.model, mode);
      QCOMPARE(restored.generated, reference.generated);
      QCOMPARE(fresh.generate(prompt, config).generated, reference.generated);
      if (turn == 2) {
        QCOMPARE(restored.stats.restored_tokens, 48 + 15);  // the first prompt and the fed reply tokens
        QCOMPARE(restored.stats.prefilled_tokens, static_cast<int>(prompt.size()) - 48 - 15);
      } else {
        QCOMPARE(restored.stats.restored_tokens, 0);  // resident now: reused in memory
        QCOMPARE(restored.stats.reused_tokens, reference.stats.reused_tokens);
      }
    }
  }

  // Two chats open with the same 200-token system prompt: once the first chat's snapshot is on disk,
  // the second chat's first turn restores the shared 200 tokens and prefills only its own.
  void a_shared_system_prompt_is_prefilled_once() {
    QTemporaryDir folder;
    auto store = make_store(folder, stories_);
    SessionPool pool(stories_.model, store);
    const std::vector<TokenId> system = test::made_up_prompt(200, 11);
    std::vector<TokenId> chat_a = system, chat_b = system;
    for (TokenId id : {300, 301, 302, 303, 304, 305}) chat_a.push_back(id);
    for (TokenId id : {400, 401, 402, 403, 404, 405, 406, 407}) chat_b.push_back(id);

    const GenerationResult first = pool.acquire(1, KvCacheMode::Contiguous).generate(chat_a, test::greedy(8));
    QCOMPARE(first.stats.prefilled_tokens, static_cast<int>(chat_a.size()));
    QVERIFY(pool.save_snapshot(1));
    store->flush();
    const GenerationResult second = pool.acquire(2, KvCacheMode::Contiguous).generate(chat_b, test::greedy(8));
    QCOMPARE(second.stats.restored_tokens, 200);
    QCOMPARE(second.stats.prefilled_tokens, 8);
    QCOMPARE(second.stats.restored_from, std::string("c-1"));
    kvchat::Session fresh(stories_.model, KvCacheMode::Contiguous);
    QCOMPARE(second.generated, fresh.generate(chat_b, test::greedy(8)).generated);
    // A prefix shorter than the restore threshold is prefilled instead: not worth reading a file for.
    pool.set_minimum_restore_tokens(201);
    const GenerationResult third = pool.acquire(3, KvCacheMode::Contiguous).generate(chat_b, test::greedy(8));
    QCOMPARE(third.stats.restored_tokens, 0);
    QCOMPARE(third.generated, second.generated);
  }

  // The memory budget evicts the least recently used conversation to disk; its next turn restores it.
  void an_evicted_conversation_is_restored_from_disk() {
    QTemporaryDir folder;
    auto store = make_store(folder, stories_);
    SessionPool pool(stories_.model, store);
    std::vector<TokenId> prompt = test::made_up_prompt(60, 2);
    const GenerationResult first = pool.acquire(1, KvCacheMode::Contiguous).generate(prompt, test::greedy(12));
    pool.acquire(2, KvCacheMode::Contiguous).generate(test::made_up_prompt(30, 9), test::greedy(12));
    const auto evicted = pool.enforce_budget(1, 2);  // conversation 2 is active: 1 goes
    QCOMPARE(evicted.size(), std::size_t{1});
    QCOMPARE(evicted[0].conversation, std::int64_t{1});
    QCOMPARE(pool.find(1)->cache_tokens(), std::int64_t{0});
    store->flush();
    QVERIFY(std::filesystem::exists(store->path_for(pool.snapshot_key(1))));
    prompt = test::continued(prompt, first.generated, 3);
    const GenerationResult next = pool.acquire(1, KvCacheMode::Contiguous).generate(prompt, test::greedy(12));
    QCOMPARE(next.stats.restored_tokens, 60 + 11);
    kvchat::Session fresh(stories_.model, KvCacheMode::Contiguous);
    QCOMPARE(next.generated, fresh.generate(prompt, test::greedy(12)).generated);
    // forget() deletes the conversation's snapshot with it.
    QVERIFY(pool.forget(1));
    QVERIFY(!std::filesystem::exists(store->path_for(pool.snapshot_key(1))));
  }

  // Six conversations of the same size, a disk budget of two and a half snapshots: after every write
  // the folder holds at most the budget (two snapshots) and never the budget + one, and what goes is
  // the least recently used (a restore counts as a use).
  void the_disk_budget_deletes_the_least_recently_used() {
    QTemporaryDir folder;
    const std::int64_t snapshot_bytes = [&] {
      QTemporaryDir probe;
      auto store = make_store(probe, stories_);
      SessionPool pool(stories_.model, store);
      pool.acquire(1, KvCacheMode::Contiguous).generate(test::made_up_prompt(40, 1), test::greedy(8));
      pool.save_snapshot(1);
      store->flush();
      return static_cast<std::int64_t>(std::filesystem::file_size(store->path_for(pool.snapshot_key(1))));
    }();
    const std::int64_t budget = snapshot_bytes * 5 / 2;
    auto store = make_store(folder, stories_, budget);
    SessionPool pool(stories_.model, store);
    auto exists = [&](int conversation) {
      return std::filesystem::exists(store->path_for(pool.snapshot_key(conversation)));
    };
    for (int conversation = 1; conversation <= 6; ++conversation) {
      // File times have the kernel clock's granularity (a few ms): keep the writes' order unambiguous.
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      pool.acquire(conversation, KvCacheMode::Contiguous)
          .generate(test::made_up_prompt(40, conversation), test::greedy(8));
      pool.save_snapshot(conversation);
      store->flush();
      QVERIFY(store->folder_bytes() <= budget + snapshot_bytes);
      QVERIFY(exists(conversation));  // the one just written is never the one deleted
      if (conversation == 2) {
        // Conversation 1 is restored (a use) by a new pool: now 2 is the least recently used.
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        SessionPool other(stories_.model, store);
        std::vector<TokenId> prompt = test::made_up_prompt(40, 1);
        prompt.push_back(77);
        QVERIFY(other.acquire(1, KvCacheMode::Contiguous).generate(prompt, test::greedy(2)).stats.restored_tokens > 0);
      }
      if (conversation == 3) QVERIFY(exists(1) && !exists(2));
    }
    QVERIFY(!exists(1) && !exists(3) && !exists(4));
    QVERIFY(exists(5) && exists(6));
    QCOMPARE(store->folder_bytes(), 2 * snapshot_bytes);
    pool.forget_all();
    QCOMPARE(store->folder_bytes(), std::int64_t{0});
  }

 private:
  kvchat::LoadedModel stories_, llama3_;
};

KVCHAT_TEST_GUILESS_MAIN(SnapshotPoolTest)

}  // namespace engine_test_snapshot_pool

#include "test_snapshot_pool.moc"
