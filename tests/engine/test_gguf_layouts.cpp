// The same random weights written by the test in both layouts, a Hugging Face directory (config.json +
// safetensors) and a GGUF file, give the same logits: Qwen2 (q/k/v biases, NEOX RoPE, no permutation)
// and Llama (Q/K rows permuted the way llama.cpp's converter writes them), tied and untied. Also the
// model-level errors of GGUF files: unsupported architecture, missing or misshapen tensors.
#include <c10/core/InferenceMode.h>

#include <QTemporaryDir>
#include <QtTest>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include "common/test_suite.h"

#include "common/test_paths.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_loader.h"
#include "engine/text/tokenizer/tokenizer_error.h"
#include "gguf/gguf_builder.h"

// Each suite in its own namespace: a group's suites are compiled in batches (unity build).
namespace engine_test_gguf_layouts {

using namespace kvchat;
using kvchat::test::append_le;
using kvchat::test::gguf_string;

namespace {

struct Shape {
  std::string arch;  // "qwen2", "qwen3" or "llama"
  bool tied;
  std::int64_t hidden = 64, inter = 96, layers = 2, heads = 4, kv_heads = 2, vocab = 80;
  double rms_norm_eps = 1e-6;
  // Qwen3 gives its head size explicitly, and it is not hidden / heads there: q is wider than the residual.
  std::int64_t head_dim() const { return arch == "qwen3" ? 32 : hidden / heads; }
};

// Named f32 tensors in HF layout (numpy shapes).
using Tensors = std::vector<std::pair<std::string, at::Tensor>>;

Tensors random_hf_tensors(const Shape& s, std::uint64_t seed) {
  at::manual_seed(seed);
  auto normal = [](std::vector<std::int64_t> shape) { return at::randn(shape, at::kFloat) * 0.08; };
  auto norm = [&](std::int64_t n) { return 1.0 + at::randn({n}, at::kFloat) * 0.1; };
  const std::int64_t q = s.heads * s.head_dim(), kv = s.kv_heads * s.head_dim();
  Tensors t;
  t.emplace_back("model.embed_tokens.weight", normal({s.vocab, s.hidden}));
  for (std::int64_t i = 0; i < s.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i);
    t.emplace_back(p + ".input_layernorm.weight", norm(s.hidden));
    t.emplace_back(p + ".self_attn.q_proj.weight", normal({q, s.hidden}));
    t.emplace_back(p + ".self_attn.k_proj.weight", normal({kv, s.hidden}));
    t.emplace_back(p + ".self_attn.v_proj.weight", normal({kv, s.hidden}));
    if (s.arch == "qwen2") {
      t.emplace_back(p + ".self_attn.q_proj.bias", normal({q}));
      t.emplace_back(p + ".self_attn.k_proj.bias", normal({kv}));
      t.emplace_back(p + ".self_attn.v_proj.bias", normal({kv}));
    }
    if (s.arch == "qwen3") {
      t.emplace_back(p + ".self_attn.q_norm.weight", norm(s.head_dim()));
      t.emplace_back(p + ".self_attn.k_norm.weight", norm(s.head_dim()));
    }
    t.emplace_back(p + ".self_attn.o_proj.weight", normal({s.hidden, q}));
    t.emplace_back(p + ".post_attention_layernorm.weight", norm(s.hidden));
    t.emplace_back(p + ".mlp.gate_proj.weight", normal({s.inter, s.hidden}));
    t.emplace_back(p + ".mlp.up_proj.weight", normal({s.inter, s.hidden}));
    t.emplace_back(p + ".mlp.down_proj.weight", normal({s.hidden, s.inter}));
  }
  t.emplace_back("model.norm.weight", norm(s.hidden));
  if (!s.tied) t.emplace_back("lm_head.weight", normal({s.vocab, s.hidden}));
  return t;
}

std::string tensor_bytes(const at::Tensor& tensor) {
  const at::Tensor values = tensor.contiguous();
  return std::string(static_cast<const char*>(values.data_ptr()), values.nbytes());
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  QVERIFY(out.good());
}

void write_hf_directory(const std::string& directory, const Shape& s, const Tensors& tensors) {
  nlohmann::json config = {{"model_type", s.arch},           {"hidden_size", s.hidden},
                           {"intermediate_size", s.inter},   {"num_hidden_layers", s.layers},
                           {"num_attention_heads", s.heads}, {"num_key_value_heads", s.kv_heads},
                           {"vocab_size", s.vocab},          {"max_position_embeddings", 128},
                           {"rms_norm_eps", s.rms_norm_eps}, {"rope_theta", s.arch != "llama" ? 1000000.0 : 10000.0},
                           {"tie_word_embeddings", s.tied},  {"hidden_act", "silu"},
                           {"use_sliding_window", false},    {"sliding_window", 4096}};
  if (s.arch == "qwen3") config["head_dim"] = s.head_dim();
  write_file(directory + "/config.json", config.dump());
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& [name, tensor] : tensors) {
    header[name] = {{"dtype", "F32"},
                    {"shape", tensor.sizes().vec()},
                    {"data_offsets", {data.size(), data.size() + tensor.nbytes()}}};
    data += tensor_bytes(tensor);
  }
  const std::string text = header.dump();
  std::string file;
  append_le<std::uint64_t>(file, text.size());
  write_file(directory + "/model.safetensors", file + text + data);
}

