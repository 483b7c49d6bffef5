// Sessions: cached (both implementations) == uncached, multi-turn reuse, truncation to a common
// prefix, a prefix copied from another session, the stop flag from another thread and between prefill
// chunks, and the context limit.
#include <QtTest>
#include <atomic>
#include <limits>
#include <thread>
#include "common/test_suite.h"

#include "common/test_paths.h"
#include "engine/generation/session.h"
#include "engine/kernels/cpu_features.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_loader.h"

#include <ATen/ATen.h>

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace engine_test_session {

using namespace kvchat;
using kvchat::test::shared_path;

namespace {

// A model directory, or a GGUF file (its weights kept in their stored types).
std::shared_ptr<const LlamaModel> load(const std::string& relative) {
  const std::string path = shared_path(relative);
  if (relative.size() > 5 && relative.compare(relative.size() - 5, 5, ".gguf") == 0) return load_model(path).model;
  return LlamaModel::from_checkpoint(path, ModelConfig::from_directory(path));
}

GenerationResult run(const std::shared_ptr<const LlamaModel>& model, KvCacheMode mode,
                     const std::vector<TokenId>& prompt, int max_new_tokens, SamplingParams sampling = {}) {
  GenerationConfig config;
  config.cache_mode = mode;
  config.max_new_tokens = max_new_tokens;
  config.sampling = sampling;
  config.stop_token_ids = {-1};  // run the full length: more positions compared
  Session session(model, mode);
  return session.generate(prompt, config);
}

std::vector<TokenId> concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

class SessionTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void cached_equals_uncached_data();
  void cached_equals_uncached();
  void multi_turn_equals_one_uncached_run();
  void truncation_to_common_prefix();
  void stop_flag_from_another_thread();
  void stop_during_prefill_keeps_cache_consistent();
  void stop_between_prefill_chunks();
  void copied_prefix_equals_prefilled_one();
  void context_limit_stops_generation();
  void end_of_sequence_token_is_never_cached();
  void over_long_prompt_is_rejected();
  void non_finite_logits_stop_with_an_error();
  void logprobs_are_the_log_softmax_of_the_logits();
  void the_kernels_follow_the_isa_setting();
};

void SessionTest::cached_equals_uncached_data() {
  QTest::addColumn<QString>("model");
  QTest::addColumn<float>("temperature");
  QTest::newRow("stories260K-greedy") << "models/stories260K" << 0.0f;
  QTest::newRow("stories260K-sampled") << "models/stories260K" << 0.9f;
  QTest::newRow("tiny-llama3-greedy") << "models/tiny-llama3-random" << 0.0f;
  QTest::newRow("tiny-llama3-sampled") << "models/tiny-llama3-random" << 1.0f;
  // Quantized weights (and a BF16 file's rounded input): the decode kernels, the short-chunk kernels and the
  // prefill GEMM must compute the same products for every type.
  for (const char* file : {"stories260K-Q8_0", "stories260K-Q4_0", "tiny-llama-k-Q4_K_M", "tiny-llama-k-Q5_K_M",
                           "tiny-llama-k-Q6_K", "tiny-llama-k-Q4_0", "tiny-llama-k-Q8_0", "tiny-llama-k-BF16"})
    QTest::newRow(qPrintable(QString(file) + "-greedy")) << QString("fixtures/gguf/%1.gguf").arg(file) << 0.0f;
}

// The cache changes nothing observable: identical token ids, compared exactly.
void SessionTest::cached_equals_uncached() {
  QFETCH(QString, model);
  QFETCH(float, temperature);
  auto llama = load(model.toStdString());
  SamplingParams sampling;
  sampling.temperature = temperature;
  sampling.top_k = 40;
  sampling.top_p = 0.95f;
  sampling.seed = 1234;
  std::vector<TokenId> prompt = {1, 403, 407, 261, 378};
  auto off = run(llama, KvCacheMode::Off, prompt, 60, sampling);
  auto naive = run(llama, KvCacheMode::Naive, prompt, 60, sampling);
  auto contiguous = run(llama, KvCacheMode::Contiguous, prompt, 60, sampling);
  QCOMPARE(off.generated.size(), size_t(60));
  QVERIFY(naive.generated == off.generated);
  QVERIFY(contiguous.generated == off.generated);
  // Same seed, same tokens; another seed (when sampling) gives another story.
  QVERIFY(run(llama, KvCacheMode::Contiguous, prompt, 60, sampling).generated == contiguous.generated);
  if (temperature > 0) {
    sampling.seed = 99;
    QVERIFY(run(llama, KvCacheMode::Contiguous, prompt, 60, sampling).generated != contiguous.generated);
  }
  QCOMPARE(contiguous.stats.cache_tokens, int64_t(prompt.size() + 59));  // the last token is never fed
  QCOMPARE(off.stats.cache_tokens, int64_t(0));
}

void SessionTest::multi_turn_equals_one_uncached_run() {
  auto model = load("models/stories260K");
  for (KvCacheMode mode : {KvCacheMode::Contiguous, KvCacheMode::Naive}) {
    GenerationConfig config;
    config.cache_mode = mode;
    config.max_new_tokens = 30;
    config.stop_token_ids = {-1};
    Session session(model, mode);
    std::vector<TokenId> turn1 = {1, 403, 407, 261, 378};
    auto first = session.generate(turn1, config);
    QCOMPARE(first.stats.prefilled_tokens, 5);
    QCOMPARE(first.stats.reused_tokens, 0);
    const int64_t cached_after_first = session.cache_tokens();
    QCOMPARE(cached_after_first, int64_t(5 + 30 - 1));

    // Turn 2: the whole history plus new user ids; only the new tokens (and the reply's last,
    // never-fed token) are prefilled.
    std::vector<TokenId> user2 = {297, 309, 409, 416};
    std::vector<TokenId> history = concat(concat(turn1, first.generated), user2);
    auto second = session.generate(history, config);
    QCOMPARE(second.stats.reused_tokens, int(cached_after_first));
    QCOMPARE(second.stats.prefilled_tokens, int(history.size() - cached_after_first));
    QCOMPARE(second.stats.prefilled_tokens, int(user2.size()) + 1);
    QCOMPARE(session.cache_tokens(), int64_t(history.size() + 30 - 1));

    // One uncached run over the whole sequence gives the same continuation.
    auto reference = run(model, KvCacheMode::Off, history, 30);
    QVERIFY(second.generated == reference.generated);
  }
}

void SessionTest::truncation_to_common_prefix() {
  auto model = load("models/stories260K");
  GenerationConfig config;
  config.max_new_tokens = 20;
  config.stop_token_ids = {-1};
  Session session(model, KvCacheMode::Contiguous);
  std::vector<TokenId> prompt = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376};
  session.generate(prompt, config);
  // Edit: the history diverges after 6 tokens; the cache is cut there, not rebuilt.
  std::vector<TokenId> edited = {1, 403, 407, 261, 378, 432, 297, 309};
  auto result = session.generate(edited, config);
  QCOMPARE(result.stats.reused_tokens, 6);
  QCOMPARE(result.stats.prefilled_tokens, 2);
  QVERIFY(result.generated == run(model, KvCacheMode::Off, edited, 20).generated);
  // Regenerate the same prompt: everything but the last token is reused.
  auto again = session.generate(edited, config);
  QCOMPARE(again.stats.reused_tokens, int(edited.size()) - 1);
  QCOMPARE(again.stats.prefilled_tokens, 1);
  QVERIFY(again.generated == result.generated);
}

