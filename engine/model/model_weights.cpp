#include "engine/model/model_weights.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "engine/kernels/block_types.h"
#include "engine/kernels/huge_pages.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"

namespace kvchat {

namespace {

at::ScalarType storage_type(WeightDtype dtype) { return dtype == WeightDtype::BFloat16 ? at::kBFloat16 : at::kFloat; }

// Weight storage on transparent huge pages: decode streams every weight once per token, and 4 KiB
// pages cost about a tenth of the read bandwidth in TLB misses and prefetcher restarts.
at::Tensor empty_weight(const std::vector<std::int64_t>& shape, at::ScalarType type) {
  std::size_t bytes = c10::elementSize(type);
  for (std::int64_t dim : shape) bytes *= static_cast<std::size_t>(dim);
  if (bytes < (std::size_t(4) << 20)) return at::empty(shape, at::TensorOptions().dtype(type));
  void* buffer = kernels::allocate_huge_page_buffer(bytes);
  return at::from_blob(
      buffer, shape, [bytes](void* data) { kernels::free_huge_page_buffer(data, bytes); },
      at::TensorOptions().dtype(type));
}

// `source` in `type`: the source itself when it already is (a memory-mapped checkpoint stays
// mapped, not copied), else a converted copy on huge pages.
at::Tensor as_weight(const at::Tensor& source, at::ScalarType type) {
  if (source.scalar_type() == type) return source;
  at::Tensor weight = empty_weight(source.sizes().vec(), type);
  weight.copy_(source);
  return weight;
}

// "[64, 512]"; a shape of more than 8 dimensions is shown by its first 8 and its rank, so a hostile
// header cannot make the message huge.
std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size() && i < 8; ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() > 8) out += ", ... (" + std::to_string(shape.size()) + " dimensions)";
  return out + "]";
}

class CheckpointReader {
 public:
  CheckpointReader(const std::string& directory, WeightDtype dtype) : checkpoint_(directory), dtype_(dtype) {}

  // A weight matrix kept in the storage dtype; a checkpoint already in that dtype is not copied.
  at::Tensor matrix(const std::string& name, std::vector<std::int64_t> shape) {
    return as_weight(checked(name, shape), storage_type(dtype_));
  }
  std::vector<FileIdentity> mapped_files() const { return checkpoint_.identities(); }
  // Norm weights and biases are tiny: always f32.
  at::Tensor vector(const std::string& name, std::int64_t size) { return checked(name, {size}).to(at::kFloat); }

 private:
  at::Tensor checked(const std::string& name, const std::vector<std::int64_t>& shape) {
    if (!checkpoint_.contains(name)) throw ModelError("checkpoint is missing tensor '" + name + "'");
    const SafetensorsEntry& entry = checkpoint_.entry(name);
    if (entry.shape != shape)
      throw ModelError(checkpoint_.file_of(name) + ": tensor '" + name + "' has shape " + shape_text(entry.shape) +
                       " but the config needs " + shape_text(shape));
    return checkpoint_.tensor(name);
  }

  SafetensorsCheckpoint checkpoint_;
  WeightDtype dtype_;
};

// The matrix shapes of one layer, from the config.
struct LayerShapes {
  std::int64_t hidden, inter, q_out, kv_out;
  explicit LayerShapes(const ModelConfig& c)
      : hidden(c.hidden_size),
        inter(c.intermediate_size),
        q_out(c.num_attention_heads * c.head_dim),
        kv_out(c.num_key_value_heads * c.head_dim) {}
};

// The bytes the config's weights take (in double: absurd configs must not overflow the estimate), checked
// against the machine's memory before anything is allocated: a config with 10^9 layers fails at once
// with its size instead of after gigabytes of allocation.
void check_fits_in_memory(const ModelConfig& config, double bytes_per_weight) {
  const LayerShapes s(config);
  const double per_layer = double(s.hidden) * double(s.q_out + 2 * s.kv_out) + double(s.q_out) * double(s.hidden) +
                           3.0 * double(s.hidden) * double(s.inter);
  const double matrices = double(config.vocab_size) * double(s.hidden) * (config.tie_word_embeddings ? 1.0 : 2.0) +
                          double(config.num_hidden_layers) * per_layer;
  const double bytes = matrices * bytes_per_weight;
  const double memory = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  if (memory > 0 && bytes > memory)
    throw ModelError("the weights of this config need " + std::to_string(static_cast<long long>(bytes / 1073741824.0)) +
                     " GiB, more than this machine's " + std::to_string(static_cast<long long>(memory / 1073741824.0)) +
                     " GiB of memory");
}