// The converter's row order for llama Q/K: HF row (h, i, j) goes to h*head_dim + 2j + i.
at::Tensor permute_for_gguf(const at::Tensor& w, std::int64_t heads) {
  const std::int64_t rows = w.size(0);
  std::vector<std::int64_t> shape = {heads, 2, rows / heads / 2};
  for (std::int64_t d = 1; d < w.dim(); ++d) shape.push_back(w.size(d));
  std::vector<std::int64_t> flat = w.sizes().vec();
  return w.reshape(shape).transpose(1, 2).reshape(flat).contiguous();
}

std::string gguf_name(const std::string& hf) {
  static const std::vector<std::pair<std::string, std::string>> parts = {{"model.embed_tokens.", "token_embd."},
                                                                         {"model.layers.", "blk."},
                                                                         {".input_layernorm.", ".attn_norm."},
                                                                         {".self_attn.q_proj.", ".attn_q."},
                                                                         {".self_attn.k_proj.", ".attn_k."},
                                                                         {".self_attn.v_proj.", ".attn_v."},
                                                                         {".self_attn.o_proj.", ".attn_output."},
                                                                         {".self_attn.q_norm.", ".attn_q_norm."},
                                                                         {".self_attn.k_norm.", ".attn_k_norm."},
                                                                         {".post_attention_layernorm.", ".ffn_norm."},
                                                                         {".mlp.gate_proj.", ".ffn_gate."},
                                                                         {".mlp.up_proj.", ".ffn_up."},
                                                                         {".mlp.down_proj.", ".ffn_down."},
                                                                         {"model.norm.", "output_norm."},
                                                                         {"lm_head.", "output."}};
  std::string name = hf;
  for (const auto& [from, to] : parts)
    if (auto at = name.find(from); at != std::string::npos) name.replace(at, from.size(), to);
  return name;
}

std::string kv_u32(const std::string& key, std::uint32_t value) { return test::gguf_kv_u32(key, value); }
std::string kv_f32(const std::string& key, float value) {
  std::string out = gguf_string(key);
  append_le<std::uint32_t>(out, 6);
  append_le<float>(out, value);
  return out;
}
std::string kv_string(const std::string& key, const std::string& value) {
  std::string out = gguf_string(key);
  append_le<std::uint32_t>(out, 8);
  return out + gguf_string(value);
}

test::GgufPieces gguf_pieces(const Shape& s, const Tensors& tensors) {
  test::GgufPieces pieces;
  pieces.magic_and_version = std::string("GGUF") + std::string("\x03\x00\x00\x00", 4);
  const std::string& a = s.arch;
  pieces.metadata = {kv_string("general.architecture", a),
                     kv_u32(a + ".context_length", 128),
                     kv_u32(a + ".embedding_length", s.hidden),
                     kv_u32(a + ".block_count", s.layers),
                     kv_u32(a + ".feed_forward_length", s.inter),
                     kv_u32(a + ".attention.head_count", s.heads),
                     kv_u32(a + ".attention.head_count_kv", s.kv_heads),
                     kv_f32(a + ".attention.layer_norm_rms_epsilon", static_cast<float>(s.rms_norm_eps)),
                     kv_f32(a + ".rope.freq_base", a != "llama" ? 1000000.f : 10000.f),
                     kv_u32(a + ".rope.dimension_count", s.head_dim()),
                     kv_u32(a + ".attention.key_length", s.head_dim()),
                     kv_u32(a + ".attention.value_length", s.head_dim())};
  for (const auto& [name, hf_tensor] : tensors) {
    at::Tensor tensor = hf_tensor;
    const bool q = name.find("q_proj") != std::string::npos, k = name.find("k_proj") != std::string::npos;
    if (a == "llama" && (q || k)) tensor = permute_for_gguf(tensor, q ? s.heads : s.kv_heads);
    test::GgufTensorInfo info;
    info.name = gguf_name(name);
    for (std::int64_t d = tensor.dim() - 1; d >= 0; --d)
      info.dims.push_back(static_cast<std::uint64_t>(tensor.size(d)));
    info.type = 0;  // F32
    info.offset = pieces.data.size();
    pieces.data += tensor_bytes(tensor);
    pieces.data.append((32 - pieces.data.size() % 32) % 32, '\0');
    pieces.tensors.push_back(info);
  }
  return pieces;
}

