#include "engine/model/gguf_model.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "engine/gguf/dequantize.h"

namespace kvchat {

namespace {

[[noreturn]] void fail(const GgufFile& file, const std::string& problem) {
  throw ModelError(file.path() + ": " + problem);
}

// Reads the tensors of one file into the engine's layers.
class GgufWeightReader {
 public:
  explicit GgufWeightReader(std::shared_ptr<const GgufFile> file) : file_(std::move(file)) {}

  // Gives back the mapped pages of [data, data + bytes) where that lies in the file (the kernels read a copy).
  void release_mapped(const void* data, std::size_t bytes) const {
    GgufTensor range;
    range.data = static_cast<const std::uint8_t*>(data);
    range.n_bytes = bytes;
    file_->release(range);
  }

  // Matrix y = W x with W [out, in] (GGUF ne = [in, out]), in its stored type. `head_dim` > 0 undoes
  // the converter's Q/K row permutation within each head of that size.
  Linear matrix(const std::string& name, std::int64_t out, std::int64_t in, std::int64_t head_dim = 0) const {
    const GgufTensor& tensor = checked(name, {in, out});
    const GgufTypeInfo& info = gguf_type_info(tensor.type);
    if (!info.dequantizable())
      fail(*file_, "tensor " + name + " has type " + info.name +
                       ", which kvchat cannot decode (supported: " + dequantizable_gguf_type_names() + ")");
    const std::vector<std::int64_t> source_rows =
        head_dim > 0 ? unpermuted_rows(out, head_dim) : std::vector<std::int64_t>();
    Linear linear;
    if (tensor.type == GgufType::F32 || tensor.type == GgufType::BF16) {
      // Plain tensors over the mapping (the deleter keeps the file mapped): the f32/bf16 kernels.
      const at::ScalarType type = tensor.type == GgufType::F32 ? at::kFloat : at::kBFloat16;
      std::shared_ptr<const GgufFile> keep = file_;
      linear.weight = at::from_blob(
          const_cast<std::uint8_t*>(tensor.data), {out, in}, [keep](void*) {}, at::TensorOptions().dtype(type));
      if (!source_rows.empty()) {
        linear.weight = linear.weight.index_select(0, at::tensor(source_rows, at::kLong));
        file_->release(tensor);
      }
      return linear;
    }
    const auto row_bytes = static_cast<std::int64_t>(tensor.row_bytes());
    linear.quantized.view = kernels::QuantizedMatrixView{tensor.type, tensor.data, out, in, row_bytes};
    linear.quantized.owner = file_;
    if (!source_rows.empty()) {
      // The permuted matrix's rows in Hugging Face's order, copied (Q and K are a small part of a model).
      auto rows = std::make_shared<std::vector<std::uint8_t>>(static_cast<std::size_t>(out * row_bytes));
      for (std::int64_t r = 0; r < out; ++r)
        std::memcpy(rows->data() + r * row_bytes, tensor.data + source_rows[r] * row_bytes, row_bytes);
      linear.quantized.view.data = rows->data();
      linear.quantized.owner = rows;
      file_->release(tensor);
    }
    return linear;
  }

  // A 1-D tensor of `size` values (norm weights, biases) as f32, in HF row order for a permuted bias.
  at::Tensor vector(const std::string& name, std::int64_t size, std::int64_t head_dim = 0) const {
    const GgufTensor& tensor = checked(name, {size});
    const std::vector<float> values = dequantize_tensor(tensor);
    at::Tensor result = at::tensor(values, at::kFloat);
    if (head_dim > 0) result = result.index_select(0, at::tensor(unpermuted_rows(size, head_dim), at::kLong));
    return result;
  }

  bool has(const std::string& name) const { return file_->find_tensor(name) != nullptr; }

 private:
  const GgufTensor& checked(const std::string& name, const std::vector<std::int64_t>& ne) const {
    const GgufTensor* tensor = file_->find_tensor(name);
    if (tensor == nullptr) fail(*file_, "tensor " + name + " is missing");
    if (tensor->ne != ne) {
      auto text = [](const std::vector<std::int64_t>& dims) {
        std::string out;
        for (std::int64_t dim : dims) out += (out.empty() ? "" : ", ") + std::to_string(dim);
        return "[" + out + "]";
      };
      fail(*file_, "tensor " + name + " has dimensions " + text(tensor->ne) + " but the metadata needs " + text(ne));
    }
    return *tensor;
  }

  // llama.cpp's converter stores HF row (h, i, j) of a head (i in {0, 1} the half, j < head_dim/2) at
  // h*head_dim + 2j + i, so that its RoPE rotates adjacent pairs. Returns, for each HF row, its row in
  // the file.
  static std::vector<std::int64_t> unpermuted_rows(std::int64_t rows, std::int64_t head_dim) {
    std::vector<std::int64_t> source(static_cast<std::size_t>(rows));
    const std::int64_t half = head_dim / 2;
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t head = r / head_dim, i = (r % head_dim) / half, j = r % half;
      source[static_cast<std::size_t>(r)] = head * head_dim + 2 * j + i;
    }
    return source;
  }

  std::shared_ptr<const GgufFile> file_;
};

}  // namespace

