// Activations rounded to one byte per value (engine/kernels/activation_quantization.h) against the rule
// written out here (bytes_by_the_rule), llama.cpp's rounding of its block-type products' input on x86 (ggml's
// quantize_row_q8_0 for groups of 32, quantize_row_q8_K_ref for 256): per group, byte = nearest integer of
// x * (127 / max|x|), ties to even (0 for a zero or non-finite group); the unit max|x| / 127 rounded to an IEEE half
// for groups of 32, 1 / (127 / max|x|) for 256 (NaN when not finite); and the byte sums of each 16 and each 32.
// Where llama.cpp's would overflow, the unit stays f32 (past the half range) or the group is zero (127 / max|x| past
// the f32 range). The AVX2 and portable versions must give exactly these values.
#include <QtTest>
#include "common/test_suite.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "engine/kernels/activation_quantization.h"
#include "engine/kernels/cpu_features.h"
#include "engine/kernels/kv_rows.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace kernels_test_activation_quantization {

using namespace kvchat;

namespace {

// `count` values from a normal distribution (mean 0, deviation 1), seeded.
std::vector<float> normal_values(unsigned seed, std::size_t count) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(count);
  for (float& v : x) v = normal(rng);
  return x;
}

// Blocks of every kind: normal values, a zero block, a NaN, an infinity, exact halves (ties), one
// huge value beside tiny ones, and a block at the largest magnitude (q = +-127).
std::vector<float> input_blocks(std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> x(32 * 9);
  for (float& v : x) v = normal(rng);
  std::fill(x.begin() + 32, x.begin() + 64, 0.f);
  x[64 + 5] = std::numeric_limits<float>::quiet_NaN();
  x[96 + 31] = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < 32; ++j) x[128 + j] = 0.5f * static_cast<float>(j - 16);
  for (int j = 0; j < 32; ++j) x[160 + j] = (j == 0 ? 127.f : static_cast<float>(j % 5) + 0.5f);  // scale 1: ties at .5
  x[192] = 1e30f;
  for (int j = 1; j < 32; ++j) x[192 + j] = 1e-30f * static_cast<float>(j);
  for (int j = 0; j < 32; ++j) x[224 + j] = j % 2 ? 3.f : -3.f;
  return x;
}

struct RoundedBytes {
  std::vector<std::int8_t> bytes;
  std::vector<float> scales;
  std::vector<std::int16_t> sums16, sums32;
};

RoundedBytes bytes_by_the_rule(const std::vector<float>& x, std::size_t group) {
  RoundedBytes r{std::vector<std::int8_t>(x.size()), {}, {}, {}};
  for (std::size_t block = 0; block < x.size(); block += group) {
    float largest = 0.f;
    bool finite = true;
    for (std::size_t j = block; j < block + group; ++j) {
      finite = finite && std::isfinite(x[j]);
      largest = std::max(largest, std::fabs(x[j]));
    }
    float inverse = finite && largest > 0.f ? 127.f / largest : 0.f;
    if (std::isinf(inverse)) inverse = 0.f;
    float unit = 0.f;
    if (!finite) {
      unit = std::numeric_limits<float>::quiet_NaN();
    } else if (inverse > 0.f && group == 256) {
      unit = 1.f / inverse;
    } else if (inverse > 0.f) {
      unit = largest / 127.f;
      if (unit < 65520.f) unit = kernels::f16_to_float(kernels::float_to_f16(unit));  // else past the half range
    }
    r.scales.push_back(unit);
    for (std::size_t j = block; j < block + group; ++j)
      if (inverse != 0.f) r.bytes[j] = static_cast<std::int8_t>(std::nearbyint(x[j] * inverse));
  }
  for (std::size_t g = 0; g < x.size(); g += 16) {
    int sum = 0;
    for (std::size_t j = g; j < g + 16; ++j) sum += r.bytes[j];
    r.sums16.push_back(static_cast<std::int16_t>(sum));
    if (g % 32 == 16) r.sums32.push_back(static_cast<std::int16_t>(r.sums16[r.sums16.size() - 2] + sum));
  }
  return r;
}

