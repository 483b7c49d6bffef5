// How weights are kept: a checkpoint already in the compute dtype is used where it lies (the file is
// memory-mapped, the tensors view it), and only a dtype change makes a copy. A GGUF file's blocks are
// used where they lie too, never decoded at load; only Q/K rows are copied, to undo the converter's
// row order.
#include <QtTest>
#include "common/test_suite.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <utility>

#include "common/test_paths.h"
#include "engine/gguf/gguf_file.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_loader.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace engine_test_weight_storage {

using namespace kvchat;
using kvchat::test::shared_path;

namespace {

std::vector<at::Tensor> all_weights(const LlamaModel& model) {
  std::vector<at::Tensor> tensors = {model.weights().embedding.weight};
  for (const LayerWeights& layer : model.weights().layers)
    for (const Linear* linear : layer.matrices()) tensors.push_back(linear->weight);
  return tensors;
}

// Tensors made by at::from_blob over the mapping have storage that does not own resizable memory;
// copies made by the loader do.
bool views_the_file(const at::Tensor& tensor) { return !tensor.storage().resizable(); }

// The address ranges where the file at `path` is mapped into this process (/proc/self/maps).
std::vector<std::pair<std::uintptr_t, std::uintptr_t>> mapped_ranges(const std::string& path) {
  const std::string file = std::filesystem::canonical(path).string();
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.size() < file.size() || line.compare(line.size() - file.size(), file.size(), file) != 0) continue;
    unsigned long begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &begin, &end) == 2) ranges.emplace_back(begin, end);
  }
  return ranges;
}

bool inside(const std::vector<std::pair<std::uintptr_t, std::uintptr_t>>& ranges, const void* data,
            std::int64_t bytes) {
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  for (const auto& [first, last] : ranges)
    if (begin >= first && begin + static_cast<std::uintptr_t>(bytes) <= last) return true;
  return false;
}

}  // namespace

class WeightStorageTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void f32_checkpoint_in_f32_is_not_copied();
  void bf16_checkpoint_in_bf16_is_not_copied();
  void a_dtype_change_copies_once();
  void weight_bytes_count_the_kept_dtype();
  void gguf_blocks_stay_in_the_mapped_file_data();
  void gguf_blocks_stay_in_the_mapped_file();
};

void WeightStorageTest::f32_checkpoint_in_f32_is_not_copied() {
  std::string directory = shared_path("models/stories260K");
  auto model = LlamaModel::from_checkpoint(directory, ModelConfig::from_directory(directory), WeightDtype::Float32);
  for (const at::Tensor& tensor : all_weights(*model)) {
    QCOMPARE(tensor.scalar_type(), at::kFloat);
    QVERIFY(views_the_file(tensor));
  }
}

void WeightStorageTest::bf16_checkpoint_in_bf16_is_not_copied() {
  std::string directory = shared_path("models/tiny-llama3-random");
  auto model = LlamaModel::from_checkpoint(directory, ModelConfig::from_directory(directory), WeightDtype::BFloat16);
  for (const at::Tensor& tensor : all_weights(*model)) {
    QCOMPARE(tensor.scalar_type(), at::kBFloat16);
    QVERIFY(views_the_file(tensor));
  }
}

void WeightStorageTest::a_dtype_change_copies_once() {
  std::string directory = shared_path("models/tiny-llama3-random");
  auto model = LlamaModel::from_checkpoint(directory, ModelConfig::from_directory(directory), WeightDtype::Float32);
  for (const at::Tensor& tensor : all_weights(*model)) {
    QCOMPARE(tensor.scalar_type(), at::kFloat);
    QVERIFY(!views_the_file(tensor));
  }
  // Tied embeddings: the lm_head is the embedding itself, not a second copy.
  QCOMPARE(model->weights().lm_head.data(), model->weights().embedding.data());
}

void WeightStorageTest::weight_bytes_count_the_kept_dtype() {
  std::string directory = shared_path("models/tiny-llama3-random");
  ModelConfig config = ModelConfig::from_directory(directory);
  auto f32 = LlamaModel::from_checkpoint(directory, config, WeightDtype::Float32);
  auto bf16 = LlamaModel::from_checkpoint(directory, config, WeightDtype::BFloat16);
  const int64_t norms = (2 * config.num_hidden_layers + 1) * config.hidden_size * 4;  // always f32
  QCOMPARE(f32->weight_bytes(), config.parameter_count() * 4);
  QCOMPARE(bf16->weight_bytes(), (config.parameter_count() - norms / 4) * 2 + norms);
}

void WeightStorageTest::gguf_blocks_stay_in_the_mapped_file_data() {
  QTest::addColumn<QString>("file");
  for (const char* file : {"tiny-llama-k-Q4_K_M.gguf", "tiny-llama-k-Q8_0.gguf", "stories260K-Q4_0.gguf"})
    QTest::newRow(file) << QString(file);
}

// Every matrix keeps the type and the bytes the file stores. Those of V, O, the MLP and the embedding
// are the mapped file itself; Q and K (llama's converter permutes their rows) are copies of the same
// bytes in Hugging Face's row order.
void WeightStorageTest::gguf_blocks_stay_in_the_mapped_file() {
  QFETCH(QString, file);
  const std::string path = shared_path("fixtures/gguf/" + file.toStdString());
  const GgufFile stored(path);
  const LoadedModel loaded = load_model(path);
  const LlamaModel& model = *loaded.model;
  const auto ranges = mapped_ranges(path);
  QVERIFY(!ranges.empty());
  const auto expect = [&](const Linear& linear, const std::string& tensor_name, bool copied) {
    const GgufTensor* tensor = stored.find_tensor(tensor_name);
    QVERIFY2(tensor != nullptr, tensor_name.c_str());
    QCOMPARE(linear.type_name(), std::string(gguf_type_info(tensor->type).name));
    QVERIFY2(linear.is_quantized(), tensor_name.c_str());
    QCOMPARE(linear.bytes(), static_cast<std::int64_t>(tensor->n_bytes));
    QVERIFY2(inside(ranges, linear.data(), linear.bytes()) == !copied, tensor_name.c_str());
  };
  expect(model.weights().embedding, "token_embd.weight", false);
  if (stored.find_tensor("output.weight"))
    expect(model.weights().lm_head, "output.weight", false);
  else
    QCOMPARE(model.weights().lm_head.data(), model.weights().embedding.data());
  for (std::size_t i = 0; i < model.weights().layers.size(); ++i) {
    const LayerWeights& layer = model.weights().layers[i];
    const std::string prefix = "blk." + std::to_string(i) + ".";
    expect(layer.q, prefix + "attn_q.weight", true);
    expect(layer.k, prefix + "attn_k.weight", true);
    expect(layer.v, prefix + "attn_v.weight", false);
    expect(layer.o, prefix + "attn_output.weight", false);
    expect(layer.gate, prefix + "ffn_gate.weight", false);
    expect(layer.up, prefix + "ffn_up.weight", false);
    expect(layer.down, prefix + "ffn_down.weight", false);
  }
}

KVCHAT_TEST_APPLESS_MAIN(WeightStorageTest)

}  // namespace engine_test_weight_storage

#include "test_weight_storage.moc"