// Every matrix of the config's shapes from make_linear(out, in), unit norms; tied or separate lm_head.
template <typename MakeLinear>
ModelWeights weights_of_shapes(const ModelConfig& config, const MakeLinear& make_linear) {
  const LayerShapes s(config);
  auto norm = [&]() { return at::ones({s.hidden}, at::kFloat); };
  ModelWeights weights;
  weights.embedding = make_linear(config.vocab_size, s.hidden);
  for (std::int64_t i = 0; i < config.num_hidden_layers; ++i) {
    LayerWeights layer;
    layer.attention_norm = norm();
    layer.q = make_linear(s.q_out, s.hidden);
    layer.k = make_linear(s.kv_out, s.hidden);
    layer.v = make_linear(s.kv_out, s.hidden);
    layer.o = make_linear(s.hidden, s.q_out);
    if (config.qk_norm) {
      layer.q_norm = at::ones({config.head_dim}, at::kFloat);
      layer.k_norm = at::ones({config.head_dim}, at::kFloat);
    }
    layer.mlp_norm = norm();
    if (config.post_norms) {
      layer.post_attention_norm = norm();
      layer.post_mlp_norm = norm();
    }
    layer.gate = make_linear(s.inter, s.hidden);
    layer.up = make_linear(s.inter, s.hidden);
    layer.down = make_linear(s.hidden, s.inter);
    weights.layers.push_back(std::move(layer));
  }
  weights.final_norm = norm();
  weights.lm_head = config.tie_word_embeddings ? weights.embedding : make_linear(config.vocab_size, s.hidden);
  return weights;
}

// A matrix [out, in] of random blocks of `block_type` on huge pages. The blocks' f16 scales (block_types.h:
// where a block keeps them, and its largest |value| in units of d) are chosen so that weights stay within
// about +-0.05, like a trained model's (larger random weights would overflow the activations of a deep model
// into infinities).
Linear random_quantized_linear(std::int64_t out, std::int64_t in, const kernels::BlockType& block_type,
                               std::uint64_t& state) {
  const GgufType type = block_type.type;
  const GgufTypeInfo& info = *block_type.format;
  if (in % info.block_size != 0)
    throw ModelError("a row of " + std::to_string(in) + " weights is not a whole number of " + info.name + " blocks (" +
                     std::to_string(info.block_size) + " weights each)");
  const std::int64_t row_bytes = in / info.block_size * info.block_bytes;
  const std::size_t bytes = static_cast<std::size_t>(out * row_bytes);
  auto* data = static_cast<std::uint8_t*>(kernels::allocate_huge_page_buffer(bytes));
  std::shared_ptr<const void> owner(
      data, [bytes](const void* p) { kernels::free_huge_page_buffer(const_cast<void*>(p), bytes); });
  auto next = [&state] {  // xorshift64*: fast, and the values do not matter
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 0x2545F4914F6CDD1DULL;
  };
  for (std::size_t i = 0; i < bytes; i += 8) {
    const std::uint64_t value = next();
    std::memcpy(data + i, &value, std::min<std::size_t>(8, bytes - i));
  }
  const double scale = 0.05 / block_type.largest_quant;
  for (std::size_t block = 0; block < bytes; block += info.block_bytes) {
    for (int field : {block_type.scale_at, block_type.min_at}) {
      if (field < 0) continue;
      const double unit = double(next() >> 11) / double(1ULL << 53);  // [0, 1)
      const c10::Half value(static_cast<float>(scale * (0.5 + 0.5 * unit)));
      std::memcpy(data + block + field, &value.x, 2);
    }
  }
  Linear linear;
  linear.quantized.view = kernels::QuantizedMatrixView{type, data, out, in, row_bytes};
  linear.quantized.owner = std::move(owner);
  return linear;
}

}  // namespace

