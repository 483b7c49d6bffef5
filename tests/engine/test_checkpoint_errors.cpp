// Bad model files each give their specific error, naming the file and the tensor or field. The tests
// build the bad files from the real stories260K checkpoint.
#include <sys/stat.h>
#include <QTemporaryDir>
#include <QtTest>
#include <filesystem>
#include <fstream>
#include "common/test_suite.h"

#include "common/json_fixture.h"
#include "common/test_paths.h"
#include "engine/generation/session.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_loader.h"
#include "engine/model/safetensors.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace engine_test_checkpoint_errors {

using namespace kvchat;
using kvchat::test::shared_path;
namespace fs = std::filesystem;

namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

struct Checkpoint {
  nlohmann::json header;
  std::string data;
};

Checkpoint read_checkpoint(const std::string& path) {
  std::string bytes = read_bytes(path);
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | static_cast<unsigned char>(bytes[i]);
  return {nlohmann::json::parse(bytes.substr(8, length)), bytes.substr(8 + length)};
}

std::string encode(const nlohmann::json& header, const std::string& data) {
  std::string text = header.dump();
  std::string out(8, '\0');
  uint64_t length = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((length >> (8 * i)) & 0xFF);
  return out + text + data;
}

// A copy of stories260K whose config and weights the test may break.
struct ModelCopy {
  QTemporaryDir temporary;
  std::string directory;
  ModelCopy() {
    directory = temporary.path().toStdString();
    for (const char* file : {"config.json", "generation_config.json", "model.safetensors"}) {
      fs::copy_file(shared_path(std::string("models/stories260K/") + file), directory + "/" + file);
      fs::permissions(directory + "/" + file, fs::perms::owner_write, fs::perm_options::add);
    }
  }
  std::string weights() const { return directory + "/model.safetensors"; }
  std::string config() const { return directory + "/config.json"; }
};

// Loading must throw ModelError whose message contains every fragment.
void expect_model_error(const std::string& directory, const std::vector<std::string>& fragments) {
  try {
    ModelConfig config = ModelConfig::from_directory(directory);
    LlamaModel::from_checkpoint(directory, config);
  } catch (const ModelError& error) {
    for (const std::string& fragment : fragments)
      QVERIFY2(std::string(error.what()).find(fragment) != std::string::npos,
               qPrintable(QString("'%1' does not mention '%2'").arg(error.what(), QString::fromStdString(fragment))));
    return;
  }
  QFAIL("expected a ModelError");
}

}  // namespace

class CheckpointErrorsTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void intact_copy_loads();
  void missing_weights_file();
  void missing_directory();
  void truncated_file();
  void tiny_file_without_header();
  void header_length_past_the_end();
  void header_not_json();
  void offsets_outside_the_data();
  void overlapping_tensors();
  void shape_and_dtype_size_disagree();
  void unknown_dtype();
  void unsupported_dtype();
  void missing_tensor();
  void tensor_shape_differs_from_config();
  void shard_missing_a_listed_tensor();
  void invalid_config_json();
  void incomplete_config();
  void unsupported_architecture_fields();
  void huge_context_costs_nothing_until_used();
  void tokenizer_larger_than_the_vocabulary();
  void fifos_and_directories_are_refused_without_blocking();
  void duplicate_names_and_absurd_shapes();
  void numbers_beyond_double_are_model_errors();
};

void CheckpointErrorsTest::intact_copy_loads() {
  ModelCopy copy;
  auto model = LlamaModel::from_checkpoint(copy.directory, ModelConfig::from_directory(copy.directory));
  QCOMPARE(model->config().vocab_size, int64_t(512));
}

void CheckpointErrorsTest::missing_weights_file() {
  ModelCopy copy;
  fs::remove(copy.weights());
  expect_model_error(copy.directory, {"neither model.safetensors nor model.safetensors.index.json", copy.directory});
}

