// Speculative decoding changes no token: prompt lookup gives, token for token, what plain decoding gives
// (greedy and seeded sampling), on f32, bf16 and block-type weights, across a sliding window, whatever ends
// the reply (end of sequence or max tokens inside a checked proposal, the stop flag); the cache after a
// rejected proposal equals one that never saw it; and a forward over several rows equals its decode steps
// to the bit, which is what makes all of this hold.
#include <QtTest>
#include "common/test_suite.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/test_models.h"
#include "engine/cache/kv_cache.h"
#include "engine/cache/kv_snapshot.h"
#include "engine/generation/draft.h"
#include "engine/generation/session.h"
#include "engine/model/decode_context.h"
#include "engine/model/llama_model.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace engine_test_speculative_decoding {

using namespace kvchat;

namespace {

// "name" -> a model (tests/common/test_models.h).
std::shared_ptr<const LlamaModel> load(const QString& name) {
  return kvchat::test::load_test_model(name.toStdString());
}

void add_model_rows() {
  QTest::addColumn<QString>("model");
  for (const char* name : {"models/stories260K", "models/tiny-llama3-random", "models/tiny-llama3-random-bf16",
                           "fixtures/gguf/stories260K-F32.gguf", "fixtures/gguf/tiny-llama-k-Q4_K_M.gguf",
                           "fixtures/gguf/tiny-llama-k-Q8_0.gguf", "qwen2-random-f32", "qwen2-random-bf16",
                           // Sliding windows of 32 positions: rolling back a proposal must keep each window's rows.
                           "family:gemma3", "family:gemma3/model-Q4_K.gguf", "family:phi3", "family:qwen2"})
    QTest::newRow(name) << name;
}

// Prompts: random ones, and one that repeats a passage (what prompt lookup exists for).
std::vector<std::vector<TokenId>> prompts_for(const LlamaModel& model) {
  const auto vocab = static_cast<TokenId>(std::min<std::int64_t>(model.config().vocab_size, 500));
  std::mt19937 random(5);
  std::uniform_int_distribution<TokenId> id(3, vocab - 1);
  std::vector<std::vector<TokenId>> prompts;
  for (std::size_t length : {7u, 40u}) {
    std::vector<TokenId> prompt;
    for (std::size_t i = 0; i < length; ++i) prompt.push_back(id(random));
    prompts.push_back(prompt);
  }
  std::vector<TokenId> passage;
  for (int i = 0; i < 30; ++i) passage.push_back(id(random));
  std::vector<TokenId> repeating = passage;
  repeating.insert(repeating.end(), passage.begin(), passage.end());
  repeating.insert(repeating.end(), passage.begin(), passage.begin() + 6);
  prompts.push_back(repeating);
  return prompts;
}

GenerationConfig config_for(SpeculativeMode mode, int max_new_tokens, int min_ngram = 2) {
  GenerationConfig config;
  config.max_new_tokens = max_new_tokens;
  config.stop_token_ids = {-1};  // the full length: more positions compared
  config.speculative.mode = mode;
  config.speculative.draft_tokens = 6;
  config.speculative.min_ngram = min_ngram;
  return config;
}

// Speculative decoding runs only where a forward over rows computes each as a decode step does (the
// engine kernels); elsewhere (KVCHAT_KERNELS=off) generation decodes plainly, and these checks do not apply.
const char* const kNoRowsPath = "the model's products do not run on the engine kernels: no speculative decoding";

std::string ids_text(const std::vector<TokenId>& ids) {
  std::string text;
  for (TokenId id : ids) text += std::to_string(id) + " ";
  return text;
}

}  // namespace

class SpeculativeDecodingTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void rows_in_one_pass_equal_decode_steps_data() { add_model_rows(); }
  void rows_in_one_pass_equal_decode_steps() {
    QFETCH(QString, model);
    const auto llama = load(model);
    if (!llama->rows_match_decode_steps()) QSKIP(kNoRowsPath);
    const std::vector<TokenId> prompt = prompts_for(*llama)[1];
    const std::vector<TokenId> rows = {prompt[3], prompt[9], prompt[1], prompt[30], prompt[3], prompt[12], prompt[5]};
    const std::int64_t vocab = llama->config().vocab_size;
    auto stepped_cache = make_kv_cache(KvCacheMode::Contiguous, llama->cache_shape());
    auto rows_cache = make_kv_cache(KvCacheMode::Contiguous, llama->cache_shape());
    DecodeContext stepped, in_rows;
    for (std::size_t i = 0; i < prompt.size(); ++i) {
      llama->decode(prompt[i], static_cast<std::int64_t>(i), *stepped_cache, stepped);
      llama->decode(prompt[i], static_cast<std::int64_t>(i), *rows_cache, in_rows);
    }
    const auto start = static_cast<std::int64_t>(prompt.size());
    llama->decode_rows(rows.data(), static_cast<std::int64_t>(rows.size()), start, *rows_cache, in_rows);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      llama->decode(rows[i], start + static_cast<std::int64_t>(i), *stepped_cache, stepped);
      QVERIFY2(std::memcmp(stepped.logits.data(), in_rows.row_logits.data() + i * vocab, vocab * sizeof(float)) == 0,
               qPrintable(QString("row %1's logits differ from its decode step's").arg(i)));
    }
    QCOMPARE(rows_cache->size(), stepped_cache->size());
  }

  // Greedy: lookup decoding (with the default n-grams, and with single-token matches that propose at almost
  // every step and are often wrong) gives plain decoding's ids, 200 tokens per prompt.
  void lookup_gives_plain_greedy_tokens_data() { add_model_rows(); }
  void lookup_gives_plain_greedy_tokens() {
    QFETCH(QString, model);
    const auto llama = load(model);
    if (!llama->rows_match_decode_steps()) QSKIP(kNoRowsPath);
    int accepted = 0, drafted = 0;
    for (const std::vector<TokenId>& prompt : prompts_for(*llama)) {
      Session plain_session(llama, KvCacheMode::Contiguous);
      const GenerationResult plain = plain_session.generate(prompt, config_for(SpeculativeMode::None, 200));
      QCOMPARE(plain.stats.drafted_tokens, 0);
      for (int min_ngram : {2, 1}) {
        Session session(llama, KvCacheMode::Contiguous);
        const GenerationResult lookup = session.generate(prompt, config_for(SpeculativeMode::Lookup, 200, min_ngram));
        QVERIFY2(lookup.generated == plain.generated,
                 qPrintable(QString::fromStdString("lookup: " + ids_text(lookup.generated) +
                                                   "\nplain:  " + ids_text(plain.generated))));
        QVERIFY(session.history() == plain_session.history());
        QCOMPARE(session.cache_tokens(), plain_session.cache_tokens());
        QVERIFY(lookup.stats.accepted_tokens <= lookup.stats.drafted_tokens);
        accepted += lookup.stats.accepted_tokens;
        drafted += lookup.stats.drafted_tokens;
      }
    }
    // The path was taken: proposals were checked (how many hold depends on the model: random weights may
    // never repeat; the stories model's acceptance is checked below).
    QVERIFY2(drafted > 0, qPrintable(QString("%1 of %2 accepted").arg(accepted).arg(drafted)));
    qInfo("%s: %d of %d proposed tokens accepted", qPrintable(model), accepted, drafted);
  }

  // Sampling draws each token from the model's own logits with the seed's stream, so a seed gives the same
  // reply with and without lookup.
  void a_seeded_sample_is_the_same_with_lookup() {
    for (const char* name : {"models/stories260K", "fixtures/gguf/tiny-llama-k-Q4_K_M.gguf"}) {
      const auto llama = load(name);
      if (!llama->rows_match_decode_steps()) QSKIP(kNoRowsPath);
      for (const std::vector<TokenId>& prompt : prompts_for(*llama)) {
        GenerationConfig plain = config_for(SpeculativeMode::None, 150);
        plain.sampling.temperature = 0.8f;
        plain.sampling.top_p = 0.95f;
        plain.sampling.repetition_penalty = 1.1f;
        plain.sampling.seed = 42;
        GenerationConfig lookup = plain;
        lookup.speculative = config_for(SpeculativeMode::Lookup, 150, 1).speculative;
        Session a(llama, KvCacheMode::Contiguous), b(llama, KvCacheMode::Contiguous);
        const GenerationResult expected = a.generate(prompt, plain);
        const GenerationResult got = b.generate(prompt, lookup);
        QVERIFY2(got.generated == expected.generated, name);
        QVERIFY(got.stats.drafted_tokens > 0);
      }
    }
  }

  // Sampled with temperature 1, the tokens that came from checked proposals follow the model's distribution: over
  // 2,000 replies with lookup and 2,000 without (disjoint seeds, so the samples are independent), the third
  // token's frequencies pass a chi-square test of homogeneity at p > 0.01. (One seed gives one reply either way:
  // a_seeded_sample_is_the_same_with_lookup.)
  void sampled_tokens_follow_the_plain_distribution() {
    const auto llama = load("models/stories260K");
    if (!llama->rows_match_decode_steps()) QSKIP(kNoRowsPath);
    // A prompt that repeats itself, so that lookup proposes at every step.
    std::vector<TokenId> prompt = {1, 403, 407, 261, 378, 403, 407, 261, 378, 403, 407, 261};
    constexpr int kSamples = 2000;
    constexpr std::size_t kPosition = 2;
    std::map<TokenId, int> plain_counts, lookup_counts;
    int drafted = 0;
    for (int i = 0; i < kSamples; ++i) {
      for (bool lookup : {false, true}) {
        GenerationConfig config = config_for(lookup ? SpeculativeMode::Lookup : SpeculativeMode::None, 3, 1);
        config.sampling.temperature = 1.0f;
        config.sampling.seed = static_cast<std::uint64_t>(lookup ? kSamples + i + 1 : i + 1);
        Session session(llama, KvCacheMode::Contiguous);
        const GenerationResult result = session.generate(prompt, config);
        QCOMPARE(result.generated.size(), std::size_t(3));
        ++(lookup ? lookup_counts : plain_counts)[result.generated[kPosition]];
        drafted += result.stats.drafted_tokens;
      }
    }
    QVERIFY(drafted > 0);
    // Categories with few samples pooled into one, so every expected count is at least 5.
    std::map<TokenId, std::pair<int, int>> table;
    for (const auto& [token, count] : plain_counts) table[token].first = count;
    for (const auto& [token, count] : lookup_counts) table[token].second = count;
    std::vector<std::pair<double, double>> cells;
    std::pair<double, double> pooled{0, 0};
    for (const auto& [token, counts] : table) {
      if (counts.first + counts.second < 10) {
        pooled.first += counts.first;
        pooled.second += counts.second;
      } else {
        cells.emplace_back(counts.first, counts.second);
      }
    }
    if (pooled.first + pooled.second > 0) cells.push_back(pooled);
    QVERIFY2(cells.size() >= 3, "the third token should vary over the samples");
    double statistic = 0;
    for (const auto& [a, b] : cells) {
      const double expected = (a + b) / 2;  // equal sample sizes
      statistic += (a - expected) * (a - expected) / expected + (b - expected) * (b - expected) / expected;
    }
    // The chi-square quantile at 0.99 for the degrees of freedom (Wilson-Hilferty).
    const double degrees = static_cast<double>(cells.size() - 1);
    const double z = 2.3263478740408408;  // the standard normal's 0.99 quantile
    const double cube = 1 - 2 / (9 * degrees) + z * std::sqrt(2 / (9 * degrees));
    const double critical = degrees * cube * cube * cube;
    qInfo("chi-square %.2f over %d categories (critical %.2f at p = 0.01)", statistic, int(cells.size()), critical);
    QVERIFY2(statistic < critical, qPrintable(QString("chi-square %1 >= %2").arg(statistic).arg(critical)));
  }

  // Whatever ends the reply inside a checked proposal leaves what plain decoding leaves: the same ids, the
  // cache holding the prompt and every token but the last.
  void a_reply_ending_inside_a_proposal_ends_as_without_it() {
    const auto llama = load("models/stories260K");
    if (!llama->rows_match_decode_steps()) QSKIP(kNoRowsPath);
    const std::vector<TokenId> prompt = prompts_for(*llama)[2];
    Session reference(llama, KvCacheMode::Contiguous);
    const std::vector<TokenId> full = reference.generate(prompt, config_for(SpeculativeMode::None, 120)).generated;
    {
      Session session(llama, KvCacheMode::Contiguous);
      const GenerationStats stats = session.generate(prompt, config_for(SpeculativeMode::Lookup, 120)).stats;
      QVERIFY2(stats.accepted_tokens > 0 && stats.accepted_tokens < stats.drafted_tokens,
               qPrintable(QString("%1 of %2 accepted").arg(stats.accepted_tokens).arg(stats.drafted_tokens)));
    }
    // Max tokens at every length up to 40.
    for (int max_tokens = 1; max_tokens <= 40; ++max_tokens) {
      Session session(llama, KvCacheMode::Contiguous);
      const GenerationResult result = session.generate(prompt, config_for(SpeculativeMode::Lookup, max_tokens, 1));
      QVERIFY(result.generated == std::vector<TokenId>(full.begin(), full.begin() + max_tokens));
      QCOMPARE(result.stats.stop_reason, StopReason::MaxTokens);
      QCOMPARE(session.cache_tokens(), static_cast<std::int64_t>(prompt.size()) + max_tokens - 1);
    }
    // An end-of-sequence id: each of the reply's tokens in turn as the stop id.
    for (std::size_t at = 1; at < 60; at += 3) {
      GenerationConfig config = config_for(SpeculativeMode::Lookup, 120, 1);
      config.stop_token_ids = {full[at]};
      GenerationConfig plain_config = config;
      plain_config.speculative.mode = SpeculativeMode::None;
      Session session(llama, KvCacheMode::Contiguous), plain_session(llama, KvCacheMode::Contiguous);
      const GenerationResult result = session.generate(prompt, config);
      const GenerationResult plain = plain_session.generate(prompt, plain_config);
      QVERIFY(result.generated == plain.generated);
      QCOMPARE(result.stats.stop_reason, StopReason::Eos);
      QVERIFY(session.history() == plain_session.history());
    }
    // The stop flag, set from the token callback after n tokens: the reply is what was shown.
    for (int n : {3, 10, 17, 33}) {
      std::atomic<bool> stop{false};
      std::vector<TokenId> shown;
      Session session(llama, KvCacheMode::Contiguous);
      const GenerationResult result = session.generate(prompt, config_for(SpeculativeMode::Lookup, 120, 1), &stop,
                                                       [&](TokenId token, const DecodeProgress& progress) {
                                                         shown.push_back(token);
                                                         if (progress.generated_tokens == n) stop = true;
                                                       });
      QCOMPARE(result.stats.stop_reason, StopReason::Stopped);
      QVERIFY(result.generated == shown);
      QVERIFY(result.generated == std::vector<TokenId>(full.begin(), full.begin() + n));
      QCOMPARE(session.cache_tokens(), static_cast<std::int64_t>(prompt.size()) + n - 1);
    }
  }

  // After rejected proposals the cache holds exactly what a plain run's holds (its rows compared byte for
  // byte), and the next turn's 50 greedy tokens are the same.
  void the_cache_after_rejections_equals_one_that_never_saw_them_data() {
    QTest::addColumn<QString>("model");
    for (const char* name : {"models/stories260K", "models/tiny-llama3-random",
                             "fixtures/gguf/tiny-llama-k-Q4_K_M.gguf", "qwen2-random-bf16"})
      QTest::newRow(name) << name;
  }
  void the_cache_after_rejections_equals_one_that_never_saw_them() {
    QFETCH(QString, model);
    const auto llama = load(model);
    if (!llama->rows_match_decode_steps()) QSKIP(kNoRowsPath);
    const std::vector<TokenId> prompt = prompts_for(*llama)[0];
    Session plain(llama, KvCacheMode::Contiguous), lookup(llama, KvCacheMode::Contiguous);
    const GenerationResult plain_first = plain.generate(prompt, config_for(SpeculativeMode::None, 80));
    int from_checked_rows = 0;  // tokens the callback was told came from a row fed ahead
    const GenerationResult lookup_first = lookup.generate(
        prompt, config_for(SpeculativeMode::Lookup, 80, 1), nullptr,
        [&](TokenId, const DecodeProgress& progress) { from_checked_rows += progress.from_checked_row; });
    QVERIFY(lookup_first.generated == plain_first.generated);
    QCOMPARE(from_checked_rows, lookup_first.stats.accepted_tokens);
    QVERIFY2(lookup_first.stats.accepted_tokens < lookup_first.stats.drafted_tokens, "no proposal was rejected");
    const auto plain_rows = plain.capture();
    const auto lookup_rows = lookup.capture();
    QVERIFY(plain_rows && lookup_rows);
    QVERIFY(plain_rows->tokens == lookup_rows->tokens);
    QCOMPARE(lookup_rows->data.size(), plain_rows->data.size());
    QVERIFY(std::memcmp(lookup_rows->data.data(), plain_rows->data.data(), plain_rows->data.size()) == 0);
    // The next turn, plain on both: only the cache differs in how it was made.
    std::vector<TokenId> next = prompt;
    next.insert(next.end(), plain_first.generated.begin(), plain_first.generated.end());
    next.insert(next.end(), {prompt[2], prompt[4]});
    const GenerationResult plain_second = plain.generate(next, config_for(SpeculativeMode::None, 50));
    const GenerationResult lookup_second = lookup.generate(next, config_for(SpeculativeMode::None, 50));
    QCOMPARE(lookup_second.stats.reused_tokens, plain_second.stats.reused_tokens);
    QVERIFY(lookup_second.generated == plain_second.generated);
  }

  void prompt_lookup_proposes_the_latest_continuation() {
    PromptLookupDrafter drafter(3, 1);
    std::vector<TokenId> out;
    // "5 6 7" occurs twice; the latest occurrence's continuation (8 9) wins over the first's (1 2).
    drafter.propose({5, 6, 7, 1, 2, 5, 6, 7, 8, 9, 4, 5, 6, 7}, 4, out);
    QVERIFY(out == std::vector<TokenId>({8, 9, 4, 5}));
    // Past the end the proposal repeats the period the match found: "8 9 4 5 6 7" again.
    drafter.propose({5, 6, 7, 1, 2, 5, 6, 7, 8, 9, 4, 5, 6, 7}, 9, out);
    QVERIFY(out == std::vector<TokenId>({8, 9, 4, 5, 6, 7, 8, 9, 4}));
    drafter.propose({3, 1, 1, 1}, 5, out);  // a loop of one token
    QVERIFY(out == std::vector<TokenId>({1, 1, 1, 1, 1}));
    drafter.propose({5, 6, 7, 1, 2, 5, 6, 7, 8, 9, 4, 5, 6, 7}, 1, out);
    QVERIFY(out == std::vector<TokenId>({8}));
    // A longer match beats a later shorter one: "2 3" follows "1 2 3" at the start, "3" alone later.
    drafter.propose({1, 2, 3, 10, 11, 9, 3, 12, 1, 2, 3}, 2, out);
    QVERIFY(out == std::vector<TokenId>({10, 11}));
    // Nothing repeats: no proposal.
    drafter.propose({1, 2, 3, 4}, 4, out);
    QVERIFY(out.empty());
    PromptLookupDrafter pairs_only(3, 2);
    pairs_only.propose({1, 2, 3, 4, 3}, 4, out);
    QVERIFY(out.empty());
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, PromptLookupDrafter(1, 2));
    const auto stories = load("models/stories260K");
    SpeculativeConfig config;
    config.mode = SpeculativeMode::Lookup;
    config.draft_tokens = 0;
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, make_drafter(config, *stories));
    QCOMPARE(speculative_mode_from_string("lookup"), SpeculativeMode::Lookup);
    QCOMPARE(speculative_mode_from_string("draft"), SpeculativeMode::DraftModel);
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, speculative_mode_from_string("draft-model"));
  }

  // A draft model: a smaller or more coarsely quantized model of the same vocabulary proposes; the reply is
  // plain decoding's, and its own cache follows the conversation from turn to turn.
  void a_draft_model_gives_plain_greedy_tokens_data() {
    QTest::addColumn<QString>("target");
    QTest::addColumn<QString>("draft");
    QTest::newRow("Q4_K drafts for Q8_0") << "fixtures/gguf/tiny-llama-k-Q8_0.gguf"
                                          << "fixtures/gguf/tiny-llama-k-Q4_K_M.gguf";
    QTest::newRow("stories260K drafts for the tiny llama") << "fixtures/gguf/tiny-llama-k-Q8_0.gguf"
                                                           << "models/stories260K";
    QTest::newRow("Q8_0 drafts for f32") << "models/stories260K"
                                         << "fixtures/gguf/stories260K-Q8_0.gguf";
  }
  void a_draft_model_gives_plain_greedy_tokens() {
    QFETCH(QString, target);
    QFETCH(QString, draft);
    const auto model = load(target);
    if (!model->rows_match_decode_steps()) QSKIP(kNoRowsPath);
    GenerationConfig speculative = config_for(SpeculativeMode::DraftModel, 150);
    speculative.speculative.draft_model = load(draft);
    speculative.speculative.draft_tokens = 4;
    int accepted = 0, drafted = 0;
    Session plain_session(model, KvCacheMode::Contiguous), session(model, KvCacheMode::Contiguous);
    std::vector<TokenId> conversation = prompts_for(*model)[1];
    for (int turn = 0; turn < 2; ++turn) {  // the second turn continues the first: the draft's cache follows
      const GenerationResult plain = plain_session.generate(conversation, config_for(SpeculativeMode::None, 150));
      const GenerationResult result = session.generate(conversation, speculative);
      QVERIFY2(result.generated == plain.generated,
               qPrintable(QString::fromStdString("draft: " + ids_text(result.generated) +
                                                 "\nplain: " + ids_text(plain.generated))));
      QVERIFY(session.history() == plain_session.history());
      accepted += result.stats.accepted_tokens;
      drafted += result.stats.drafted_tokens;
      conversation.insert(conversation.end(), plain.generated.begin(), plain.generated.end());
      conversation.insert(conversation.end(), {5, 9, 13});
    }
    QVERIFY(drafted > 0);
    qInfo("%s: %d of %d proposed tokens accepted", QTest::currentDataTag(), accepted, drafted);
  }

  void a_draft_model_of_another_vocabulary_is_refused() {
    const auto target = load("models/tiny-llama3-random");  // 1000 ids
    SpeculativeConfig config;
    config.mode = SpeculativeMode::DraftModel;
    try {
      make_drafter(config, *target);
      QFAIL("a draft mode without a draft model must be refused");
    } catch (const std::invalid_argument& error) {
      QCOMPARE(QString(error.what()), QString("speculative decoding with a draft model needs a draft model"));
    }
    config.draft_model = load("models/stories260K");  // 512 ids
    try {
      make_drafter(config, *target);
      QFAIL("a draft model of another vocabulary must be refused");
    } catch (const std::invalid_argument& error) {
      QCOMPARE(QString(error.what()), QString("the draft model's vocabulary has 512 ids, the model's 1000: a draft "
                                              "model must share the model's tokenizer"));
    }
    GenerationConfig generation = config_for(SpeculativeMode::DraftModel, 10);
    generation.speculative.draft_model = config.draft_model;
    Session session(target, KvCacheMode::Contiguous);
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, session.generate({1, 2, 3}, generation));
  }
};

KVCHAT_TEST_GUILESS_MAIN(SpeculativeDecodingTest)

}  // namespace engine_test_speculative_decoding

#include "test_speculative_decoding.moc"