// Super-blocks of every kind: normal values, zeros, a NaN, an infinity, ties at .5 (scale 1), one huge
// value beside tiny ones.
std::vector<float> input_super_blocks(std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> x(256 * 6);
  for (float& v : x) v = normal(rng);
  std::fill(x.begin() + 256, x.begin() + 512, 0.f);
  x[512 + 77] = std::numeric_limits<float>::quiet_NaN();
  x[768 + 255] = std::numeric_limits<float>::infinity();
  for (int j = 0; j < 256; ++j) x[1024 + j] = j == 0 ? -127.f : static_cast<float>(j % 7) - 3.5f;
  x[1280] = 1e30f;
  for (int j = 1; j < 256; ++j) x[1280 + j] = 1e-30f * static_cast<float>(j);
  return x;
}

}  // namespace

class ActivationQuantizationTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void cleanup() { kernels::set_avx2_kernels_enabled(true); }
  void blocks_follow_the_rule_data();
  void blocks_follow_the_rule();
  void super_blocks_follow_the_rule_data() { blocks_follow_the_rule_data(); }
  void super_blocks_follow_the_rule();
  void rounded_values_are_scale_times_byte_data();
  void rounded_values_are_scale_times_byte();
  void rejects_partial_groups();
};

void ActivationQuantizationTest::blocks_follow_the_rule_data() {
  QTest::addColumn<bool>("avx2");
  QTest::newRow("avx2") << true;
  QTest::newRow("portable") << false;
}

// What the rule gives (bytes, scales and sums) against what kvchat's rounding gives, element by element.
void compare_with_the_rule(const std::vector<float>& x, std::int64_t group, const RoundedBytes& expected) {
  RoundedBytes got{std::vector<std::int8_t>(x.size()), std::vector<float>(x.size() / static_cast<std::size_t>(group)),
                   std::vector<std::int16_t>(x.size() / 16), std::vector<std::int16_t>(x.size() / 32)};
  kernels::quantize_activation_bytes(x.data(), static_cast<std::int64_t>(x.size()), group, got.bytes.data(),
                                     got.scales.data(), got.sums16.data(), got.sums32.data());
  for (std::size_t j = 0; j < x.size(); ++j)
    QVERIFY2(got.bytes[j] == expected.bytes[j],
             qPrintable(QString("element %1 is %2, expected %3").arg(j).arg(got.bytes[j]).arg(expected.bytes[j])));
  for (std::size_t b = 0; b < expected.scales.size(); ++b) {
    const bool both_nan = std::isnan(got.scales[b]) && std::isnan(expected.scales[b]);
    QVERIFY2(both_nan || got.scales[b] == expected.scales[b], qPrintable(QString("scale %1").arg(b)));
  }
  QVERIFY(got.sums16 == expected.sums16);
  QVERIFY(got.sums32 == expected.sums32);
}

void ActivationQuantizationTest::blocks_follow_the_rule() {
  QFETCH(bool, avx2);
  if (avx2 && !kernels::cpu_has_avx2_fma()) QSKIP("no AVX2 on this processor");
  kernels::set_avx2_kernels_enabled(avx2);
  std::mt19937 rng(3);
  const std::vector<float> x = input_blocks(rng);
  const RoundedBytes expected = bytes_by_the_rule(x, 32);
  compare_with_the_rule(x, 32, expected);
  if (QTest::currentTestFailed()) return;
  // The rule itself at the blocks of every kind: the zero, NaN and infinity blocks, ties to even at
  // scale 1, the largest value at +-127.
  QCOMPARE(expected.scales[1], 0.f);
  QVERIFY(std::isnan(expected.scales[2]) && std::isnan(expected.scales[3]));
  QCOMPARE(int(expected.bytes[64 + 5]), 0);
  QCOMPARE(expected.scales[5], 1.f);
  QCOMPARE(int(expected.bytes[160]), 127);
  QCOMPARE(int(expected.bytes[161]), 2);  // 1.5 -> 2
  QCOMPARE(int(expected.bytes[162]), 2);  // 2.5 -> 2
  QCOMPARE(int(expected.bytes[165]), 0);  // 0.5 -> 0
  QCOMPARE(int(expected.bytes[224]), -127);
  QCOMPARE(int(expected.bytes[225]), 127);
  // A normal block's unit is a half; the block led by 1e30 keeps an f32 unit (past the half range).
  QCOMPARE(kernels::f16_to_float(kernels::float_to_f16(expected.scales[0])), expected.scales[0]);
  QCOMPARE(expected.scales[6], 1e30f / 127.f);
}

