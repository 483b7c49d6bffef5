// The quantized products against a plain reference: every row decoded exactly (engine/gguf's
// dequantize) and multiplied in double. The block types multiply the input rounded to integers
// (activation_quantization.h: one byte per value with a scale per block of 32, or per super-block of 256
// for the K-quants): they must match the double product with the rounded input to f32 accuracy,
// and the exact product within the stated bound, sum over blocks of 0.51 scale * sum|w|.
// Each type through the AVX2 kernels and the portable twins, one and several input vectors, with and
// without bias, small (inline) and large (threaded) matrices, and shared-input jobs that mix types.
#include <QtTest>
#include "common/test_suite.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/gguf/dequantize.h"
#include "engine/kernels/activation_quantization.h"
#include "engine/kernels/cpu_features.h"
#include "engine/kernels/kv_rows.h"
#include "engine/kernels/quantized_matvec.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace kernels_test_quantized_matvec {

using namespace kvchat;
using kvchat::kernels::QuantizedMatrixView;

namespace {

std::uint16_t f16_bits(float value) {
  // Exact for the values used here (normal f16 range, few mantissa bits); checked below.
  std::uint32_t bits;
  std::memcpy(&bits, &value, 4);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  const int exponent = static_cast<int>((bits >> 23) & 0xFF) - 127 + 15;
  return static_cast<std::uint16_t>(sign | (static_cast<std::uint32_t>(exponent) << 10) | ((bits >> 13) & 0x3FFu));
}

// Offsets of the f16 scale fields of a block (the rest of a block may hold any bits).
std::vector<int> scale_fields(GgufType type) {
  switch (type) {
    case GgufType::Q8_0:
    case GgufType::Q4_0:
    case GgufType::Q5_0:
    case GgufType::F16: return {0};
    case GgufType::Q4_1:
    case GgufType::Q5_1:
    case GgufType::Q4_K:
    case GgufType::Q5_K: return {0, 2};
    case GgufType::Q6_K: return {208};
    default: return {};
  }
}

struct RandomMatrix {
  std::vector<std::uint8_t> bytes;
  QuantizedMatrixView view;
};

RandomMatrix random_matrix(GgufType type, std::int64_t rows, std::int64_t cols, std::mt19937& rng) {
  const GgufTypeInfo& info = gguf_type_info(type);
  RandomMatrix m;
  const std::int64_t row_bytes = cols / info.block_size * info.block_bytes;
  m.bytes.resize(static_cast<std::size_t>(rows * row_bytes));
  for (auto& byte : m.bytes) byte = static_cast<std::uint8_t>(rng());
  std::uniform_real_distribution<float> unit(0.25f, 1.0f);
  for (std::size_t block = 0; block < m.bytes.size(); block += info.block_bytes) {
    if (type == GgufType::F32 || type == GgufType::BF16) {
      const float value = (rng() & 1 ? 1.f : -1.f) * unit(rng);
      if (type == GgufType::F32)
        std::memcpy(&m.bytes[block], &value, 4);
      else {
        std::uint32_t bits;
        std::memcpy(&bits, &value, 4);
        const auto top = static_cast<std::uint16_t>(bits >> 16);
        std::memcpy(&m.bytes[block], &top, 2);
      }
    }
    for (int field : scale_fields(type)) {
      const std::uint16_t bits = f16_bits((rng() & 1 ? 1.f : -1.f) * std::ldexp(unit(rng), -6));
      std::memcpy(&m.bytes[block + field], &bits, 2);
    }
  }
  m.view = QuantizedMatrixView{type, m.bytes.data(), rows, cols, row_bytes};
  return m;
}

// The input as the block types' products see it, rounded here independently of the kernels, as llama.cpp rounds it:
// per group of 32 values (the 32-element types) or 256 (the K-quants), x^ = s * nearest integer of x * (127 / max|x|),
// with s = max|x| / 127 as an IEEE half for groups of 32, 1 / (127 / max|x|) for 256; |x - x^| <= 0.51 * s (half a
// step, and the f32 roundings), plus 127 times the half's rounding of s (2^-11 of it) for groups of 32.
struct RoundedInput {
  std::vector<double> values, error_bound;
};
RoundedInput round_input(const std::vector<float>& x, kernels::ActivationRounding rounding) {
  RoundedInput rounded{std::vector<double>(x.size()), std::vector<double>(x.size())};
  const std::size_t group = rounding == kernels::ActivationRounding::SuperBlockBytes ? 256 : 32;
  for (std::size_t block = 0; block < x.size(); block += group) {
    float largest = 0.f;
    for (std::size_t j = block; j < block + group; ++j) largest = std::max(largest, std::fabs(x[j]));
    const float inverse = largest > 0.f ? 127.f / largest : 0.f;
    float unit = group == 256 ? (inverse > 0.f ? 1.f / inverse : 0.f) : largest / 127.f;
    if (group == 32) unit = kernels::f16_to_float(kernels::float_to_f16(unit));
    const double slack = group == 32 ? 127.0 / 2048.0 : 0.0;
    for (std::size_t j = block; j < block + group; ++j) {
      rounded.values[j] = double(unit) * std::nearbyint(x[j] * inverse);
      rounded.error_bound[j] = (0.51 + slack) * double(unit);
    }
  }
  return rounded;
}

struct Reference {
  std::vector<double> y, magnitude, bound;  // Y [n, rows]; sum |w x| per output; the rounding bound
};

// Reference Y [n, rows] in double from the exactly decoded rows, with the input `x` (exact) or, when
// `rounded`, with the input the block types use; bound = sum |w| * |x - x^| bound (0 unrounded).
Reference reference_product(const QuantizedMatrixView& w, const std::vector<float>& x, std::int64_t n,
                            const float* bias, bool rounded) {
  std::vector<double> input(x.begin(), x.end()), error(x.size(), 0.0);
  if (rounded) {
    RoundedInput r = round_input(x, kernels::activation_rounding(w.type));
    input = r.values;
    error = r.error_bound;
  }
  std::vector<float> row(static_cast<std::size_t>(w.cols));
  Reference ref;
  ref.y.assign(static_cast<std::size_t>(n * w.rows), 0.0);
  ref.magnitude.assign(ref.y.size(), 0.0);
  ref.bound.assign(ref.y.size(), 0.0);
  for (std::int64_t r = 0; r < w.rows; ++r) {
    dequantize(w.type, w.data + r * w.row_bytes, w.cols, row.data());
    for (std::int64_t i = 0; i < n; ++i) {
      double sum = bias ? bias[r] : 0.0, size = bias ? std::fabs(bias[r]) : 0.0, bound = 0.0;
      for (std::int64_t c = 0; c < w.cols; ++c) {
        const std::size_t k = static_cast<std::size_t>(i * w.cols + c);
        sum += double(row[c]) * input[k];
        size += std::fabs(double(row[c]) * input[k]);
        bound += std::fabs(double(row[c])) * error[k];
      }
      const std::size_t out = static_cast<std::size_t>(i * w.rows + r);
      ref.y[out] = sum;
      ref.magnitude[out] = size;
      ref.bound[out] = bound;
    }
  }
  return ref;
}

// Within f32 accumulation error of `expected` (plus a bound per output, when given).
void expect_close(const std::vector<float>& got, const Reference& expected, const QString& what,
                  const std::vector<double>* bound = nullptr) {
  for (std::size_t k = 0; k < got.size(); ++k) {
    const double tolerance = 1e-5 * expected.magnitude[k] + 1e-6 + (bound ? (*bound)[k] : 0.0);
    if (!(std::fabs(got[k] - expected.y[k]) <= tolerance))
      QFAIL(qPrintable(QString("%1: output %2 is %3, expected %4 (tolerance %5)")
                           .arg(what)
                           .arg(k)
                           .arg(got[k])
                           .arg(expected.y[k])
                           .arg(tolerance)));
  }
}

// The product of a block type against its rounded input, then the exact one within the bound; f32
// types against the exact product.
void expect_product(const std::vector<float>& got, const QuantizedMatrixView& w, const std::vector<float>& x,
                    std::int64_t n, const float* bias, const QString& what) {
  const bool rounds = kernels::activation_rounding(w.type) != kernels::ActivationRounding::None;
  const Reference rounded = reference_product(w, x, n, bias, rounds);
  expect_close(got, rounded, what + (rounds ? " (rounded input)" : ""));
  if (rounds)
    expect_close(got, reference_product(w, x, n, bias, false), what + " (exact input, bound)", &rounded.bound);
}

// The kernels a product can run on: AVX-512 (where the processor has it), AVX2, or the portable code.
enum class Kernels { Avx512, Avx2, Portable };
const Kernels kAllKernels[] = {Kernels::Avx512, Kernels::Avx2, Kernels::Portable};

const char* kernels_name(Kernels kernels) {
  return kernels == Kernels::Avx512 ? "avx512" : kernels == Kernels::Avx2 ? "avx2" : "portable";
}

// Switches to `kernels`; false (with the reason in *skip) when this processor cannot run them.
bool use_kernels(Kernels kernels, QString* skip) {
  if (kernels != Kernels::Portable && !kernels::cpu_has_avx2_fma()) {
    *skip = "no AVX2 on this processor";
    return false;
  }
  if (kernels == Kernels::Avx512 && !kernels::cpu_has_avx512()) {
    *skip = "no AVX-512 on this processor";
    return false;
  }
  kernels::set_avx2_kernels_enabled(kernels != Kernels::Portable);
  kernels::set_avx512_kernels_enabled(kernels == Kernels::Avx512);
  return true;
}

const GgufType kTypes[] = {GgufType::Q8_0, GgufType::Q4_0, GgufType::Q4_1, GgufType::Q5_0,
                           GgufType::Q5_1, GgufType::Q4_K, GgufType::Q5_K, GgufType::Q6_K,
                           GgufType::F16,  GgufType::BF16, GgufType::F32};

}  // namespace

