// Decode attention for one KV head against a double-precision reference, for the AVX-512, AVX2 and
// portable versions, with strided cache rows and GQA groups.
#include <QtTest>
#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>
#include "common/test_suite.h"

#include "engine/kernels/attention.h"
#include "engine/kernels/cpu_features.h"
#include "engine/kernels/kv_rows.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace kernels_test_attention {

using namespace kvchat::kernels;
using kvchat::KvDtype;

class AttentionTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void matches_reference_data();
  void matches_reference();
  void a_dominant_key_selects_its_value();
  void stored_rows_equal_their_decoded_rows();
  void paged_rows_equal_the_same_rows_in_one_piece();
};

void AttentionTest::matches_reference_data() {
  QTest::addColumn<int>("n");
  QTest::addColumn<int>("group");
  QTest::addColumn<int>("head_dim");
  QTest::addColumn<QString>("kernels");
  // The AVX-512 version takes head_dim in multiples of 16 (others go to the AVX2 one), queries in pairs
  // for the scores and up to four per pass over the values, dimensions up to 64 per pass.
  const std::vector<std::tuple<int, int, int>> shapes{
      {1, 1, 8}, {5, 2, 8},   {37, 4, 64}, {300, 3, 64}, {129, 2, 32}, {17, 1, 80}, {23, 2, 12},
      {9, 3, 4}, {200, 2, 8}, {7, 5, 16},  {64, 8, 64},  {70, 4, 128}, {33, 6, 48}, {150, 7, 96}};
  for (const char* kernels : {"avx512", "avx2", "portable"})
    for (auto [n, group, head_dim] : shapes)
      QTest::newRow(QString("n%1 g%2 d%3 %4").arg(n).arg(group).arg(head_dim).arg(kernels).toUtf8())
          << n << group << head_dim << QString(kernels);
}

void AttentionTest::matches_reference() {
  QFETCH(int, n);
  QFETCH(int, group);
  QFETCH(int, head_dim);
  QFETCH(QString, kernels);
  if (kernels == "avx512" && !cpu_has_avx512()) QSKIP("no AVX-512 on this processor");
  if (kernels != "portable" && !cpu_has_avx2_fma()) QSKIP("no AVX2 on this processor");
  set_avx2_kernels_enabled(kernels != "portable");
  set_avx512_kernels_enabled(kernels == "avx512");
  std::mt19937 rng(n * 131 + group * 7 + head_dim);
  std::normal_distribution<float> normal(0.f, 1.f);
  const int stride = head_dim + 3;  // cache rows need not be packed
  std::vector<float> q(group * head_dim), keys(n * stride), values(n * stride);
  for (float& v : q) v = normal(rng);
  for (float& v : keys) v = normal(rng);
  for (float& v : values) v = normal(rng);
  const float scale = 1.0f / std::sqrt(float(head_dim));
  std::vector<float> scores(group * n), out(group * head_dim, NAN);
  attention_decode_head(q.data(), keys.data(), values.data(), n, stride, group, head_dim, scale, scores.data(),
                        out.data());
  set_avx2_kernels_enabled(true);
  set_avx512_kernels_enabled(true);
  for (int j = 0; j < group; ++j) {
    std::vector<double> p(n);
    double top = -INFINITY, sum = 0;
    for (int t = 0; t < n; ++t) {
      double dot = 0;
      for (int d = 0; d < head_dim; ++d) dot += double(q[j * head_dim + d]) * keys[t * stride + d];
      p[t] = dot * scale;
      top = std::max(top, p[t]);
    }
    for (double& v : p) sum += v = std::exp(v - top);
    for (int d = 0; d < head_dim; ++d) {
      double expected = 0;
      for (int t = 0; t < n; ++t) expected += p[t] / sum * values[t * stride + d];
      const double got = out[j * head_dim + d];
      QVERIFY2(std::fabs(got - expected) <= 1e-5 + 1e-5 * std::fabs(expected),
               qPrintable(QString("query %1 dim %2: %3 vs %4").arg(j).arg(d).arg(got).arg(expected)));
    }
  }
}