void SessionTest::stop_flag_from_another_thread() {
  auto model = load("models/stories260K");
  GenerationConfig config;
  config.max_new_tokens = 400;
  config.stop_token_ids = {-1};
  Session session(model, KvCacheMode::Contiguous);
  std::atomic<bool> stop{false};
  std::atomic<int> tokens_seen{0};
  std::atomic<int> tokens_at_stop{-1};
  std::thread stopper([&] {
    while (tokens_seen.load() < 10) std::this_thread::yield();
    tokens_at_stop = tokens_seen.load();
    stop = true;
  });
  std::vector<TokenId> prompt = {1, 403, 407, 261, 378};
  auto result = session.generate(prompt, config, &stop, [&](TokenId, const kvchat::DecodeProgress&) {
    ++tokens_seen;
    // Give the stopper time to act, as a slow consumer would.
    if (tokens_seen.load() >= 10) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  });
  stopper.join();
  QCOMPARE(result.stats.stop_reason, StopReason::Stopped);
  // Ends within one token of the flag being set.
  QVERIFY2(int(result.generated.size()) <= tokens_at_stop.load() + 1,
           qPrintable(QString("%1 tokens, stop set after %2").arg(result.generated.size()).arg(tokens_at_stop.load())));
  // The cache holds exactly the tokens processed: the prompt and every generated token but the last.
  QCOMPARE(session.cache_tokens(), int64_t(prompt.size() + result.generated.size() - 1));
  QCOMPARE(session.history().size(), size_t(session.cache_tokens()));
  // And it is consistent: continuing equals a fresh uncached run over the same history.
  std::vector<TokenId> history = concat(prompt, result.generated);
  config.max_new_tokens = 15;
  auto continued = session.generate(history, config);
  QVERIFY(continued.generated == run(model, KvCacheMode::Off, history, 15).generated);
}

