// The sampler chain: seeds reproduce, degenerate settings equal greedy, and 10,000 draws follow the
// filtered distribution (computed independently here) for top-k, top-p and min-p.
#include <QtTest>
#include <algorithm>
#include <cmath>
#include <numeric>
#include "common/test_suite.h"

#include "engine/generation/sampler.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace engine_test_sampler {

using namespace kvchat;

namespace {

const std::vector<float> kLogits = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f, 0.0f, -3.0f, 1.9f};

// Reference: softmax(logits / T), keep per the filters, renormalise. Written independently of the
// sampler: filters applied over the sorted list explicitly.
std::vector<double> reference_distribution(float temperature, int top_k, float top_p, float min_p) {
  const size_t n = kLogits.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [](size_t a, size_t b) { return kLogits[a] > kLogits[b]; });
  size_t keep = top_k > 0 ? std::min<size_t>(n, top_k) : n;
  std::vector<double> p(keep);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += p[i] = std::exp(kLogits[order[i]] / temperature);
  for (double& x : p) x /= sum;
  if (top_p < 1) {
    double c = 0;
    for (size_t i = 0; i < keep; ++i) {
      c += p[i];
      if (c >= top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (min_p > 0) {
    size_t k = 0;
    while (k < keep && p[k] >= min_p * p[0]) ++k;
    keep = k;
  }
  std::vector<double> out(n, 0.0);
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += p[i];
  for (size_t i = 0; i < keep; ++i) out[order[i]] = p[i] / kept;
  return out;
}

}  // namespace

class SamplerTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void draws_follow_filtered_distribution_data();
  void draws_follow_filtered_distribution();
  void same_seed_same_tokens();
  void degenerate_settings_equal_greedy();
  void repetition_penalty_changes_the_choice();
};

void SamplerTest::draws_follow_filtered_distribution_data() {
  QTest::addColumn<float>("temperature");
  QTest::addColumn<int>("top_k");
  QTest::addColumn<float>("top_p");
  QTest::addColumn<float>("min_p");
  QTest::newRow("plain") << 1.0f << 0 << 1.0f << 0.0f;
  QTest::newRow("top-k 3") << 1.0f << 3 << 1.0f << 0.0f;
  QTest::newRow("top-p 0.7") << 1.0f << 0 << 0.7f << 0.0f;
  QTest::newRow("min-p 0.3") << 1.0f << 0 << 1.0f << 0.3f;
  QTest::newRow("hot, all filters") << 1.5f << 5 << 0.9f << 0.1f;
  QTest::newRow("cold") << 0.5f << 0 << 1.0f << 0.0f;
}

void SamplerTest::draws_follow_filtered_distribution() {
  QFETCH(float, temperature);
  QFETCH(int, top_k);
  QFETCH(float, top_p);
  QFETCH(float, min_p);
  SamplingParams params;
  params.temperature = temperature;
  params.top_k = top_k;
  params.top_p = top_p;
  params.min_p = min_p;
  params.seed = 42;
  Sampler sampler(params);
  std::vector<double> expected = reference_distribution(temperature, top_k, top_p, min_p);
  std::vector<double> reported = sampler.probabilities(kLogits.data(), kLogits.size(), {});
  for (size_t i = 0; i < expected.size(); ++i)
    QVERIFY2(std::abs(reported[i] - expected[i]) < 1e-6,
             qPrintable(QString("token %1: %2 vs %3").arg(i).arg(reported[i]).arg(expected[i])));

  const int draws = 10000;
  std::vector<int> counts(kLogits.size(), 0);
  for (int i = 0; i < draws; ++i) ++counts[sampler.sample(kLogits.data(), kLogits.size(), {})];
  for (size_t i = 0; i < expected.size(); ++i) {
    double frequency = double(counts[i]) / draws;
    if (expected[i] == 0) {
      QVERIFY2(counts[i] == 0, qPrintable(QString("filtered token %1 drawn %2 times").arg(i).arg(counts[i])));
      continue;
    }
    // Tolerance: 4.5 standard deviations of a binomial frequency (a false failure is ~1 in 10^5).
    double tolerance = 4.5 * std::sqrt(expected[i] * (1 - expected[i]) / draws) + 1e-3;
    QVERIFY2(std::abs(frequency - expected[i]) < tolerance,
             qPrintable(QString("token %1: frequency %2, expected %3 +- %4")
                            .arg(i)
                            .arg(frequency)
                            .arg(expected[i])
                            .arg(tolerance)));
  }
}

void SamplerTest::same_seed_same_tokens() {
  SamplingParams params;
  params.temperature = 1.0f;
  params.seed = 7;
  Sampler a(params), b(params);
  std::vector<TokenId> first, second;
  for (int i = 0; i < 200; ++i) {
    first.push_back(a.sample(kLogits.data(), kLogits.size(), {}));
    second.push_back(b.sample(kLogits.data(), kLogits.size(), {}));
  }
  QVERIFY(first == second);
  params.seed = 8;
  Sampler c(params);
  std::vector<TokenId> third;
  for (int i = 0; i < 200; ++i) third.push_back(c.sample(kLogits.data(), kLogits.size(), {}));
  QVERIFY(third != first);
}

void SamplerTest::degenerate_settings_equal_greedy() {
  const TokenId best = argmax(kLogits.data(), kLogits.size());
  QCOMPARE(best, TokenId(1));
  SamplingParams zero_temperature;
  zero_temperature.temperature = 0.0f;
  SamplingParams top_k_one;
  top_k_one.temperature = 1.3f;
  top_k_one.top_k = 1;
  top_k_one.seed = 3;
  for (const SamplingParams& params : {zero_temperature, top_k_one}) {
    Sampler sampler(params);
    for (int i = 0; i < 50; ++i) QCOMPARE(sampler.sample(kLogits.data(), kLogits.size(), {}), best);
  }
  // Ties go to the first index, as llama2.c's argmax.
  std::vector<float> tied = {0.0f, 3.0f, 3.0f, 1.0f};
  QCOMPARE(argmax(tied.data(), tied.size()), TokenId(1));
}

void SamplerTest::repetition_penalty_changes_the_choice() {
  SamplingParams params;
  params.repetition_penalty = 1.2f;  // 2.0 / 1.2 = 1.67 < 1.9: token 7 wins once token 1 was seen
  Sampler sampler(params);
  QCOMPARE(sampler.sample(kLogits.data(), kLogits.size(), {}), TokenId(1));
  QCOMPARE(sampler.sample(kLogits.data(), kLogits.size(), {1}), TokenId(7));
  params.repetition_window = 1;  // only the last token counts
  Sampler windowed(params);
  QCOMPARE(windowed.sample(kLogits.data(), kLogits.size(), {1, 5}), TokenId(1));
}

KVCHAT_TEST_APPLESS_MAIN(SamplerTest)

}  // namespace engine_test_sampler

#include "test_sampler.moc"