// One row per block type and set of kernels.
void add_type_and_kernels_rows() {
  QTest::addColumn<int>("type");
  QTest::addColumn<int>("kernels");
  for (GgufType type : kTypes)
    for (Kernels kernels : kAllKernels)
      QTest::newRow(qPrintable(QString("%1 %2").arg(to_string(type), kernels_name(kernels))))
          << int(type) << int(kernels);
}

class QuantizedMatvecTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void cleanup() {
    kernels::set_avx2_kernels_enabled(true);
    kernels::set_avx512_kernels_enabled(true);
  }
  void matches_decoded_rows_data();
  void matches_decoded_rows();
  void shared_input_mixes_types();
  void several_vectors_equal_one_at_a_time_data();
  void several_vectors_equal_one_at_a_time();
  void decoded_rows_match_dequantize_data();
  void decoded_rows_match_dequantize();
  void rejects_bad_arguments();
};

void QuantizedMatvecTest::matches_decoded_rows_data() {
  QTest::addColumn<int>("type");
  QTest::addColumn<int>("kernels");
  QTest::addColumn<int>("rows");
  for (GgufType type : kTypes)
    for (Kernels kernels : kAllKernels)
      for (int rows : {37, 1200})  // inline, and over the threshold where the pool's threads share it
        QTest::newRow(qPrintable(QString("%1 %2 %3 rows").arg(to_string(type), kernels_name(kernels)).arg(rows)))
            << int(type) << int(kernels) << rows;
}

