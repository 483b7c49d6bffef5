// EngineWorker on its own QThread, driven only through queued signals and slots, with stories260K greedy:
// streaming, cache reuse across turns and across conversation switches, eviction under a memory budget,
// cache off, stopping mid-reply, and errors turned into signals.
#include <QtTest>
#include "common/test_suite.h"

#include <QTemporaryDir>
#include <QThread>

#include <atomic>
#include <memory>
#include <optional>

#include "app/chat/chat_turn_runner.h"
#include "app/chat/engine_worker.h"
#include "common/chat_fixture.h"
#include "common/test_paths.h"
#include "engine/generation/session.h"
#include "engine/model/model_loader.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace app_test_engine_worker {

using kvchat::ChatMessage;
using kvchat::GenerationStats;
using kvchat::KvCacheMode;
using kvchat::SpeculativeMode;
using kvchat::StopReason;
using kvchat::TokenId;
using kvchat::app::EngineWorker;
using kvchat::app::TurnRequest;

namespace {

struct TurnResult {
  QStringList chunks;
  QString text;
  std::optional<GenerationStats> stats;
  QString error;
  int last_reported_tokens = -1;
  kvchat::app::ReplyTokens tokens;  // the reply's exact ids, as the store keeps them
};

struct CacheEvent {
  qint64 conversation = 0;
  qint64 tokens = 0;
  qint64 bytes = 0;
  qint64 total = 0;
};

// A worker on its own thread, as the app runs it. Every signal is received on the test thread.
class WorkerHarness : public QObject {
 public:
  WorkerHarness() {
    EngineWorker::register_meta_types();
    worker_ = new EngineWorker;
    worker_->moveToThread(&thread_);
    connect(worker_, &EngineWorker::textReady, this, [this](quint64 turn, const QString& chunk) {
      results_[turn].chunks << chunk;
      results_[turn].text += chunk;
    });
    connect(worker_, &EngineWorker::tokenStats, this,
            [this](quint64 turn, int tokens, double) { results_[turn].last_reported_tokens = tokens; });
    connect(worker_, &EngineWorker::replyTokens, this,
            [this](quint64 turn, const kvchat::app::ReplyTokens& tokens) { results_[turn].tokens = tokens; });
    connect(worker_, &EngineWorker::finished, this, [this](quint64 turn, const GenerationStats& stats) {
      results_[turn].stats = stats;
      done_.insert(turn);
    });
    connect(worker_, &EngineWorker::failed, this, [this](quint64 turn, const QString& message) {
      results_[turn].error = message;
      done_.insert(turn);
    });
    connect(worker_, &EngineWorker::cacheChanged, this,
            [this](qint64 conversation, qint64 tokens, qint64 bytes, qint64 total, qint64) {
              cache_events.push_back({conversation, tokens, bytes, total});
            });
    connect(worker_, &EngineWorker::cacheEvicted, this, [this](qint64 conversation) { evicted << conversation; });
    thread_.start();
  }
  ~WorkerHarness() override {
    thread_.quit();
    thread_.wait();
    delete worker_;
  }

  bool load(const QString& directory, QString* error = nullptr) {
    bool finished = false, ok = false;
    auto c1 = connect(worker_, &EngineWorker::loaded, this, [&] { finished = ok = true; });
    auto c2 = connect(worker_, &EngineWorker::loadFailed, this, [&](const QString&, const QString& message) {
      finished = true;
      if (error) *error = message;
    });
    QMetaObject::invokeMethod(
        worker_, [w = worker_, directory] { w->loadModel(directory, 1); }, Qt::QueuedConnection);
    const bool arrived = QTest::qWaitFor([&] { return finished; }, 60000);
    disconnect(c1);
    disconnect(c2);
    return arrived && ok;
  }

  TurnRequest request(qint64 conversation, std::vector<ChatMessage> messages, int max_new_tokens = 40,
                      KvCacheMode mode = KvCacheMode::Contiguous, qint64 budget = qint64(1) << 40) {
    TurnRequest request;
    request.turn_id = next_turn_++;
    request.conversation_id = conversation;
    request.messages = std::move(messages);
    request.generation.max_new_tokens = max_new_tokens;
    request.generation.sampling.temperature = 0.0f;
    request.generation.cache_mode = mode;
    request.cache_budget_bytes = budget;
    request.threads = 1;
    request.stop = std::make_shared<std::atomic<bool>>(false);
    return request;
  }