at::Tensor all_logits(const LlamaModel& model, const std::vector<TokenId>& ids) {
  c10::InferenceMode guard;
  return model.forward(ids, 0, nullptr, /*all_positions=*/true);
}

// load_model must throw ModelError mentioning `fragment`.
void expect_load_error(const std::string& path, const std::string& fragment) {
  try {
    load_model(path);
  } catch (const ModelError& error) {
    QVERIFY2(std::string(error.what()).find(fragment) != std::string::npos,
             qPrintable(QString("'%1' does not mention '%2'").arg(error.what(), QString::fromStdString(fragment))));
    return;
  }
  QFAIL(qPrintable(QString("expected a ModelError mentioning '%1'").arg(QString::fromStdString(fragment))));
}

}  // namespace

class GgufLayoutsTest : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void same_logits_in_both_layouts_data();
  void same_logits_in_both_layouts();
  void rms_norm_epsilon_is_read_data();
  void rms_norm_epsilon_is_read();
  void qwen2_biases_are_used();
  void qwen3_qk_norms_are_used();
  void model_level_errors();
};

void GgufLayoutsTest::same_logits_in_both_layouts_data() {
  QTest::addColumn<QString>("arch");
  QTest::addColumn<bool>("tied");
  for (const char* arch : {"qwen2", "qwen3", "llama"})
    for (bool tied : {false, true})
      QTest::newRow(qPrintable(QString("%1 %2").arg(arch, tied ? "tied" : "untied"))) << QString(arch) << tied;
}

void GgufLayoutsTest::same_logits_in_both_layouts() {
  QFETCH(QString, arch);
  QFETCH(bool, tied);
  const Shape shape{arch.toStdString(), tied};
  const Tensors tensors = random_hf_tensors(shape, tied ? 11 : 12);
  QTemporaryDir directory;
  write_hf_directory(directory.path().toStdString(), shape, tensors);
  const std::string gguf_path = directory.path().toStdString() + "/model.gguf";
  write_file(gguf_path, gguf_pieces(shape, tensors).bytes());

  const LoadedModel hf = load_model(directory.path().toStdString());
  const LoadedModel gguf = load_model(gguf_path);
  QCOMPARE(QString::fromStdString(gguf.format), QString("gguf"));
  QCOMPARE(QString::fromStdString(gguf.config.model_type), arch);
  QCOMPARE(gguf.config.tie_word_embeddings, tied);
  QCOMPARE(gguf.config.qkv_bias, arch == "qwen2");
  QCOMPARE(hf.config.qkv_bias, arch == "qwen2");
  QVERIFY(!hf.config.output_bias && !gguf.config.output_bias);
  QCOMPARE(gguf.config.qk_norm, arch == "qwen3");
  QCOMPARE(hf.config.qk_norm, arch == "qwen3");
  QCOMPARE(gguf.config.head_dim, shape.head_dim());
  QCOMPARE(hf.config.head_dim, shape.head_dim());

  const std::vector<TokenId> ids = {1, 17, 42, 5, 79, 33, 8, 60, 21, 2, 64, 11};
  const at::Tensor expected = all_logits(*hf.model, ids), got = all_logits(*gguf.model, ids);
  const double worst = (expected - got).abs().max().item<double>();
  QVERIFY2(worst < 1e-4, qPrintable(QString("logits differ by %1").arg(worst)));
  QVERIFY(expected.abs().max().item<double>() > 0.1);  // not a degenerate model

  // Decoding through the cache, token by token, agrees too (the positions of RoPE in the decode step).
  c10::InferenceMode guard;
  auto cache = make_kv_cache(KvCacheMode::Contiguous, gguf.model->cache_shape());
  DecodeContext context;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    gguf.model->decode(ids[i], static_cast<std::int64_t>(i), *cache, context);
    const at::Tensor row = at::from_blob(context.logits.data(), {shape.vocab}, at::kFloat);
    const double step = (row - expected[static_cast<std::int64_t>(i)]).abs().max().item<double>();
    QVERIFY2(step < 1e-4, qPrintable(QString("decode step %1 differs by %2").arg(i).arg(step)));
  }
}