namespace {

// A file whose tensors name more layers than its block_count is damaged or mislabelled: running the first
// block_count layers of it would give a plausible-looking but wrong model, so it is refused.
void check_no_layers_beyond_block_count(const GgufFile& file, std::int64_t layers) {
  constexpr std::string_view prefix = "blk.";
  for (const GgufTensor& tensor : file.tensors()) {
    const std::string_view name = tensor.name;
    if (name.substr(0, prefix.size()) != prefix) continue;
    std::int64_t layer = 0;
    std::size_t at = prefix.size();
    while (at < name.size() && name[at] >= '0' && name[at] <= '9' && layer <= layers)
      layer = layer * 10 + (name[at++] - '0');
    if (at > prefix.size() && layer >= layers)
      fail(file, "tensor " + std::string(name) + " belongs to a layer past the " + std::to_string(layers) +
                     " layers the metadata's block_count declares");
  }
}

}  // namespace

ModelWeights load_gguf_weights(const std::shared_ptr<const GgufFile>& file, const ModelConfig& config) {
  check_no_layers_beyond_block_count(*file, config.num_hidden_layers);
  const GgufWeightReader reader(file);
  const std::int64_t hidden = config.hidden_size, inter = config.intermediate_size;
  const std::int64_t q_out = config.num_attention_heads * config.head_dim;
  const std::int64_t kv_out = config.num_key_value_heads * config.head_dim;
  // llama and smollm3 files carry Q/K permuted for interleaved RoPE; qwen2, qwen3 and gemma files are in HF order
  // (NEOX RoPE).
  const bool permuted = config.model_type == "llama" || config.model_type == "smollm3";
  const std::int64_t permuted_head = permuted ? config.head_dim : 0;
  auto with_bias = [&](Linear linear, const std::string& prefix, std::int64_t out, std::int64_t head_dim) {
    if (config.qkv_bias) linear.bias = reader.vector(prefix + ".bias", out, head_dim);
    return linear;
  };

  ModelWeights weights;
  weights.embedding = reader.matrix("token_embd.weight", config.vocab_size, hidden);
  for (std::int64_t i = 0; i < config.num_hidden_layers; ++i) {
    const std::string p = "blk." + std::to_string(i);
    LayerWeights layer;
    layer.attention_norm = reader.vector(p + ".attn_norm.weight", hidden);
    if (reader.has(p + ".attn_qkv.weight")) {  // Phi-3's fused q, k, v rows (in Hugging Face's order)
      const Linear qkv = reader.matrix(p + ".attn_qkv.weight", q_out + 2 * kv_out, hidden);
      layer.q = qkv.rows(0, q_out);
      layer.k = qkv.rows(q_out, kv_out);
      layer.v = qkv.rows(q_out + kv_out, kv_out);
    } else {
      layer.q = with_bias(reader.matrix(p + ".attn_q.weight", q_out, hidden, permuted_head), p + ".attn_q", q_out,
                          permuted_head);
      layer.k = with_bias(reader.matrix(p + ".attn_k.weight", kv_out, hidden, permuted_head), p + ".attn_k", kv_out,
                          permuted_head);
      layer.v = with_bias(reader.matrix(p + ".attn_v.weight", kv_out, hidden), p + ".attn_v", kv_out, 0);
    }
    layer.o = reader.matrix(p + ".attn_output.weight", hidden, q_out);
    if (config.qk_norm) {
      layer.q_norm = reader.vector(p + ".attn_q_norm.weight", config.head_dim);
      layer.k_norm = reader.vector(p + ".attn_k_norm.weight", config.head_dim);
    }
    layer.mlp_norm = reader.vector(p + ".ffn_norm.weight", hidden);
    if (config.post_norms) {  // Gemma's, stored as 1 + weight like every norm of its GGUF files
      layer.post_attention_norm = reader.vector(p + ".post_attention_norm.weight", hidden);
      layer.post_mlp_norm = reader.vector(p + ".post_ffw_norm.weight", hidden);
    }
    if (config.model_type == "phi3") {  // ffn_up holds the gate's rows, then the up rows (llama.cpp's fused SwiGLU)
      const Linear gate_up = reader.matrix(p + ".ffn_up.weight", 2 * inter, hidden);
      layer.gate = gate_up.rows(0, inter);
      layer.up = gate_up.rows(inter, inter);
    } else {
      layer.gate = reader.matrix(p + ".ffn_gate.weight", inter, hidden);
      layer.up = reader.matrix(p + ".ffn_up.weight", inter, hidden);
    }
    layer.down = reader.matrix(p + ".ffn_down.weight", hidden, inter);
    weights.layers.push_back(std::move(layer));
  }
  weights.final_norm = reader.vector("output_norm.weight", hidden);
  // Without output.weight the embedding is the output matrix too, in its stored type.
  weights.lm_head =
      config.tie_word_embeddings ? weights.embedding : reader.matrix("output.weight", config.vocab_size, hidden);
  // llama.cpp multiplies a BF16 matrix by bf16 activations. Where the processor has AVX-512 BF16, so does kvchat
  // (kernels on): the product matrices are repacked for its kernels (Linear::bf16_packed), and their pages in the
  // mapping given back. Not the embedding's lookups: a tied lm_head gets a packed copy of its own.
  const auto pack = [&](Linear& linear) {
    linear.pack_bf16_rows([&](const void* data, std::size_t bytes) { reader.release_mapped(data, bytes); });
  };
  for (LayerWeights& layer : weights.layers)
    for (Linear* linear : {&layer.q, &layer.k, &layer.v, &layer.o, &layer.gate, &layer.up, &layer.down}) pack(*linear);
  pack(weights.lm_head);
  weights.mapped_files = {file->identity()};
  return weights;
}

}  // namespace kvchat