  TurnResult run(const TurnRequest& request) {
    QMetaObject::invokeMethod(
        worker_, [w = worker_, request] { w->runTurn(request); }, Qt::QueuedConnection);
    if (!QTest::qWaitFor([&] { return done_.contains(request.turn_id); }, 120000)) {
      TurnResult timeout;
      timeout.error = "timed out";
      return timeout;
    }
    return results_.value(request.turn_id);
  }

  EngineWorker* worker() const { return worker_; }
  qint64 last_tokens_of(qint64 conversation) const {
    for (auto it = cache_events.crbegin(); it != cache_events.crend(); ++it)
      if (it->conversation == conversation) return it->tokens;
    return -1;
  }
  qint64 last_bytes_of(qint64 conversation) const {
    for (auto it = cache_events.crbegin(); it != cache_events.crend(); ++it)
      if (it->conversation == conversation) return it->bytes;
    return -1;
  }

  std::vector<CacheEvent> cache_events;
  QList<qint64> evicted;

 private:
  QThread thread_;
  EngineWorker* worker_ = nullptr;
  QHash<quint64, TurnResult> results_;
  QSet<quint64> done_;
  quint64 next_turn_ = 1;
};

// The conversation as the store gives it back: the reply with its exact ids, then the next message.
std::vector<ChatMessage> continued(std::vector<ChatMessage> messages, const TurnResult& reply, const char* next_user) {
  messages.push_back({"assistant", reply.text.toStdString(), reply.tokens.ids, reply.tokens.vocabulary});
  messages.push_back({"user", next_user});
  return messages;
}

}  // namespace

class EngineWorkerTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void initTestCase();
  void streamed_chunks_concatenate_to_the_reply();
  void second_turn_prefills_only_its_new_tokens();
  void switching_conversations_keeps_each_cache();
  void small_budget_evicts_and_rebuilds_with_identical_output();
  void cache_off_gives_identical_greedy_output();
  void speculative_decoding_gives_identical_greedy_output();
  void kv_dtype_setting_reaches_the_cache();
  void stop_after_the_first_chunk_then_continue_consistently();
  void errors_become_signals_and_a_bad_model_keeps_the_old_one();

 private:
  kvchat::LoadedModel reference_;
};

void EngineWorkerTest::initTestCase() {
  reference_ = kvchat::load_model_directory(kvchat::test::stories_model_directory().toStdString());
}

void EngineWorkerTest::streamed_chunks_concatenate_to_the_reply() {
  WorkerHarness harness;
  QVERIFY(harness.load(kvchat::test::stories_model_directory()));
  const TurnResult result = harness.run(harness.request(1, {{"user", "Once upon a time"}}, 60));
  QVERIFY2(result.error.isEmpty(), qPrintable(result.error));
  QVERIFY(result.stats);
  QVERIFY2(result.chunks.size() >= 2, "the first token is sent on its own, the rest follows");

  // The same greedy continuation computed without the worker.
  const auto prompt = reference_.tokenizer->encode("Once upon a time", true, false);
  kvchat::Session session(reference_.model, KvCacheMode::Contiguous);
  kvchat::GenerationConfig config;
  config.max_new_tokens = 60;
  const auto expected = session.generate(prompt, config);
  QCOMPARE(result.text.toStdString(), reference_.tokenizer->decode(expected.generated, true));
  QCOMPARE(result.stats->generated_tokens, static_cast<int>(expected.generated.size()));
  QCOMPARE(result.last_reported_tokens, result.stats->generated_tokens);
  QCOMPARE(result.stats->prompt_tokens, static_cast<int>(prompt.size()));
}

void EngineWorkerTest::second_turn_prefills_only_its_new_tokens() {
  WorkerHarness harness;
  QVERIFY(harness.load(kvchat::test::stories_model_directory()));
  const std::vector<ChatMessage> first_messages = {{"user", "Once upon a time"}};
  const TurnResult first = harness.run(harness.request(7, first_messages));
  QVERIFY(first.stats);
  const qint64 cached = harness.last_tokens_of(7);
  QCOMPARE(cached, first.stats->cache_tokens);
  QVERIFY(cached > 0);

  const TurnResult second = harness.run(harness.request(7, continued(first_messages, first, "Lily was happy")));
  QVERIFY2(second.error.isEmpty(), qPrintable(second.error));
  QCOMPARE(static_cast<qint64>(second.stats->reused_tokens), cached);
  QCOMPARE(second.stats->prefilled_tokens, second.stats->prompt_tokens - second.stats->reused_tokens);
  QVERIFY(second.stats->prefilled_tokens < 10);  // the new message (and the reply's last token), not the history
  // Grown by exactly this turn's tokens; the last sampled token is fed by the next turn.
  QCOMPARE(harness.last_tokens_of(7), cached + second.stats->prefilled_tokens + second.stats->generated_tokens - 1);
}