void GgufLayoutsTest::rms_norm_epsilon_is_read_data() {
  QTest::addColumn<QString>("arch");
  QTest::addColumn<double>("eps");
  for (const char* arch : {"qwen2", "llama"})
    for (double eps : {1e-6, 0.5})
      QTest::newRow(qPrintable(QString("%1 %2").arg(arch).arg(eps))) << QString(arch) << eps;
}

// The standard key llama.cpp writes (attention.layer_norm_rms_epsilon) sets the epsilon: a file and a
// Hugging Face folder with the same epsilon give the same logits, and a large one is not lost to a default.
void GgufLayoutsTest::rms_norm_epsilon_is_read() {
  QFETCH(QString, arch);
  QFETCH(double, eps);
  Shape shape{arch.toStdString(), false};
  shape.rms_norm_eps = eps;
  const Tensors tensors = random_hf_tensors(shape, 15);
  QTemporaryDir directory;
  write_hf_directory(directory.path().toStdString(), shape, tensors);
  const std::string gguf_path = directory.path().toStdString() + "/model.gguf";
  write_file(gguf_path, gguf_pieces(shape, tensors).bytes());
  const LoadedModel hf = load_model(directory.path().toStdString());
  const LoadedModel gguf = load_model(gguf_path);
  QCOMPARE(gguf.config.rms_norm_eps, static_cast<double>(static_cast<float>(eps)));
  const std::vector<TokenId> ids = {1, 17, 42, 5, 79};
  const double worst = (all_logits(*hf.model, ids) - all_logits(*gguf.model, ids)).abs().max().item<double>();
  // The file stores the epsilon as f32, the folder as a double: they differ in the last bits only.
  QVERIFY2(worst < 1e-4, qPrintable(QString("logits differ by %1").arg(worst)));
}

// Dropping the q/k/v biases must change the logits: the biases are read and applied.
void GgufLayoutsTest::qwen2_biases_are_used() {
  const Shape shape{"qwen2", false};
  Tensors tensors = random_hf_tensors(shape, 13);
  QTemporaryDir directory;
  const std::string path = directory.path().toStdString() + "/model.gguf";
  write_file(path, gguf_pieces(shape, tensors).bytes());
  for (auto& [name, tensor] : tensors)
    if (name.find(".bias") != std::string::npos) tensor = at::zeros_like(tensor);
  const std::string zero_bias_path = directory.path().toStdString() + "/zero-bias.gguf";
  write_file(zero_bias_path, gguf_pieces(shape, tensors).bytes());
  const std::vector<TokenId> ids = {1, 5, 9, 13};
  const double difference =
      (all_logits(*load_model(path).model, ids) - all_logits(*load_model(zero_bias_path).model, ids))
          .abs()
          .max()
          .item<double>();
  QVERIFY2(difference > 1e-3, qPrintable(QString("biases changed the logits by only %1").arg(difference)));
}

// Qwen3's per-head q/k norms take part: other norm weights give other logits, and a file without them is refused
// with the tensor's name.
void GgufLayoutsTest::qwen3_qk_norms_are_used() {
  const Shape shape{"qwen3", false};
  Tensors tensors = random_hf_tensors(shape, 15);
  QTemporaryDir directory;
  const std::string path = directory.path().toStdString() + "/model.gguf";
  write_file(path, gguf_pieces(shape, tensors).bytes());
  Tensors unit_norms = tensors;
  for (auto& [name, tensor] : unit_norms)
    if (name.find("_norm.") != std::string::npos && name.find("self_attn") != std::string::npos)
      tensor = at::ones_like(tensor);
  const std::string unit_path = directory.path().toStdString() + "/unit-norms.gguf";
  write_file(unit_path, gguf_pieces(shape, unit_norms).bytes());
  const std::vector<TokenId> ids = {1, 5, 9, 13};
  const double difference = (all_logits(*load_model(path).model, ids) - all_logits(*load_model(unit_path).model, ids))
                                .abs()
                                .max()
                                .item<double>();
  QVERIFY2(difference > 1e-3, qPrintable(QString("q/k norms changed the logits by only %1").arg(difference)));

  Tensors without = tensors;
  without.erase(
      std::remove_if(without.begin(), without.end(),
                     [](const auto& named) { return named.first == "model.layers.1.self_attn.k_norm.weight"; }),
      without.end());
  const std::string missing_path = directory.path().toStdString() + "/missing.gguf";
  write_file(missing_path, gguf_pieces(shape, without).bytes());
  expect_load_error(missing_path, "blk.1.attn_k_norm.weight");
  write_hf_directory(directory.path().toStdString(), shape, without);
  expect_load_error(directory.path().toStdString(), "model.layers.1.self_attn.k_norm.weight");
}

