// A GGUF BF16 matrix's products over its repacked rows (bf16_packed.h): against sums in double of the same bf16
// values for every shape a model can give (input rows past a 12-row group, odd columns, columns past a panel,
// weight rows past a 32-row tile), y untouched outside the product, threads' shares of tiles equal to one call,
// and each input row's sums equal to the bit whatever the number of rows computed with it (one row, a decode step,
// as part of a prompt's rows).
#include <QtTest>
#include "common/test_suite.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "engine/kernels/bf16.h"
#include "engine/kernels/bf16_packed.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace kernels_test_bf16_packed {

using namespace kvchat::kernels;

namespace {

struct Problem {
  int rows, cols, out;
  std::vector<float> x;  // bf16 values
  std::vector<std::uint16_t> w;
  std::vector<std::uint32_t> matrix;
};

Problem make_problem(int rows, int cols, int out) {
  Problem problem{rows, cols, out, {}, {}, {}};
  std::mt19937 generator(static_cast<unsigned>(rows * 1000003 + cols * 101 + out));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  problem.x.resize(static_cast<std::size_t>(rows * cols));
  for (float& value : problem.x) value = bf16_to_float(float_to_bf16(normal(generator)));
  problem.w.resize(static_cast<std::size_t>(out * cols));
  for (std::uint16_t& value : problem.w) value = float_to_bf16(normal(generator) * 0.1f);
  problem.matrix.assign(static_cast<std::size_t>(bf16_packed_matrix_words(out, cols)), 0xdeadbeefu);
  // Packed in two calls, as threads pack their shares of the tiles.
  const std::int64_t tiles = (out + kBf16TileRows - 1) / kBf16TileRows, first_share = tiles / 2;
  bf16_pack_matrix(problem.w.data(), out, cols, 0, first_share, problem.matrix.data());
  bf16_pack_matrix(problem.w.data(), out, cols, first_share, tiles - first_share, problem.matrix.data());
  return problem;
}

// y [rows, ldy] for input rows [first, first + rows) of the problem, in two calls over the tiles.
std::vector<float> products(const Problem& problem, int first, int rows, int ldy, float fill) {
  std::vector<std::uint32_t> input(static_cast<std::size_t>(bf16_packed_input_words(rows, problem.cols)));
  const float* x = problem.x.data() + static_cast<std::size_t>(first * problem.cols);
  bf16_pack_input(x, rows, problem.cols, 0, rows, input.data());
  std::vector<float> y(static_cast<std::size_t>((rows + 1) * ldy), fill);
  const std::int64_t tiles = (problem.out + kBf16TileRows - 1) / kBf16TileRows, first_share = (tiles + 1) / 2;
  std::vector<float> scratch(static_cast<std::size_t>(bf16_products_scratch_floats(tiles)));
  bf16_packed_products(input.data(), rows, problem.cols, problem.matrix.data(), problem.out, 0, first_share, y.data(),
                       ldy, scratch.data());
  if (tiles > first_share)
    bf16_packed_products(input.data(), rows, problem.cols, problem.matrix.data(), problem.out, first_share,
                         tiles - first_share, y.data(), ldy, scratch.data());
  return y;
}

}  // namespace

class Bf16PackedTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void products_equal_double_sums_data();
  void products_equal_double_sums();
  void a_row_sums_alike_in_any_number_of_rows_data();
  void a_row_sums_alike_in_any_number_of_rows();
};

void Bf16PackedTest::products_equal_double_sums_data() {
  QTest::addColumn<int>("rows");
  QTest::addColumn<int>("cols");
  QTest::addColumn<int>("out");
  QTest::newRow("one row") << 1 << 64 << 32;
  QTest::newRow("one row, partial tiles") << 1 << 70 << 131;
  QTest::newRow("a group") << 12 << 256 << 64;
  QTest::newRow("groups and a tail") << 29 << 512 << 96;
  QTest::newRow("odd columns") << 13 << 33 << 17;
  QTest::newRow("one column") << 5 << 1 << 3;
  QTest::newRow("past a panel, partial tiles") << 25 << 300 << 47;
  QTest::newRow("long rows") << 40 << 2050 << 70;
}

void Bf16PackedTest::products_equal_double_sums() {
  if (!bf16_packed_available()) QSKIP("no AVX-512 BF16 on this processor (or the AVX-512 kernels are off)");
  QFETCH(int, rows);
  QFETCH(int, cols);
  QFETCH(int, out);
  const Problem problem = make_problem(rows, cols, out);
  const int ldy = out + 5;  // y is wider than the product and has a row beyond it: those values must stay
  const float sentinel = -12345.0f;
  const std::vector<float> y = products(problem, 0, rows, ldy, sentinel);
  for (int r = 0; r <= rows; ++r) {
    for (int c = 0; c < ldy; ++c) {
      const float got = y[static_cast<std::size_t>(r * ldy + c)];
      if (r == rows || c >= out) {
        QVERIFY2(got == sentinel, qPrintable(QString("y[%1][%2] outside the product was written").arg(r).arg(c)));
        continue;
      }
      // Each product of two bf16 values is exact in f32; only the f32 sums round.
      double exact = 0.0, magnitude = 0.0;
      for (int k = 0; k < cols; ++k) {
        const double product = double(problem.x[static_cast<std::size_t>(r * cols + k)]) *
                               double(bf16_to_float(problem.w[static_cast<std::size_t>(c * cols + k)]));
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

void Bf16PackedTest::a_row_sums_alike_in_any_number_of_rows_data() {
  QTest::addColumn<int>("cols");
  QTest::addColumn<int>("out");
  QTest::newRow("model-like") << 512 << 96;
  QTest::newRow("odd, past a panel") << 301 << 45;
}

// A decode step (one row), a few rows of a batch, and a prompt's rows: every row's sums to the bit the same.
void Bf16PackedTest::a_row_sums_alike_in_any_number_of_rows() {
  if (!bf16_packed_available()) QSKIP("no AVX-512 BF16 on this processor (or the AVX-512 kernels are off)");
  QFETCH(int, cols);
  QFETCH(int, out);
  const int rows = 30;
  const Problem problem = make_problem(rows, cols, out);
  const std::vector<float> all = products(problem, 0, rows, out, 0.0f);
  for (int count : {1, 2, 5, 12, 13}) {
    for (int first = 0; first + count <= rows; first += 7) {
      const std::vector<float> some = products(problem, first, count, out, 0.0f);
      QVERIFY2(
          std::memcmp(some.data(), all.data() + static_cast<std::size_t>(first * out),
                      static_cast<std::size_t>(count * out) * sizeof(float)) == 0,
          qPrintable(QString("rows %1..%2 computed %3 at a time differ").arg(first).arg(first + count - 1).arg(count)));
    }
  }
}

KVCHAT_TEST_APPLESS_MAIN(Bf16PackedTest)

}  // namespace kernels_test_bf16_packed

#include "test_bf16_packed.moc"
