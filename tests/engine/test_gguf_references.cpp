// GGUF files made by llama.cpp's own tools against llama.cpp's own outputs on them
// (../shared/fixtures/gguf, whose README defines the tolerances used here):
// - stories260K F32: greedy ids equal llama2.c's run.c goldens with the cache on, naive and off;
// - every file: teacher-forced logits within 2*dq of llama.cpp's own quantized logits (llama.cpp rounds
//   the activations to 8-bit blocks for its block-type products: dq is what that moves its logits), and
//   greedy ids equal llama.cpp's wherever its margin is at least 2*dq;
// - the exact path (f32, f16, bf16 files; every file with KVCHAT_KERNELS=off): logits within
//   1e-4 + 2e-5*max|logit| of the same weights dequantized to f32, greedy ids equal the f32 twin's
//   wherever its margin is at least 1e-3;
// - the fast kernels on a block-type file round the activations too (engine/kernels/
//   activation_quantization.h), one byte per value as llama.cpp does (blocks of 32 for Q8_0 and the
//   32-element types, super-blocks of 256 for the K-quants), and so on a BF16 file where the processor
//   multiplies bf16 pairs (bf16 values, engine/kernels/bf16_packed.h): logits within exact + 2*dq of the f32 twin
//   (rounding_allowance; the largest of such moves over the positions is itself a sample: a factor 2 to
//   spare); the twin's greedy ids wherever its margin is at least 1e-3 + twice that allowance;
// - a file whose products round their input runs every forward row-exact: a prompt's logits equal, to the
//   bit, those of its tokens decoded one by one.
// Logits are checked through one batched forward (prefill kernels) and token by token through the
// cache (decode kernels).
#include <c10/core/InferenceMode.h>

#include <QtTest>
#include "common/test_suite.h"

#include "common/json_fixture.h"
#include "common/run_c_reference.h"
#include "common/test_paths.h"
#include "engine/compute/compute_options.h"
#include "engine/generation/session.h"
#include "engine/kernels/bf16_packed.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_loader.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace engine_test_gguf_references {

using namespace kvchat;
using kvchat::test::load_json;
using kvchat::test::shared_path;
using kvchat::test::token_list_text;

namespace {

const char* const kFiles[] = {"stories260K-F32",     "stories260K-Q8_0",  "stories260K-Q4_0",  "tiny-llama-k-BF16",
                              "tiny-llama-k-F16",    "tiny-llama-k-Q8_0", "tiny-llama-k-Q4_0", "tiny-llama-k-Q4_K_M",
                              "tiny-llama-k-Q5_K_M", "tiny-llama-k-Q6_K"};

std::string gguf_path(const QString& name) { return shared_path("fixtures/gguf/" + name.toStdString() + ".gguf"); }
nlohmann::json reference_of(const QString& name) {
  return load_json(shared_path("fixtures/gguf/" + name.toStdString() + ".json"));
}

// One model per file for the whole run.
std::shared_ptr<const LlamaModel> model_of(const QString& name) {
  static std::map<QString, std::shared_ptr<const LlamaModel>> models;
  auto& model = models[name];
  if (!model) model = load_model(gguf_path(name)).model;
  return model;
}

std::vector<TokenId> ids_of(const nlohmann::json& array) { return array.get<std::vector<TokenId>>(); }

// Whether the file holds a type whose products round their input (with the kernels on): a block type (one byte
// per value), or BF16 where the processor multiplies bf16 pairs (bf16 values, as llama.cpp).
bool has_rounded_inputs(const nlohmann::json& reference) {
  for (const auto& [type, count] : reference["type_counts"].items()) {
    if (type == "BF16" && kernels::bf16_packed_available()) return true;
    if (type != "F32" && type != "F16" && type != "BF16") return true;
  }
  return false;
}

// What this run's rounding of the activations may move a logit by: the fast kernels round a block
// type's input to one byte per value, as llama.cpp does (which moves its logits by up to dq over the
// fixture's positions; ours by a like amount, twice that allowed).
double rounding_allowance(const nlohmann::json& reference, double dq) {
  return fast_kernels_enabled() && has_rounded_inputs(reference) ? 2 * dq : 0.0;
}

// Logits of every position of `ids`: one batched forward without a cache, and token by token through
// the cache.
std::pair<at::Tensor, at::Tensor> logits_both_ways(const LlamaModel& model, const std::vector<TokenId>& ids) {
  c10::InferenceMode guard;
  at::Tensor batched = model.forward(ids, 0, nullptr, /*all_positions=*/true);
  auto cache = make_kv_cache(KvCacheMode::Contiguous, model.cache_shape());
  DecodeContext context;
  at::Tensor stepped = at::empty_like(batched);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    model.decode(ids[i], static_cast<std::int64_t>(i), *cache, context);
    stepped[static_cast<std::int64_t>(i)].copy_(at::from_blob(context.logits.data(), {batched.size(1)}, at::kFloat));
  }
  return {batched, stepped};
}

