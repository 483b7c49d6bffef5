// ThreadPool: every index is visited exactly once, chunks honour the grain, exceptions propagate,
// nested and repeated use work, and the default pool follows set_default_threads.
#include <QtTest>
#include "common/test_suite.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <vector>

#include "engine/kernels/thread_pool.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace kernels_test_thread_pool {

using namespace kvchat::kernels;

class ThreadPoolTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void every_index_visited_once() {
    for (int threads : {1, 2, 3, 4, 7}) {
      ThreadPool pool(threads);
      QCOMPARE(pool.size(), threads);
      for (std::int64_t n : {1, 2, 3, 5, 7, 8, 64, 1000, 1001, 65537}) {
        for (std::int64_t grain : {1, 3, 4, 16, 1000}) {
          std::vector<std::atomic<int>> visits(static_cast<std::size_t>(n));
          std::mutex chunks_mutex;
          std::vector<std::pair<std::int64_t, std::int64_t>> chunks;
          pool.parallel_for(
              n,
              [&](std::int64_t begin, std::int64_t end) {
                for (std::int64_t i = begin; i < end; ++i) visits[static_cast<std::size_t>(i)].fetch_add(1);
                std::lock_guard<std::mutex> lock(chunks_mutex);
                chunks.emplace_back(begin, end);
              },
              grain);
          for (std::int64_t i = 0; i < n; ++i) {
            QVERIFY2(visits[static_cast<std::size_t>(i)].load() == 1,
                     qPrintable(QString("threads=%1 n=%2 grain=%3: index %4 visited %5 times")
                                    .arg(threads)
                                    .arg(n)
                                    .arg(grain)
                                    .arg(i)
                                    .arg(visits[static_cast<std::size_t>(i)].load())));
          }
          QVERIFY(static_cast<int>(chunks.size()) <= threads);
          for (const auto& [begin, end] : chunks) {
            QVERIFY2(begin % grain == 0,
                     qPrintable(QString("chunk start %1 not a multiple of grain %2").arg(begin).arg(grain)));
            QVERIFY(begin < end);
          }
        }
      }
    }
  }

  void blocks_cover_range_in_order_of_size() {
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      for (std::int64_t n : {1, 5, 16, 17, 1000, 4099}) {
        for (std::int64_t block : {1, 4, 16, 5000}) {
          std::vector<std::atomic<int>> visits(static_cast<std::size_t>(n));
          std::mutex calls_mutex;
          std::vector<std::pair<std::int64_t, std::int64_t>> calls;
          pool.parallel_for_blocks(
              n,
              [&](std::int64_t begin, std::int64_t end) {
                for (std::int64_t i = begin; i < end; ++i) visits[static_cast<std::size_t>(i)].fetch_add(1);
                std::lock_guard<std::mutex> lock(calls_mutex);
                calls.emplace_back(begin, end);
              },
              block);
          for (std::int64_t i = 0; i < n; ++i) QCOMPARE(visits[static_cast<std::size_t>(i)].load(), 1);
          const std::int64_t expected_calls = threads == 1 || n <= block ? 1 : (n + block - 1) / block;
          QCOMPARE(static_cast<std::int64_t>(calls.size()), expected_calls);
          if (expected_calls > 1) {
            for (const auto& [begin, end] : calls) {
              QCOMPARE(begin % block, std::int64_t{0});
              QCOMPARE(end, std::min(n, begin + block));
            }
          }
        }
      }
    }
  }

  // The chunks really run at the same time: each one waits (up to a generous limit) until all three
  // have started, which a pool that ran them one after another could never satisfy.
  void guided_blocks_cover_range_and_shrink() {
    // Every index once; each block a multiple of min_block (but the last), at most max_block; and
    // since claims take a share of what is left, the last blocks are shorter than the first.
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      for (auto [n, min_block, max_block] : std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{
               {1, 16, 128}, {15, 16, 128}, {1000, 16, 128}, {8192, 16, 256}, {128256, 64, 512}, {100, 7, 3}}) {
        std::vector<std::atomic<int>> visits(static_cast<std::size_t>(n));
        std::mutex blocks_mutex;
        std::vector<std::pair<std::int64_t, std::int64_t>> blocks;
        pool.parallel_for_guided(
            n,
            [&](std::int64_t begin, std::int64_t end) {
              for (std::int64_t i = begin; i < end; ++i) visits[static_cast<std::size_t>(i)].fetch_add(1);
              std::lock_guard<std::mutex> lock(blocks_mutex);
              blocks.emplace_back(begin, end);
            },
            min_block, max_block);
        for (std::int64_t i = 0; i < n; ++i) QCOMPARE(visits[static_cast<std::size_t>(i)].load(), 1);
        std::sort(blocks.begin(), blocks.end());
        if (threads == 1) {  // nobody to share with: one call over the whole range
          QCOMPARE(blocks.size(), std::size_t{1});
          QCOMPARE(blocks.front(), std::make_pair(std::int64_t{0}, n));
          continue;
        }
        const std::int64_t effective_max = std::max(max_block, min_block);
        for (std::size_t b = 0; b < blocks.size(); ++b) {
          const std::int64_t size = blocks[b].second - blocks[b].first;
          QVERIFY(size >= 1 && size <= effective_max);
          if (blocks[b].second != n) QCOMPARE(size % min_block, std::int64_t{0});
        }
        if (n >= 8 * effective_max) {
          QCOMPARE(blocks.front().second - blocks.front().first, effective_max);
          QVERIFY(blocks.back().second - blocks.back().first < effective_max);
        }
      }
    }
  }

  void chunks_run_concurrently_on_distinct_threads() {
    ThreadPool pool(3);
    std::atomic<int> started{0};
    std::atomic<int> saw_all_started{0};
    std::mutex ids_mutex;
    std::set<std::thread::id> ids;
    pool.parallel_for(3, [&](std::int64_t, std::int64_t) {
      {
        std::lock_guard<std::mutex> lock(ids_mutex);
        ids.insert(std::this_thread::get_id());
      }
      started.fetch_add(1);
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (started.load() < 3 && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
      if (started.load() == 3) saw_all_started.fetch_add(1);
    });
    QCOMPARE(saw_all_started.load(), 3);
    QCOMPARE(static_cast<int>(ids.size()), 3);
  }

  void repeated_use_many_times() {
    ThreadPool pool(2);
    std::int64_t total = 0;
    for (int iteration = 0; iteration < 20000; ++iteration) {
      std::atomic<std::int64_t> sum{0};
      pool.parallel_for(100, [&](std::int64_t begin, std::int64_t end) {
        std::int64_t local = 0;
        for (std::int64_t i = begin; i < end; ++i) local += i;
        sum.fetch_add(local);
      });
      total += sum.load();
    }
    QCOMPARE(total, static_cast<std::int64_t>(20000) * 4950);
  }

  void survives_idle_gaps() {
    // Workers fall asleep after their spin; the next job must still wake them.
    ThreadPool pool(2);
    for (int iteration = 0; iteration < 5; ++iteration) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      std::atomic<int> count{0};
      pool.parallel_for(10,
                        [&](std::int64_t begin, std::int64_t end) { count.fetch_add(static_cast<int>(end - begin)); });
      QCOMPARE(count.load(), 10);
    }
  }

  void nested_call_runs_inline() {
    ThreadPool pool(2);
    std::vector<std::atomic<int>> visits(20 * 30);
    pool.parallel_for(20, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) {
        pool.parallel_for(30, [&](std::int64_t inner_begin, std::int64_t inner_end) {
          for (std::int64_t j = inner_begin; j < inner_end; ++j)
            visits[static_cast<std::size_t>(i * 30 + j)].fetch_add(1);
        });
      }
    });
    for (auto& v : visits) QCOMPARE(v.load(), 1);
  }

  void concurrent_callers_share_a_pool() {
    ThreadPool pool(2);
    std::atomic<std::int64_t> sum{0};
    std::vector<std::thread> callers;
    for (int t = 0; t < 4; ++t) {
      callers.emplace_back([&] {
        for (int iteration = 0; iteration < 500; ++iteration) {
          pool.parallel_for(64, [&](std::int64_t begin, std::int64_t end) { sum.fetch_add(end - begin); });
        }
      });
    }
    for (auto& caller : callers) caller.join();
    QCOMPARE(sum.load(), static_cast<std::int64_t>(4 * 500 * 64));
  }

  void exception_propagates_and_pool_stays_usable() {
    ThreadPool pool(2);
    for (std::int64_t failing_index : {0, 99}) {  // thrown on the caller's chunk, then on a worker's
      try {
        pool.parallel_for(100, [&](std::int64_t begin, std::int64_t end) {
          if (failing_index >= begin && failing_index < end) throw std::runtime_error("chunk failed");
        });
        QFAIL("no exception");
      } catch (const std::runtime_error& error) {
        QCOMPARE(QString(error.what()), QString("chunk failed"));
      }
    }
    std::atomic<int> count{0};
    pool.parallel_for(100,
                      [&](std::int64_t begin, std::int64_t end) { count.fetch_add(static_cast<int>(end - begin)); });
    QCOMPARE(count.load(), 100);
  }

  void empty_range_runs_nothing() {
    ThreadPool pool(2);
    bool called = false;
    pool.parallel_for(0, [&](std::int64_t, std::int64_t) { called = true; });
    pool.parallel_for(-5, [&](std::int64_t, std::int64_t) { called = true; });
    QVERIFY(!called);
  }

  void invalid_thread_count_throws() {
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, ThreadPool(0));
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, set_default_threads(-1));
  }

  void default_pool_recreated_by_set_default_threads() {
    set_default_threads(3);
    QCOMPARE(default_threads(), 3);
    QCOMPARE(default_thread_pool().size(), 3);
    set_default_threads(1);
    QCOMPARE(default_threads(), 1);
    QCOMPARE(default_thread_pool().size(), 1);
    std::atomic<int> count{0};
    default_thread_pool().parallel_for(
        10, [&](std::int64_t begin, std::int64_t end) { count.fetch_add(static_cast<int>(end - begin)); });
    QCOMPARE(count.load(), 10);
    set_default_threads(0);
    const int hardware = static_cast<int>(std::thread::hardware_concurrency());
    QCOMPARE(default_threads(), hardware > 0 ? hardware : 1);
    QCOMPARE(default_thread_pool().size(), default_threads());
  }
};

KVCHAT_TEST_APPLESS_MAIN(ThreadPoolTest)

}  // namespace kernels_test_thread_pool

#include "test_thread_pool.moc"