void EngineWorkerTest::switching_conversations_keeps_each_cache() {
  WorkerHarness harness;
  QVERIFY(harness.load(kvchat::test::stories_model_directory()));
  const std::vector<ChatMessage> a1 = {{"user", "Once upon a time"}};
  const std::vector<ChatMessage> b1 = {{"user", "Tom had a big dog"}};
  const TurnResult a_first = harness.run(harness.request(1, a1));
  const qint64 a_cached = harness.last_tokens_of(1);
  const TurnResult b_first = harness.run(harness.request(2, b1));
  QVERIFY(a_first.stats && b_first.stats);
  QCOMPARE(harness.cache_events.back().total, harness.last_bytes_of(1) + harness.last_bytes_of(2));

  const TurnResult a_second = harness.run(harness.request(1, continued(a1, a_first, "The sun was warm")));
  QVERIFY(a_second.stats);
  QCOMPARE(static_cast<qint64>(a_second.stats->reused_tokens), a_cached);  // nothing of A re-read
  QVERIFY(harness.evicted.isEmpty());
}

void EngineWorkerTest::small_budget_evicts_and_rebuilds_with_identical_output() {
  const std::vector<ChatMessage> a1 = {{"user", "Once upon a time"}};
  const std::vector<ChatMessage> b1 = {{"user", "Tom had a big dog"}};
  // Control: a budget large enough for both.
  WorkerHarness control;
  QVERIFY(control.load(kvchat::test::stories_model_directory()));
  const TurnResult control_a1 = control.run(control.request(1, a1));
  const qint64 a_bytes = control.last_bytes_of(1);
  const TurnResult control_b1 = control.run(control.request(2, b1));
  const qint64 b_bytes = control.last_bytes_of(2);
  const auto a2 = continued(a1, control_a1, "The sun was warm");
  const TurnResult control_a2 = control.run(control.request(1, a2));
  QVERIFY(control_a2.stats);

  WorkerHarness harness;
  QVERIFY(harness.load(kvchat::test::stories_model_directory()));
  const qint64 budget = a_bytes + b_bytes - 1;  // each fits alone, both do not
  const TurnResult small_a1 = harness.run(harness.request(1, a1, 40, KvCacheMode::Contiguous, budget));
  QVERIFY(harness.evicted.isEmpty());
  const TurnResult small_b1 = harness.run(harness.request(2, b1, 40, KvCacheMode::Contiguous, budget));
  QCOMPARE(harness.evicted, QList<qint64>{1});  // A was the least recently used
  QCOMPARE(harness.last_tokens_of(1), qint64(0));
  QCOMPARE(small_a1.text, control_a1.text);
  QCOMPARE(small_b1.text, control_b1.text);

  const TurnResult small_a2 = harness.run(harness.request(1, a2, 40, KvCacheMode::Contiguous, budget));
  QVERIFY(small_a2.stats);
  QCOMPARE(small_a2.stats->reused_tokens, 0);  // rebuilt by prefill
  QCOMPARE(small_a2.stats->prompt_tokens, control_a2.stats->prompt_tokens);
  QCOMPARE(small_a2.text, control_a2.text);  // the same tokens as with the cache kept
  QCOMPARE(harness.evicted, (QList<qint64>{1, 2}));
  // Only the active conversation's cache is left (it is never evicted while in use).
  QCOMPARE(harness.last_tokens_of(2), qint64(0));
  QCOMPARE(harness.cache_events.back().total, harness.last_bytes_of(1));
}

void EngineWorkerTest::cache_off_gives_identical_greedy_output() {
  QString texts[2];
  for (int m = 0; m < 2; ++m) {
    const KvCacheMode mode = m == 0 ? KvCacheMode::Contiguous : KvCacheMode::Off;
    WorkerHarness harness;
    QVERIFY(harness.load(kvchat::test::stories_model_directory()));
    const std::vector<ChatMessage> first_messages = {{"user", "The cat sat"}};
    const TurnResult first = harness.run(harness.request(3, first_messages, 30, mode));
    const TurnResult second =
        harness.run(harness.request(3, continued(first_messages, first, "A bird sang"), 30, mode));
    QVERIFY(first.stats && second.stats);
    texts[m] = first.text + "|" + second.text;
    if (mode == KvCacheMode::Off) {
      QCOMPARE(second.stats->cache_mode, KvCacheMode::Off);
      QCOMPARE(second.stats->cache_tokens, std::int64_t(0));
      QCOMPARE(second.stats->reused_tokens, 0);
      QCOMPARE(second.stats->prefilled_tokens, second.stats->prompt_tokens);  // the whole chat recomputed
      QCOMPARE(harness.last_tokens_of(3), qint64(0));
    }
  }
  QCOMPARE(texts[1], texts[0]);
}