double max_difference(const at::Tensor& ours, const nlohmann::json& row) {
  return (ours - at::tensor(row.get<std::vector<float>>())).abs().max().item<double>();
}

// Whether our argmax along `path` equals the reference's id at every step whose reference margin is
// at least `threshold`. Returns a description of the first disagreement, or "" .
std::string greedy_disagreement(const LlamaModel& model, const nlohmann::json& greedy, double threshold) {
  const std::vector<TokenId> prompt = ids_of(greedy["prompt_ids"]), generated = ids_of(greedy["generated_ids"]);
  std::vector<TokenId> path = prompt;
  path.insert(path.end(), generated.begin(), generated.end());
  path.pop_back();  // the last generated id is never fed
  c10::InferenceMode guard;
  const at::Tensor logits = model.forward(path, 0, nullptr, /*all_positions=*/true);
  const auto margins = greedy["top2_margins"].get<std::vector<double>>();
  for (std::size_t step = 0; step < generated.size(); ++step) {
    if (margins[step] < threshold) continue;
    const auto ours =
        static_cast<TokenId>(logits[static_cast<std::int64_t>(prompt.size() - 1 + step)].argmax().item<std::int64_t>());
    if (ours != generated[step])
      return "step " + std::to_string(step) + ": ours " + std::to_string(ours) + ", reference " +
             std::to_string(generated[step]) + " (margin " + std::to_string(margins[step]) + ")";
  }
  return "";
}

}  // namespace

class GgufReferencesTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void stories_f32_matches_run_c_data();
  void stories_f32_matches_run_c();
  void logits_match_data();
  void logits_match();
  void greedy_ids_match_data();
  void greedy_ids_match();
  void long_prompt_agrees_with_its_steps_data();
  void long_prompt_agrees_with_its_steps();
};

void GgufReferencesTest::stories_f32_matches_run_c_data() { kvchat::test::add_run_c_rows(); }

// Acceptance: the F32 file reproduces llama2.c's greedy stories exactly (which proves the Q/K
// un-permutation: a wrong RoPE layout drifts within a few tokens).
void GgufReferencesTest::stories_f32_matches_run_c() {
  QFETCH(int, case_index);
  QFETCH(QString, mode);
  // The file's end-of-sequence id is 2; llama2.c's stories end with BOS (1) as well.
  kvchat::test::check_greedy_matches_run_c(model_of("stories260K-F32"), case_index, mode, {1, 2});
}

void GgufReferencesTest::logits_match_data() {
  QTest::addColumn<QString>("file");
  for (const char* file : kFiles) QTest::newRow(file) << QString(file);
}

void GgufReferencesTest::logits_match() {
  QFETCH(QString, file);
  const auto model = model_of(file);
  const nlohmann::json reference = reference_of(file);
  // The file's RMSNorm epsilon is the one llama.cpp ran with (read from the file, not a default).
  QCOMPARE(static_cast<float>(model->config().rms_norm_eps), reference["hparams"]["eps"].get<float>());
  const bool is_f32 = !reference.contains("dequantized_f32");
  // The exact engine's tolerance against f32 logits, and llama.cpp's quantization step dq.
  const double max_logit = reference.value("max_abs_logit_all_positions", reference["max_abs_logit"].get<double>());
  const double dq =
      is_f32 ? 0.0 : reference["dequantized_f32"]["max_abs_diff_vs_quantized_all_positions"].get<double>();
  const double exact = 1e-4 + 2e-5 * max_logit + rounding_allowance(reference, dq);
  const nlohmann::json& exact_rows =
      is_f32 ? reference["teacher_forced"] : reference["dequantized_f32"]["teacher_forced"];

  double worst_exact = 0, worst_llama_cpp = 0;
  for (std::size_t k = 0; k < reference["teacher_forced"].size(); ++k) {
    const nlohmann::json& llama_cpp = reference["teacher_forced"][k];
    const nlohmann::json& twin = exact_rows[k];
    QCOMPARE(ids_of(twin["ids"]), ids_of(llama_cpp["ids"]));
    const auto [batched, stepped] = logits_both_ways(*model, ids_of(llama_cpp["ids"]));
    const auto positions = llama_cpp["positions"].get<std::vector<std::int64_t>>();
    for (std::size_t j = 0; j < positions.size(); ++j) {
      for (const at::Tensor& ours : {batched[positions[j]], stepped[positions[j]]}) {
        const double vs_exact = max_difference(ours, twin["logits"][j]);
        QVERIFY2(vs_exact <= exact, qPrintable(QString("sequence %1 position %2: %3 from the f32 logits (tolerance %4)")
                                                   .arg(k)
                                                   .arg(positions[j])
                                                   .arg(vs_exact)
                                                   .arg(exact)));
        const double vs_llama_cpp = max_difference(ours, llama_cpp["logits"][j]);
        worst_exact = std::max(worst_exact, vs_exact);
        worst_llama_cpp = std::max(worst_llama_cpp, vs_llama_cpp);
        QVERIFY2(vs_llama_cpp <= 2 * dq + exact,
                 qPrintable(QString("sequence %1 position %2: %3 from llama.cpp's logits (tolerance %4)")
                                .arg(k)
                                .arg(positions[j])
                                .arg(vs_llama_cpp)
                                .arg(2 * dq + exact)));
      }
    }
  }
  qInfo("%s: largest difference %.3g from the f32 logits (tolerance %.3g), %.3g from llama.cpp's (tolerance %.3g)",
        qPrintable(file), worst_exact, exact, worst_llama_cpp, 2 * dq + exact);
}

