// Continuous batching (DecodeBatcher): sequences generated on threads of their own, their decode steps computed
// together, give exactly the tokens each gives alone: eight requests of different lengths joining and leaving at
// different steps (two sharing a 200-token prefix, one sampled with a seed, one with speculative decoding) on a
// Llama-2-shape, a Llama-3-shape and a Qwen2 model in f32, and in Q4_K (two files and a random Qwen2). A row that fails
// fails alone, and a prompt's prefill takes turns with the decoding sequences instead of holding them up.
#include <c10/core/InferenceMode.h>

#include <QtTest>
#include "common/test_suite.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/test_models.h"
#include "engine/cache/kv_cache.h"
#include "engine/generation/decode_batcher.h"
#include "engine/generation/session.h"
#include "engine/model/decode_context.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace engine_test_decode_batcher {

using namespace kvchat;

struct Request {
  std::vector<TokenId> prompt;
  GenerationConfig config;
};

// Eight requests: prompts of 1 to 260 tokens over the first `vocab` ids, two of them sharing their first 200 tokens,
// replies of 8 to 48 tokens, one sampled (temperature 0.8, a seed), one with prompt-lookup speculative decoding.
std::vector<Request> requests_for(std::int64_t vocab) {
  std::vector<Request> requests;
  std::vector<TokenId> shared_prefix;
  for (int i = 0; i < 200; ++i) shared_prefix.push_back(static_cast<TokenId>(3 + (i * 29 + 5) % (vocab - 3)));
  for (int j = 0; j < 8; ++j) {
    Request request;
    if (j == 2 || j == 5) request.prompt = shared_prefix;
    const int own = j == 2 ? 40 : j == 5 ? 60 : 1 + (j * 23) % 90;
    for (int i = 0; i < own; ++i) request.prompt.push_back(static_cast<TokenId>(3 + (i * 17 + j * 101) % (vocab - 3)));
    request.config.max_new_tokens = 8 + (j * 13) % 41;
    request.config.stop_token_ids = {-1};  // every request runs its whole length (no end-of-sequence id stops it)
    request.config.prefill_chunk_tokens = 64;
    if (j == 6) {
      request.config.sampling.temperature = 0.8f;
      request.config.sampling.seed = 7;
    }
    if (j == 3) {
      // Prompt lookup: its checks of proposed tokens run as exclusive work between the batch's steps. The prompt
      // repeats itself so that proposals are made.
      request.config.speculative.mode = SpeculativeMode::Lookup;
      const std::vector<TokenId> once = request.prompt;
      for (int copy = 0; copy < 3; ++copy) request.prompt.insert(request.prompt.end(), once.begin(), once.end());
    }
    requests.push_back(request);
  }
  return requests;
}

class DecodeBatcherTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void every_sequence_equals_its_run_alone_data() {
    QTest::addColumn<QString>("model");
    for (const char* name :
         {"models/stories260K", "models/tiny-llama3-random", "qwen2-random-f32",
          "fixtures/gguf/tiny-llama-k-Q4_K_M.gguf", "qwen2-random-q4_k", "family:qwen3/model-Q4_K.gguf"})
      QTest::newRow(name) << name;
  }

  void every_sequence_equals_its_run_alone() {
    QFETCH(QString, model);
    const auto llama = kvchat::test::load_test_model(model.toStdString());
    if (!llama->rows_match_decode_steps()) QSKIP("the model's products do not run on the engine kernels: no batching");
    const std::vector<Request> requests = requests_for(std::min<std::int64_t>(llama->config().vocab_size, 500));

    std::vector<std::vector<TokenId>> alone(requests.size());
    for (std::size_t j = 0; j < requests.size(); ++j) {
      Session session(llama, KvCacheMode::Contiguous);
      alone[j] = session.generate(requests[j].prompt, requests[j].config).generated;
      QCOMPARE(static_cast<int>(alone[j].size()), requests[j].config.max_new_tokens);
    }

    // Batched: each request on its own thread and session, all started at once; their prompts' lengths make them
    // join the running batch at different steps and their replies' lengths leave it at different steps. A step
    // waits up to 50 ms for every member's token (the default 2 ms is a server's choice): on a loaded machine a
    // thread can sleep longer than that between two tokens, and the test asserts that steps held several rows.
    auto batcher = std::make_shared<DecodeBatcher>(llama, 8, std::chrono::milliseconds(50));
    std::vector<std::vector<TokenId>> batched(requests.size());
    std::vector<std::string> errors(requests.size());
    std::atomic<int> started{0};
    std::vector<std::thread> threads;
    for (std::size_t j = 0; j < requests.size(); ++j)
      threads.emplace_back([&, j] {
        try {
          ++started;
          while (started.load() < static_cast<int>(requests.size())) std::this_thread::yield();
          Session session(llama, KvCacheMode::Contiguous);
          session.set_decode_batcher(batcher);
          batched[j] = session.generate(requests[j].prompt, requests[j].config).generated;
        } catch (const std::exception& error) {
          errors[j] = error.what();
        }
      });
    for (std::thread& thread : threads) thread.join();
    for (std::size_t j = 0; j < requests.size(); ++j) {
      QVERIFY2(errors[j].empty(), errors[j].c_str());
      QVERIFY2(
          batched[j] == alone[j],
          qPrintable(QString("request %1: the batched reply differs from its run alone").arg(static_cast<int>(j))));
    }
    const DecodeBatcher::Stats stats = batcher->stats();
    qInfo("%lld rows in %lld steps, at most %lld in one", static_cast<long long>(stats.rows),
          static_cast<long long>(stats.steps), static_cast<long long>(stats.largest_batch));
    // Every decode step of every request was a row of a batched step (the last token of a reply is never fed), but
    // for the tokens the speculative request fed in its checks.
    std::int64_t fed = 0, fed_plainly = 0;
    for (const Request& request : requests) {
      fed += request.config.max_new_tokens - 1;
      if (request.config.speculative.mode == SpeculativeMode::None) fed_plainly += request.config.max_new_tokens - 1;
    }
    QVERIFY2(stats.rows >= fed_plainly && stats.rows <= fed, qPrintable(QString::number(stats.rows)));
    QVERIFY2(stats.largest_batch >= 2, "no step ever held two sequences");
    QVERIFY(stats.steps < fed);
    QCOMPARE(stats.failed_steps, std::int64_t(0));
    QVERIFY(stats.exclusive_runs >= static_cast<std::int64_t>(requests.size()));  // the prefill chunks
  }

  // Two rows in one step, one of them at the end of its context: that one gets the error, the other its logits, equal
  // to its step alone.
  void a_failing_row_fails_alone() {
    c10::InferenceMode guard;
    const auto llama = kvchat::test::load_test_model("models/stories260K");
    if (!llama->rows_match_decode_steps()) QSKIP("the model's products do not run on the engine kernels: no batching");
    DecodeContext context;
    auto full = make_kv_cache(KvCacheMode::Contiguous, llama->cache_shape());
    const std::vector<TokenId> everything(static_cast<std::size_t>(llama->config().max_position_embeddings), 7);
    llama->decode_rows(everything.data(), static_cast<std::int64_t>(everything.size()), 0, *full, context);
    auto healthy = make_kv_cache(KvCacheMode::Contiguous, llama->cache_shape());
    const std::vector<TokenId> prompt = {1, 45, 67, 89};
    llama->decode_rows(prompt.data(), 4, 0, *healthy, context);
    auto expected_cache = make_kv_cache(KvCacheMode::Contiguous, llama->cache_shape());
    llama->decode_rows(prompt.data(), 4, 0, *expected_cache, context);
    llama->decode(50, 4, *expected_cache, context);
    const std::vector<float> expected = context.logits;

    // A long straggler wait: the step runs once both rows are in.
    DecodeBatcher batcher(llama, 4, std::chrono::seconds(30));
    std::vector<float> logits;
    std::string error;
    {
      DecodeBatcher::Member first(batcher), second(batcher);
      std::thread other([&] {
        std::vector<float> ignored;
        try {
          second.decode(9, *full, ignored);
        } catch (const std::length_error& e) {
          error = e.what();
        }
      });
      first.decode(50, *healthy, logits);
      other.join();
    }
    QVERIFY2(!error.empty(), "the row past the context was not refused");
    QCOMPARE(full->size(), llama->config().max_position_embeddings);
    QCOMPARE(healthy->size(), std::int64_t(5));
    QCOMPARE(logits.size(), expected.size());
    QVERIFY(std::memcmp(logits.data(), expected.data(), expected.size() * sizeof(float)) == 0);
    QCOMPARE(batcher.stats().failed_steps, std::int64_t(1));
  }

  // A long prompt prefilled in chunks while another sequence decodes: the decoding sequence makes tokens between
  // the chunks (steps and chunks take turns), and both replies equal their runs alone. Before each chunk the
  // prefilling thread gives the decoding one up to two seconds to make a token: on a loaded machine (ctest -j) the
  // decoding thread may not be scheduled between two chunks at all, which says nothing about the batcher; a batcher
  // that held decode steps back for the whole prompt would still leave it without a token there.
  void a_prefill_takes_turns_with_decoding() {
    const auto llama = kvchat::test::load_test_model("models/tiny-llama3-random");
    if (!llama->rows_match_decode_steps()) QSKIP("the model's products do not run on the engine kernels: no batching");
    GenerationConfig decoding;
    decoding.max_new_tokens = 200;
    decoding.stop_token_ids = {-1};
    GenerationConfig prefilling = decoding;
    prefilling.max_new_tokens = 4;
    prefilling.prefill_chunk_tokens = 16;
    const std::vector<TokenId> short_prompt = {1, 300, 301};
    std::vector<TokenId> long_prompt;
    for (int i = 0; i < 160; ++i) long_prompt.push_back(static_cast<TokenId>(5 + (i * 7) % 400));

    auto batcher = std::make_shared<DecodeBatcher>(llama, 4);
    std::atomic<int> decoded{0};
    std::atomic<bool> prefill_done{false};
    std::mutex order_mutex;
    std::vector<int> tokens_before_chunk;  // the decoding sequence's tokens when each chunk began
    std::vector<TokenId> first_reply, second_reply;
    std::thread decoder([&] {
      Session session(llama, KvCacheMode::Contiguous);
      session.set_decode_batcher(batcher);
      // Decoding at least until the prefill is done: the rest of the run is beside the point.
      std::atomic<bool> stop{false};
      first_reply = session
                        .generate(short_prompt, decoding, &stop,
                                  [&](TokenId, const DecodeProgress&) {
                                    ++decoded;
                                    if (prefill_done && decoded > 40) stop = true;
                                  })
                        .generated;
    });
    while (decoded < 5) std::this_thread::yield();
    Session session(llama, KvCacheMode::Contiguous);
    session.set_decode_batcher(batcher);
    second_reply = session
                       .generate(long_prompt, prefilling, nullptr, {},
                                 [&](std::int64_t) {
                                   const std::lock_guard<std::mutex> lock(order_mutex);
                                   if (!tokens_before_chunk.empty()) {
                                     const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
                                     while (decoded.load() <= tokens_before_chunk.back() &&
                                            std::chrono::steady_clock::now() < deadline)
                                       std::this_thread::sleep_for(std::chrono::microseconds(200));
                                   }
                                   tokens_before_chunk.push_back(decoded.load());
                                 })
                       .generated;
    prefill_done = true;
    decoder.join();

    QCOMPARE(static_cast<int>(tokens_before_chunk.size()), 10);
    int advanced = 0;  // chunks after which the decoding sequence had made more tokens
    for (std::size_t i = 1; i < tokens_before_chunk.size(); ++i)
      advanced += tokens_before_chunk[i] > tokens_before_chunk[i - 1];
    QVERIFY2(advanced >= 5, qPrintable(QString("the decoding sequence advanced during %1 of 9 chunks").arg(advanced)));

    Session alone(llama, KvCacheMode::Contiguous);
    QVERIFY(alone.generate(long_prompt, prefilling).generated == second_reply);
    Session alone_first(llama, KvCacheMode::Contiguous);
    GenerationConfig same_length = decoding;
    same_length.max_new_tokens = static_cast<int>(first_reply.size());
    QVERIFY(alone_first.generate(short_prompt, same_length).generated == first_reply);
  }

  void a_batcher_refuses_another_models_session() {
    const auto llama = kvchat::test::load_test_model("models/stories260K");
    if (!llama->rows_match_decode_steps()) QSKIP("the model's products do not run on the engine kernels: no batching");
    const auto other = kvchat::test::load_test_model("qwen2-random-f32");
    Session session(other, KvCacheMode::Contiguous);
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument,
                             session.set_decode_batcher(std::make_shared<DecodeBatcher>(llama, 2)));
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, DecodeBatcher(llama, 0));
  }
};

KVCHAT_TEST_GUILESS_MAIN(DecodeBatcherTest)

}  // namespace engine_test_decode_batcher

#include "test_decode_batcher.moc"
