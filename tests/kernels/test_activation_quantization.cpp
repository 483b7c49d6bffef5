// Activations rounded to two bytes per value (engine/kernels/activation_quantization.h) against the
// rule written out here (and the K-quants' one byte per value, below bytes_by_the_rule): per block of 32, s = max|x| / 127, t = x * (1/s), high = nearest integer of t,
// low = nearest integer of (t - high) * 254, ties to even, scale = s / 254, sums of 254 high + low over
// each 16; zero blocks give scale 0, non-finite ones scale NaN and zeros. The AVX2 and portable
// versions must give exactly these values.
#include <QtTest>
#include "common/test_suite.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "engine/kernels/activation_quantization.h"
#include "engine/kernels/cpu_features.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace kernels_test_activation_quantization {

using namespace kvchat;

namespace {

struct Rounded {
  std::vector<std::int8_t> high, low;
  std::vector<float> scales;
  std::vector<std::int32_t> sums;
};

Rounded by_the_rule(const std::vector<float>& x) {
  Rounded r{std::vector<std::int8_t>(x.size()), std::vector<std::int8_t>(x.size()), {}, {}};
  for (std::size_t block = 0; block < x.size(); block += 32) {
    float largest = 0.f;
    bool finite = true;
    for (std::size_t j = block; j < block + 32; ++j) {
      finite = finite && std::isfinite(x[j]);
      largest = std::max(largest, std::fabs(x[j]));
    }
    const float unit = finite ? largest / 127.f : std::numeric_limits<float>::quiet_NaN();
    const float inverse = finite && unit > 0.f ? 1.f / unit : 0.f;
    r.scales.push_back(unit / 254.f);
    for (std::size_t j = block; j < block + 32; ++j) {
      if (inverse == 0.f) continue;
      const float t = x[j] * inverse, high = std::nearbyint(t);
      r.high[j] = static_cast<std::int8_t>(high);
      r.low[j] = static_cast<std::int8_t>(std::nearbyint((t - high) * 254.f));
    }
    for (std::size_t g = block; g < block + 32; g += 16) {
      std::int32_t sum = 0;
      for (std::size_t j = g; j < g + 16; ++j) sum += 254 * r.high[j] + r.low[j];
      r.sums.push_back(sum);
    }
  }
  return r;
}

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

// One byte per value (the K-quants' rounding): per super-block of 256, s = max|x| / 127 (NaN when not
// finite), byte = nearest integer of x * (1 / s), ties to even (0 for a zero or non-finite block), and
// the byte sums of each 16 and each 32.
struct RoundedBytes {
  std::vector<std::int8_t> bytes;
  std::vector<float> scales;
  std::vector<std::int16_t> sums16, sums32;
};

RoundedBytes bytes_by_the_rule(const std::vector<float>& x) {
  RoundedBytes r{std::vector<std::int8_t>(x.size()), {}, {}, {}};
  for (std::size_t block = 0; block < x.size(); block += 256) {
    float largest = 0.f;
    bool finite = true;
    for (std::size_t j = block; j < block + 256; ++j) {
      finite = finite && std::isfinite(x[j]);
      largest = std::max(largest, std::fabs(x[j]));
    }
    const float unit = finite ? largest / 127.f : std::numeric_limits<float>::quiet_NaN();
    const float inverse = finite && unit > 0.f ? 1.f / unit : 0.f;
    r.scales.push_back(unit);
    for (std::size_t j = block; j < block + 256; ++j)
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
  void follows_the_rule_data();
  void follows_the_rule();
  void rounded_values_are_scale_times_q();
  void high_byte_values_are_scale_times_high();
  void rejects_partial_blocks();
  void bytes_follow_the_rule_data();
  void bytes_follow_the_rule();
  void rounded_bytes_are_scale_times_byte();
};

void ActivationQuantizationTest::follows_the_rule_data() {
  QTest::addColumn<bool>("avx2");
  QTest::newRow("avx2") << true;
  QTest::newRow("portable") << false;
}

void ActivationQuantizationTest::follows_the_rule() {
  QFETCH(bool, avx2);
  if (avx2 && !kernels::cpu_has_avx2_fma()) QSKIP("no AVX2 on this processor");
  kernels::set_avx2_kernels_enabled(avx2);
  std::mt19937 rng(3);
  const std::vector<float> x = input_blocks(rng);
  const Rounded expected = by_the_rule(x);
  Rounded got{std::vector<std::int8_t>(x.size()), std::vector<std::int8_t>(x.size()), std::vector<float>(x.size() / 32),
              std::vector<std::int32_t>(x.size() / 16)};
  kernels::quantize_activations(x.data(), static_cast<std::int64_t>(x.size()), got.high.data(), got.low.data(),
                                got.scales.data(), got.sums.data());
  for (std::size_t j = 0; j < x.size(); ++j) {
    QVERIFY2(got.high[j] == expected.high[j] && got.low[j] == expected.low[j],
             qPrintable(QString("element %1 is %2,%3, expected %4,%5")
                            .arg(j).arg(got.high[j]).arg(got.low[j]).arg(expected.high[j]).arg(expected.low[j])));
    QVERIFY(std::abs(got.low[j]) <= 127);
  }
  for (std::size_t b = 0; b < expected.scales.size(); ++b) {
    const bool both_nan = std::isnan(got.scales[b]) && std::isnan(expected.scales[b]);
    QVERIFY2(both_nan || got.scales[b] == expected.scales[b], qPrintable(QString("scale %1").arg(b)));
  }
  QVERIFY(got.sums == expected.sums);
  // The NaN and the infinity blocks, the zero block, and the ties at .5 rounded to even (in the high
  // byte, with the half in the low one).
  QVERIFY(std::isnan(got.scales[2]) && std::isnan(got.scales[3]));
  QCOMPARE(got.scales[1], 0.f);
  QCOMPARE(got.scales[5], 1.f / 254.f);
  QCOMPARE(int(got.high[160]), 127);
  QCOMPARE(int(got.high[161]), 2);  // 1.5 -> 2 - 0.5
  QCOMPARE(int(got.low[161]), -127);
  QCOMPARE(int(got.high[162]), 2);  // 2.5 -> 2 + 0.5
  QCOMPARE(int(got.low[162]), 127);
  QCOMPARE(int(got.high[165]), 0);  // 0.5 -> 0 + 0.5
  QCOMPARE(int(got.high[224]), -127);
  QCOMPARE(int(got.low[224]), 0);
}

void ActivationQuantizationTest::rounded_values_are_scale_times_q() {
  std::vector<float> x = normal_values(4, 2 * 64);
  std::vector<float> out(x.size());
  kernels::round_activations(kernels::ActivationRounding::TwoBytesPerValue, x.data(), 2, 64, out.data());
  const Rounded expected = by_the_rule(x);
  for (std::size_t j = 0; j < x.size(); ++j) {
    QCOMPARE(out[j], expected.scales[j / 32] * static_cast<float>(254 * expected.high[j] + expected.low[j]));
    QVERIFY(std::fabs(out[j] - x[j]) <= 0.51f * expected.scales[j / 32]);
  }
  kernels::round_activations(kernels::ActivationRounding::TwoBytesPerValue, x.data(), 2, 64, x.data());  // in place
  QVERIFY(x == out);
}

// Q8_0's rounding: the high bytes alone, each block's step 254 times the two-byte scale, within half a
// step (plus the f32 roundings) of x.
void ActivationQuantizationTest::high_byte_values_are_scale_times_high() {
  std::vector<float> x = normal_values(5, 2 * 64);
  std::vector<float> out(x.size());
  kernels::round_activations(kernels::ActivationRounding::HighBytePerValue, x.data(), 2, 64, out.data());
  const Rounded expected = by_the_rule(x);
  for (std::size_t j = 0; j < x.size(); ++j) {
    const float step = expected.scales[j / 32] * 254.f;
    QCOMPARE(out[j], step * static_cast<float>(expected.high[j]));
    QVERIFY(std::fabs(out[j] - x[j]) <= 0.51f * step);
  }
}

void ActivationQuantizationTest::rejects_partial_blocks() {
  std::vector<float> x(40);
  std::vector<std::int8_t> high(40), low(40);
  std::vector<float> scales(2);
  std::vector<std::int32_t> sums(3);
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument,
                           kernels::quantize_activations(x.data(), 40, high.data(), low.data(), scales.data(), sums.data()));
}

void ActivationQuantizationTest::bytes_follow_the_rule_data() { follows_the_rule_data(); }

void ActivationQuantizationTest::bytes_follow_the_rule() {
  QFETCH(bool, avx2);
  if (avx2 && !kernels::cpu_has_avx2_fma()) QSKIP("no AVX2 on this processor");
  kernels::set_avx2_kernels_enabled(avx2);
  std::mt19937 rng(5);
  const std::vector<float> x = input_super_blocks(rng);
  const RoundedBytes expected = bytes_by_the_rule(x);
  RoundedBytes got{std::vector<std::int8_t>(x.size()), std::vector<float>(x.size() / 256),
                   std::vector<std::int16_t>(x.size() / 16), std::vector<std::int16_t>(x.size() / 32)};
  kernels::quantize_activation_bytes(x.data(), static_cast<std::int64_t>(x.size()), got.bytes.data(), got.scales.data(),
                                     got.sums16.data(), got.sums32.data());
  for (std::size_t j = 0; j < x.size(); ++j)
    QVERIFY2(got.bytes[j] == expected.bytes[j],
             qPrintable(QString("element %1 is %2, expected %3").arg(j).arg(got.bytes[j]).arg(expected.bytes[j])));
  for (std::size_t b = 0; b < expected.scales.size(); ++b) {
    const bool both_nan = std::isnan(got.scales[b]) && std::isnan(expected.scales[b]);
    QVERIFY2(both_nan || got.scales[b] == expected.scales[b], qPrintable(QString("scale %1").arg(b)));
  }
  QVERIFY(got.sums16 == expected.sums16);
  QVERIFY(got.sums32 == expected.sums32);
  // The zero, NaN and infinity super-blocks; ties to even at scale 1; the largest value at -127.
  QCOMPARE(got.scales[1], 0.f);
  QVERIFY(std::isnan(got.scales[2]) && std::isnan(got.scales[3]));
  QCOMPARE(int(got.bytes[512 + 77]), 0);
  QCOMPARE(got.scales[4], 1.f);
  QCOMPARE(int(got.bytes[1024]), -127);
  QCOMPARE(int(got.bytes[1024 + 1]), -2);  // -2.5 -> -2
  QCOMPARE(int(got.bytes[1024 + 2]), -2);  // -1.5 -> -2
  QCOMPARE(int(got.bytes[1024 + 4]), 0);   // 0.5 -> 0
  QCOMPARE(int(got.bytes[1024 + 5]), 2);   // 1.5 -> 2
  QCOMPARE(int(got.bytes[1280]), 127);
  QCOMPARE(int(got.bytes[1281]), 0);
}

void ActivationQuantizationTest::rounded_bytes_are_scale_times_byte() {
  std::vector<float> x = normal_values(6, 2 * 512);
  std::vector<float> out(x.size());
  kernels::round_activations(kernels::ActivationRounding::OneBytePerValue, x.data(), 2, 512, out.data());
  const RoundedBytes expected = bytes_by_the_rule(x);
  for (std::size_t j = 0; j < x.size(); ++j) {
    QCOMPARE(out[j], expected.scales[j / 256] * static_cast<float>(expected.bytes[j]));
    QVERIFY(std::fabs(out[j] - x[j]) <= 0.51f * expected.scales[j / 256]);
  }
  std::vector<float> partial(300);
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument, kernels::round_activations(kernels::ActivationRounding::OneBytePerValue,
                                                                             partial.data(), 1, 300, partial.data()));
}

KVCHAT_TEST_GUILESS_MAIN(ActivationQuantizationTest)

}  // namespace kernels_test_activation_quantization

#include "test_activation_quantization.moc"