void SessionTest::stop_during_prefill_keeps_cache_consistent() {
  auto model = load("models/stories260K");
  GenerationConfig config;
  config.max_new_tokens = 10;
  config.prefill_chunk_tokens = 4;
  Session session(model, KvCacheMode::Contiguous);
  std::atomic<bool> stop{true};  // already set: nothing is prefilled, nothing generated
  std::vector<TokenId> prompt = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376};
  auto result = session.generate(prompt, config, &stop);
  QCOMPARE(result.stats.stop_reason, StopReason::Stopped);
  QVERIFY(result.generated.empty());
  QCOMPARE(session.cache_tokens(), int64_t(0));
  stop = false;
  auto resumed = session.generate(prompt, config, &stop);
  QCOMPARE(resumed.stats.prefilled_tokens, int(prompt.size()));
  QCOMPARE(resumed.generated.size(), size_t(10));
}

// The caller is asked before every prefill chunk, with the cache (and history()) holding the chunks run
// so far; a stop set there ends the prefill before the next chunk.
void SessionTest::stop_between_prefill_chunks() {
  auto model = load("models/stories260K");
  GenerationConfig config;
  config.max_new_tokens = 10;
  config.prefill_chunk_tokens = 4;
  std::vector<TokenId> prompt = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 297, 309, 409, 416};
  Session session(model, KvCacheMode::Contiguous);
  GenerationConfig one_token = config;
  one_token.max_new_tokens = 1;  // never fed: the cache holds the 3 prompt tokens
  session.generate(std::vector<TokenId>(prompt.begin(), prompt.begin() + 3), one_token);
  QCOMPARE(session.cache_tokens(), int64_t(3));
  std::atomic<bool> stop{false};
  std::vector<std::int64_t> asked;
  auto result = session.generate(prompt, config, &stop, {}, [&](std::int64_t cached_tokens) {
    asked.push_back(cached_tokens);
    QCOMPARE(session.history(), std::vector<TokenId>(prompt.begin(), prompt.begin() + cached_tokens));
    if (asked.size() == 3) stop = true;
  });
  // 3 reused, then chunks of 4 from there: asked at 3, 7 and 11, stopped before the third chunk.
  QCOMPARE(asked, (std::vector<std::int64_t>{3, 7, 11}));
  QCOMPARE(result.stats.reused_tokens, 3);
  QCOMPARE(result.stats.prefilled_tokens, 8);
  QCOMPARE(result.stats.stop_reason, StopReason::Stopped);
  QVERIFY(result.generated.empty());
  QCOMPARE(session.cache_tokens(), int64_t(11));
  QCOMPARE(session.history(), std::vector<TokenId>(prompt.begin(), prompt.begin() + 11));

  // Unasked, or never stopped, it runs to the end as before.
  stop = false;
  asked.clear();
  auto resumed =
      session.generate(prompt, config, &stop, {}, [&](std::int64_t cached_tokens) { asked.push_back(cached_tokens); });
  QCOMPARE(asked, (std::vector<std::int64_t>{11}));
  QCOMPARE(resumed.stats.prefilled_tokens, 3);
  QVERIFY(resumed.generated == run(model, KvCacheMode::Off, prompt, 10).generated);
}

// A prefix copied from another session's cache serves as its own prefill would: the same reply, with
// the copied positions reused; the source keeps its cache.
void SessionTest::copied_prefix_equals_prefilled_one() {
  auto model = load("models/stories260K");
  for (KvCacheMode mode : {KvCacheMode::Contiguous, KvCacheMode::Naive}) {
    GenerationConfig config;
    config.cache_mode = mode;
    config.max_new_tokens = 20;
    config.stop_token_ids = {-1};
    Session source(model, mode);
    const std::vector<TokenId> first = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376};
    source.generate(first, config);
    const std::vector<TokenId> source_history = source.history();

    const std::vector<TokenId> second = {1, 403, 407, 261, 378, 432, 297, 309, 409};
    Session branch(model, mode);
    branch.generate({1, 297, 309}, config);  // whatever it held is replaced
    QCOMPARE(branch.copy_prefix_from(source, 6), int64_t(6));
    QCOMPARE(branch.history(), std::vector<TokenId>(first.begin(), first.begin() + 6));
    QCOMPARE(branch.cache_tokens(), int64_t(6));
    auto result = branch.generate(second, config);
    QCOMPARE(result.stats.reused_tokens, 6);
    QCOMPARE(result.stats.prefilled_tokens, 3);
    QVERIFY(result.generated == run(model, KvCacheMode::Off, second, 20).generated);
    QCOMPARE(source.history(), source_history);

    // More than the source holds: what it holds. A session without a cache copies nothing.
    Session whole(model, mode);
    QCOMPARE(whole.copy_prefix_from(source, 10000), int64_t(source_history.size()));
    QCOMPARE(whole.history(), source_history);
    Session off(model, KvCacheMode::Off);
    QCOMPARE(off.copy_prefix_from(source, 6), int64_t(0));
  }
}