void ActivationQuantizationTest::super_blocks_follow_the_rule() {
  QFETCH(bool, avx2);
  if (avx2 && !kernels::cpu_has_avx2_fma()) QSKIP("no AVX2 on this processor");
  kernels::set_avx2_kernels_enabled(avx2);
  std::mt19937 rng(5);
  const std::vector<float> x = input_super_blocks(rng);
  const RoundedBytes expected = bytes_by_the_rule(x, 256);
  compare_with_the_rule(x, 256, expected);
  if (QTest::currentTestFailed()) return;
  // The zero, NaN and infinity super-blocks; ties to even at scale 1; the largest value at -127.
  QCOMPARE(expected.scales[1], 0.f);
  QVERIFY(std::isnan(expected.scales[2]) && std::isnan(expected.scales[3]));
  QCOMPARE(int(expected.bytes[512 + 77]), 0);
  QCOMPARE(expected.scales[4], 1.f);
  QCOMPARE(int(expected.bytes[1024]), -127);
  QCOMPARE(int(expected.bytes[1024 + 1]), -2);  // -2.5 -> -2
  QCOMPARE(int(expected.bytes[1024 + 2]), -2);  // -1.5 -> -2
  QCOMPARE(int(expected.bytes[1024 + 4]), 0);   // 0.5 -> 0
  QCOMPARE(int(expected.bytes[1024 + 5]), 2);   // 1.5 -> 2
  QCOMPARE(int(expected.bytes[1280]), 127);
  QCOMPARE(int(expected.bytes[1281]), 0);
  // The unit is the f32 reciprocal of the factor, not max|x| / 127 (they differ in the last bit for some maxima).
  QCOMPARE(expected.scales[5], 1.f / (127.f / 1e30f));
}

void ActivationQuantizationTest::rounded_values_are_scale_times_byte_data() {
  QTest::addColumn<int>("rounding");
  QTest::newRow("blocks of 32") << int(kernels::ActivationRounding::BlockBytes);
  QTest::newRow("super-blocks of 256") << int(kernels::ActivationRounding::SuperBlockBytes);
}

// What the prefill GEMM multiplies by: scale * byte, within half a step (plus the f32 roundings) of x.
void ActivationQuantizationTest::rounded_values_are_scale_times_byte() {
  QFETCH(int, rounding);
  const auto which = static_cast<kernels::ActivationRounding>(rounding);
  const std::size_t group = static_cast<std::size_t>(kernels::activation_group(which));
  std::vector<float> x = normal_values(6, 2 * 512);
  std::vector<float> out(x.size());
  kernels::round_activations(which, x.data(), 2, 512, out.data());
  const RoundedBytes expected = bytes_by_the_rule(x, group);
  for (std::size_t j = 0; j < x.size(); ++j) {
    QCOMPARE(out[j], expected.scales[j / group] * static_cast<float>(expected.bytes[j]));
    // Half a step, plus for groups of 32 the half's rounding of the unit (2^-11 of it) times at most 127.
    const float slack = group == 32 ? 127.f / 2048.f : 0.f;
    QVERIFY(std::fabs(out[j] - x[j]) <= (0.51f + slack) * expected.scales[j / group]);
  }
  kernels::round_activations(which, x.data(), 2, 512, x.data());  // in place
  QVERIFY(x == out);
}

void ActivationQuantizationTest::rejects_partial_groups() {
  std::vector<float> x(300);
  std::vector<std::int8_t> bytes(300);
  std::vector<float> scales(10);
  std::vector<std::int16_t> sums16(20), sums32(10);
  QVERIFY_THROWS_EXCEPTION(
      std::invalid_argument,
      kernels::quantize_activation_bytes(x.data(), 40, 32, bytes.data(), scales.data(), sums16.data(), sums32.data()));
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument,
                           kernels::quantize_activation_bytes(x.data(), 288, 256, bytes.data(), scales.data(),
                                                              sums16.data(), sums32.data()));
  QVERIFY_THROWS_EXCEPTION(
      std::invalid_argument,
      kernels::quantize_activation_bytes(x.data(), 64, 64, bytes.data(), scales.data(), sums16.data(), sums32.data()));
  QVERIFY_THROWS_EXCEPTION(
      std::invalid_argument,
      kernels::round_activations(kernels::ActivationRounding::SuperBlockBytes, x.data(), 1, 288, x.data()));
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument,
                           kernels::round_activations(kernels::ActivationRounding::None, x.data(), 1, 32, x.data()));
}

KVCHAT_TEST_GUILESS_MAIN(ActivationQuantizationTest)

}  // namespace kernels_test_activation_quantization

#include "test_activation_quantization.moc"