void AttentionTest::a_dominant_key_selects_its_value() {
  // Softmax extremes: one key far above the others (the others' exp underflows to 0).
  const int n = 20, head_dim = 16;
  std::vector<float> q(head_dim, 1.f), keys(n * head_dim, 0.f), values(n * head_dim);
  for (int t = 0; t < n; ++t)
    for (int d = 0; d < head_dim; ++d) values[t * head_dim + d] = float(t);
  for (int d = 0; d < head_dim; ++d) keys[13 * head_dim + d] = 100.f;
  std::vector<float> scores(n), out(head_dim);
  attention_decode_head(q.data(), keys.data(), values.data(), n, head_dim, 1, head_dim, 1.f, scores.data(), out.data());
  for (float v : out) QCOMPARE(v, 13.f);
}

// The KV cache's 16- and 8-bit rows attended directly give, to the bit, what the f32 kernel gives over the values
// they decode to (the cache changes no token); where no kernel reads them directly, the caller is told so.
void AttentionTest::stored_rows_equal_their_decoded_rows() {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 1.f);
  int direct = 0;
  for (const bool avx512 : {true, false})
    for (const KvDtype dtype : {KvDtype::F32, KvDtype::BF16, KvDtype::F16, KvDtype::Q8_0})
      for (const auto& [n, group, head_dim] : std::vector<std::tuple<int, int, int>>{
               {1, 1, 64}, {37, 4, 64}, {300, 3, 128}, {129, 2, 32}, {70, 8, 96}, {9, 2, 16}, {20, 1, 8}}) {
        set_avx2_kernels_enabled(cpu_has_avx2_fma());
        set_avx512_kernels_enabled(avx512 && cpu_has_avx512());
        std::vector<float> q(group * head_dim), keys(n * head_dim), values(n * head_dim);
        for (float& v : q) v = normal(rng);
        for (float& v : keys) v = normal(rng) * 3.f;
        for (float& v : values) v = normal(rng);
        const std::int64_t row_bytes = kv_row_bytes(dtype, head_dim);
        std::vector<std::uint8_t> stored_keys(n * row_bytes), stored_values(n * row_bytes);
        encode_kv_rows(dtype, keys.data(), n, head_dim, stored_keys.data());
        encode_kv_rows(dtype, values.data(), n, head_dim, stored_values.data());
        decode_kv_rows(dtype, stored_keys.data(), n, row_bytes, head_dim, keys.data());
        decode_kv_rows(dtype, stored_values.data(), n, row_bytes, head_dim, values.data());
        const float scale = 1.0f / std::sqrt(float(head_dim));
        std::vector<float> scores(group * n), expected(group * head_dim), out(group * head_dim, NAN);
        attention_decode_head(q.data(), keys.data(), values.data(), n, head_dim, group, head_dim, scale, scores.data(),
                              expected.data());
        const bool read = attention_decode_head_stored(q.data(), {stored_keys.data(), row_bytes, dtype},
                                                       {stored_values.data(), row_bytes, dtype}, n, group, head_dim,
                                                       scale, scores.data(), out.data());
        const bool expect_direct =
            avx512 && cpu_has_avx512() && head_dim % 16 == 0 && (dtype != KvDtype::Q8_0 || head_dim % 32 == 0);
        QCOMPARE(read, expect_direct);
        if (!read) continue;
        ++direct;
        QVERIFY2(std::memcmp(out.data(), expected.data(), out.size() * sizeof(float)) == 0,
                 qPrintable(QString("dtype %1, n %2, group %3, head_dim %4: differs from the decoded rows' result")
                                .arg(static_cast<int>(dtype))
                                .arg(n)
                                .arg(group)
                                .arg(head_dim)));
      }
  set_avx2_kernels_enabled(cpu_has_avx2_fma());
  set_avx512_kernels_enabled(cpu_has_avx512());
  if (!cpu_has_avx512()) QSKIP("no AVX-512 on this processor: no kernel reads stored rows directly");
  QVERIFY(direct > 0);
}

