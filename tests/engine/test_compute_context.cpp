// Compute contexts: a scope makes a context's pool and kernels switch the calling thread's (nested scopes,
// null scopes, other threads untouched), a thread count past the limit is refused, and two sessions with
// contexts of their own generate side by side on two threads exactly what one session generates alone.
#include <QtTest>
#include "common/test_suite.h"

#include <atomic>
#include <stdexcept>
#include <thread>

#include "common/snapshot_support.h"
#include "common/test_paths.h"
#include "engine/compute/compute_context.h"
#include "engine/compute/compute_options.h"
#include "engine/generation/session.h"
#include "engine/kernels/thread_pool.h"
#include "engine/model/model_loader.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace engine_test_compute_context {

using namespace kvchat;

namespace {

GenerationConfig greedy(int max_new_tokens) {
  GenerationConfig config = test::greedy(max_new_tokens);
  config.stop_token_ids = {-1};  // the full length: more positions compared
  return config;
}

}  // namespace

class ComputeContextTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void initTestCase() { loaded_ = load_model(test::shared_path("models/stories260K")); }

  void a_scope_makes_the_context_the_threads_own() {
    const bool process_kernels = fast_kernels_enabled();
    const ComputeContext three({3, !process_kernels});
    const ComputeContext one({1, process_kernels});
    QCOMPARE(three.threads(), 3);
    QVERIFY(current_compute_context() == nullptr);
    QCOMPARE(&kernels::current_thread_pool(), &kernels::default_thread_pool());
    {
      const ComputeScope scope(&three);
      QVERIFY(current_compute_context() == &three);
      QCOMPARE(kernels::current_thread_pool().size(), 3);
      QCOMPARE(fast_kernels_enabled(), !process_kernels);
      {
        const ComputeScope inner(&one);
        QCOMPARE(kernels::current_thread_pool().size(), 1);
        QCOMPARE(fast_kernels_enabled(), process_kernels);
        const ComputeScope nothing(nullptr);  // changes nothing
        QVERIFY(current_compute_context() == &one);
      }
      QVERIFY(current_compute_context() == &three);
      // Another thread is not inside this scope.
      bool other_sees_none = false;
      std::thread([&] { other_sees_none = current_compute_context() == nullptr; }).join();
      QVERIFY(other_sees_none);
    }
    QVERIFY(current_compute_context() == nullptr);
    QCOMPARE(fast_kernels_enabled(), process_kernels);
    QCOMPARE(&kernels::current_thread_pool(), &kernels::default_thread_pool());
  }

  void a_thread_count_past_the_limit_is_refused() {
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, ComputeContext({max_compute_threads() + 1, true}));
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, ComputeContext({-1, true}));
    QVERIFY(ComputeContext({0, true}).threads() >= 1);  // the machine's cores
  }

  // One session with one thread and LibTorch's products, one with two threads and the kernels, at the same
  // time on two threads, three rounds: each gives exactly the ids of a session with no context of its own.
  void two_contexts_generate_side_by_side() {
    const std::vector<TokenId> prompt = test::made_up_prompt(40, 11);
    Session alone(loaded_.model, KvCacheMode::Contiguous);
    const std::vector<TokenId> expected = alone.generate(prompt, greedy(96)).generated;
    QCOMPARE(expected.size(), std::size_t{96});

    auto plain = std::make_shared<const ComputeContext>(ComputeContext::Options{1, false});
    auto fast = std::make_shared<const ComputeContext>(ComputeContext::Options{2, true});
    std::vector<TokenId> results[2];
    std::atomic<int> ready{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i)
      threads.emplace_back([&, i] {
        Session session(loaded_.model, KvCacheMode::Contiguous);
        session.set_compute_context(i == 0 ? plain : fast);
        ++ready;
        while (ready < 2) std::this_thread::yield();  // both start together
        for (int round = 0; round < 3; ++round) {
          session.clear();
          results[i] = session.generate(prompt, greedy(96)).generated;
          if (results[i] != expected) return;
        }
      });
    for (std::thread& thread : threads) thread.join();
    QCOMPARE(results[0], expected);
    QCOMPARE(results[1], expected);
    QVERIFY(current_compute_context() == nullptr);  // the sessions' scopes ended with their calls
  }

 private:
  LoadedModel loaded_;
};

KVCHAT_TEST_MAIN(ComputeContextTest)

}  // namespace engine_test_compute_context

#include "test_compute_context.moc"
