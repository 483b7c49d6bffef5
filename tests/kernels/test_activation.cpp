// The SwiGLU activation kernel against a double-precision reference, for the AVX2 and the portable
// versions: lengths with and without a vector tail, ordinary and extreme inputs.
#include <QtTest>
#include <cmath>
#include <random>
#include <vector>
#include "common/test_suite.h"

#include "engine/kernels/activation.h"
#include "engine/kernels/cpu_features.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace kernels_test_activation {

using namespace kvchat::kernels;

class ActivationTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void silu_mul_matches_reference_data();
  void silu_mul_matches_reference();
  void silu_mul_extremes_data();
  void silu_mul_extremes();
  void cleanup() { set_avx2_kernels_enabled(true); }
};

namespace {
double silu_reference(double x) { return x / (1.0 + std::exp(-x)); }

void add_isa_rows(const std::vector<int>& lengths) {
  for (bool avx2 : {true, false})
    for (int n : lengths) QTest::newRow(QString("n%1 %2").arg(n).arg(avx2 ? "avx2" : "portable").toUtf8()) << n << avx2;
}
}  // namespace

void ActivationTest::silu_mul_matches_reference_data() {
  QTest::addColumn<int>("n");
  QTest::addColumn<bool>("avx2");
  add_isa_rows({0, 1, 7, 8, 9, 64, 172, 8192});
}

void ActivationTest::silu_mul_matches_reference() {
  QFETCH(int, n);
  QFETCH(bool, avx2);
  if (avx2 && !cpu_has_avx2_fma()) QSKIP("no AVX2 on this processor");
  set_avx2_kernels_enabled(avx2);
  std::mt19937 rng(static_cast<unsigned>(n) * 31u + 7u);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> gate(n), up(n);
  for (float& v : gate) v = normal(rng);
  for (float& v : up) v = normal(rng);
  std::vector<float> result = gate;
  silu_mul(result.data(), up.data(), n);
  for (int i = 0; i < n; ++i) {
    const double expected = silu_reference(gate[i]) * up[i];
    QVERIFY2(std::fabs(result[i] - expected) <= 1e-6 * std::fabs(expected) + 1e-7,
             qPrintable(QString("element %1: silu(%2) * %3 = %4, expected %5")
                            .arg(i)
                            .arg(gate[i])
                            .arg(up[i])
                            .arg(result[i])
                            .arg(expected)));
  }
}

void ActivationTest::silu_mul_extremes_data() {
  QTest::addColumn<int>("n");
  QTest::addColumn<bool>("avx2");
  add_isa_rows({8, 11});
}

void ActivationTest::silu_mul_extremes() {
  // Far beyond the exponential's range on both sides, zero and its sign: finite, and at the limits
  // silu(x) -> x for large x and -> 0 for very negative x.
  QFETCH(int, n);
  QFETCH(bool, avx2);
  if (avx2 && !cpu_has_avx2_fma()) QSKIP("no AVX2 on this processor");
  set_avx2_kernels_enabled(avx2);
  const float inputs[] = {-1000.f, -100.f, -88.5f, -0.f, 0.f, 88.5f, 100.f, 1000.f, -20.f, 20.f, 1e-30f};
  std::vector<float> gate(inputs, inputs + n), up(n, 2.f);
  silu_mul(gate.data(), up.data(), n);
  for (int i = 0; i < n; ++i) {
    QVERIFY2(std::isfinite(gate[i]), qPrintable(QString("silu(%1) is not finite").arg(inputs[i])));
    const double expected = silu_reference(inputs[i]) * 2.0;
    QVERIFY2(std::fabs(gate[i] - expected) <= 1e-6 * std::fabs(expected) + 1e-30,
             qPrintable(QString("silu(%1) * 2 = %2, expected %3").arg(inputs[i]).arg(gate[i]).arg(expected)));
  }
}

KVCHAT_TEST_APPLESS_MAIN(ActivationTest)

}  // namespace kernels_test_activation

#include "test_activation.moc"
