// The bandwidth probe returns sane numbers (no timing thresholds: the machine may be busy).
#include <QtTest>

#include <cmath>
#include <stdexcept>

#include "engine/kernels/memory_probe.h"

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

  void bad_arguments_throw() {
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, measure_read_bandwidth(0, 1u << 20, 1));
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, measure_read_bandwidth(1, 1u << 20, 0));
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, measure_read_bandwidth(1, 100, 1));
  }
};

QTEST_APPLESS_MAIN(MemoryProbeTest)
#include "test_memory_probe.moc"