void CheckpointErrorsTest::missing_directory() {
  expect_model_error("/nonexistent/kvchat-model", {"model directory not found", "/nonexistent/kvchat-model"});
}

void CheckpointErrorsTest::truncated_file() {
  ModelCopy copy;
  std::string bytes = read_bytes(copy.weights());
  write_bytes(copy.weights(), bytes.substr(0, bytes.size() / 2));
  expect_model_error(copy.directory, {copy.weights(), "outside the data section", "truncated"});
}

void CheckpointErrorsTest::tiny_file_without_header() {
  ModelCopy copy;
  write_bytes(copy.weights(), "abc");
  expect_model_error(copy.directory, {copy.weights(), "no header"});
}

void CheckpointErrorsTest::header_length_past_the_end() {
  ModelCopy copy;
  std::string bytes = read_bytes(copy.weights());
  bytes[5] = '\x7f';  // a length of terabytes
  write_bytes(copy.weights(), bytes);
  expect_model_error(copy.directory, {copy.weights(), "header length", "past the end"});
}

void CheckpointErrorsTest::header_not_json() {
  ModelCopy copy;
  Checkpoint checkpoint = read_checkpoint(copy.weights());
  std::string text = checkpoint.header.dump();
  text[text.size() / 2] = '\x01';
  uint64_t length = text.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((length >> (8 * i)) & 0xFF);
  write_bytes(copy.weights(), out + text + checkpoint.data);
  expect_model_error(copy.directory, {copy.weights(), "not valid JSON"});
}

void CheckpointErrorsTest::offsets_outside_the_data() {
  ModelCopy copy;
  Checkpoint checkpoint = read_checkpoint(copy.weights());
  auto& entry = checkpoint.header["model.norm.weight"];
  entry["data_offsets"] = {checkpoint.data.size() + 16, checkpoint.data.size() + 16 + 256};
  write_bytes(copy.weights(), encode(checkpoint.header, checkpoint.data));
  expect_model_error(copy.directory, {copy.weights(), "'model.norm.weight'", "outside the data section"});
}

void CheckpointErrorsTest::overlapping_tensors() {
  ModelCopy copy;
  Checkpoint checkpoint = read_checkpoint(copy.weights());
  auto layer0 = checkpoint.header["model.layers.0.input_layernorm.weight"]["data_offsets"];
  checkpoint.header["model.layers.1.input_layernorm.weight"]["data_offsets"] = layer0;
  write_bytes(copy.weights(), encode(checkpoint.header, checkpoint.data));
  expect_model_error(copy.directory, {copy.weights(), "overlap", "input_layernorm.weight"});
}

void CheckpointErrorsTest::shape_and_dtype_size_disagree() {
  ModelCopy copy;
  Checkpoint checkpoint = read_checkpoint(copy.weights());
  checkpoint.header["model.norm.weight"]["shape"] = {65};
  write_bytes(copy.weights(), encode(checkpoint.header, checkpoint.data));
  expect_model_error(copy.directory, {copy.weights(), "'model.norm.weight'", "shape x dtype size"});
}

void CheckpointErrorsTest::unknown_dtype() {
  ModelCopy copy;
  Checkpoint checkpoint = read_checkpoint(copy.weights());
  checkpoint.header["model.norm.weight"]["dtype"] = "Q4_K";
  write_bytes(copy.weights(), encode(checkpoint.header, checkpoint.data));
  expect_model_error(copy.directory, {copy.weights(), "'model.norm.weight'", "unknown dtype 'Q4_K'"});
}

void CheckpointErrorsTest::unsupported_dtype() {
  ModelCopy copy;
  Checkpoint checkpoint = read_checkpoint(copy.weights());
  checkpoint.header["model.norm.weight"]["dtype"] = "I32";  // same size as F32: the header stays valid
  write_bytes(copy.weights(), encode(checkpoint.header, checkpoint.data));
  expect_model_error(copy.directory, {copy.weights(), "'model.norm.weight'", "unsupported dtype 'I32'"});
}