// The app's speculative settings reach the engine: prompt lookup and a draft model (loaded by the worker from
// the settings' path) give plain decoding's replies, over two turns, and say what they proposed; a draft
// model that cannot load fails the turn with its path named.
void EngineWorkerTest::speculative_decoding_gives_identical_greedy_output() {
  QString texts[3];
  for (int m = 0; m < 3; ++m) {
    WorkerHarness harness;
    QVERIFY(harness.load(kvchat::test::stories_model_directory()));
    const std::vector<ChatMessage> first_messages = {{"user", "The cat sat on the mat. The cat sat"}};
    TurnRequest request = harness.request(4, first_messages, 60);
    request.generation.speculative.mode = m == 0   ? SpeculativeMode::None
                                          : m == 1 ? SpeculativeMode::Lookup
                                                   : SpeculativeMode::DraftModel;
    request.draft_model_path = QString::fromStdString(kvchat::test::shared_path("fixtures/gguf/stories260K-Q8_0.gguf"));
    const TurnResult first = harness.run(request);
    TurnRequest next = harness.request(4, continued(first_messages, first, "A bird sang"), 60);
    next.generation.speculative = request.generation.speculative;
    next.draft_model_path = request.draft_model_path;
    const TurnResult second = harness.run(next);
    QVERIFY2(first.stats && second.stats, qPrintable(first.error + second.error));
    if (m > 0) QVERIFY(first.stats->drafted_tokens + second.stats->drafted_tokens > 0);
    texts[m] = first.text + "|" + second.text;
  }
  QCOMPARE(texts[1], texts[0]);
  QCOMPARE(texts[2], texts[0]);

  WorkerHarness harness;
  QVERIFY(harness.load(kvchat::test::stories_model_directory()));
  TurnRequest request = harness.request(6, {{"user", "Hello"}}, 10);
  request.generation.speculative.mode = SpeculativeMode::DraftModel;
  request.draft_model_path = QStringLiteral("/nonexistent/draft.gguf");
  const TurnResult failed = harness.run(request);
  QVERIFY2(failed.error.contains(QStringLiteral("/nonexistent/draft.gguf")), qPrintable(failed.error));
}

// The KV cache storage setting reaches the engine: a q8_0 chat gives the replies of the same rounding without a
// cache, over two turns (the second reusing the first's cache), and its gauge counts q8_0 bytes; switching the
// dtype rebuilds the cache.
void EngineWorkerTest::kv_dtype_setting_reaches_the_cache() {
  QString texts[2];
  qint64 bytes = 0, tokens = 0;
  for (int m = 0; m < 2; ++m) {
    const KvCacheMode mode = m == 0 ? KvCacheMode::Contiguous : KvCacheMode::Off;
    WorkerHarness harness;
    QVERIFY(harness.load(kvchat::test::stories_model_directory()));
    const std::vector<ChatMessage> first_messages = {{"user", "The cat sat"}};
    TurnRequest request = harness.request(5, first_messages, 30, mode);
    request.generation.kv_dtype = kvchat::KvDtype::Q8_0;
    const TurnResult first = harness.run(request);
    TurnRequest next = harness.request(5, continued(first_messages, first, "A bird sang"), 30, mode);
    next.generation.kv_dtype = kvchat::KvDtype::Q8_0;
    const TurnResult second = harness.run(next);
    QVERIFY2(first.stats && second.stats, qPrintable(first.error + second.error));
    QCOMPARE(second.stats->kv_dtype, kvchat::KvDtype::Q8_0);
    texts[m] = first.text + "|" + second.text;
    if (mode == KvCacheMode::Contiguous) {
      QVERIFY(second.stats->reused_tokens > 0);
      tokens = harness.last_tokens_of(5);
      bytes = harness.last_bytes_of(5);
      // stories260K: 5 layers, K and V, 4 KV heads, rows of 8 values as 8 bytes and one f16 scale.
      QCOMPARE(bytes, tokens * 5 * 2 * 4 * (8 + 2));
      TurnRequest f32 = harness.request(5, continued(first_messages, first, "A bird sang"), 30, mode);
      const TurnResult again = harness.run(f32);
      QVERIFY2(again.stats, qPrintable(again.error));
      QCOMPARE(again.stats->reused_tokens, 0);  // the q8_0 cache was dropped
      QCOMPARE(harness.last_bytes_of(5), harness.last_tokens_of(5) * 5 * 2 * 4 * 8 * 4);
    }
  }
  QCOMPARE(texts[1], texts[0]);
}

