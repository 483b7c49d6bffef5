// matvec_* and matmul_*_small against a double-precision reference, on random data, for shapes that
// hit every tail (row blocks, column blocks, scalar columns), with 1, 2 and 3 threads and with both
// the AVX2 and the portable kernels.
#include <QtTest>
#include "common/test_suite.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/kernels/bf16.h"
#include "engine/kernels/cpu_features.h"
#include "engine/kernels/matvec.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace kernels_test_matvec {

using namespace kvchat::kernels;

namespace {

struct Shape {
  std::int64_t rows;
  std::int64_t cols;
};

const std::vector<Shape> kShapes = {{1, 1},
                                    {3, 5},
                                    {7, 9},
                                    {4, 8},
                                    {5, 16},
                                    {9, 17},
                                    {13, 31},
                                    {64, 64},
                                    {172, 64},
                                    {64, 172},
                                    {33, 100},
                                    {1000, 257},
                                    {257, 1000},
                                    {130, 2048},
                                    {2050, 129},
                                    // Long rows, as in down projections: 4,133 columns (no whole
                                    // number of the kernels' 64-column steps), and the 1B shape's 8,192,
                                    // a matrix the pool's threads split into blocks.
                                    {40, 4133},
                                    {300, 8192}};

std::vector<float> random_floats(std::size_t count, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> values(count);
  for (float& v : values) v = dist(rng);
  return values;
}

double weight_value(float w) { return w; }
double weight_value(std::uint16_t w) { return bf16_to_float(w); }

// Checks Y [n, rows] against sum_c W[r, c] X[i, c] + bias[r] in double. Float accumulation error
// grows with the magnitude of the terms, not of their (possibly cancelling) sum, so the tolerance is
// relative to sum_c |W[r, c] X[i, c]|.
template <typename Weight>
void check_against_reference(const Weight* weight, const float* x, const float* y, const float* bias, std::int64_t n,
                             std::int64_t rows, std::int64_t cols, const QString& context) {
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t r = 0; r < rows; ++r) {
      double sum = bias ? bias[r] : 0.0;
      double magnitude = bias ? std::fabs(bias[r]) : 0.0;
      for (std::int64_t c = 0; c < cols; ++c) {
        const double term = weight_value(weight[r * cols + c]) * static_cast<double>(x[i * cols + c]);
        sum += term;
        magnitude += std::fabs(term);
      }
      const double got = y[i * rows + r];
      const double tolerance = 1e-5 * magnitude + 1e-30;
      if (!(std::fabs(got - sum) <= tolerance)) {
        QFAIL(qPrintable(QString("%1: Y[%2, %3] = %4, expected %5 (tolerance %6)")
                             .arg(context)
                             .arg(i)
                             .arg(r)
                             .arg(got, 0, 'g', 9)
                             .arg(sum, 0, 'g', 9)
                             .arg(tolerance)));
      }
    }
  }
}

// Runs `body` for every combination of thread count and kernel family.
template <typename Body>
void for_each_configuration(const Body& body) {
  for (int threads : {1, 2, 3}) {
    set_default_threads(threads);
    // AVX-512 where the processor has it (the kernels that use it), AVX2 alone, portable.
    for (int level : {2, 1, 0}) {
      if (level > 0 && !cpu_has_avx2_fma()) continue;
      if (level == 2 && !cpu_has_avx512()) continue;
      set_avx2_kernels_enabled(level > 0);
      set_avx512_kernels_enabled(level == 2);
      body(QString("threads=%1 %2").arg(threads).arg(level == 2 ? "avx512" : level == 1 ? "avx2" : "portable"));
      if (QTest::currentTestFailed()) break;
    }
    if (QTest::currentTestFailed()) break;
  }
  set_avx2_kernels_enabled(true);
  set_avx512_kernels_enabled(true);
  set_default_threads(0);
}

}  // namespace

class MatvecTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  // Products sharing one input, as one job, equal the separate matrix-vector products exactly (the same
  // per-row code), across matrix boundaries that fall inside the threads' blocks.
  void shared_input_products_equal_separate_ones() {
    std::mt19937 rng(2024);
    for_each_configuration([&](const QString& config) {
      for (std::int64_t cols : {64, 257, 2048, 4133}) {
        const std::int64_t rows[3] = {203, 61, 1100};  // uneven, so blocks straddle the matrices
        std::vector<float> x = random_floats(static_cast<std::size_t>(cols), rng);
        std::vector<std::vector<float>> weights, biases, expected(3), got(3);
        std::vector<std::vector<std::uint16_t>> weights_bf16;
        SharedInputProduct<float> jobs[3];
        SharedInputProduct<std::uint16_t> jobs_bf16[3];
        for (int i = 0; i < 3; ++i) {
          weights.push_back(random_floats(static_cast<std::size_t>(rows[i] * cols), rng));
          biases.push_back(random_floats(static_cast<std::size_t>(rows[i]), rng));
          expected[i].assign(static_cast<std::size_t>(rows[i]), NAN);
          got[i].assign(static_cast<std::size_t>(rows[i]), NAN);
          matvec_f32(weights[i].data(), x.data(), expected[i].data(), rows[i], cols,
                     i == 1 ? biases[i].data() : nullptr);
          jobs[i] = {weights[i].data(), got[i].data(), rows[i], i == 1 ? biases[i].data() : nullptr};
        }
        matvec_f32_shared_input(jobs, 3, x.data(), cols);
        for (int i = 0; i < 3; ++i)
          QVERIFY2(got[i] == expected[i],
                   qPrintable(QString("f32 product %1, cols %2, %3").arg(i).arg(cols).arg(config)));
        for (int i = 0; i < 3; ++i) {
          weights_bf16.emplace_back(weights[i].size());
          f32_to_bf16(weights[i].data(), weights_bf16[i].data(), static_cast<std::int64_t>(weights[i].size()));
          matvec_bf16(weights_bf16[i].data(), x.data(), expected[i].data(), rows[i], cols, nullptr);
          jobs_bf16[i] = {weights_bf16[i].data(), got[i].data(), rows[i], nullptr};
        }
        matvec_bf16_shared_input(jobs_bf16, 3, x.data(), cols);
        for (int i = 0; i < 3; ++i)
          QVERIFY2(got[i] == expected[i],
                   qPrintable(QString("bf16 product %1, cols %2, %3").arg(i).arg(cols).arg(config)));
      }
    });
  }

  // The row-exact products over n vectors give, bit for bit, what the one-vector product gives each vector: a
  // forward over several tokens then equals its decode steps (speculative checks, batches). Every shape,
  // including short rows (the four-row path), column tails and vector counts that are not multiples of four.
  void row_exact_products_equal_one_vector_products() {
    std::mt19937 rng(77);
    for_each_configuration([&](const QString& config) {
      for (const Shape& shape : kShapes) {
        for (std::int64_t n : {2, 3, 5, 6, 8, 12}) {
          const std::vector<float> weight = random_floats(static_cast<std::size_t>(shape.rows * shape.cols), rng);
          std::vector<std::uint16_t> weight_bf16(weight.size());
          f32_to_bf16(weight.data(), weight_bf16.data(), static_cast<std::int64_t>(weight.size()));
          const std::vector<float> bias = random_floats(static_cast<std::size_t>(shape.rows), rng);
          const std::vector<float> x = random_floats(static_cast<std::size_t>(n * shape.cols), rng);
          std::vector<float> got(static_cast<std::size_t>(n * shape.rows), NAN), expected(got.size(), NAN);
          const QString where = QString("%1x%2 n=%3 %4").arg(shape.rows).arg(shape.cols).arg(n).arg(config);
          SharedInputProduct<float> job{weight.data(), got.data(), shape.rows, bias.data()};
          matmul_f32_shared_input_exact(&job, 1, x.data(), n, shape.cols);
          for (std::int64_t i = 0; i < n; ++i) {
            SharedInputProduct<float> one{weight.data(), expected.data() + i * shape.rows, shape.rows, bias.data()};
            matvec_f32_shared_input(&one, 1, x.data() + i * shape.cols, shape.cols);
          }
          QVERIFY2(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)) == 0,
                   qPrintable("f32 " + where));
          SharedInputProduct<std::uint16_t> job_bf16{weight_bf16.data(), got.data(), shape.rows, nullptr};
          matmul_bf16_shared_input_exact(&job_bf16, 1, x.data(), n, shape.cols);
          for (std::int64_t i = 0; i < n; ++i) {
            SharedInputProduct<std::uint16_t> one{weight_bf16.data(), expected.data() + i * shape.rows, shape.rows,
                                                  nullptr};
            matvec_bf16_shared_input(&one, 1, x.data() + i * shape.cols, shape.cols);
          }
          QVERIFY2(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)) == 0,
                   qPrintable("bf16 " + where));
        }
      }
    });
  }

  void matvec_f32_matches_reference() {
    std::mt19937 rng(1234);
    for_each_configuration([&](const QString& config) {
      for (const Shape& shape : kShapes) {
        // One extra leading element so that the data is not 32-byte aligned.
        std::vector<float> w = random_floats(static_cast<std::size_t>(shape.rows * shape.cols) + 1, rng);
        std::vector<float> x = random_floats(static_cast<std::size_t>(shape.cols) + 1, rng);
        std::vector<float> bias = random_floats(static_cast<std::size_t>(shape.rows), rng);
        std::vector<float> y(static_cast<std::size_t>(shape.rows), NAN);
        const QString context = QString("matvec_f32 %1x%2 %3").arg(shape.rows).arg(shape.cols).arg(config);
        matvec_f32(w.data() + 1, x.data() + 1, y.data(), shape.rows, shape.cols);
        check_against_reference(w.data() + 1, x.data() + 1, y.data(), nullptr, 1, shape.rows, shape.cols, context);
        if (QTest::currentTestFailed()) return;
        matvec_f32(w.data() + 1, x.data() + 1, y.data(), shape.rows, shape.cols, bias.data());
        check_against_reference(w.data() + 1, x.data() + 1, y.data(), bias.data(), 1, shape.rows, shape.cols,
                                context + " +bias");
        if (QTest::currentTestFailed()) return;
      }
    });
  }

  void matvec_bf16_matches_reference() {
    std::mt19937 rng(99);
    for_each_configuration([&](const QString& config) {
      for (const Shape& shape : kShapes) {
        const std::vector<float> w32 = random_floats(static_cast<std::size_t>(shape.rows * shape.cols) + 1, rng);
        std::vector<std::uint16_t> w(w32.size());
        for (std::size_t i = 0; i < w32.size(); ++i) w[i] = float_to_bf16(w32[i]);
        std::vector<float> x = random_floats(static_cast<std::size_t>(shape.cols) + 1, rng);
        std::vector<float> bias = random_floats(static_cast<std::size_t>(shape.rows), rng);
        std::vector<float> y(static_cast<std::size_t>(shape.rows), NAN);
        const QString context = QString("matvec_bf16 %1x%2 %3").arg(shape.rows).arg(shape.cols).arg(config);
        matvec_bf16(w.data() + 1, x.data() + 1, y.data(), shape.rows, shape.cols);
        check_against_reference(w.data() + 1, x.data() + 1, y.data(), nullptr, 1, shape.rows, shape.cols, context);
        if (QTest::currentTestFailed()) return;
        matvec_bf16(w.data() + 1, x.data() + 1, y.data(), shape.rows, shape.cols, bias.data());
        check_against_reference(w.data() + 1, x.data() + 1, y.data(), bias.data(), 1, shape.rows, shape.cols,
                                context + " +bias");
        if (QTest::currentTestFailed()) return;
      }
    });
  }

  void matmul_small_matches_reference() {
    std::mt19937 rng(7);
    for_each_configuration([&](const QString& config) {
      for (const Shape& shape : kShapes) {
        for (std::int64_t n : {1, 2, 3, 5, 8}) {
          const std::size_t weights = static_cast<std::size_t>(shape.rows * shape.cols);
          const std::vector<float> w32 = random_floats(weights, rng);
          std::vector<std::uint16_t> w16(weights);
          for (std::size_t i = 0; i < weights; ++i) w16[i] = float_to_bf16(w32[i]);
          const std::vector<float> x = random_floats(static_cast<std::size_t>(n * shape.cols), rng);
          const std::vector<float> bias = random_floats(static_cast<std::size_t>(shape.rows), rng);
          std::vector<float> y(static_cast<std::size_t>(n * shape.rows), NAN);
          const QString context = QString("%1x%2 n=%3 %4").arg(shape.rows).arg(shape.cols).arg(n).arg(config);
          matmul_f32_small(w32.data(), x.data(), y.data(), n, shape.rows, shape.cols, bias.data());
          check_against_reference(w32.data(), x.data(), y.data(), bias.data(), n, shape.rows, shape.cols,
                                  "matmul_f32_small " + context);
          if (QTest::currentTestFailed()) return;
          std::fill(y.begin(), y.end(), NAN);
          matmul_bf16_small(w16.data(), x.data(), y.data(), n, shape.rows, shape.cols);
          check_against_reference(w16.data(), x.data(), y.data(), nullptr, n, shape.rows, shape.cols,
                                  "matmul_bf16_small " + context);
          if (QTest::currentTestFailed()) return;
        }
      }
    });
  }

  // A known product, independent of the reference loop: W = ones, x = 0..cols-1.
  void matvec_exact_small_integers() {
    for_each_configuration([&](const QString& config) {
      const std::int64_t rows = 37, cols = 45;
      std::vector<float> w(rows * cols);
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols; ++c) w[r * cols + c] = static_cast<float>(r + 1);
      std::vector<float> x(cols);
      for (std::int64_t c = 0; c < cols; ++c) x[c] = static_cast<float>(c);
      std::vector<float> y(rows);
      matvec_f32(w.data(), x.data(), y.data(), rows, cols);
      for (std::int64_t r = 0; r < rows; ++r) {
        QVERIFY2(y[r] == static_cast<float>((r + 1) * 990), qPrintable(config + " row " + QString::number(r)));
      }
    });
  }

  void zero_columns_give_bias() {
    const float bias[3] = {1.5f, -2.f, 0.25f};
    float y[3] = {NAN, NAN, NAN};
    matvec_f32(nullptr, nullptr, y, 3, 0, bias);
    QCOMPARE(y[0], 1.5f);
    QCOMPARE(y[1], -2.f);
    QCOMPARE(y[2], 0.25f);
    matvec_bf16(nullptr, nullptr, y, 3, 0);
    QCOMPARE(y[0], 0.f);
    QCOMPARE(y[2], 0.f);
  }

  void bad_arguments_throw() {
    float w[4] = {1, 2, 3, 4}, x[2] = {1, 1}, y[2];
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, matvec_f32(w, x, y, -1, 2));
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, matvec_f32(w, x, y, 2, -3));
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, matvec_f32(nullptr, x, y, 2, 2));
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, matvec_bf16(nullptr, x, y, 2, 2));
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, matmul_f32_small(w, x, y, -2, 2, 2));
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, matmul_f32_small(w, nullptr, y, 1, 2, 2));
    try {
      matvec_f32(w, x, y, 2, -3);
      QFAIL("no exception");
    } catch (const std::invalid_argument& error) {
      QCOMPARE(QString(error.what()), QString("matvec_f32: negative cols=-3"));
    }
  }
};

KVCHAT_TEST_APPLESS_MAIN(MatvecTest)

}  // namespace kernels_test_matvec

#include "test_matvec.moc"