void CheckpointErrorsTest::missing_tensor() {
  ModelCopy copy;
  Checkpoint checkpoint = read_checkpoint(copy.weights());
  checkpoint.header.erase("model.layers.3.mlp.up_proj.weight");
  write_bytes(copy.weights(), encode(checkpoint.header, checkpoint.data));
  expect_model_error(copy.directory, {"missing tensor 'model.layers.3.mlp.up_proj.weight'"});
}

void CheckpointErrorsTest::tensor_shape_differs_from_config() {
  ModelCopy copy;
  auto config = kvchat::test::load_json(copy.config());
  config["intermediate_size"] = 86;  // the checkpoint's MLP is 172 wide
  write_bytes(copy.config(), config.dump());
  expect_model_error(copy.directory,
                     {copy.weights(), "'model.layers.0.mlp.gate_proj.weight'", "[172, 64]", "[86, 64]"});
}

void CheckpointErrorsTest::shard_missing_a_listed_tensor() {
  ModelCopy copy;
  nlohmann::json index;
  index["weight_map"]["model.norm.weight"] = "model.safetensors";
  index["weight_map"]["model.extra.weight"] = "model.safetensors";
  write_bytes(copy.directory + "/model.safetensors.index.json", index.dump());
  expect_model_error(copy.directory, {"'model.extra.weight'", "missing from the file"});
}

void CheckpointErrorsTest::invalid_config_json() {
  ModelCopy copy;
  write_bytes(copy.config(), "{\"hidden_size\": 64,");
  expect_model_error(copy.directory, {copy.config(), "invalid JSON"});
}

void CheckpointErrorsTest::incomplete_config() {
  ModelCopy copy;
  auto config = kvchat::test::load_json(copy.config());
  config.erase("num_hidden_layers");
  write_bytes(copy.config(), config.dump());
  expect_model_error(copy.directory, {copy.config(), "'num_hidden_layers' is missing"});
  config = kvchat::test::load_json(shared_path("models/stories260K/config.json"));
  config["hidden_size"] = "64";
  write_bytes(copy.config(), config.dump());
  expect_model_error(copy.directory, {copy.config(), "'hidden_size' must be an integer"});
}