void SessionTest::context_limit_stops_generation() {
  auto model = load("models/stories260K");  // 512 positions
  GenerationConfig config;
  config.max_new_tokens = 1000;
  config.stop_token_ids = {-1};
  Session session(model, KvCacheMode::Contiguous);
  std::vector<TokenId> prompt(500, 261);
  prompt[0] = 1;
  auto result = session.generate(prompt, config);
  QCOMPARE(result.stats.stop_reason, StopReason::ContextFull);
  // Every generated token has a position inside the context: prompt + reply fill it exactly, and the
  // cache holds all but the last (never fed).
  QCOMPARE(result.generated.size(), size_t(512 - 500));
  QCOMPARE(session.cache_tokens(), int64_t(511));

  // A smaller limit of the caller's stops the same way, and bounds the prompt too.
  config.context_limit = 505;
  Session limited(model, KvCacheMode::Contiguous);
  auto short_result = limited.generate(prompt, config);
  QCOMPARE(short_result.stats.stop_reason, StopReason::ContextFull);
  QCOMPARE(short_result.generated.size(), size_t(5));
  QCOMPARE(std::vector<TokenId>(short_result.generated.begin(), short_result.generated.end()),
           std::vector<TokenId>(result.generated.begin(), result.generated.begin() + 5));
  config.context_limit = 499;
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument, limited.generate(prompt, config));
}

void SessionTest::end_of_sequence_token_is_never_cached() {
  auto model = load("models/stories260K");
  std::vector<TokenId> prompt = {1, 403, 407, 261, 378};
  // The 6th greedy token, made the stop id: the reply ends on it.
  const auto free_run = run(model, KvCacheMode::Off, prompt, 6).generated;
  QCOMPARE(free_run.size(), size_t(6));
  for (KvCacheMode mode : {KvCacheMode::Contiguous, KvCacheMode::Naive}) {
    GenerationConfig config;
    config.max_new_tokens = 50;
    config.cache_mode = mode;
    config.stop_token_ids = {free_run.back()};
    Session session(model, mode);
    auto result = session.generate(prompt, config);
    QCOMPARE(result.stats.stop_reason, StopReason::Eos);
    QVERIFY(result.generated.size() <= free_run.size());
    QCOMPARE(result.generated.back(), free_run.back());
    // The cache ends with the reply's last real token: what the next turn's prompt continues from.
    std::vector<TokenId> expected = prompt;
    expected.insert(expected.end(), result.generated.begin(), result.generated.end() - 1);
    QCOMPARE(session.history(), expected);
    QCOMPARE(session.cache_tokens(), int64_t(expected.size()));
  }
}

void SessionTest::over_long_prompt_is_rejected() {
  auto model = load("models/stories260K");
  Session session(model, KvCacheMode::Contiguous);
  std::vector<TokenId> prompt(513, 261);
  try {
    session.generate(prompt, GenerationConfig{});
    QFAIL("an over-long prompt must be rejected");
  } catch (const std::invalid_argument& error) {
    QVERIFY2(QString(error.what()).contains("513 tokens"), error.what());
  }
  QCOMPARE(session.cache_tokens(), int64_t(0));
}

// Weights that turn the logits into NaN (or infinity) end the generation with an error naming the
// problem, on every cache path, instead of sampling garbage.
void SessionTest::non_finite_logits_stop_with_an_error() {
  auto healthy = load("models/stories260K");
  for (float poison : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    ModelWeights weights = random_model_weights(healthy->config(), 1, WeightDtype::Float32);
    weights.final_norm = weights.final_norm.clone().fill_(poison);
    auto broken = std::make_shared<LlamaModel>(healthy->config(), std::move(weights));
    for (KvCacheMode mode : {KvCacheMode::Contiguous, KvCacheMode::Naive, KvCacheMode::Off}) {
      GenerationConfig config;
      config.cache_mode = mode;
      Session session(broken, mode);
      try {
        session.generate({1, 403, 407}, config);
        QFAIL("non-finite logits must be an error");
      } catch (const std::runtime_error& error) {
        QVERIFY2(QString(error.what()).contains("NaN or infinite logits at position 2"), error.what());
      }
    }
  }
}