void GgufLayoutsTest::model_level_errors() {
  QTemporaryDir directory;
  const Shape shape{"llama", true};
  const Tensors tensors = random_hf_tensors(shape, 14);
  auto write_variant = [&](const std::string& name, const std::function<void(test::GgufPieces&)>& change) {
    test::GgufPieces pieces = gguf_pieces(shape, tensors);
    change(pieces);
    const std::string path = directory.path().toStdString() + "/" + name;
    write_file(path, pieces.bytes());
    return path;
  };
  expect_load_error(
      write_variant("arch.gguf",
                    [](test::GgufPieces& p) { p.metadata[0] = kv_string("general.architecture", "gpt2"); }),
      "unsupported architecture 'gpt2'");
  expect_load_error(write_variant("missing.gguf",
                                  [](test::GgufPieces& p) {
                                    for (auto& t : p.tensors)
                                      if (t.name == "blk.1.ffn_up.weight") t.name = "blk.1.ffn_upp.weight";
                                  }),
                    "tensor blk.1.ffn_up.weight is missing");
  expect_load_error(write_variant("shape.gguf",
                                  [](test::GgufPieces& p) {
                                    for (auto& t : p.tensors)
                                      if (t.name == "blk.0.attn_k.weight")
                                        t.dims = {32, 64};  // same bytes, wrong shape
                                  }),
                    "tensor blk.0.attn_k.weight has dimensions [32, 64] but the metadata needs [64, 32]");
  // Partial rotary is a real layout (Phi-3, rope.dimension_count < head size); an odd count is not.
  expect_load_error(
      write_variant("rope.gguf", [](test::GgufPieces& p) { p.metadata[9] = kv_u32("llama.rope.dimension_count", 7); }),
      "llama.rope.dimension_count is 7: it must be even and at most the head dimension");
  // No epsilon: a guessed default would change every logit silently.
  expect_load_error(write_variant("eps.gguf",
                                  [](test::GgufPieces& p) {
                                    p.metadata.erase(p.metadata.begin() + 7);
                                    p.metadata.push_back(kv_f32("llama.attention.layer_norm_rms_eps", 1e-6f));
                                  }),
                    "metadata llama.attention.layer_norm_rms_epsilon (the RMSNorm epsilon) is missing");
  // block_count says fewer layers than the file has tensors for.
  expect_load_error(
      write_variant("blocks.gguf", [](test::GgufPieces& p) { p.metadata[3] = kv_u32("llama.block_count", 1); }),
      "tensor blk.1.attn_norm.weight belongs to a layer past the 1 layers the metadata's block_count declares");
  // llama.cpp's mark of a file without a vocabulary ("none", or "no_vocab") loads the weights alone; another name is
  // read as a tokenizer (this file has no tokens for one: refused).
  for (const char* none : {"none", "no_vocab"}) {
    const LoadedModel vocabulary_less = load_model(write_variant(std::string(none) + ".gguf", [&](test::GgufPieces& p) {
      p.metadata.push_back(kv_string("tokenizer.ggml.model", none));
    }));
    QVERIFY(!vocabulary_less.tokenizer);
    QCOMPARE(vocabulary_less.config.num_hidden_layers, shape.layers);
  }
  const std::string bert = write_variant(
      "bert.gguf", [](test::GgufPieces& p) { p.metadata.push_back(kv_string("tokenizer.ggml.model", "bert")); });
  try {
    load_model(bert);
    QFAIL("a file naming another tokenizer loaded");
  } catch (const TokenizerError& error) {  // read as a tokenizer: this file has no tokens for it
    QVERIFY2(std::string(error.what()).find("missing tokenizer.ggml.tokens") != std::string::npos, error.what());
  }
  // A vocabulary-only file has no weights.
  expect_load_error(test::shared_path("fixtures/gguf/llama3-vocab-only.gguf"), "tensor token_embd.weight is missing");
  // A file that is not GGUF at all.
  const std::string text_path = directory.path().toStdString() + "/notes.gguf";
  write_file(text_path, "just some text, not a model");
  expect_load_error(text_path, "is not a GGUF file");
  expect_load_error(directory.path().toStdString() + "/absent.gguf", "model not found");
}

KVCHAT_TEST_GUILESS_MAIN(GgufLayoutsTest)

}  // namespace engine_test_gguf_layouts

#include "test_gguf_layouts.moc"
