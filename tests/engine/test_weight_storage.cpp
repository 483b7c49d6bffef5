// How weights are kept: a checkpoint already in the compute dtype is used where it lies (the file is
// memory-mapped, the tensors view it), and only a dtype change makes a copy.
#include <QtTest>
#include "common/test_suite.h"

#include "common/test_paths.h"
#include "engine/llama_model.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace engine_test_weight_storage {

using namespace kvchat;
using kvchat::test::shared_path;

namespace {

std::vector<at::Tensor> all_weights(const LlamaModel& model) {
  std::vector<at::Tensor> tensors = {model.weights().embedding.weight};
  for (const LayerWeights& layer : model.weights().layers)
    for (const Linear* linear : {&layer.q, &layer.k, &layer.v, &layer.o, &layer.gate, &layer.up, &layer.down})
      tensors.push_back(linear->weight);
  return tensors;
}

// Tensors made by at::from_blob over the mapping have storage that does not own resizable memory;
// copies made by the loader do.
bool views_the_file(const at::Tensor& tensor) { return !tensor.storage().resizable(); }

}  // namespace

class WeightStorageTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void f32_checkpoint_in_f32_is_not_copied();
  void bf16_checkpoint_in_bf16_is_not_copied();
  void a_dtype_change_copies_once();
  void weight_bytes_count_the_kept_dtype();
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

KVCHAT_TEST_APPLESS_MAIN(WeightStorageTest)

}  // namespace engine_test_weight_storage

#include "test_weight_storage.moc"