// Each sampled token's logprobs are the log-softmax of the logits it was drawn from (repetition penalty
// applied, over the temperature when sampled), recomputed here from an uncached forward of the sequence
// so far; the top list is those logits' best ids in order.
void SessionTest::logprobs_are_the_log_softmax_of_the_logits() {
  const auto model = load("models/stories260K");
  const std::vector<TokenId> prompt = {1, 403, 407, 261, 378};
  for (const SamplingParams& sampling : {SamplingParams{}, SamplingParams{0.8f, 0, 1.0f, 0.0f, 1.3f, 16, 5}}) {
    GenerationConfig config;
    config.max_new_tokens = 12;
    config.sampling = sampling;
    config.stop_token_ids = {-1};
    config.top_logprobs = 3;
    Session session(model, KvCacheMode::Contiguous);
    std::vector<TokenLogprobs> reported;
    const GenerationResult result =
        session.generate(prompt, config, nullptr, [&](TokenId, const DecodeProgress& progress) {
          QVERIFY(progress.logprobs);
          reported.push_back(*progress.logprobs);
        });
    QCOMPARE(reported.size(), result.generated.size());
    std::vector<TokenId> sequence = prompt;
    for (std::size_t i = 0; i < result.generated.size(); ++i) {
      at::Tensor logits = model->forward(sequence, 0, nullptr).clone();
      // The CTRL-style penalty over the last `repetition_window` ids, each distinct id once.
      if (sampling.repetition_penalty != 1.0f) {
        std::vector<TokenId> window(
            sequence.end() - std::min<std::ptrdiff_t>(sequence.size(), sampling.repetition_window), sequence.end());
        std::sort(window.begin(), window.end());
        window.erase(std::unique(window.begin(), window.end()), window.end());
        for (TokenId id : window) {
          const float value = logits[id].item<float>();
          logits[id] = value > 0 ? value / sampling.repetition_penalty : value * sampling.repetition_penalty;
        }
      }
      if (sampling.temperature > 0) logits = logits / sampling.temperature;
      const at::Tensor expected = at::log_softmax(logits.to(at::kDouble), 0);
      const TokenId chosen = result.generated[i];
      QCOMPARE(reported[i].chosen.token, chosen);
      QVERIFY2(std::abs(reported[i].chosen.logprob - expected[chosen].item<double>()) < 1e-4,
               qPrintable(QString("token %1: %2 against %3")
                              .arg(i)
                              .arg(reported[i].chosen.logprob)
                              .arg(expected[chosen].item<double>())));
      const at::Tensor best = std::get<1>(expected.topk(3));
      QCOMPARE(reported[i].top.size(), std::size_t(3));
      for (int j = 0; j < 3; ++j) {
        QCOMPARE(reported[i].top[j].token, static_cast<TokenId>(best[j].item<std::int64_t>()));
        QVERIFY(std::abs(reported[i].top[j].logprob - expected[best[j]].item<double>()) < 1e-4);
      }
      if (sampling.temperature <= 0) QCOMPARE(reported[i].top[0].token, chosen);  // greedy: the argmax
      sequence.push_back(chosen);
    }
  }
}

// This suite also runs with KVCHAT_ISA=portable (tests/CMakeLists.txt): that run must really be on the
// portable kernels.
void SessionTest::the_kernels_follow_the_isa_setting() {
  const QByteArray isa = qgetenv("KVCHAT_ISA");
  if (isa == "portable") {
    QVERIFY(!kernels::use_avx2_kernels());
    QVERIFY(!kernels::use_avx512_kernels());
  } else if (isa == "avx2") {
    QCOMPARE(kernels::use_avx2_kernels(), kernels::cpu_has_avx2_fma());
    QVERIFY(!kernels::use_avx512_kernels());
  } else if (isa.isEmpty() && qgetenv("KVCHAT_AVX512").isEmpty()) {
    QCOMPARE(kernels::use_avx2_kernels(), kernels::cpu_has_avx2_fma());
    QCOMPARE(kernels::use_avx512_kernels(), kernels::cpu_has_avx512());
  }
}

KVCHAT_TEST_APPLESS_MAIN(SessionTest)

}  // namespace engine_test_session

#include "test_session.moc"
