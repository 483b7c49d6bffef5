// A steady-state decode step allocates nothing: no tensor, no buffer, no std::function. Every
// operator new of the process is counted (LibTorch's tensor headers and the engine's buffers go
// through it), and the count over many decode steps after a warm-up must be zero, on models whose
// products run inline (stories260K) and on one large enough for the thread pool and the parallel
// attention, with f32 and bf16 weights. The session's generate must not allocate per token either.
#include <QtTest>
#include "common/test_suite.h"

#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>

#include "common/test_paths.h"
#include "engine/cache/kv_cache.h"
#include "engine/generation/session.h"
#include "engine/kernels/thread_pool.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_weights.h"

// The operators below replace the whole program's: this suite is a program of its own
// (tests/CMakeLists.txt), so that the other suites keep the allocator the sanitizers check.
namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_allocations{0};
}  // namespace

void* operator new(std::size_t size) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size ? size : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size) { return operator new(size); }
// The nothrow forms are replaced too (std::stable_sort's buffer uses one): the standard library's own
// forward to the replaced operator new, but a runtime that defines them itself (AddressSanitizer's)
// would allocate outside the counter, and the free() below would release memory it did not allocate.
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return operator new(size);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept { return operator new(size, std::nothrow); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace engine_test_decode_allocations {

using namespace kvchat;
using kvchat::test::shared_path;

namespace {

// Allocations made while `work` runs.
template <typename Work>
long allocations_during(Work&& work) {
  g_allocations = 0;
  g_counting = true;
  work();
  g_counting = false;
  return g_allocations.load();
}

// hidden 512 / intermediate 2048: every product is over the kernels' parallel threshold.
const char* kMidConfig = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
  "hidden_size": 512, "intermediate_size": 2048, "num_attention_heads": 8, "num_key_value_heads": 2,
  "head_dim": 64, "num_hidden_layers": 2, "vocab_size": 2000, "max_position_embeddings": 1024,
  "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": true,
  "bos_token_id": 1, "eos_token_id": 2
})";

// Runs `warm_up` decode steps, then counts the allocations of `counted` more.
long decode_allocations(const LlamaModel& model, std::int64_t start, int warm_up, int counted) {
  ContiguousKvCache cache(model.cache_shape(), start + warm_up + counted + 1);
  DecodeContext context;
  std::vector<TokenId> prompt(static_cast<std::size_t>(start), 5);
  model.forward(prompt, 0, &cache);
  std::int64_t position = start;
  TokenId token = 7;
  auto step = [&] {
    model.decode(token, position++, cache, context);
    token = static_cast<TokenId>((token * 31 + 11) % model.config().vocab_size);
  };
  for (int i = 0; i < warm_up; ++i) step();
  return allocations_during([&] {
    for (int i = 0; i < counted; ++i) step();
  });
}

}  // namespace

class DecodeAllocationsTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void initTestCase() { kernels::set_default_threads(2); }
  void the_counter_sees_tensor_allocations();
  void the_counter_sees_nothrow_allocations();
  void stories260k_decode_step_allocates_nothing();
  void parallel_decode_step_allocates_nothing_data();
  void parallel_decode_step_allocates_nothing();
  void generate_allocates_nothing_per_token();
};

void DecodeAllocationsTest::the_counter_sees_tensor_allocations() {
  // The zero counts below mean something only if a LibTorch call is seen.
  const long seen = allocations_during([] { at::Tensor t = at::empty({4}, at::kFloat); });
  QVERIFY2(seen >= 1, "operator new is not interposed");
}

void DecodeAllocationsTest::the_counter_sees_nothrow_allocations() {
  // The nothrow forms must reach the counter (and its malloc) under every runtime, sanitized included.
  static std::atomic<void*> escaped{nullptr};  // keeps the compiler from eliding the pairs
  const long seen = allocations_during([] {
    std::unique_ptr<int> single(new (std::nothrow) int(1));
    std::unique_ptr<int[]> array(new (std::nothrow) int[4]);
    escaped = single.get();
    escaped = array.get();
  });
  QCOMPARE(seen, 2L);
}

void DecodeAllocationsTest::stories260k_decode_step_allocates_nothing() {
  const std::string directory = shared_path("models/stories260K");
  auto model = LlamaModel::from_checkpoint(directory, ModelConfig::from_directory(directory));
  QCOMPARE(decode_allocations(*model, 3, 4, 200), 0L);
}

void DecodeAllocationsTest::parallel_decode_step_allocates_nothing_data() {
  QTest::addColumn<QString>("dtype");
  QTest::addColumn<int>("gguf_type");  // -1: a torch tensor of dtype
  QTest::newRow("f32") << "f32" << -1;
  QTest::newRow("bf16") << "bf16" << -1;
  // Block types, whose products round the activations into per-thread buffers, and F16.
  for (GgufType type : {GgufType::Q8_0, GgufType::Q4_0, GgufType::Q4_K, GgufType::Q5_K, GgufType::Q6_K, GgufType::F16})
    QTest::newRow(to_string(type)) << QString(to_string(type)) << int(type);
}

void DecodeAllocationsTest::parallel_decode_step_allocates_nothing() {
  QFETCH(QString, dtype);
  QFETCH(int, gguf_type);
  const ModelConfig config = ModelConfig::from_json_text(kMidConfig, "mid-size test config");
  const auto model =
      gguf_type < 0
          ? LlamaModel::random(config, 3, dtype == "bf16" ? WeightDtype::BFloat16 : WeightDtype::Float32)
          : std::make_shared<LlamaModel>(config, random_quantized_model_weights(config, 3, GgufType(gguf_type)));
  // Crossing 256 positions switches attention to the thread pool.
  QCOMPARE(decode_allocations(*model, 240, 4, 40), 0L);
}

void DecodeAllocationsTest::generate_allocates_nothing_per_token() {
  const std::string directory = shared_path("models/stories260K");
  auto model = LlamaModel::from_checkpoint(directory, ModelConfig::from_directory(directory));
  const std::vector<TokenId> prompt = {1, 403, 407, 261, 378};
  GenerationConfig config;
  config.cache_mode = KvCacheMode::Contiguous;
  config.stop_token_ids = {-1};  // exactly max_new_tokens tokens
  auto generate = [&](int tokens) {
    config.max_new_tokens = tokens;
    Session session(model, KvCacheMode::Contiguous);
    return allocations_during([&] { QCOMPARE(int(session.generate(prompt, config).generated.size()), tokens); });
  };
  generate(60);  // sizes the per-thread decode buffers for this context
  const long short_run = generate(10);
  const long long_run = generate(60);
  QVERIFY2(short_run > 0, "a generate call sets up its buffers");
  QCOMPARE(long_run, short_run);
}

KVCHAT_TEST_APPLESS_MAIN(DecodeAllocationsTest)

}  // namespace engine_test_decode_allocations

#include "test_decode_allocations.moc"
