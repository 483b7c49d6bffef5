// The families beyond Llama against an independent reference: tests/reference/transformer_reference.py, a NumPy
// forward written from the families' reference modeling code, over tiny seeded random models that
// tests/reference/make_family_fixtures.py writes to tests/fixtures/families/<family>/ (a Hugging Face folder in
// bf16, GGUF files in Q8_0 and Q4_K) with the reference's logits for a 64-token prompt.
// - Every file, with the exact path (a compute context without the hand-written kernels): every position's
//   logits within 1e-4 of the largest reference logit. The GGUF files' reference ran over the files' own
//   dequantized weights, so this also checks the block decoding.
// - With the kernels, which round a block type's product inputs to bytes as llama.cpp does (per 32 for Q8_0, per
//   256 for the K-quants): against the reference with the same rounding (transformer_reference.round_activations).
//   That reference does not yet reproduce the kernels' roundings as closely as the exact path is reproduced
//   (see the closing figures in DESIGN), so the bar there is 5e-2 of the largest logit, and the reference's
//   argmax wherever its top-two margin is clear of twice that.
// - Cached (contiguous and naive) == uncached greedy ids for 200 tokens, token for token.
#include <c10/core/InferenceMode.h>

#include <QtTest>
#include "common/test_suite.h"

#include <fstream>

#include "common/json_fixture.h"
#include "common/test_paths.h"
#include "engine/compute/compute_context.h"
#include "engine/generation/session.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_loader.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace engine_test_family_references {

using namespace kvchat;

namespace {

const char* const kFamilies[] = {"qwen3"};

std::string family_dir(const QString& family) {
  return kvchat::test::source_dir() + "/tests/fixtures/families/" + family.toStdString();
}

// The reference's logits [positions, vocab] for one file of the family.
at::Tensor reference_logits(const std::string& directory, const nlohmann::json& reference, const std::string& file,
                            const char* which = "logits") {
  const std::string path = directory + "/" + reference[which][file].get<std::string>();
  const auto positions = reference["positions"].get<std::int64_t>(),
             vocab = reference["vocab_size"].get<std::int64_t>();
  std::vector<float> values(static_cast<std::size_t>(positions * vocab));
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(values.size() * sizeof(float)));
  if (!in) throw std::runtime_error("cannot read " + path);
  return at::from_blob(values.data(), {positions, vocab}, at::kFloat).clone();
}

std::string load_path(const std::string& directory, const std::string& file) {
  return file == "model.safetensors" ? directory : directory + "/" + file;
}

}  // namespace

class FamilyReferencesTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void logits_match_the_reference_data();
  void logits_match_the_reference();
  void cached_and_uncached_ids_agree_data();
  void cached_and_uncached_ids_agree();
};

void FamilyReferencesTest::logits_match_the_reference_data() {
  QTest::addColumn<QString>("family");
  QTest::addColumn<QString>("file");
  for (const char* family : kFamilies)
    for (const char* file : {"model.safetensors", "model-Q8_0.gguf", "model-Q4_K.gguf"})
      QTest::newRow(qPrintable(QString("%1 %2").arg(family, file))) << QString(family) << QString(file);
}

void FamilyReferencesTest::logits_match_the_reference() {
  QFETCH(QString, family);
  QFETCH(QString, file);
  const std::string directory = family_dir(family);
  const nlohmann::json reference = kvchat::test::load_json(directory + "/reference.json");
  const LoadedModel loaded = load_model(load_path(directory, file.toStdString()));
  QCOMPARE(QString::fromStdString(loaded.config.model_type), family);
  const at::Tensor expected = reference_logits(directory, reference, file.toStdString());
  const auto prompt = reference["prompt"].get<std::vector<TokenId>>();
  const double largest = expected.abs().max().item<double>();
  QVERIFY(largest > 0.5);  // not a degenerate model

  c10::InferenceMode guard;
  const auto logits_with = [&](bool kernels) {
    const ComputeContext context(ComputeContext::Options{1, kernels});
    const ComputeScope scope(&context);
    return loaded.model->forward(prompt, 0, nullptr, /*all_positions=*/true);
  };
  const double exact = (logits_with(false) - expected).abs().max().item<double>() / largest;
  QVERIFY2(exact <= 1e-4, qPrintable(QString("exact path: logits differ by %1 of the largest").arg(exact)));

  // The safetensors file's products are f32: the kernels compute them exactly too.
  const at::Tensor expected_fast =
      reference["logits_with_rounded_activations"].contains(file.toStdString())
          ? reference_logits(directory, reference, file.toStdString(), "logits_with_rounded_activations")
          : expected;
  const at::Tensor fast = logits_with(true);
  const double fast_bar = expected_fast.equal(expected) ? 1e-4 : 5e-2;
  const double rounded = (fast - expected_fast).abs().max().item<double>() / largest;
  qInfo("%s %s: exact path %.2e, kernels %.2e of the largest logit", qPrintable(family), qPrintable(file), exact,
        rounded);
  QVERIFY2(rounded <= fast_bar, qPrintable(QString("kernels: logits differ by %1 of the largest").arg(rounded)));
  const auto [top, top_ids] = expected_fast.topk(2, -1);
  const at::Tensor fast_ids = fast.argmax(-1);
  for (std::int64_t position = 0; position < expected_fast.size(0); ++position) {
    if ((top[position][0] - top[position][1]).item<double>() < 2 * fast_bar * largest) continue;
    QCOMPARE(fast_ids[position].item<std::int64_t>(), top_ids[position][0].item<std::int64_t>());
  }
}

void FamilyReferencesTest::cached_and_uncached_ids_agree_data() { logits_match_the_reference_data(); }

void FamilyReferencesTest::cached_and_uncached_ids_agree() {
  QFETCH(QString, family);
  QFETCH(QString, file);
  const std::string directory = family_dir(family);
  const nlohmann::json reference = kvchat::test::load_json(directory + "/reference.json");
  const LoadedModel loaded = load_model(load_path(directory, file.toStdString()));
  const auto prompt = reference["prompt"].get<std::vector<TokenId>>();
  GenerationConfig config;
  config.max_new_tokens = 200;
  config.stop_token_ids = {-1};  // exactly 200 tokens
  std::vector<std::vector<TokenId>> runs;
  for (KvCacheMode mode : {KvCacheMode::Contiguous, KvCacheMode::Naive, KvCacheMode::Off}) {
    Session session(loaded.model, mode);
    runs.push_back(session.generate(prompt, config).generated);
  }
  QCOMPARE(runs[0].size(), std::size_t(200));
  QCOMPARE(runs[1], runs[0]);
  QCOMPARE(runs[2], runs[0]);
  // Not a model stuck on one token: the test would pass whatever the positions did.
  std::set<TokenId> distinct(runs[0].begin(), runs[0].end());
  QVERIFY2(distinct.size() >= 10, qPrintable(QString("only %1 distinct tokens").arg(distinct.size())));
}

KVCHAT_TEST_MAIN(FamilyReferencesTest)

}  // namespace engine_test_family_references

#include "test_family_references.moc"
