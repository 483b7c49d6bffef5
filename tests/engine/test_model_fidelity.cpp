// The engine against independent references: llama2.c's run.c greedy outputs for stories260K,
// transformers' logits for a random bf16 sharded Llama-3-layout model, transformers' RoPE tables, and
// the plain-LibTorch oracle of tests/common/reference_forward.h.
#include <c10/core/InferenceMode.h>

#include <QtTest>
#include "common/test_suite.h"

#include "common/json_fixture.h"
#include "common/reference_forward.h"
#include "common/run_c_reference.h"
#include "common/test_paths.h"
#include "engine/cache/kv_cache.h"
#include "engine/compute/compute_options.h"
#include "engine/generation/session.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_weights.h"
#include "engine/model/rope.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace engine_test_model_fidelity {

using namespace kvchat;
using kvchat::test::load_json;
using kvchat::test::shared_path;
using kvchat::test::token_list_text;

namespace {

std::shared_ptr<LlamaModel> load(const std::string& relative, WeightDtype dtype = WeightDtype::Float32) {
  std::string directory = shared_path(relative);
  return LlamaModel::from_checkpoint(directory, ModelConfig::from_directory(directory), dtype);
}

std::vector<TokenId> ids_of(const nlohmann::json& array) { return array.get<std::vector<TokenId>>(); }

}  // namespace

class ModelFidelityTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void stories260k_matches_run_c_data();
  void stories260k_matches_run_c();
  void tiny_llama3_logits_match_transformers_data();
  void tiny_llama3_logits_match_transformers();
  void tiny_llama3_greedy_continuation_data();
  void tiny_llama3_greedy_continuation();
  void rope_tables_match_transformers_data();
  void rope_tables_match_transformers();
  void prefill_then_decode_equals_one_forward();
  void row_exact_forward_equals_decode_steps_data();
  void row_exact_forward_equals_decode_steps();
  void forward_agrees_with_the_oracle_data();
  void forward_agrees_with_the_oracle();
};

void ModelFidelityTest::stories260k_matches_run_c_data() { kvchat::test::add_run_c_rows(); }

// Greedy generation from prompt_ids reproduces run.c's generated_ids exactly, with every cache mode.
void ModelFidelityTest::stories260k_matches_run_c() {
  QFETCH(int, case_index);
  QFETCH(QString, mode);
  static auto model = load("models/stories260K");
  auto reference = kvchat::test::run_c_cases()[case_index];
  std::vector<TokenId> prompt = ids_of(reference["prompt_ids"]);

  c10::InferenceMode guard;
  // First-step logits agree with run.c's to 1e-4.
  at::Tensor logits = model->forward(prompt, 0, nullptr);
  auto first_step = reference["first_step_logits"].get<std::vector<float>>();
  QCOMPARE(logits.numel(), static_cast<int64_t>(first_step.size()));
  double worst = (logits - at::tensor(first_step)).abs().max().item<double>();
  QVERIFY2(worst < 1e-4, qPrintable(QString("first-step logits differ by %1").arg(worst)));

  kvchat::test::check_greedy_matches_run_c(model, case_index, mode);
}

void ModelFidelityTest::tiny_llama3_logits_match_transformers_data() {
  QTest::addColumn<int>("dtype");
  QTest::newRow("f32 weights") << int(WeightDtype::Float32);
  QTest::newRow("bf16 weights") << int(WeightDtype::BFloat16);  // as stored: f32 accumulation
}

