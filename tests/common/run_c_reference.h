#pragma once
// llama2.c's run.c greedy stories for stories260K (fixtures/reference/stories260K_greedy.json): the
// test rows (every case in every cache mode) and the check, shared by every model file that holds
// stories260K's weights (the Hugging Face directory, the GGUF file).
#include <QtTest>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "common/json_fixture.h"
#include "common/sanitized_build.h"
#include "common/test_paths.h"
#include "engine/generation/session.h"

namespace kvchat::test {

inline nlohmann::json run_c_cases() { return load_json(shared_path("fixtures/reference/stories260K_greedy.json")); }

// Columns case_index (int) and mode (QString: on, naive, off).
inline void add_run_c_rows() {
  QTest::addColumn<int>("case_index");
  QTest::addColumn<QString>("mode");
  const nlohmann::json cases = run_c_cases();
  for (int i = 0; i < static_cast<int>(cases.size()); ++i)
    for (const char* mode : {"on", "naive", "off"})
      QTest::newRow(QString("case%1-%2").arg(i).arg(mode).toUtf8()) << i << QString(mode);
}

// Without a cache every step recomputes the whole prefix through LibTorch, so a story costs O(steps^2)
// of large tensor allocations; under AddressSanitizer each of those is a fresh mapping, and one 256-step
// story takes minutes. There the cache-off rows generate this many tokens and check them against the
// start of run.c's story (the cached modes still run every story to its end).
constexpr int kSanitizedCacheOffTokens = 48;

inline std::string token_list_text(const std::vector<TokenId>& ids) {
  std::string out;
  for (TokenId id : ids) out += std::to_string(id) + " ";
  return out;
}

// Greedy generation from the case's prompt_ids in `mode` reproduces run.c's generated_ids exactly and
// stops the same way. stop_ids empty: the model's own end-of-sequence ids.
inline void check_greedy_matches_run_c(const std::shared_ptr<const LlamaModel>& model, int case_index,
                                       const QString& mode, const std::vector<TokenId>& stop_ids = {}) {
  const nlohmann::json reference = run_c_cases()[case_index];
  const std::vector<TokenId> prompt = reference["prompt_ids"].get<std::vector<TokenId>>();
  std::vector<TokenId> expected = reference["generated_ids"].get<std::vector<TokenId>>();
  GenerationConfig config;
  config.cache_mode = kv_cache_mode_from_string(mode.toStdString());
  config.max_new_tokens = reference["steps"].get<int>() - static_cast<int>(prompt.size()) + 1;
  config.stop_token_ids = stop_ids;
  const bool shortened =
      kSanitizedBuild && mode == QLatin1String("off") && config.max_new_tokens > kSanitizedCacheOffTokens;
  if (shortened) config.max_new_tokens = kSanitizedCacheOffTokens;
  Session session(model, config.cache_mode);
  const GenerationResult result = session.generate(prompt, config);
  if (shortened && result.stats.stop_reason != StopReason::Eos) {
    QCOMPARE(static_cast<int>(result.generated.size()), kSanitizedCacheOffTokens);
    expected.resize(std::min(expected.size(), result.generated.size()));
    QVERIFY2(result.generated == expected,
             qPrintable(QString::fromStdString("expected " + token_list_text(expected) + "\n got " +
                                               token_list_text(result.generated))));
    return;
  }
  // Our result includes the stop token; compare the stories themselves, whichever way the reference
  // records the final BOS, and check separately that both stopped the same way.
  std::vector<TokenId> generated = result.generated;
  if (result.stats.stop_reason == StopReason::Eos) generated.pop_back();
  const bool stopped_on_bos = reference["stopped_on_bos"].get<bool>();
  if (stopped_on_bos && !expected.empty() && expected.back() == 1) expected.pop_back();
  QVERIFY2(generated == expected, qPrintable(QString::fromStdString("expected " + token_list_text(expected) +
                                                                    "\n got " + token_list_text(generated))));
  QCOMPARE(result.stats.stop_reason == StopReason::Eos, stopped_on_bos);
}

}  // namespace kvchat::test