ModelWeights load_model_weights(const std::string& directory, const ModelConfig& config, WeightDtype dtype) {
  CheckpointReader reader(directory, dtype);
  const LayerShapes s(config);
  auto linear = [&](const std::string& prefix, std::int64_t out, std::int64_t in, bool has_bias) {
    Linear l;
    l.weight = reader.matrix(prefix + ".weight", {out, in});
    if (has_bias) l.bias = reader.vector(prefix + ".bias", out);
    return l;
  };

  // Gemma's norms multiply by 1 + weight (ModelConfig::norm_weight_offset), added here once in f32 as its
  // RMSNorm adds it on every call.
  auto norm = [&](const std::string& name, std::int64_t size) {
    at::Tensor weight = reader.vector(name, size);
    return config.norm_weight_offset != 0 ? weight + config.norm_weight_offset : weight;
  };
  // Llama's post_attention_layernorm is the norm before its feed-forward; Gemma's is the norm of the attention's
  // output, and its pre_feedforward_layernorm the one before the feed-forward.
  const char* const mlp_norm_name =
      config.post_norms ? ".pre_feedforward_layernorm.weight" : ".post_attention_layernorm.weight";

  const bool fused = config.model_type == "phi3";

  ModelWeights weights;
  weights.embedding.weight = reader.matrix("model.embed_tokens.weight", {config.vocab_size, s.hidden});
  for (std::int64_t i = 0; i < config.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i);
    LayerWeights layer;
    layer.attention_norm = norm(p + ".input_layernorm.weight", s.hidden);
    if (fused) {  // Phi-3: one qkv_proj, its q, k and v rows in that order
      const Linear qkv = linear(p + ".self_attn.qkv_proj", s.q_out + 2 * s.kv_out, s.hidden, false);
      layer.q = qkv.rows(0, s.q_out);
      layer.k = qkv.rows(s.q_out, s.kv_out);
      layer.v = qkv.rows(s.q_out + s.kv_out, s.kv_out);
    } else {
      layer.q = linear(p + ".self_attn.q_proj", s.q_out, s.hidden, config.qkv_bias);
      layer.k = linear(p + ".self_attn.k_proj", s.kv_out, s.hidden, config.qkv_bias);
      layer.v = linear(p + ".self_attn.v_proj", s.kv_out, s.hidden, config.qkv_bias);
    }
    layer.o = linear(p + ".self_attn.o_proj", s.hidden, s.q_out, config.output_bias);
    if (config.qk_norm) {
      layer.q_norm = norm(p + ".self_attn.q_norm.weight", config.head_dim);
      layer.k_norm = norm(p + ".self_attn.k_norm.weight", config.head_dim);
    }
    layer.mlp_norm = norm(p + mlp_norm_name, s.hidden);
    if (config.post_norms) {
      layer.post_attention_norm = norm(p + ".post_attention_layernorm.weight", s.hidden);
      layer.post_mlp_norm = norm(p + ".post_feedforward_layernorm.weight", s.hidden);
    }
    if (fused) {  // Phi-3: one gate_up_proj, the gate's rows first
      const Linear gate_up = linear(p + ".mlp.gate_up_proj", 2 * s.inter, s.hidden, false);
      layer.gate = gate_up.rows(0, s.inter);
      layer.up = gate_up.rows(s.inter, s.inter);
    } else {
      layer.gate = linear(p + ".mlp.gate_proj", s.inter, s.hidden, config.mlp_bias);
      layer.up = linear(p + ".mlp.up_proj", s.inter, s.hidden, config.mlp_bias);
    }
    layer.down = linear(p + ".mlp.down_proj", s.hidden, s.inter, config.mlp_bias);
    weights.layers.push_back(std::move(layer));
  }
  weights.final_norm = norm("model.norm.weight", s.hidden);
  if (config.tie_word_embeddings)
    weights.lm_head = weights.embedding;
  else
    weights.lm_head = linear("lm_head", config.vocab_size, s.hidden, false);
  weights.mapped_files = reader.mapped_files();
  return weights;
}

ModelWeights random_model_weights(const ModelConfig& config, std::uint64_t seed, WeightDtype dtype) {
  check_fits_in_memory(config, dtype == WeightDtype::BFloat16 ? 2.0 : 4.0);
  at::manual_seed(seed);
  const at::ScalarType type = storage_type(dtype);
  // Normal(0, 0.02), transformers' initializer_range: layer outputs dominate the residual stream, so
  // a random model's greedy tokens vary like a real model's instead of echoing the input.
  return weights_of_shapes(config, [&](std::int64_t out, std::int64_t in) {
    Linear linear;
    linear.weight = empty_weight({out, in}, at::kFloat).normal_(0.0, 0.02);
    if (type != at::kFloat) linear.weight = as_weight(linear.weight, type);
    return linear;
  });
}

ModelWeights random_quantized_model_weights(const ModelConfig& config, std::uint64_t seed, GgufType type) {
  const GgufTypeInfo& info = gguf_type_info(type);
  const kernels::BlockType* block_type = kernels::find_block_type(type);
  if (block_type == nullptr || type == GgufType::F32 || type == GgufType::BF16)
    throw ModelError(std::string("random weights in ") + info.name +
                     " are not supported (f32 and bf16 are dtypes of their own)");
  check_fits_in_memory(config, double(info.block_bytes) / double(info.block_size));
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ULL + 1;
  return weights_of_shapes(
      config, [&](std::int64_t out, std::int64_t in) { return random_quantized_linear(out, in, *block_type, state); });
}

std::int64_t weight_bytes(const ModelWeights& weights, bool tied_lm_head) {
  std::int64_t bytes = weights.embedding.bytes() + weights.final_norm.nbytes();
  auto add = [&](const Linear& l) { bytes += l.bytes(); };
  for (const LayerWeights& layer : weights.layers) {
    bytes += layer.attention_norm.nbytes() + layer.mlp_norm.nbytes();
    for (const at::Tensor* norm : {&layer.q_norm, &layer.k_norm, &layer.post_attention_norm, &layer.post_mlp_norm})
      if (norm->defined()) bytes += norm->nbytes();
    for (const Linear* l : layer.matrices()) add(*l);
  }
  if (!tied_lm_head) add(weights.lm_head);
  return bytes;
}

}  // namespace kvchat