void ModelFidelityTest::tiny_llama3_logits_match_transformers() {
  QFETCH(int, dtype);
  auto model = load("models/tiny-llama3-random", WeightDtype(dtype));
  auto reference = load_json(shared_path("models/tiny-llama3-random/reference_logits.json"));
  std::vector<TokenId> input = ids_of(reference["input_ids"]);
  c10::InferenceMode guard;
  for (const char* mode : {"off", "on", "naive"}) {
    at::Tensor all;
    if (std::string(mode) == "off") {
      all = model->forward(input, 0, nullptr, /*all_positions=*/true);
    } else {
      // Prefill in two uneven chunks through the cache: the rectangular mask must still be right.
      auto cache = make_kv_cache(kv_cache_mode_from_string(mode), model->cache_shape());
      std::vector<TokenId> first(input.begin(), input.begin() + 5), rest(input.begin() + 5, input.end());
      at::Tensor a = model->forward(first, 0, cache.get(), true);
      at::Tensor b = model->forward(rest, 5, cache.get(), true);
      all = at::cat({a, b}, 0);
      QCOMPARE(cache->size(), static_cast<int64_t>(input.size()));
    }
    at::Tensor last = all[-1], row0 = all[0];
    double last_error =
        (last - at::tensor(reference["logits_last"].get<std::vector<float>>())).abs().max().item<double>();
    double row0_error =
        (row0 - at::tensor(reference["logits_row_0"].get<std::vector<float>>())).abs().max().item<double>();
    QVERIFY2(last_error < 1e-3, qPrintable(QString("%1: logits_last differ by %2").arg(mode).arg(last_error)));
    QVERIFY2(row0_error < 1e-3, qPrintable(QString("%1: logits_row_0 differ by %2").arg(mode).arg(row0_error)));
    std::vector<TokenId> argmax(all.size(0));
    at::Tensor arg = all.argmax(-1);
    for (int64_t i = 0; i < all.size(0); ++i) argmax[i] = static_cast<TokenId>(arg[i].item<int64_t>());
    QVERIFY(argmax == ids_of(reference["argmax_per_position"]));
  }
}

void ModelFidelityTest::tiny_llama3_greedy_continuation_data() { tiny_llama3_logits_match_transformers_data(); }

void ModelFidelityTest::tiny_llama3_greedy_continuation() {
  QFETCH(int, dtype);
  auto model = load("models/tiny-llama3-random", WeightDtype(dtype));
  auto reference = load_json(shared_path("models/tiny-llama3-random/reference_logits.json"));
  std::vector<TokenId> expected = ids_of(reference["greedy_continuation_24"]);
  for (KvCacheMode mode : {KvCacheMode::Contiguous, KvCacheMode::Naive, KvCacheMode::Off}) {
    GenerationConfig config;
    config.cache_mode = mode;
    config.max_new_tokens = static_cast<int>(expected.size());
    config.stop_token_ids = {-1};  // the reference runs all 24 steps, through any end-of-sequence id
    Session session(model, mode);
    auto result = session.generate(ids_of(reference["greedy_prompt"]), config);
    QVERIFY2(
        result.generated == expected,
        qPrintable(QString::fromStdString(std::string(to_string(mode)) + ": expected " + token_list_text(expected) +
                                          "\n got " + token_list_text(result.generated))));
  }
}

void ModelFidelityTest::rope_tables_match_transformers_data() {
  QTest::addColumn<QString>("name");
  auto tables = load_json(shared_path("fixtures/reference/rope.json"));
  for (auto& [name, table] : tables.items()) QTest::newRow(name.c_str()) << QString::fromStdString(name);
}

void ModelFidelityTest::rope_tables_match_transformers() {
  QFETCH(QString, name);
  auto table = load_json(shared_path("fixtures/reference/rope.json"))[name.toStdString()];
  std::string config_file = table["config"].get<std::string>();
  std::string config_path = config_file.find('/') == std::string::npos ? shared_path("fixtures/configs/" + config_file)
                                                                       : shared_path(config_file);
  ModelConfig config = ModelConfig::from_file(config_path);
  QCOMPARE(config.head_dim, table["head_dim"].get<int64_t>());
  at::Tensor inv_freq = rope_inverse_frequencies(config);
  double inv_error = (inv_freq - at::tensor(table["inv_freq"].get<std::vector<float>>())).abs().max().item<double>();
  QVERIFY2(inv_error < 1e-5, qPrintable(QString("inv_freq differs by %1").arg(inv_error)));
  auto positions = table["positions"].get<std::vector<int64_t>>();
  auto [cos, sin] = rope_cos_sin(config, at::tensor(positions));
  for (size_t i = 0; i < positions.size(); ++i) {
    double cos_error = (cos[i] - at::tensor(table["cos"][i].get<std::vector<float>>())).abs().max().item<double>();
    double sin_error = (sin[i] - at::tensor(table["sin"][i].get<std::vector<float>>())).abs().max().item<double>();
    QVERIFY2(
        cos_error < 1e-5 && sin_error < 1e-5,
        qPrintable(QString("position %1: cos error %2, sin error %3").arg(positions[i]).arg(cos_error).arg(sin_error)));
  }
}