void EngineWorkerTest::stop_after_the_first_chunk_then_continue_consistently() {
  WorkerHarness harness;
  QVERIFY(harness.load(kvchat::test::stories_model_directory()));
  const std::vector<ChatMessage> first_messages = {{"user", "Once upon a time"}};
  TurnRequest request = harness.request(5, first_messages, 200);
  // Set the flag the moment the first chunk leaves the engine (as a GUI click would, without its delay).
  auto stop = request.stop;
  auto connection = QObject::connect(
      harness.worker(), &EngineWorker::textReady, harness.worker(),
      [stop](quint64, const QString&) { stop->store(true); }, Qt::DirectConnection);
  const TurnResult stopped = harness.run(request);
  QObject::disconnect(connection);
  QVERIFY(stopped.stats);
  QCOMPARE(stopped.stats->stop_reason, StopReason::Stopped);
  QVERIFY2(stopped.stats->generated_tokens <= 2, "generation ends within one token of the stop");
  QVERIFY(!stopped.text.isEmpty());

  const auto next_messages = continued(first_messages, stopped, "Lily saw a cat");
  const TurnResult next = harness.run(harness.request(5, next_messages, 40));
  QVERIFY2(next.error.isEmpty(), qPrintable(next.error));
  QCOMPARE(static_cast<qint64>(next.stats->reused_tokens), stopped.stats->cache_tokens);

  // A fresh session given the same token history produces the same reply.
  const kvchat::app::ChatTurnRunner runner(reference_);
  const auto first_prompt = runner.encode_messages(first_messages);
  kvchat::Session replay(reference_.model, KvCacheMode::Contiguous);
  kvchat::GenerationConfig config;
  config.max_new_tokens = stopped.stats->generated_tokens;
  const auto first_ids = replay.generate(first_prompt, config).generated;
  QCOMPARE(stopped.tokens.ids, first_ids);
  const auto next_prompt = runner.encode_messages(next_messages);
  QCOMPARE(next.stats->prompt_tokens, static_cast<int>(next_prompt.size()));
  kvchat::Session fresh(reference_.model, KvCacheMode::Contiguous);
  config.max_new_tokens = 40;
  const auto expected = fresh.generate(next_prompt, config);
  QCOMPARE(next.text.toStdString(), reference_.tokenizer->decode(expected.generated, true));
}

void EngineWorkerTest::errors_become_signals_and_a_bad_model_keeps_the_old_one() {
  WorkerHarness harness;
  const TurnResult no_model = harness.run(harness.request(1, {{"user", "Hello"}}));
  QCOMPARE(no_model.error, QStringLiteral("no model is loaded"));

  QVERIFY(harness.load(kvchat::test::stories_model_directory()));
  QTemporaryDir broken;
  QFile config(broken.filePath("config.json"));
  QVERIFY(config.open(QIODevice::WriteOnly));
  config.write("{ \"hidden_size\": ");
  config.close();
  QString load_error;
  QVERIFY(!harness.load(broken.path(), &load_error));
  QVERIFY2(load_error.contains("config.json"), qPrintable(load_error));

  // The previous model still answers.
  const TurnResult after = harness.run(harness.request(1, {{"user", "Once upon a time"}}, 10));
  QVERIFY2(after.error.isEmpty(), qPrintable(after.error));
  QCOMPARE(after.stats->generated_tokens, 10);

  // A conversation longer than the context (policy stop) fails with the engine's reason, not a crash.
  TurnRequest too_long = harness.request(2, {{"user", "Once upon a time there was a girl"}}, 10);
  too_long.context_limit = 4;
  const TurnResult refused = harness.run(too_long);
  QVERIFY2(refused.error.contains("context limit is 4 tokens"), qPrintable(refused.error));
}

KVCHAT_TEST_GUILESS_MAIN(EngineWorkerTest)

}  // namespace app_test_engine_worker

#include "test_engine_worker.moc"
