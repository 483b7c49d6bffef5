#pragma once
// An independent forward pass in plain LibTorch operations, kept only as a test oracle for
// LlamaModel's own forward (engine/model/llama_forward.cpp): whole tensors instead of row buffers, one
// rectangular causal mask (triu(-inf, diagonal = past + 1)) instead of a count of keys per row, RoPE
// by rotate_half on tensors, and exact products (every matrix decoded to f32, the input never rounded).
// Written from the transformers Llama model, not from the engine's code.
#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "engine/cache/kv_cache.h"
#include "engine/model/llama_model.h"
#include "engine/model/rope.h"

namespace kvchat::test {

inline at::Tensor reference_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor variance = x.pow(2).mean(-1, /*keepdim=*/true);
  return x * at::rsqrt(variance + eps) * weight;
}

// x [heads, T, head_dim]; cos/sin [T, head_dim]: x*cos + rotate_half(x)*sin.
inline at::Tensor reference_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const std::int64_t half = x.size(-1) / 2;
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

// The matrix as f32 [out, in], whatever it is kept in.
inline at::Tensor reference_matrix(const Linear& linear) {
  if (!linear.is_quantized()) return linear.weight.to(at::kFloat);
  const kvchat::kernels::QuantizedMatrixView& view = linear.quantized.view;
  at::Tensor matrix = at::empty({view.rows, view.cols}, at::kFloat);
  kvchat::kernels::dequantize_rows(view, 0, view.rows, matrix.data_ptr<float>());
  return matrix;
}

inline at::Tensor reference_product(const Linear& linear, const at::Tensor& x) {
  const at::Tensor w = reference_matrix(linear);
  return linear.bias.defined() ? at::linear(x, w, linear.bias) : at::linear(x, w);
}

// The tokens `ids` at positions start_pos.. through `model`; with a cache (start_pos == cache->size())
// its keys and values are used and the new ones appended and committed. Logits [vocab] of the last
// position, or [T, vocab] of every position if all_positions.
inline at::Tensor reference_forward(const LlamaModel& model, const std::vector<TokenId>& ids, std::int64_t start_pos,
                                    KvCache* cache, bool all_positions = false) {
  const ModelConfig& config = model.config();
  const ModelWeights& weights = model.weights();
  const auto steps = static_cast<std::int64_t>(ids.size());
  if (steps == 0 || start_pos != (cache ? cache->size() : 0))
    throw std::invalid_argument("reference_forward: bad request");
  const std::int64_t heads = config.num_attention_heads, kv_heads = config.num_key_value_heads;
  const std::int64_t head_dim = config.head_dim, group = heads / kv_heads, total = start_pos + steps;

  std::vector<std::int64_t> id_values(ids.begin(), ids.end());
  at::Tensor x = reference_matrix(weights.embedding).index_select(0, at::tensor(id_values, at::kLong));  // [T, hidden]
  std::vector<std::int64_t> position_values;
  for (std::int64_t i = 0; i < steps; ++i) position_values.push_back(start_pos + i);
  auto [cos, sin] = rope_cos_sin(config, at::tensor(position_values, at::kLong));
  at::Tensor mask = at::full({steps, total}, -std::numeric_limits<float>::infinity(), at::kFloat).triu(start_pos + 1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));

  for (std::int64_t layer_index = 0; layer_index < config.num_hidden_layers; ++layer_index) {
    const LayerWeights& layer = weights.layers[static_cast<std::size_t>(layer_index)];
    at::Tensor h = reference_rms_norm(x, layer.attention_norm, config.rms_norm_eps);
    at::Tensor q = reference_product(layer.q, h).view({steps, heads, head_dim}).transpose(0, 1);
    at::Tensor k = reference_product(layer.k, h).view({steps, kv_heads, head_dim}).transpose(0, 1);
    at::Tensor v = reference_product(layer.v, h).view({steps, kv_heads, head_dim}).transpose(0, 1);
    if (config.qk_norm) {  // per head, over head_dim
      q = reference_rms_norm(q, layer.q_norm, config.rms_norm_eps);
      k = reference_rms_norm(k, layer.k_norm, config.rms_norm_eps);
    }
    q = reference_rope(q, cos, sin);
    k = reference_rope(k, cos, sin);
    at::Tensor keys = k, values = v;  // [KVH, total, d]
    if (cache) std::tie(keys, values) = cache->append(layer_index, k, v);
    // Each query head h reads KV head h / group: repeat the compact K/V for the score matmul here.
    keys = keys.to(at::kFloat).repeat_interleave(group, 0);
    values = values.to(at::kFloat).repeat_interleave(group, 0);
    at::Tensor scores = at::matmul(q, keys.transpose(1, 2)).mul(scale).add(mask);  // [H, T, total]
    at::Tensor attended = at::matmul(at::softmax(scores, -1), values);             // [H, T, d]
    attended = attended.transpose(0, 1).reshape({steps, heads * head_dim});
    x = x + reference_product(layer.o, attended);
    h = reference_rms_norm(x, layer.mlp_norm, config.rms_norm_eps);
    x = x + reference_product(layer.down, at::silu(reference_product(layer.gate, h)) * reference_product(layer.up, h));
  }
  if (cache) cache->commit(steps);
  const at::Tensor last = all_positions ? x : x.narrow(0, steps - 1, 1);
  const at::Tensor logits =
      reference_product(weights.lm_head, reference_rms_norm(last, weights.final_norm, config.rms_norm_eps));
  return all_positions ? logits : logits.squeeze(0);
}

}  // namespace kvchat::test
