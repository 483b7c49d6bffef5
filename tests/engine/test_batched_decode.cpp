// A batched decode step (LlamaModel::decode_batch): several sequences' next tokens in one pass, each row
// bit-identical to the same sequence's decode step alone (logits compared with memcmp), with sequences of
// different lengths joining and leaving the batch at different steps, over f32, bf16 (a GGUF BF16 file: repacked
// rows, rounded input), Q8_0, Q4_K, Qwen2 and
// sliding-window models, with contiguous caches and with paged ones (the attention reading the pool's blocks).
#include <QtTest>
#include "common/test_suite.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/test_models.h"
#include "engine/cache/kv_cache.h"
#include "engine/cache/paged_kv_cache.h"
#include "engine/model/decode_context.h"
#include "engine/model/llama_model.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace engine_test_batched_decode {

using namespace kvchat;

namespace {

std::shared_ptr<const LlamaModel> load(const std::string& name) { return kvchat::test::load_test_model(name); }

TokenId argmax(const float* logits, std::int64_t vocab) {
  return static_cast<TokenId>(std::max_element(logits, logits + vocab) - logits);
}

// One sequence: its prompt, when it joins the batch and how many tokens it makes.
struct Sequence {
  std::vector<TokenId> prompt;
  int joins_at = 0;
  int new_tokens = 0;
};

}  // namespace

class BatchedDecodeTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void each_row_equals_its_sequence_alone_data() {
    QTest::addColumn<QString>("model");
    QTest::addColumn<bool>("paged");
    for (const char* name : {"models/stories260K", "models/tiny-llama3-random", "models/tiny-llama3-random-bf16",
                             "fixtures/gguf/tiny-llama-k-Q4_K_M.gguf", "fixtures/gguf/tiny-llama-k-Q8_0.gguf",
                             "fixtures/gguf/tiny-llama-k-BF16.gguf", "qwen2-random-bf16", "family:gemma3",
                             "family:gemma2", "family:qwen2"})
      QTest::newRow(name) << name << false;
    // The batch over a paged cache (one block pool, attention reading the blocks); sliding-window models are not
    // paged yet.
    for (const char* name :
         {"models/stories260K", "models/tiny-llama3-random", "fixtures/gguf/tiny-llama-k-Q4_K_M.gguf",
          "fixtures/gguf/tiny-llama-k-BF16.gguf", "qwen2-random-bf16", "qwen2-random-q4_k"})
      QTest::newRow(qPrintable(QString("%1 paged").arg(name))) << name << true;
  }

  void each_row_equals_its_sequence_alone() {
    QFETCH(QString, model);
    QFETCH(bool, paged);
    const auto llama = load(model.toStdString());
    if (!llama->rows_match_decode_steps())
      QSKIP("the model's products do not run on the engine kernels: no batched step");
    const std::int64_t vocab = llama->config().vocab_size;
    const auto vocabulary = static_cast<TokenId>(std::min<std::int64_t>(vocab, 500));
    std::mt19937 random(9);
    std::uniform_int_distribution<TokenId> id(3, vocabulary - 1);
    // Eight sequences: prompt lengths 1 to 70 (past the fixtures' window of 32), joining at steps 0 to 21 and
    // leaving after 6 to 60 tokens, so the batch grows, shrinks and changes members from step to step.
    std::vector<Sequence> sequences;
    for (int j = 0; j < 8; ++j) {
      Sequence sequence;
      for (int t = 0; t < 1 + 10 * j % 71; ++t) sequence.prompt.push_back(id(random));
      sequence.joins_at = 3 * j;
      sequence.new_tokens = 6 + (j * 17) % 55;
      sequences.push_back(sequence);
    }

    // Alone: each sequence prefilled, then decoded one step at a time; every step's logits kept.
    std::vector<std::vector<std::vector<float>>> alone_logits(sequences.size());
    std::vector<std::vector<TokenId>> alone_tokens(sequences.size());
    for (std::size_t j = 0; j < sequences.size(); ++j) {
      auto cache = make_kv_cache(KvCacheMode::Contiguous, llama->cache_shape());
      DecodeContext context;
      const std::vector<TokenId>& prompt = sequences[j].prompt;
      llama->decode_rows(prompt.data(), static_cast<std::int64_t>(prompt.size()), 0, *cache, context);
      std::vector<float> logits(context.row_logits.end() - vocab, context.row_logits.end());
      for (int step = 0; step < sequences[j].new_tokens; ++step) {
        const TokenId token = argmax(logits.data(), vocab);
        alone_tokens[j].push_back(token);
        llama->decode(token, cache->size(), *cache, context);
        logits = context.logits;
        alone_logits[j].push_back(logits);
      }
    }

    // Batched: the same prefills, then one decode_batch per step over the sequences running at that step.
    KvBlockPool pool(llama->cache_shape(), /*block_tokens=*/16, /*max_blocks=*/64);
    std::vector<std::unique_ptr<KvCache>> caches;
    std::vector<std::vector<float>> next_logits(sequences.size());
    std::vector<std::vector<TokenId>> batched_tokens(sequences.size());
    for (const Sequence& sequence : sequences) {
      if (paged)
        caches.push_back(std::make_unique<PagedKvCache>(pool));
      else
        caches.push_back(make_kv_cache(KvCacheMode::Contiguous, llama->cache_shape()));
      DecodeContext context;
      llama->decode_rows(sequence.prompt.data(), static_cast<std::int64_t>(sequence.prompt.size()), 0, *caches.back(),
                         context);
      next_logits[caches.size() - 1].assign(context.row_logits.end() - vocab, context.row_logits.end());
    }
    DecodeContext batch_context;
    int largest_batch = 0;
    for (int step = 0;; ++step) {
      std::vector<std::size_t> members;
      std::vector<TokenId> ids;
      std::vector<KvCache*> row_caches;
      bool pending = false;
      for (std::size_t j = 0; j < sequences.size(); ++j) {
        const int made = static_cast<int>(batched_tokens[j].size());
        if (made < sequences[j].new_tokens) pending = true;
        if (step < sequences[j].joins_at || made >= sequences[j].new_tokens) continue;
        const TokenId token = argmax(next_logits[j].data(), vocab);
        batched_tokens[j].push_back(token);
        members.push_back(j);
        ids.push_back(token);
        row_caches.push_back(caches[j].get());
      }
      if (!pending) break;
      if (members.empty()) continue;
      largest_batch = std::max(largest_batch, static_cast<int>(members.size()));
      llama->decode_batch(ids.data(), row_caches.data(), static_cast<std::int64_t>(members.size()), batch_context);
      for (std::size_t row = 0; row < members.size(); ++row) {
        const std::size_t j = members[row];
        const float* logits = batch_context.row_logits.data() + row * vocab;
        const std::size_t made = batched_tokens[j].size();
        QVERIFY2(std::memcmp(logits, alone_logits[j][made - 1].data(), vocab * sizeof(float)) == 0,
                 qPrintable(QString("sequence %1, token %2 (batch of %3): the logits differ from its step alone")
                                .arg(j)
                                .arg(made)
                                .arg(members.size())));
        next_logits[j].assign(logits, logits + vocab);
      }
    }
    for (std::size_t j = 0; j < sequences.size(); ++j) {
      QVERIFY(batched_tokens[j] == alone_tokens[j]);
      QCOMPARE(caches[j]->size(), static_cast<std::int64_t>(sequences[j].prompt.size()) + sequences[j].new_tokens);
    }
    QVERIFY(largest_batch >= 5);
    if (paged) {
      std::int64_t blocks = 0;
      for (const auto& cache : caches) blocks += (cache->size() + 15) / 16;
      QCOMPARE(pool.blocks_in_use(), blocks);
      caches.clear();
      QCOMPARE(pool.blocks_in_use(), std::int64_t(0));
    }
  }

  void a_batch_refuses_a_shared_cache_and_a_full_context() {
    const auto llama = load("models/stories260K");
    if (!llama->rows_match_decode_steps()) QSKIP("the model's products do not run on the engine kernels");
    auto cache = make_kv_cache(KvCacheMode::Contiguous, llama->cache_shape());
    DecodeContext context;
    const std::vector<TokenId> ids = {5, 6};
    KvCache* both[] = {cache.get(), cache.get()};
    try {
      llama->decode_batch(ids.data(), both, 2, context);
      QFAIL("two rows of one cache must be refused");
    } catch (const std::invalid_argument& error) {
      QCOMPARE(QString(error.what()), QString("decode_batch: rows 0 and 1 share a cache (one row per sequence)"));
    }
    QCOMPARE(cache->size(), std::int64_t(0));
    // A sequence at the end of the context: refused before anything is written.
    auto other = make_kv_cache(KvCacheMode::Contiguous, llama->cache_shape());
    const std::vector<TokenId> full(static_cast<std::size_t>(llama->config().max_position_embeddings), 7);
    llama->decode_rows(full.data(), static_cast<std::int64_t>(full.size()), 0, *other, context);
    KvCache* rows[] = {cache.get(), other.get()};
    QVERIFY_THROWS_EXCEPTION(std::length_error, llama->decode_batch(ids.data(), rows, 2, context));
    QCOMPARE(cache->size(), std::int64_t(0));
  }
};

KVCHAT_TEST_GUILESS_MAIN(BatchedDecodeTest)

}  // namespace engine_test_batched_decode

#include "test_batched_decode.moc"