void QuantizedMatvecTest::matches_decoded_rows() {
  QFETCH(int, type);
  QFETCH(int, kernels);
  QFETCH(int, rows);
  QString skip;
  if (!use_kernels(Kernels(kernels), &skip)) QSKIP(qPrintable(skip));
  std::mt19937 rng(static_cast<unsigned>(type * 131 + rows));
  // Three K-quant super-blocks (24 small blocks); and, for the types with blocks of 32, 25 blocks, which
  // leaves a remainder after the kernels' groups of two and of eight blocks; and, for the 16- and 32-bit
  // types, a row that ends in single values after the kernels' groups of 64 and of 8.
  for (const std::int64_t cols : {768, 800, 803}) {
    if (cols % gguf_type_info(GgufType(type)).block_size != 0) continue;
    const RandomMatrix m = random_matrix(GgufType(type), rows, cols, rng);
    std::normal_distribution<float> normal(0.f, 1.f);
    for (std::int64_t n : {1, 3, 5}) {
      std::vector<float> x(static_cast<std::size_t>(n * cols)), bias(static_cast<std::size_t>(rows));
      for (float& v : x) v = normal(rng);
      for (float& v : bias) v = normal(rng);
      for (const float* b : {static_cast<const float*>(nullptr), static_cast<const float*>(bias.data())}) {
        std::vector<float> y(static_cast<std::size_t>(n * rows), -1.f);
        kernels::matmul_quantized(m.view, x.data(), y.data(), n, b);
        expect_product(y, m.view, x, n, b, QString("cols=%1 n=%2 bias=%3").arg(cols).arg(n).arg(b != nullptr));
      }
    }
  }
}

// q/k/v of a Q4_K_M file: Q4_K q and k, Q6_K v; and an f32 matrix in the same job.
void QuantizedMatvecTest::shared_input_mixes_types() {
  std::mt19937 rng(5);
  const std::int64_t cols = 512;
  const RandomMatrix q = random_matrix(GgufType::Q4_K, 700, cols, rng),
                     k = random_matrix(GgufType::Q4_K, 300, cols, rng);
  const RandomMatrix v = random_matrix(GgufType::Q6_K, 300, cols, rng), f = random_matrix(GgufType::F32, 90, cols, rng);
  std::vector<float> x(static_cast<std::size_t>(cols));
  std::normal_distribution<float> normal(0.f, 1.f);
  for (float& value : x) value = normal(rng);
  std::vector<float> bias(700, 0.5f);
  std::vector<std::vector<float>> outputs(3);
  for (const RandomMatrix* third : {&v, &f}) {
    const RandomMatrix* matrices[] = {&q, &k, third};
    kernels::SharedInputQuantizedProduct jobs[3];
    for (int i = 0; i < 3; ++i) {
      outputs[i].assign(static_cast<std::size_t>(matrices[i]->view.rows), 0.f);
      jobs[i] = {matrices[i]->view, outputs[i].data(), i == 0 ? bias.data() : nullptr};
    }
    kernels::matvec_quantized_shared_input(jobs, 3, x.data());
    for (int i = 0; i < 3; ++i) {
      expect_product(outputs[i], matrices[i]->view, x, 1, i == 0 ? bias.data() : nullptr, QString("product %1").arg(i));
    }
  }
}