// Rows in the blocks of a paged cache (blocks out of order in memory, a window starting inside a block) give, to the
// bit, the result over the same rows decoded and laid one after another: read in their blocks by the AVX-512 kernel,
// or gathered (every processor, and a block size that is not a power of two).
void AttentionTest::paged_rows_equal_the_same_rows_in_one_piece() {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 1.f);
  int read_in_blocks = 0;
  for (const bool avx512 : {true, false})
    for (const KvDtype dtype : {KvDtype::F32, KvDtype::BF16, KvDtype::F16, KvDtype::Q8_0})
      for (const auto& [positions, first, block_tokens, group, head_dim] :
           std::vector<std::tuple<int, int, int, int, int>>{
               {1, 0, 16, 1, 64}, {37, 0, 16, 4, 64}, {300, 45, 32, 3, 128}, {129, 1, 1, 2, 32}, {70, 17, 12, 8, 64}}) {
        set_avx2_kernels_enabled(cpu_has_avx2_fma());
        set_avx512_kernels_enabled(avx512 && cpu_has_avx512());
        const int total = first + positions, blocks = (total + block_tokens - 1) / block_tokens;
        const std::int64_t row_bytes = kv_row_bytes(dtype, head_dim);
        // Each block holds keys then values of its block_tokens rows after 24 bytes of something else; the blocks
        // sit in memory in reverse order.
        const std::int64_t offset = 24, block_bytes = offset + 2 * block_tokens * row_bytes;
        std::vector<std::uint8_t> memory(static_cast<std::size_t>(blocks * block_bytes));
        std::vector<const std::uint8_t*> block_starts;
        for (int b = 0; b < blocks; ++b) block_starts.push_back(memory.data() + (blocks - 1 - b) * block_bytes);
        std::vector<float> q(group * head_dim), row(head_dim);
        for (float& v : q) v = normal(rng);
        std::vector<float> keys(positions * head_dim), values(positions * head_dim);
        for (int p = 0; p < total; ++p)
          for (int part = 0; part < 2; ++part) {
            for (float& v : row) v = normal(rng) * (part == 0 ? 3.f : 1.f);
            auto* stored = const_cast<std::uint8_t*>(block_starts[p / block_tokens]) + offset +
                           (part * block_tokens + p % block_tokens) * row_bytes;
            encode_kv_rows(dtype, row.data(), 1, head_dim, stored);
            if (p >= first)
              decode_kv_rows(dtype, stored, 1, row_bytes, head_dim,
                             (part == 0 ? keys : values).data() + (p - first) * head_dim);
          }
        const PagedKvRows paged_keys{block_starts.data(), block_tokens, offset, first, row_bytes, dtype};
        PagedKvRows paged_values = paged_keys;
        paged_values.offset = offset + block_tokens * row_bytes;
        std::vector<float> gathered(positions * head_dim);
        gather_paged_kv_rows(paged_values, positions, head_dim, gathered.data());
        QVERIFY(std::memcmp(gathered.data(), values.data(), gathered.size() * sizeof(float)) == 0);

        const float scale = 1.0f / std::sqrt(float(head_dim));
        std::vector<float> scores(group * positions), expected(group * head_dim), out(group * head_dim, NAN);
        attention_decode_head(q.data(), keys.data(), values.data(), positions, head_dim, group, head_dim, scale,
                              scores.data(), expected.data());
        const bool read = attention_decode_head_paged(q.data(), paged_keys, paged_values, positions, group, head_dim,
                                                      scale, scores.data(), out.data());
        QCOMPARE(read, avx512 && cpu_has_avx512() && paged_block_shift(block_tokens) >= 0);
        if (!read) continue;
        ++read_in_blocks;
        QVERIFY2(
            std::memcmp(out.data(), expected.data(), out.size() * sizeof(float)) == 0,
            qPrintable(QString("dtype %1, %2 positions from %3 in blocks of %4: differs from the rows in one piece")
                           .arg(static_cast<int>(dtype))
                           .arg(positions)
                           .arg(first)
                           .arg(block_tokens)));
      }
  set_avx2_kernels_enabled(cpu_has_avx2_fma());
  set_avx512_kernels_enabled(cpu_has_avx512());
  QCOMPARE(paged_block_shift(16), std::int64_t(4));
  QCOMPARE(paged_block_shift(12), std::int64_t(-1));
  if (!cpu_has_avx512()) QSKIP("no AVX-512 on this processor: paged rows are gathered, checked above");
  QVERIFY(read_in_blocks > 0);
}

KVCHAT_TEST_APPLESS_MAIN(AttentionTest)

}  // namespace kernels_test_attention

#include "test_attention.moc"