void CheckpointErrorsTest::unsupported_architecture_fields() {
  ModelCopy copy;
  auto original = kvchat::test::load_json(shared_path("models/stories260K/config.json"));
  auto config = original;
  config["model_type"] = "gpt2";
  write_bytes(copy.config(), config.dump());
  expect_model_error(copy.directory, {"unsupported model_type 'gpt2'"});
  config = original;
  config["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  write_bytes(copy.config(), config.dump());
  expect_model_error(copy.directory, {"unsupported rope_scaling type 'yarn'"});
  config = original;
  config["hidden_act"] = "gelu";
  write_bytes(copy.config(), config.dump());
  expect_model_error(copy.directory, {"unsupported hidden_act 'gelu'"});
  // A mixture of experts (Mixtral's field, Qwen-MoE's) is named, never run as a dense model.
  for (const char* experts : {"num_local_experts", "num_experts"}) {
    config = original;
    config[experts] = 8;
    write_bytes(copy.config(), config.dump());
    expect_model_error(copy.directory, {copy.config(), std::string("'") + experts + "'", "mixture-of-experts"});
  }
  // Gemma 3's multimodal checkpoint (its text model sits under text_config, beside a vision tower).
  config = original;
  config["model_type"] = "gemma3";
  config["vision_config"] = {{"model_type", "siglip_vision_model"}};
  write_bytes(copy.config(), config.dump());
  expect_model_error(copy.directory, {"'vision_config'", "not supported"});
  // layer_types that this engine does not know.
  config = original;
  config["layer_types"] = std::vector<std::string>(5, "linear_attention");
  write_bytes(copy.config(), config.dump());
  expect_model_error(copy.directory, {"'layer_types'", "linear_attention"});
}

// A config that claims a huge context costs nothing until positions are used (RoPE rows grow on
// demand, the cache grows with its contents), and gives the same tokens; an absurd one is refused.
void CheckpointErrorsTest::huge_context_costs_nothing_until_used() {
  ModelCopy copy;
  auto config = kvchat::test::load_json(shared_path("models/stories260K/config.json"));
  config["max_position_embeddings"] = 10000000;
  write_bytes(copy.config(), config.dump());
  auto model = LlamaModel::from_checkpoint(copy.directory, ModelConfig::from_directory(copy.directory));
  QCOMPARE(model->rope().ready_positions(), std::int64_t(0));
  auto original = LlamaModel::from_checkpoint(shared_path("models/stories260K"),
                                              ModelConfig::from_directory(shared_path("models/stories260K")));
  GenerationConfig generation;
  generation.max_new_tokens = 40;
  const std::vector<TokenId> prompt = {1, 403, 407, 261, 378};
  Session huge_session(model, KvCacheMode::Contiguous), original_session(original, KvCacheMode::Contiguous);
  QCOMPARE(huge_session.generate(prompt, generation).generated,
           original_session.generate(prompt, generation).generated);
  QVERIFY(model->rope().ready_positions() <= 4096);

  for (const std::int64_t absurd : {std::int64_t(1) << 25, std::int64_t(1000000000000)}) {
    config["max_position_embeddings"] = absurd;
    write_bytes(copy.config(), config.dump());
    expect_model_error(copy.directory, {"'max_position_embeddings' is " + std::to_string(absurd),
                                        "more than the 16777216 positions kvchat accepts"});
  }
}

// A tokenizer whose ids do not all have an embedding row is refused at load, before the weights are read.
void CheckpointErrorsTest::tokenizer_larger_than_the_vocabulary() {
  ModelCopy copy;
  const std::string tokenizer = copy.directory + "/tokenizer.json";
  fs::copy_file(shared_path("models/stories260K/tokenizer.json"), tokenizer);
  fs::permissions(tokenizer, fs::perms::owner_write, fs::perm_options::add);
  QCOMPARE(load_model_directory(copy.directory).tokenizer->vocab_size(), 512);  // its own tokenizer fits

  fs::copy_file(shared_path("fixtures/tokenizers/llama3/tokenizer.json"), tokenizer,
                fs::copy_options::overwrite_existing);
  try {
    load_model_directory(copy.directory);
    QFAIL("a 128,256-token tokenizer on a 512-token model must be refused");
  } catch (const ModelError& error) {
    const std::string message = error.what();
    for (const std::string& fragment :
         std::vector<std::string>{tokenizer, "token ids up to 128255", "has 512 ids", "does not belong"})
      QVERIFY2(message.find(fragment) != std::string::npos, error.what());
  }
}

// A FIFO named like a model file would block open() forever; a directory reads as nonsense. Both are
// refused at once with the file named.
void CheckpointErrorsTest::fifos_and_directories_are_refused_without_blocking() {
  ModelCopy copy;
  fs::remove(copy.weights());
  QCOMPARE(mkfifo(copy.weights().c_str(), 0600), 0);
  expect_model_error(copy.directory, {copy.weights(), "not a regular file"});
  fs::remove(copy.weights());
  fs::create_directory(copy.weights());
  expect_model_error(copy.directory, {copy.weights(), "not a regular file"});

  ModelCopy config_fifo;
  fs::remove(config_fifo.config());
  QCOMPARE(mkfifo(config_fifo.config().c_str(), 0600), 0);
  expect_model_error(config_fifo.directory, {config_fifo.config(), "not a regular file"});

  ModelCopy tokenizer_fifo;
  const std::string tokenizer = tokenizer_fifo.directory + "/tokenizer.json";
  QCOMPARE(mkfifo(tokenizer.c_str(), 0600), 0);
  try {
    load_model_directory(tokenizer_fifo.directory);
    QFAIL("a FIFO tokenizer.json must be refused");
  } catch (const TokenizerError& error) {
    QVERIFY2(std::string(error.what()).find("not a regular file") != std::string::npos, error.what());
  }
}

// A tensor listed twice (JSON would keep the last), a shape whose element count wraps around 2^64 (it
// would match an empty byte range), and a 100,000-dimension shape (a short error, not a 300 KB one).
void CheckpointErrorsTest::duplicate_names_and_absurd_shapes() {
  ModelCopy copy;
  const Checkpoint original = read_checkpoint(copy.weights());
  std::string text = original.header.dump();
  const std::string entry = "\"model.norm.weight\":" + original.header["model.norm.weight"].dump();
  text.insert(1, entry + ",");
  std::string length_bytes(8, '\0');
  for (int i = 0; i < 8; ++i) length_bytes[i] = static_cast<char>((uint64_t(text.size()) >> (8 * i)) & 0xFF);
  write_bytes(copy.weights(), length_bytes + text + original.data);
  expect_model_error(copy.directory, {copy.weights(), "'model.norm.weight' is listed twice"});

  Checkpoint wrapped = original;
  wrapped.header["unused.weight"] = {
      {"dtype", "F32"}, {"shape", {int64_t(1) << 62, int64_t(1) << 62}}, {"data_offsets", {0, 0}}};
  write_bytes(copy.weights(), encode(wrapped.header, wrapped.data));
  expect_model_error(copy.directory, {"'unused.weight'", "more elements than a file can hold"});

  Checkpoint deep = original;
  deep.header["model.norm.weight"]["shape"] = std::vector<int64_t>(100000, 1);
  write_bytes(copy.weights(), encode(deep.header, deep.data));
  try {
    LlamaModel::from_checkpoint(copy.directory, ModelConfig::from_directory(copy.directory));
    QFAIL("a 100,000-dimension shape must be refused");
  } catch (const ModelError& error) {
    QVERIFY2(std::string(error.what()).find("100000 dimensions") != std::string::npos, error.what());
    QVERIFY(std::strlen(error.what()) < 1000);
  }
}

// 1e400 is valid JSON syntax but overflows a double: the JSON library throws out_of_range, not
// parse_error, and that escaped as a library exception instead of a ModelError naming the file.
void CheckpointErrorsTest::numbers_beyond_double_are_model_errors() {
  {
    ModelCopy copy;
    write_bytes(copy.config(), "{\"hidden_size\": 64, \"rope_theta\": 1e400}");
    expect_model_error(copy.directory, {copy.config(), "invalid JSON", "number overflow parsing '1e400'"});
  }
  {
    ModelCopy copy;
    const std::string generation = copy.directory + "/generation_config.json";
    write_bytes(generation, "{\"eos_token_id\": -1e999}");
    expect_model_error(copy.directory, {generation, "invalid JSON", "number overflow parsing '-1e999'"});
  }
  {
    ModelCopy copy;
    Checkpoint checkpoint = read_checkpoint(copy.weights());
    std::string text = checkpoint.header.dump();
    text.insert(1, "\"overflow\": 1e400, ");
    std::string length(8, '\0');
    for (int i = 0; i < 8; ++i) length[i] = static_cast<char>((uint64_t(text.size()) >> (8 * i)) & 0xFF);
    write_bytes(copy.weights(), length + text + checkpoint.data);
    expect_model_error(copy.directory, {copy.weights(), "not valid JSON", "number overflow parsing '1e400'"});
  }
  {
    ModelCopy copy;
    fs::remove(copy.weights());
    const std::string index = copy.directory + "/model.safetensors.index.json";
    write_bytes(index, "{\"metadata\": {\"total_size\": 1e400}, \"weight_map\": {}}");
    expect_model_error(copy.directory, {index, "invalid JSON", "number overflow parsing '1e400'"});
  }
}

KVCHAT_TEST_APPLESS_MAIN(CheckpointErrorsTest)

}  // namespace engine_test_checkpoint_errors

#include "test_checkpoint_errors.moc"