void QuantizedMatvecTest::several_vectors_equal_one_at_a_time_data() { add_type_and_kernels_rows(); }

// A prompt's product (several vectors, which some kernels take up to eight at a time) gives each vector's row
// the very bits that a product with that vector alone gives: the row-exact forwards rely on it. Counts of 2 to 11
// vectors and 16, 17: each kernel width, one to three groups, and the remainders after the widest groups.
void QuantizedMatvecTest::several_vectors_equal_one_at_a_time() {
  QFETCH(int, type);
  QFETCH(int, kernels);
  QString skip;
  if (!use_kernels(Kernels(kernels), &skip)) QSKIP(qPrintable(skip));
  std::mt19937 rng(static_cast<unsigned>(type * 17 + 3));
  const std::int64_t rows = 700, cols = 768, most = 17;  // 700 rows: the pool's threads share them
  const RandomMatrix m = random_matrix(GgufType(type), rows, cols, rng);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(static_cast<std::size_t>(most * cols)), bias(static_cast<std::size_t>(rows));
  for (float& v : x) v = normal(rng);
  for (float& v : bias) v = normal(rng);
  std::vector<float> alone(static_cast<std::size_t>(most * rows));
  for (std::int64_t i = 0; i < most; ++i)
    kernels::matmul_quantized(m.view, x.data() + i * cols, alone.data() + i * rows, 1, bias.data());
  std::vector<float> together(static_cast<std::size_t>(most * rows));
  for (std::int64_t n : {2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 16, 17}) {
    kernels::matmul_quantized(m.view, x.data(), together.data(), n, bias.data());
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t r = 0; r < rows; ++r) {
        const float a = together[static_cast<std::size_t>(i * rows + r)],
                    b = alone[static_cast<std::size_t>(i * rows + r)];
        QVERIFY2(std::memcmp(&a, &b, sizeof a) == 0, qPrintable(QString("%1 vectors, vector %2 row %3: %4 vs %5")
                                                                    .arg(n)
                                                                    .arg(i)
                                                                    .arg(r)
                                                                    .arg(a, 0, 'g', 9)
                                                                    .arg(b, 0, 'g', 9)));
      }
  }
}

void QuantizedMatvecTest::decoded_rows_match_dequantize_data() { add_type_and_kernels_rows(); }

// The prefill's decoded blocks of rows: the values of engine/gguf's dequantize (a K-quant's
// d*sc*q - dmin*m may round once instead of twice).
void QuantizedMatvecTest::decoded_rows_match_dequantize() {
  QFETCH(int, type);
  QFETCH(int, kernels);
  QString skip;
  if (!use_kernels(Kernels(kernels), &skip)) QSKIP(qPrintable(skip));
  std::mt19937 rng(static_cast<unsigned>(type + 77));
  const std::int64_t rows = 9, cols = 512;
  const RandomMatrix m = random_matrix(GgufType(type), rows, cols, rng);
  std::vector<float> got(static_cast<std::size_t>(5 * cols)), expected(got.size());
  kernels::dequantize_rows(m.view, 3, 5, got.data());
  dequantize(GgufType(type), m.view.data + 3 * m.view.row_bytes, 5 * cols, expected.data());
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::fabs(got[i] - expected[i]) > 1e-6f * std::fabs(expected[i]) + 1e-12f)
      QFAIL(qPrintable(QString("value %1 is %2, expected %3").arg(i).arg(got[i]).arg(expected[i])));
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument, kernels::dequantize_rows(m.view, 6, 5, got.data()));
}

void QuantizedMatvecTest::rejects_bad_arguments() {
  std::mt19937 rng(9);
  RandomMatrix m = random_matrix(GgufType::Q4_K, 4, 256, rng);
  std::vector<float> x(256), y(4);
  QuantizedMatrixView ragged = m.view;
  ragged.cols = 200;  // not a whole number of 256-element super-blocks
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument, kernels::matmul_quantized(ragged, x.data(), y.data(), 1));
  QuantizedMatrixView unknown = m.view;
  unknown.type = GgufType::IQ2_XS;  // a type that cannot be decoded
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument, kernels::matmul_quantized(unknown, x.data(), y.data(), 1));
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument, kernels::matmul_quantized(m.view, x.data(), nullptr, 1));
}

KVCHAT_TEST_GUILESS_MAIN(QuantizedMatvecTest)

}  // namespace kernels_test_quantized_matvec

#include "test_quantized_matvec.moc"