// The cache's core promise, on the logits themselves: prefill(n) then decode(1) == forward(n + 1).
void ModelFidelityTest::prefill_then_decode_equals_one_forward() {
  auto model = load("models/tiny-llama3-random");
  c10::InferenceMode guard;
  std::vector<TokenId> ids = {1, 17, 230, 5, 999, 42, 7, 300, 8};
  at::Tensor whole = model->forward(ids, 0, nullptr);
  for (KvCacheMode mode : {KvCacheMode::Contiguous, KvCacheMode::Naive}) {
    auto cache = make_kv_cache(mode, model->cache_shape());
    model->forward(std::vector<TokenId>(ids.begin(), ids.end() - 1), 0, cache.get());
    at::Tensor step = model->forward({ids.back()}, static_cast<int64_t>(ids.size()) - 1, cache.get());
    double error = (step - whole).abs().max().item<double>();
    QVERIFY2(error < 1e-4, qPrintable(QString("%1: decode step differs by %2").arg(to_string(mode)).arg(error)));
  }
}

void ModelFidelityTest::row_exact_forward_equals_decode_steps_data() {
  QTest::addColumn<QString>("layers");
  QTest::newRow("f32 layers") << "f32";
  QTest::newRow("bf16 layers") << "bf16";
}

// A K-quant matrix (here a Q6_K lm_head) makes every forward row-exact: the logits of a prompt in one
// forward, of its tokens decoded one by one through each kind of cache, and of a prompt's tail after its
// head was cached, are the same to the bit, also where the other matrices are f32 or bf16 (their rows go
// through the matrix-vector kernels one token at a time; the GGUF fixtures cover block-type layers).
// With the kernels off (exact products through LibTorch) the paths agree within f32 noise instead.
void ModelFidelityTest::row_exact_forward_equals_decode_steps() {
  QFETCH(QString, layers);
  const std::string directory = shared_path("models/tiny-llama3-random");
  ModelConfig config = ModelConfig::from_directory(directory);
  ModelWeights weights = layers == "bf16" ? load_model_weights(directory, config, WeightDtype::BFloat16)
                                          : load_model_weights(directory, config, WeightDtype::Float32);
  config.tie_word_embeddings = false;  // the lm_head below replaces the tied one
  ModelConfig head_only = config;      // one small layer: the lm_head [vocab, hidden] is what is taken
  head_only.num_hidden_layers = 1;
  head_only.intermediate_size = 256;
  weights.lm_head = random_quantized_model_weights(head_only, 5, GgufType::Q6_K).lm_head;
  const auto model = std::make_shared<LlamaModel>(config, std::move(weights));
  c10::InferenceMode guard;
  const std::vector<TokenId> ids = {1, 17, 230, 5, 999, 42, 7, 300, 8, 64, 3, 511};
  const auto positions = static_cast<std::int64_t>(ids.size());
  const at::Tensor whole = model->forward(ids, 0, nullptr, /*all_positions=*/true);
  QVERIFY(whole.isfinite().all().item<bool>());
  const auto same = [](const at::Tensor& a, const at::Tensor& b) {
    return fast_kernels_enabled() ? at::equal(a, b) : (a - b).abs().max().item<double>() < 1e-4;
  };
  for (KvCacheMode mode : {KvCacheMode::Contiguous, KvCacheMode::Naive}) {
    auto cache = make_kv_cache(mode, model->cache_shape());
    DecodeContext context;
    for (std::int64_t i = 0; i < positions; ++i) {
      model->decode(ids[static_cast<std::size_t>(i)], i, *cache, context);
      const at::Tensor step = at::from_blob(context.logits.data(), {config.vocab_size}, at::kFloat);
      QVERIFY2(same(step, whole[i]), qPrintable(QString("%1 cache, position %2: differs by %3")
                                                    .arg(to_string(mode))
                                                    .arg(i)
                                                    .arg((step - whole[i]).abs().max().item<double>())));
    }
    auto split = make_kv_cache(mode, model->cache_shape());
    model->forward(std::vector<TokenId>(ids.begin(), ids.begin() + 5), 0, split.get());
    const at::Tensor tail = model->forward(std::vector<TokenId>(ids.begin() + 5, ids.end()), 5, split.get(), true);
    QVERIFY2(same(tail, whole.narrow(0, 5, positions - 5)),
             qPrintable(QString("%1 cache: the tail differs").arg(to_string(mode))));
  }
}