void GgufReferencesTest::greedy_ids_match_data() { logits_match_data(); }

void GgufReferencesTest::greedy_ids_match() {
  QFETCH(QString, file);
  const auto model = model_of(file);
  const nlohmann::json reference = reference_of(file);
  const bool is_f32 = !reference.contains("dequantized_f32");
  const double dq =
      is_f32 ? 0.0 : reference["dequantized_f32"]["max_abs_diff_vs_quantized_all_positions"].get<double>();
  // llama.cpp's own greedy path: its ids wherever its margin is at least 2*dq (every step for F32).
  for (const nlohmann::json& greedy : reference["greedy"]) {
    const std::string problem = greedy_disagreement(*model, greedy, 2 * dq);
    QVERIFY2(problem.empty(), qPrintable(QString::fromStdString("llama.cpp's path, " + problem)));
  }
  if (is_f32) return;
  // The f32 twin's greedy path: its ids wherever its margin is at least 1e-3 (plus twice the rounding
  // allowance); and a real greedy generation through the cache follows it up to its first closer call.
  const double twin_threshold = 1e-3 + 2 * rounding_allowance(reference, dq);
  for (const nlohmann::json& greedy : reference["dequantized_f32"]["greedy"]) {
    const std::string problem = greedy_disagreement(*model, greedy, twin_threshold);
    QVERIFY2(problem.empty(), qPrintable(QString::fromStdString("the f32 twin's path, " + problem)));
    const std::vector<TokenId> prompt = ids_of(greedy["prompt_ids"]), expected = ids_of(greedy["generated_ids"]);
    const auto margins = greedy["top2_margins"].get<std::vector<double>>();
    std::size_t sure = 0;
    while (sure < expected.size() && margins[sure] >= twin_threshold) ++sure;
    GenerationConfig config;
    config.max_new_tokens = static_cast<int>(expected.size());
    config.stop_token_ids = greedy["stop_ids"].empty() ? std::vector<TokenId>{-1} : ids_of(greedy["stop_ids"]);
    Session session(model, KvCacheMode::Contiguous);
    const std::vector<TokenId> generated = session.generate(prompt, config).generated;
    QVERIFY(generated.size() >= sure);
    QVERIFY2(std::equal(expected.begin(), expected.begin() + static_cast<std::ptrdiff_t>(sure), generated.begin()),
             qPrintable(QString::fromStdString("expected " + token_list_text(expected) + "\n got " +
                                               token_list_text(generated))));
  }
}

void GgufReferencesTest::long_prompt_agrees_with_its_steps_data() { logits_match_data(); }

// A prompt longer than the streaming kernels take (kWidenedStreamingRows) goes through the GEMM, whose
// weights are decoded to f32: its logits agree with the same tokens decoded one by one up to f32 noise
// (within 1e-3 of the largest logit), and so do the greedy choices. A file with block types (with the
// kernels on) computes the prompt row-exact instead: no difference at all.
void GgufReferencesTest::long_prompt_agrees_with_its_steps() {
  QFETCH(QString, file);
  const std::shared_ptr<const LlamaModel> model = model_of(file);
  const std::int64_t length = kWidenedStreamingRows + 16, vocab = model->config().vocab_size;
  std::vector<TokenId> ids;
  for (std::int64_t i = 0; i < length; ++i) ids.push_back(static_cast<TokenId>((7 + 31 * i) % vocab));
  const auto [batched, stepped] = logits_both_ways(*model, ids);
  const double scale = stepped.abs().max().item<double>();
  const double difference = (batched - stepped).abs().max().item<double>();
  if (fast_kernels_enabled() && has_rounded_inputs(reference_of(file)))
    QVERIFY2(at::equal(batched, stepped), qPrintable(QString("largest difference %1, expected none").arg(difference)));
  QVERIFY2(difference <= 1e-3 * scale,
           qPrintable(QString("largest difference %1 of logits up to %2").arg(difference).arg(scale)));
  qInfo("%s: largest difference %g of logits up to %g", qPrintable(file), difference, scale);
  const at::Tensor top2 = std::get<0>(stepped.topk(2, 1));
  for (std::int64_t position = 0; position < length; ++position) {
    if ((top2[position][0] - top2[position][1]).item<double>() <= 2 * difference) continue;  // a tie within the noise
    QCOMPARE(batched[position].argmax().item<std::int64_t>(), stepped[position].argmax().item<std::int64_t>());
  }
}

KVCHAT_TEST_GUILESS_MAIN(GgufReferencesTest)

}  // namespace engine_test_gguf_references

#include "test_gguf_references.moc"
