// The KV cache in 16 and 8 bits (KvDtype): the row codecs (bf16 and f16 as LibTorch rounds them, q8_0 within
// half a step and stable under a second rounding), the rule that the cache changes no token of the model with
// that rounding (cache on == naive == off, exact ids, on stories260K, a Llama-3-shape model and a Qwen2 model),
// the bytes the gauge counts, and snapshots: a q8_0 snapshot restores to the same tokens, and a store of
// another dtype's snapshots is refused with a log line.
#include <QTemporaryDir>
#include <QtTest>
#include "common/test_suite.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/snapshot_support.h"
#include "common/test_models.h"
#include "engine/cache/kv_cache.h"
#include "engine/cache/session_pool.h"
#include "engine/cache/snapshot_store.h"
#include "engine/generation/session.h"
#include "engine/kernels/kv_rows.h"
#include "engine/model/llama_model.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace engine_test_kv_dtypes {

using namespace kvchat;
namespace test = kvchat::test;

namespace {

// Values that reach every branch of the 16-bit roundings: normal, subnormal, ties, overflow, zeros, NaN.
std::vector<float> awkward_values() {
  std::vector<float> values = {0.f,
                               -0.f,
                               1.f,
                               -1.f,
                               65504.f,
                               65519.f,
                               65520.f,
                               1e6f,
                               -1e6f,
                               6.1e-5f,
                               5.9604645e-8f,
                               2.9802322e-8f,
                               8.9406967e-8f,
                               1e-10f,
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(),
                               1.00048828125f,
                               1.00146484375f,
                               3.0e38f};
  std::mt19937 random(7);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 4000; ++i) values.push_back(normal(random));
  for (int i = 0; i < 4000; ++i) {
    std::uint32_t pattern = bits(random);
    if ((pattern & 0x7f800000u) == 0x7f800000u) pattern &= 0xbfffffffu;  // NaN payloads are checked apart
    float value;
    std::memcpy(&value, &pattern, sizeof value);
    values.push_back(value);
  }
  while (values.size() % 32 != 0) values.push_back(0.5f);
  return values;
}

std::uint16_t bits_of(const at::Tensor& t, std::int64_t i) {
  std::uint16_t bits;
  std::memcpy(&bits, static_cast<const std::uint8_t*>(t.data_ptr()) + 2 * i, 2);
  return bits;
}

GenerationConfig greedy(int tokens, KvCacheMode mode, KvDtype dtype) {
  GenerationConfig config = test::greedy(tokens, mode);
  config.kv_dtype = dtype;
  return config;
}

}  // namespace

class KvDtypesTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  // bf16 and f16 rows hold what LibTorch's own conversions give, to the bit, and read back exactly.
  void sixteen_bit_rows_round_as_libtorch() {
    const std::vector<float> values = awkward_values();
    const auto n = static_cast<std::int64_t>(values.size());
    const at::Tensor input = at::from_blob(const_cast<float*>(values.data()), {n}, at::kFloat);
    for (const auto& [dtype, type] : {std::pair{KvDtype::BF16, at::kBFloat16}, std::pair{KvDtype::F16, at::kHalf}}) {
      std::vector<std::uint16_t> stored(values.size());
      kernels::encode_kv_rows(dtype, values.data(), n / 32, 32, stored.data());
      const at::Tensor expected = input.to(type);
      for (std::int64_t i = 0; i < n; ++i)
        if (stored[i] != bits_of(expected, i))
          QFAIL(qPrintable(QString("%1: %2 stored as 0x%3, LibTorch gives 0x%4")
                               .arg(to_string(dtype))
                               .arg(static_cast<double>(values[i]), 0, 'g', 9)
                               .arg(stored[i], 0, 16)
                               .arg(bits_of(expected, i), 0, 16)));
      std::vector<float> decoded(values.size());
      kernels::decode_kv_rows(dtype, stored.data(), n / 32, 64, 32, decoded.data());
      const at::Tensor widened = expected.to(at::kFloat);
      QCOMPARE(std::memcmp(decoded.data(), widened.data_ptr<float>(), values.size() * 4), 0);
    }
    std::vector<float> nan(32, std::numeric_limits<float>::quiet_NaN());
    kernels::round_kv_rows(KvDtype::F16, nan.data(), 1, 32);
    QVERIFY(std::isnan(nan[0]));
  }

  // q8_0: each value within half a step of its block's scale (plus the f16 rounding of the scale), and a rounded
  // row rounds to itself (what the cache stores of a row that the uncached path rounded).
  void q8_rows_are_close_and_stable() {
    std::mt19937 random(3);
    std::normal_distribution<float> normal(0.f, 2.f);
    for (const std::int64_t head_dim : {8, 16, 64, 96, 128}) {
      const std::int64_t rows = 50, block = kernels::kv_q8_block(head_dim);
      QCOMPARE(block, head_dim % 32 == 0 ? std::int64_t(32) : head_dim);
      QCOMPARE(kernels::kv_row_bytes(KvDtype::Q8_0, head_dim), head_dim + 2 * head_dim / block);
      std::vector<float> values(static_cast<std::size_t>(rows * head_dim));
      for (float& value : values) value = normal(random) * (random() % 3 == 0 ? 100.f : 1.f);
      values[5] = 0.f;
      std::fill(values.begin() + head_dim, values.begin() + head_dim + block, 0.f);  // an all-zero block
      std::vector<float> rounded = values;
      kernels::round_kv_rows(KvDtype::Q8_0, rounded.data(), rows, head_dim);
      for (std::int64_t b = 0; b < rows * head_dim / block; ++b) {
        float largest = 0.f;
        for (std::int64_t i = b * block; i < (b + 1) * block; ++i) largest = std::max(largest, std::fabs(values[i]));
        for (std::int64_t i = b * block; i < (b + 1) * block; ++i)
          QVERIFY2(std::fabs(values[i] - rounded[i]) <= largest / 127.f * 0.502f + largest * 1e-3f,
                   qPrintable(QString("head_dim %1, value %2 -> %3").arg(head_dim).arg(values[i]).arg(rounded[i])));
      }
      QCOMPARE(rounded[static_cast<std::size_t>(head_dim)], 0.f);
      std::vector<std::uint8_t> once(static_cast<std::size_t>(rows * kernels::kv_row_bytes(KvDtype::Q8_0, head_dim)));
      std::vector<std::uint8_t> twice(once.size());
      kernels::encode_kv_rows(KvDtype::Q8_0, values.data(), rows, head_dim, once.data());
      kernels::encode_kv_rows(KvDtype::Q8_0, rounded.data(), rows, head_dim, twice.data());
      QVERIFY2(once == twice, "a rounded row must store as the row it came from");
    }
    // A block with a non-finite value reads back NaN everywhere, as an f32 row's products would be non-finite.
    std::vector<float> bad(32, 1.f);
    bad[3] = std::numeric_limits<float>::infinity();
    kernels::round_kv_rows(KvDtype::Q8_0, bad.data(), 1, 32);
    QVERIFY(std::isnan(bad[0]) && std::isnan(bad[31]));
  }

  // The rule: with a given KV dtype the cache changes no token. Cache on, naive and off give the same ids (the
  // uncached path rounds K and V through the same dtype), and the rounding is real: the cache holds its dtype's
  // bytes, and the logits differ from f32's.
  void cache_changes_no_token_data() {
    QTest::addColumn<QString>("model");
    QTest::addColumn<int>("dtype");
    for (const char* model : {"models/stories260K", "models/tiny-llama3-random", "qwen2-random-f32"})
      for (const KvDtype dtype : {KvDtype::BF16, KvDtype::F16, KvDtype::Q8_0})
        QTest::newRow(qPrintable(QString("%1 %2").arg(model, to_string(dtype)))) << model << static_cast<int>(dtype);
  }
  void cache_changes_no_token() {
    QFETCH(QString, model);
    QFETCH(int, dtype);
    const auto kv_dtype = static_cast<KvDtype>(dtype);
    const auto llama = test::load_test_model(model.toStdString());
    const ModelConfig& config = llama->config();
    const std::vector<TokenId> prompt = test::made_up_prompt(24, 5);
    const int tokens = model.contains("stories") ? 200 : 80;
    std::vector<std::vector<TokenId>> ids;
    for (const KvCacheMode mode : {KvCacheMode::Contiguous, KvCacheMode::Naive, KvCacheMode::Off}) {
      Session session(llama, mode);
      const GenerationResult result = session.generate(prompt, greedy(tokens, mode, kv_dtype));
      QCOMPARE(result.stats.kv_dtype, kv_dtype);
      QCOMPARE(static_cast<int>(result.generated.size()), tokens);
      ids.push_back(result.generated);
      if (mode != KvCacheMode::Off) {
        // The gauge: every cached position's rows in the dtype's bytes.
        const std::int64_t row_bytes = kernels::kv_row_bytes(kv_dtype, config.head_dim);
        QCOMPARE(result.stats.cache_bytes,
                 result.stats.cache_tokens * config.num_hidden_layers * 2 * config.num_key_value_heads * row_bytes);
      }
    }
    QCOMPARE(ids[1], ids[0]);
    QCOMPARE(ids[2], ids[0]);
    // The same turn continued: a second turn reuses the cache and still equals the uncached path.
    Session cached(llama, KvCacheMode::Contiguous), uncached(llama, KvCacheMode::Off);
    std::vector<TokenId> turn = prompt;
    for (int round = 0; round < 2; ++round) {
      const auto a = cached.generate(turn, greedy(30, KvCacheMode::Contiguous, kv_dtype));
      const auto b = uncached.generate(turn, greedy(30, KvCacheMode::Off, kv_dtype));
      QCOMPARE(a.generated, b.generated);
      if (round == 1) QVERIFY(a.stats.reused_tokens > 0);
      turn = test::continued(turn, a.generated, 5);
    }
    // The rounding is real: the logits of a prompt differ from the f32 cache's.
    const at::Tensor exact = llama->forward(prompt, 0, nullptr);
    const at::Tensor rounded = llama->forward(prompt, 0, nullptr, false, kv_dtype);
    QVERIFY(!at::equal(exact, rounded));
    auto cache = make_kv_cache(KvCacheMode::Contiguous, llama->cache_shape(kv_dtype));
    QVERIFY(at::equal(llama->forward(prompt, 0, cache.get()), rounded));
  }

  // A cache's stored rows copy into another cache of its dtype as they are (a branch), and a cache of another
  // dtype is refused.
  void prefix_copies_keep_the_dtype() {
    const auto llama = test::load_test_model("models/stories260K");
    const std::vector<TokenId> prompt = test::made_up_prompt(40, 2);
    Session source(llama, KvCacheMode::Contiguous), branch(llama, KvCacheMode::Contiguous);
    const GenerationConfig q8 = greedy(20, KvCacheMode::Contiguous, KvDtype::Q8_0);
    source.generate(prompt, q8);
    branch.generate({1, 5}, q8);
    QCOMPARE(branch.copy_prefix_from(source, 40), std::int64_t(40));
    Session fresh(llama, KvCacheMode::Off);
    const auto continued = branch.generate(source.history(), q8);
    QCOMPARE(continued.generated,
             fresh.generate(source.history(), greedy(20, KvCacheMode::Off, KvDtype::Q8_0)).generated);
    Session f32(llama, KvCacheMode::Contiguous);
    f32.generate({1, 5}, test::greedy(2));
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, f32.copy_prefix_from(source, 40));
  }

  // A q8_0 conversation's snapshot restores in a new pool and continues as a fresh prefill would; a store of f32
  // snapshots neither restores into nor saves a q8_0 cache, and says so.
  void snapshots_keep_their_dtype() {
    const auto llama = test::load_test_model("models/stories260K");
    const ModelFingerprint fingerprint = fingerprint_model(*llama);
    const std::vector<TokenId> first = test::made_up_prompt(60, 4);
    const GenerationConfig q8 = greedy(20, KvCacheMode::Contiguous, KvDtype::Q8_0);
    QTemporaryDir folder;
    auto q8_store = [&] {
      return std::make_shared<SnapshotStore>(folder.path().toStdString(), 0, fingerprint,
                                             llama->cache_shape(KvDtype::Q8_0));
    };
    std::vector<TokenId> second;
    {
      auto store = q8_store();
      SessionPool pool(llama, store);
      const auto result = pool.acquire(1, KvCacheMode::Contiguous).generate(first, q8);
      second = test::continued(first, result.generated, 4);
      QVERIFY(pool.save_snapshot(1));
      store->flush();
    }
    Session fresh(llama, KvCacheMode::Contiguous);
    const auto expected = fresh.generate(second, q8);
    {
      SessionPool pool(llama, q8_store());
      const auto restored = pool.acquire(1, KvCacheMode::Contiguous).generate(second, q8);
      QVERIFY(restored.stats.restored_tokens > 0);
      QCOMPARE(restored.generated, expected.generated);
    }
    {
      QTemporaryDir f32_folder;
      auto store =
          std::make_shared<SnapshotStore>(f32_folder.path().toStdString(), 0, fingerprint, llama->cache_shape());
      SessionPool pool(llama, store);
      test::LogCapture log;
      const auto result = pool.acquire(1, KvCacheMode::Contiguous).generate(second, q8);
      QCOMPARE(result.stats.restored_tokens, 0);
      QCOMPARE(result.generated, expected.generated);
      QVERIFY2(log.contains("KV snapshots here hold f32 caches; this conversation's cache is q8_0"), log.all().c_str());
      QVERIFY(!pool.save_snapshot(1));
    }
    // The q8_0 file read as an f32 cache's: refused, and left alone.
    SessionPool pool(
        llama, std::make_shared<SnapshotStore>(folder.path().toStdString(), 0, fingerprint, llama->cache_shape()));
    test::LogCapture log;
    const auto result = pool.acquire(1, KvCacheMode::Contiguous).generate(second, test::greedy(20));
    QCOMPARE(result.stats.restored_tokens, 0);
    QVERIFY2(log.contains("holds a q8_0 KV cache; this cache is f32"), log.all().c_str());
  }

  void dtype_names() {
    for (const KvDtype dtype : {KvDtype::F32, KvDtype::BF16, KvDtype::F16, KvDtype::Q8_0})
      QCOMPARE(kv_dtype_from_string(to_string(dtype)), dtype);
    try {
      kv_dtype_from_string("q4_0");
      QFAIL("an unknown KV dtype must be refused");
    } catch (const std::invalid_argument& error) {
      QCOMPARE(QString(error.what()), QString("unknown kv cache dtype 'q4_0' (expected f32, bf16, f16 or q8_0)"));
    }
  }
};

KVCHAT_TEST_GUILESS_MAIN(KvDtypesTest)

}  // namespace engine_test_kv_dtypes

#include "test_kv_dtypes.moc"