void ModelFidelityTest::forward_agrees_with_the_oracle_data() {
  QTest::addColumn<QString>("model");
  QTest::addColumn<int>("dtype");
  QTest::newRow("stories260K f32") << "models/stories260K" << int(WeightDtype::Float32);
  QTest::newRow("tiny-llama3 f32") << "models/tiny-llama3-random" << int(WeightDtype::Float32);
  QTest::newRow("tiny-llama3 bf16") << "models/tiny-llama3-random" << int(WeightDtype::BFloat16);
}

// The model's one forward (row buffers, the engine's products and attention) against the independent
// oracle (whole tensors, a mask, exact products): every position's logits of a prompt, uncached and in
// two uneven chunks through each kind of cache, agree within f32 noise and pick the same token; and
// greedy decoding through a session's cache gives the same ids as the oracle recomputing the whole
// sequence every step.
void ModelFidelityTest::forward_agrees_with_the_oracle() {
  QFETCH(QString, model);
  QFETCH(int, dtype);
  const auto llama = load(model.toStdString(), WeightDtype(dtype));
  c10::InferenceMode guard;
  const std::vector<TokenId> ids = {1, 17, 230, 5, 199, 42, 7, 100, 8, 64, 3, 211, 90};
  const auto positions = static_cast<std::int64_t>(ids.size());
  const at::Tensor expected = kvchat::test::reference_forward(*llama, ids, 0, nullptr, /*all_positions=*/true);
  const auto check = [&](const at::Tensor& got, const QString& what) {
    const double error = (got - expected).abs().max().item<double>();
    QVERIFY2(error < 1e-4, qPrintable(QString("%1: logits differ from the oracle's by %2").arg(what).arg(error)));
    QVERIFY2(at::equal(got.argmax(-1), expected.argmax(-1)), qPrintable(what + ": another token is the most likely"));
  };
  check(llama->forward(ids, 0, nullptr, true), "uncached");
  for (KvCacheMode mode : {KvCacheMode::Contiguous, KvCacheMode::Naive}) {
    auto cache = make_kv_cache(mode, llama->cache_shape());
    const at::Tensor head = llama->forward(std::vector<TokenId>(ids.begin(), ids.begin() + 5), 0, cache.get(), true);
    const at::Tensor tail = llama->forward(std::vector<TokenId>(ids.begin() + 5, ids.end()), 5, cache.get(), true);
    QCOMPARE(cache->size(), positions);
    check(at::cat({head, tail}, 0), QString("%1 cache").arg(to_string(mode)));
  }

  GenerationConfig config;
  config.max_new_tokens = 24;
  config.stop_token_ids = {-1};  // all 24 steps, through any end-of-sequence id
  Session session(llama, KvCacheMode::Contiguous);
  const std::vector<TokenId> generated = session.generate(ids, config).generated;
  std::vector<TokenId> sequence = ids, oracle;
  for (int step = 0; step < config.max_new_tokens; ++step) {
    const auto next = static_cast<TokenId>(
        kvchat::test::reference_forward(*llama, sequence, 0, nullptr).argmax().item<std::int64_t>());
    oracle.push_back(next);
    sequence.push_back(next);
  }
  QVERIFY2(generated == oracle, qPrintable(QString::fromStdString("expected " + token_list_text(oracle) + "\n got " +
                                                                  token_list_text(generated))));
}

KVCHAT_TEST_APPLESS_MAIN(ModelFidelityTest)

}  // namespace engine_test_model_fidelity

#include "test_model_fidelity.moc"
