// The bf16 prompt product (bf16_gemm.h) against sums in double of the same bf16 values: every shape a model can
// give it (rows not a multiple of the 12-row group, columns odd or past a 256-column panel, weight rows not a
// multiple of the 32-row tile), every value of y outside the product's rows and columns left as it was, and the
// input packed in groups by several callers equal to one pack.
#include <QtTest>
#include "common/test_suite.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "engine/kernels/bf16.h"
#include "engine/kernels/bf16_gemm.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace kernels_test_bf16_gemm {

using namespace kvchat::kernels;

class Bf16GemmTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void products_equal_double_sums_data();
  void products_equal_double_sums();
  void packing_in_groups_equals_one_pack();
};

void Bf16GemmTest::products_equal_double_sums_data() {
  QTest::addColumn<int>("rows");
  QTest::addColumn<int>("cols");
  QTest::addColumn<int>("out");
  QTest::newRow("one row") << 1 << 64 << 32;
  QTest::newRow("a group") << 12 << 256 << 64;
  QTest::newRow("groups and a tail") << 29 << 512 << 96;
  QTest::newRow("odd columns") << 13 << 33 << 17;
  QTest::newRow("one column") << 5 << 1 << 3;
  QTest::newRow("past a panel, partial tiles") << 25 << 300 << 47;
  QTest::newRow("long rows") << 40 << 2050 << 70;
}

void Bf16GemmTest::products_equal_double_sums() {
  if (!bf16_gemm_available()) QSKIP("no AVX-512 BF16 on this processor (or the AVX-512 kernels are off)");
  QFETCH(int, rows);
  QFETCH(int, cols);
  QFETCH(int, out);
  std::mt19937 generator(static_cast<unsigned>(rows * 1000003 + cols * 101 + out));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(rows * cols));
  for (float& value : x) value = bf16_to_float(float_to_bf16(normal(generator)));
  std::vector<std::uint16_t> w(static_cast<std::size_t>(out * cols));
  for (std::uint16_t& value : w) value = float_to_bf16(normal(generator) * 0.1f);
  std::vector<std::uint32_t> packed(static_cast<std::size_t>(bf16_gemm_packed_words(rows, cols)));
  bf16_gemm_pack_input(x.data(), rows, cols, 0, rows, packed.data());
  // y is wider than the product (ldy = out + 5) and has a row beyond it: those values must stay.
  const int ldy = out + 5;
  const float sentinel = -12345.0f;
  std::vector<float> y(static_cast<std::size_t>((rows + 1) * ldy), sentinel);
  std::vector<float> scratch(static_cast<std::size_t>(bf16_gemm_scratch_floats(out)));
  bf16_gemm_rows(packed.data(), rows, cols, w.data(), out, y.data(), ldy, scratch.data());
  for (int r = 0; r <= rows; ++r) {
    for (int c = 0; c < ldy; ++c) {
      const float got = y[static_cast<std::size_t>(r * ldy + c)];
      if (r == rows || c >= out) {
        QVERIFY2(got == sentinel, qPrintable(QString("y[%1][%2] outside the product was written").arg(r).arg(c)));
        continue;
      }
      // Each product of two bf16 values is exact in f32; only the f32 sums round: within the sum of |products|
      // times a few f32 steps per term.
      double exact = 0.0, magnitude = 0.0;
      for (int k = 0; k < cols; ++k) {
        const double product = double(x[static_cast<std::size_t>(r * cols + k)]) *
                               double(bf16_to_float(w[static_cast<std::size_t>(c * cols + k)]));
        exact += product;
        magnitude += std::fabs(product);
      }
      const double tolerance = magnitude * 1e-7 * std::sqrt(double(cols)) + 1e-30;
      QVERIFY2(std::fabs(got - exact) <= tolerance, qPrintable(QString("y[%1][%2] = %3, expected %4 (tolerance %5)")
                                                                   .arg(r)
                                                                   .arg(c)
                                                                   .arg(double(got), 0, 'g', 9)
                                                                   .arg(exact, 0, 'g', 9)
                                                                   .arg(tolerance)));
    }
  }
}

// Threads pack their own groups of rows (the prompt GEMM packs in parallel): the same words as one pack.
void Bf16GemmTest::packing_in_groups_equals_one_pack() {
  if (!bf16_gemm_available()) QSKIP("no AVX-512 BF16 on this processor (or the AVX-512 kernels are off)");
  const int rows = 31, cols = 77;
  std::vector<float> x(static_cast<std::size_t>(rows * cols));
  for (int i = 0; i < rows * cols; ++i) x[static_cast<std::size_t>(i)] = bf16_to_float(float_to_bf16(0.01f * i - 3));
  const auto words = static_cast<std::size_t>(bf16_gemm_packed_words(rows, cols));
  std::vector<std::uint32_t> whole(words, 7u), parts(words, 9u);
  bf16_gemm_pack_input(x.data(), rows, cols, 0, rows, whole.data());
  for (int first = 0; first < rows; first += kBf16GemmGroupRows)
    bf16_gemm_pack_input(x.data(), rows, cols, first, std::min<int>(kBf16GemmGroupRows, rows - first), parts.data());
  QCOMPARE(parts, whole);
  // A word holds a row's values 2p (low half) and 2p + 1 (high half); rows past the input are zero.
  const std::int64_t pairs = (cols + 1) / 2;
  QCOMPARE(whole[0] & 0xffffu, static_cast<std::uint32_t>(float_to_bf16(x[0])));
  QCOMPARE(whole[0] >> 16, static_cast<std::uint32_t>(float_to_bf16(x[1])));
  QCOMPARE(whole[1] & 0xffffu, static_cast<std::uint32_t>(float_to_bf16(x[static_cast<std::size_t>(cols)])));
  const std::size_t last_group = static_cast<std::size_t>((rows / kBf16GemmGroupRows) * kBf16GemmGroupRows * pairs);
  QCOMPARE(whole[last_group + static_cast<std::size_t>(kBf16GemmGroupRows - 1)], 0u);
  // An odd row length's last pair has a zero high half.
  QCOMPARE(whole[static_cast<std::size_t>((pairs - 1) * kBf16GemmGroupRows)] >> 16, 0u);
}

KVCHAT_TEST_APPLESS_MAIN(Bf16GemmTest)

}  // namespace kernels_test_bf16_gemm

#include "test_bf16_gemm.moc"
