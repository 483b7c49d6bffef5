// The bandwidth probe returns sane numbers (no timing thresholds: the machine may be busy).
#include <QtTest>
#include "common/test_suite.h"

#include <cmath>
#include <stdexcept>
#include <vector>

#include "engine/kernels/memory_probe.h"
#include "engine/kernels/thread_pool.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace kernels_test_memory_probe {

using namespace kvchat::kernels;

class MemoryProbeTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void small_buffer_gives_positive_finite_rates() {
    for (int threads : {1, 2}) {
      const BandwidthResult result = measure_read_bandwidth(threads, 8u << 20, 3);
      QCOMPARE(result.runs, 3);
      QVERIFY(std::isfinite(result.best) && result.best > 0);
      QVERIFY(std::isfinite(result.median) && result.median > 0);
      QVERIFY(result.median <= result.best);
      QCOMPARE(result.gigabytes_per_second, result.best);
    }
  }

  void odd_sized_buffer_is_fine() {
    const BandwidthResult result = measure_read_bandwidth(3, (1u << 20) + 13, 2);
    QVERIFY(std::isfinite(result.best) && result.best > 0);
  }

  void existing_buffer_is_read_as_is() {
    // Memory that is not the probe's own (as a model's weights are), left unchanged.
    std::vector<std::uint64_t> data(1u << 20);
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = i * 7;
    ThreadPool pool(2);
    const BandwidthResult result = measure_read_bandwidth_of(data.data(), data.size() * 8, pool, 3);
    QCOMPARE(result.runs, 3);
    QVERIFY(std::isfinite(result.best) && result.best > 0 && result.median <= result.best);
    for (std::size_t i = 0; i < data.size(); ++i)
      if (data[i] != i * 7) QFAIL("the probe wrote to the buffer it measured");
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, measure_read_bandwidth_of(nullptr, 1u << 20, pool, 1));
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, measure_read_bandwidth_of(data.data(), 100, pool, 1));
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, measure_read_bandwidth_of(data.data(), 1u << 20, pool, 0));
  }

  void bad_arguments_throw() {
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, measure_read_bandwidth(0, 1u << 20, 1));
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, measure_read_bandwidth(1, 1u << 20, 0));
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, measure_read_bandwidth(1, 100, 1));
  }
};

KVCHAT_TEST_APPLESS_MAIN(MemoryProbeTest)

}  // namespace kernels_test_memory_probe

#include "test_memory_probe.moc"
