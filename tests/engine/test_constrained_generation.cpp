// Constrained decoding through the engine: replies generated under 50 random JSON schemas by three models
// (stories260K's folder, a llama.cpp Q4_K_M GGUF file, and a Llama-3-layout model with Llama 3's 128k-token
// vocabulary) end by themselves and are valid for an independent validator; a schema that leaves one text
// gets exactly it; and the constraint changes nothing the cache may change (cache on, naive and off, and
// prompt-lookup speculative decoding, give the same ids).
#include <random>
#include <string>
#include <vector>

#include <QtTest/QtTest>
#include "common/json_schema_testing.h"
#include "common/test_paths.h"
#include "common/test_suite.h"

#include "engine/generation/session.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_config.h"
#include "engine/model/model_loader.h"
#include "engine/text/constraint/json_grammar.h"
#include "engine/text/constraint/token_constraint.h"
#include "engine/text/tokenizer.h"

namespace engine_test_constrained_generation {

using kvchat::ConstraintVocabulary;
using kvchat::GenerationConfig;
using kvchat::JsonGrammar;
using kvchat::KvCacheMode;
using kvchat::Session;
using kvchat::TokenId;
using kvchat::test::ordered_json;

// A model of the suite (outside the anonymous namespace: the test class holds them).
struct TestModel {
  std::string name;
  // How deep the random schemas nest and how many items their arrays hold: a small context (stories260K's 512
  // positions) takes smaller replies.
  int schema_depth = 3;
  int max_items = 3;
  std::shared_ptr<const kvchat::LlamaModel> model;
  std::shared_ptr<const kvchat::Tokenizer> tokenizer;
  std::shared_ptr<const ConstraintVocabulary> vocabulary;
  std::vector<TokenId> stop_ids;
};

namespace {

// The schema's one value, written as the grammar writes it: compact, keys in the schema's order.
const char* const kOneValueSchema = R"({"const": {"answer": 42, "unit": "m\u00e8tres", "list": [true, null]}})";
const char* const kOneValueText = "{\"answer\":42,\"unit\":\"m\xC3\xA8tres\",\"list\":[true,null]}";
const char* const kYesNoSchema = R"({"enum": ["yes", "no"]})";

TestModel loaded(const std::string& name, const std::string& path) {
  kvchat::LoadedModel loaded = kvchat::load_model(kvchat::test::shared_path(path));
  TestModel model{name, 3, 3, loaded.model, loaded.tokenizer, nullptr, {}};
  if (model.model->config().max_position_embeddings <= 512) {
    model.schema_depth = 2;
    model.max_items = 2;
  }
  model.vocabulary = ConstraintVocabulary::from_tokenizer(*model.tokenizer);
  model.stop_ids = {*model.tokenizer->eos_id()};
  return model;
}

// Random weights in the Llama 3 layout (GQA, tied embeddings) over Llama 3's whole vocabulary.
TestModel llama3_vocabulary_model() {
  const kvchat::ModelConfig config = kvchat::ModelConfig::from_json_text(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "vocab_size": 128256, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "tie_word_embeddings": true, "bos_token_id": 128000, "eos_token_id": 128001})",
                                                                         "llama3-vocabulary test config");
  TestModel model;
  model.name = "llama3-vocabulary-random";
  model.model = kvchat::LlamaModel::random(config, 5);
  model.tokenizer = std::make_shared<const kvchat::Tokenizer>(
      kvchat::Tokenizer::from_directory(kvchat::test::shared_path("fixtures/tokenizers/llama3")));
  model.vocabulary = ConstraintVocabulary::from_tokenizer(*model.tokenizer);
  model.stop_ids = {128001, 128009};
  return model;
}

// Every string and array gets a bound (a random model may otherwise write one until max_new_tokens), so that
// every reply can end by itself; arrays hold at most `max_items`.
ordered_json bounded(ordered_json schema, int max_items) {
  if (schema.is_object()) {
    if (schema.value("type", "") == "string" && !schema.contains("enum") && !schema.contains("maxLength"))
      schema["maxLength"] = 12;
    if (schema.value("type", "") == "array")
      schema["maxItems"] = std::min(schema.value("maxItems", max_items), max_items);
    for (auto& [key, value] : schema.items())
      if (key != "enum" && key != "const") value = bounded(value, max_items);
  } else if (schema.is_array()) {
    for (auto& value : schema) value = bounded(value, max_items);
  }
  return schema;
}

struct Reply {
  std::vector<TokenId> ids;
  std::string text;  // the reply's bytes, the end-of-sequence id left out
  kvchat::StopReason stop_reason = kvchat::StopReason::MaxTokens;
};

