// bf16 <-> f32 conversions: exact widening, round-to-nearest-even narrowing, NaN/Inf handling, for
// both the AVX2 and portable paths and for lengths that exercise the vector body, the tail and the
// threaded split.
#include <QtTest>
#include "common/test_suite.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "engine/kernels/bf16.h"
#include "engine/kernels/cpu_features.h"
#include "engine/kernels/thread_pool.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace kernels_test_bf16 {

using namespace kvchat::kernels;

namespace {

std::uint32_t bits_of(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

float float_from_bits(std::uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// Independent statement of the rounding rule, on the exact rational value of the float:
// pick the nearer of the two bf16 neighbours, the even one on a tie.
std::uint16_t reference_round(float value) {
  const std::uint32_t bits = bits_of(value);
  if (std::isnan(value)) return static_cast<std::uint16_t>((bits >> 16) | 0x40);
  const std::uint16_t down = static_cast<std::uint16_t>(bits >> 16);
  const std::uint32_t remainder = bits & 0xffffu;
  if (remainder < 0x8000u) return down;
  if (remainder > 0x8000u) return static_cast<std::uint16_t>(down + 1);
  return (down & 1u) ? static_cast<std::uint16_t>(down + 1) : down;
}

template <typename Body>
void for_each_kernel(const Body& body) {
  for (bool avx2 : {true, false}) {
    if (avx2 && !cpu_has_avx2_fma()) continue;
    set_avx2_kernels_enabled(avx2);
    body(avx2 ? "avx2" : "portable");
  }
  set_avx2_kernels_enabled(true);
}

}  // namespace

class Bf16Test : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void every_bf16_value_widens_exactly_and_round_trips() {
    for_each_kernel([](const char* kernel) {
      std::vector<std::uint16_t> all(65536);
      for (std::uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<std::uint16_t>(i);
      std::vector<float> widened(all.size());
      bf16_to_f32(all.data(), widened.data(), static_cast<std::int64_t>(all.size()));
      for (std::uint32_t i = 0; i < 65536; ++i) {
        QVERIFY2(bits_of(widened[i]) == (i << 16),
                 qPrintable(QString("%1: widen 0x%2").arg(kernel).arg(i, 4, 16, QChar('0'))));
      }
      std::vector<std::uint16_t> back(all.size());
      f32_to_bf16(widened.data(), back.data(), static_cast<std::int64_t>(widened.size()));
      for (std::uint32_t i = 0; i < 65536; ++i) {
        const bool is_nan = (i & 0x7fffu) > 0x7f80u;
        // NaNs come back quiet (bit 6 set); everything else must be bit-identical.
        const std::uint16_t expected = is_nan ? static_cast<std::uint16_t>(i | 0x40u) : static_cast<std::uint16_t>(i);
        QVERIFY2(back[i] == expected, qPrintable(QString("%1: round trip 0x%2 -> 0x%3")
                                                     .arg(kernel)
                                                     .arg(i, 4, 16, QChar('0'))
                                                     .arg(back[i], 4, 16, QChar('0'))));
      }
    });
  }

  void rounds_to_nearest_even() {
    struct Case {
      std::uint32_t input;
      std::uint16_t expected;
    };
    const Case cases[] = {
        {0x3f800000u, 0x3f80},  // 1.0 exact
        {0x3f807fffu, 0x3f80},  // just below half: down
        {0x3f808000u, 0x3f80},  // tie, even below: stays
        {0x3f818000u, 0x3f82},  // tie, odd below: up to even
        {0x3f808001u, 0x3f81},  // just above half: up
        {0xbf818000u, 0xbf82},  // negative tie rounds the magnitude to even
        {0x7f7fffffu, 0x7f80},  // largest float rounds up to +Inf
        {0xff7fffffu, 0xff80},  // ... and to -Inf
        {0x00000001u, 0x0000},  // smallest denormal rounds to zero
        {0x00008000u, 0x0000},  // denormal tie, even: zero
        {0x00018000u, 0x0002},  // denormal tie, odd: up
        {0x80000000u, 0x8000},  // -0 keeps its sign
    };
    for_each_kernel([&](const char* kernel) {
      // Pad to 37 elements so each case goes through both the 16-wide body and the scalar tail.
      for (const Case& c : cases) {
        std::vector<float> input(37, float_from_bits(c.input));
        std::vector<std::uint16_t> output(input.size(), 0xdead);
        f32_to_bf16(input.data(), output.data(), static_cast<std::int64_t>(input.size()));
        for (std::size_t i = 0; i < output.size(); ++i) {
          QVERIFY2(output[i] == c.expected, qPrintable(QString("%1: 0x%2 -> 0x%3, expected 0x%4 at %5")
                                                           .arg(kernel)
                                                           .arg(c.input, 8, 16, QChar('0'))
                                                           .arg(output[i], 4, 16, QChar('0'))
                                                           .arg(c.expected, 4, 16, QChar('0'))
                                                           .arg(i)));
        }
        QCOMPARE(float_to_bf16(float_from_bits(c.input)), c.expected);
      }
    });
  }

  void nan_and_infinity() {
    for_each_kernel([&](const char* kernel) {
      const float inputs[] = {std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN(),
                              float_from_bits(0x7f800001u),
                              float_from_bits(0xff800001u),
                              float_from_bits(0x7fc0ffffu)};
      std::vector<float> input;
      for (int repeat = 0; repeat < 4; ++repeat) input.insert(input.end(), std::begin(inputs), std::end(inputs));
      std::vector<std::uint16_t> output(input.size());
      f32_to_bf16(input.data(), output.data(), static_cast<std::int64_t>(input.size()));
      for (std::size_t i = 0; i < input.size(); ++i) {
        std::vector<float> back(1);
        bf16_to_f32(&output[i], back.data(), 1);
        if (std::isnan(input[i])) {
          QVERIFY2(std::isnan(back[0]), qPrintable(QString("%1: NaN 0x%2 became 0x%3")
                                                       .arg(kernel)
                                                       .arg(bits_of(input[i]), 8, 16, QChar('0'))
                                                       .arg(output[i], 4, 16, QChar('0'))));
          QCOMPARE(std::signbit(back[0]), std::signbit(input[i]));
        } else {
          QCOMPARE(back[0], input[i]);
        }
      }
    });
  }

  void random_values_match_reference_rounding_on_every_path() {
    std::mt19937 rng(42);
    std::uniform_int_distribution<std::uint32_t> any_bits;
    // 3M elements crosses the threshold at which conversions are split over the pool.
    std::vector<float> input(3'000'007);
    for (float& v : input) v = float_from_bits(any_bits(rng));
    for (int threads : {1, 2}) {
      set_default_threads(threads);
      for_each_kernel([&](const char* kernel) {
        std::vector<std::uint16_t> output(input.size());
        f32_to_bf16(input.data(), output.data(), static_cast<std::int64_t>(input.size()));
        for (std::size_t i = 0; i < input.size(); ++i) {
          if (output[i] != reference_round(input[i])) {
            QFAIL(qPrintable(QString("%1 threads=%2: 0x%3 -> 0x%4, expected 0x%5")
                                 .arg(kernel)
                                 .arg(threads)
                                 .arg(bits_of(input[i]), 8, 16, QChar('0'))
                                 .arg(output[i], 4, 16, QChar('0'))
                                 .arg(reference_round(input[i]), 4, 16, QChar('0'))));
          }
        }
        std::vector<float> widened(input.size());
        bf16_to_f32(output.data(), widened.data(), static_cast<std::int64_t>(output.size()));
        for (std::size_t i = 0; i < output.size(); ++i) {
          if (bits_of(widened[i]) != static_cast<std::uint32_t>(output[i]) << 16) {
            QFAIL(qPrintable(QString("%1 threads=%2: widen 0x%3 at %4")
                                 .arg(kernel)
                                 .arg(threads)
                                 .arg(output[i], 4, 16, QChar('0'))
                                 .arg(i)));
          }
        }
      });
    }
    set_default_threads(0);
  }

  void bad_arguments_throw() {
    std::uint16_t h[2] = {};
    float f[2] = {};
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, bf16_to_f32(h, f, -1));
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, f32_to_bf16(nullptr, h, 2));
    bf16_to_f32(nullptr, nullptr, 0);  // empty is fine
  }
};

KVCHAT_TEST_APPLESS_MAIN(Bf16Test)

}  // namespace kernels_test_bf16

#include "test_bf16.moc"