Reply generate(const TestModel& model, const std::shared_ptr<const JsonGrammar>& grammar, KvCacheMode mode,
               int max_new_tokens, kvchat::SpeculativeMode speculative = kvchat::SpeculativeMode::None) {
  GenerationConfig config;
  config.max_new_tokens = max_new_tokens;
  config.cache_mode = mode;
  config.stop_token_ids = model.stop_ids;
  config.sampled_vocabulary = model.tokenizer->vocab_size();
  config.grammar = grammar;
  config.grammar_vocabulary = model.vocabulary;
  config.speculative.mode = speculative;
  Session session(model.model, mode);
  const std::vector<TokenId> prompt = model.tokenizer->encode("Once upon a time, the answer was", true);
  const kvchat::GenerationResult result = session.generate(prompt, config);
  Reply reply{result.generated, {}, result.stats.stop_reason};
  for (TokenId id : result.generated)
    if (std::find(model.stop_ids.begin(), model.stop_ids.end(), id) == model.stop_ids.end())
      reply.text += model.vocabulary->bytes(id);
  return reply;
}

}  // namespace

class ConstrainedGenerationTest : public QObject {
  Q_OBJECT

  std::vector<TestModel> models_;

 private Q_SLOTS:
  void initTestCase() {
    models_.push_back(loaded("stories260K", "models/stories260K"));
    models_.push_back(loaded("tiny-llama-k-Q4_K_M", "fixtures/gguf/tiny-llama-k-Q4_K_M.gguf"));
    models_.push_back(llama3_vocabulary_model());
  }

  void replies_are_valid_for_50_random_schemas_on_3_models() {
    for (const TestModel& model : models_) {
      std::mt19937 random(4242);
      int valid = 0;
      for (int i = 0; i < 50; ++i) {
        const ordered_json schema = bounded(kvchat::test::random_schema(random, model.schema_depth), model.max_items);
        const auto grammar = std::make_shared<const JsonGrammar>(kvchat::compile_json_schema(schema));
        const std::string where = model.name + ", schema " + std::to_string(i) + " " + schema.dump() + ": ";
        Reply reply;
        try {
          reply = generate(model, grammar, KvCacheMode::Contiguous, 3000);
        } catch (const std::exception& error) {
          QFAIL(qPrintable(QString::fromStdString(where + error.what())));
        }
        if (reply.stop_reason != kvchat::StopReason::Eos)
          QFAIL(qPrintable(QString::fromStdString(where + "did not end (" + to_string(reply.stop_reason) + ") after " +
                                                  reply.text)));
        // The text the ids decode to is the text the constraint followed.
        std::vector<TokenId> text_ids(reply.ids.begin(), reply.ids.end() - 1);
        const std::string decoded = model.tokenizer->decode(text_ids, true, /*clean_up_tokenization_spaces=*/false);
        QVERIFY2(decoded == reply.text, (where + "decodes to " + decoded + " | bytes " + reply.text).c_str());
        const ordered_json value = ordered_json::parse(reply.text, nullptr, false);
        if (value.is_discarded()) QFAIL(qPrintable(QString::fromStdString(where + "not JSON: " + reply.text)));
        const std::string violation = kvchat::test::schema_violation(schema, value);
        if (!violation.empty()) QFAIL(qPrintable(QString::fromStdString(where + violation + " in " + reply.text)));
        ++valid;
      }
      QCOMPARE(valid, 50);
    }
  }

  void a_schema_of_one_value_gives_exactly_it() {
    const auto grammar =
        std::make_shared<const JsonGrammar>(kvchat::compile_json_schema(std::string_view(kOneValueSchema)));
    for (const TestModel& model : models_) {
      const Reply reply = generate(model, grammar, KvCacheMode::Contiguous, 200);
      QCOMPARE(reply.text, std::string(kOneValueText));
      QCOMPARE(reply.stop_reason, kvchat::StopReason::Eos);
    }
    const auto choice =
        std::make_shared<const JsonGrammar>(kvchat::compile_json_schema(std::string_view(kYesNoSchema)));
    for (const TestModel& model : models_) {
      const std::string text = generate(model, choice, KvCacheMode::Contiguous, 50).text;
      QVERIFY2(text == "\"yes\"" || text == "\"no\"", text.c_str());
    }
  }

  void the_cache_and_speculation_change_no_constrained_token() {
    const auto grammar = std::make_shared<const JsonGrammar>(kvchat::any_json_object_grammar());
    for (const TestModel& model : models_) {
      const Reply on = generate(model, grammar, KvCacheMode::Contiguous, 120);
      QVERIFY(on.ids.size() > 10);
      QCOMPARE(generate(model, grammar, KvCacheMode::Naive, 120).ids, on.ids);
      QCOMPARE(generate(model, grammar, KvCacheMode::Off, 120).ids, on.ids);
      QCOMPARE(generate(model, grammar, KvCacheMode::Contiguous, 120, kvchat::SpeculativeMode::Lookup).ids, on.ids);
    }
  }
};

KVCHAT_TEST_APPLESS_MAIN(ConstrainedGenerationTest)

}  // namespace engine_test_constrained_generation

#include "test_constrained_generation.moc"
