// The fused decode step of LlamaModel: one token through every layer over the engine kernels, the
// session's DecodeContext and the cache's rows, so that a steady-state step makes no LibTorch call and
// no allocation (tiny models spent most of a step in LibTorch's per-call cost). The same computation
// as LlamaModel::forward for one token; the fidelity tests compare the two.
//
// Also the row-exact forward (forward_rows): a prompt through the same kernels, each token's row
// computed exactly as a decode step computes it, for models whose products round their input to one
// byte per value (the K-quants). There the rounding is coarse enough that a last-bit difference
// between a prompt's path and a decode step's (a GEMM's order of additions, a batched norm) flips
// roundings and moves logits by the rounding's own size; computed the same way, a prompt, its tokens
// decoded one by one, and the uncached recomputation give bit-identical logits.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "engine/kernels/activation.h"
#include "engine/kernels/attention.h"
#include "engine/kernels/bf16.h"
#include "engine/kernels/matvec.h"
#include "engine/kernels/quantized_matvec.h"
#include "engine/kernels/thread_pool.h"
#include "engine/llama_model.h"

namespace kvchat {

void DecodeContext::reserve(const ModelConfig& c, std::int64_t positions) {
  const auto q_size = static_cast<std::size_t>(c.num_attention_heads * c.head_dim);
  const auto kv_size = static_cast<std::size_t>(c.num_key_value_heads * c.head_dim);
  const auto hidden = static_cast<std::size_t>(c.hidden_size), inter = static_cast<std::size_t>(c.intermediate_size);
  logits.resize(static_cast<std::size_t>(c.vocab_size));
  x.resize(hidden);
  h.resize(std::max(hidden, q_size));
  q.resize(q_size);
  attended.resize(q_size);
  k.resize(kv_size);
  v.resize(kv_size);
  gate.resize(inter);
  up.resize(inter);
  // Sized for what the cache can hold, so the buffer grows when the cache does, not per token.
  const auto needed_scores = static_cast<std::size_t>(c.num_attention_heads * positions);
  if (scores.size() < needed_scores) scores.resize(std::max(needed_scores, 2 * scores.size()));
}

namespace {

// out = x * rsqrt(mean(x^2) + eps) * weight, as transformers' LlamaRMSNorm (float32).
void rms_norm_into(const float* x, const float* weight, float* out, std::int64_t n, double eps) {
  double sum = 0;
  for (std::int64_t i = 0; i < n; ++i) sum += double(x[i]) * x[i];
  const float inverse = 1.0f / std::sqrt(static_cast<float>(sum / double(n)) + static_cast<float>(eps));
  for (std::int64_t i = 0; i < n; ++i) out[i] = (x[i] * inverse) * weight[i];
}

// Up to three products that share their input (q/k/v, gate/up): each matrix and where its output goes.
// A plain value on the stack: a decode step allocates nothing here.
struct SharedInputLinears {
  std::pair<const Linear*, float*> items[3];
  int count = 0;
  SharedInputLinears(std::initializer_list<std::pair<const Linear*, float*>> products) {
    for (const auto& product : products) items[count++] = product;
  }
  const std::pair<const Linear*, float*>* begin() const { return items; }
  const std::pair<const Linear*, float*>* end() const { return items + count; }
};

// y_i = W_i x for projections that share their input, streamed as one parallel job.
template <typename Weight>
void shared_input_into(const SharedInputLinears& products, const float* x) {
  kernels::SharedInputProduct<Weight> jobs[3];  // on the stack: a decode step allocates nothing here
  int count = 0;
  for (auto [linear, y] : products) {
    const void* data = linear->weight.data_ptr();
    jobs[count++] = {static_cast<const Weight*>(data), y, linear->weight.size(0),
                     linear->bias.defined() ? static_cast<const float*>(linear->bias.data_ptr()) : nullptr};
  }
  const std::int64_t in = products.begin()->first->weight.size(1);
  if constexpr (std::is_same_v<Weight, float>) kernels::matvec_f32_shared_input(jobs, count, x, in);
  else kernels::matvec_bf16_shared_input(jobs, count, x, in);
}

// The view of a matrix for the quantized kernels; f32 and bf16 tensors are GGUF F32 and BF16 rows.
kernels::QuantizedMatrixView quantized_view(const Linear& linear) {
  if (linear.is_quantized()) return linear.quantized.view;
  const bool bf16 = linear.weight.scalar_type() == at::kBFloat16;
  const std::int64_t in = linear.weight.size(1);
  return {bf16 ? GgufType::BF16 : GgufType::F32, static_cast<const std::uint8_t*>(linear.weight.data_ptr()),
          linear.weight.size(0), in, in * (bf16 ? 2 : 4)};
}

// Products that share their input go to the kernels of their common storage type; a mix (or a GGUF
// type) goes to the quantized kernels, which take each matrix in its own type.
void shared_input_linears_into(const SharedInputLinears& products, const float* x) {
  bool all_f32 = true, all_bf16 = true;
  for (const auto& [linear, y] : products) {
    all_f32 = all_f32 && !linear->is_quantized() && linear->weight.scalar_type() == at::kFloat;
    all_bf16 = all_bf16 && !linear->is_quantized() && linear->weight.scalar_type() == at::kBFloat16;
  }
  if (all_f32) return shared_input_into<float>(products, x);
  if (all_bf16) return shared_input_into<std::uint16_t>(products, x);
  kernels::SharedInputQuantizedProduct jobs[3];
  int count = 0;
  for (auto [linear, y] : products)
    jobs[count++] = {quantized_view(*linear), y,
                     linear->bias.defined() ? static_cast<const float*>(linear->bias.data_ptr()) : nullptr};
  kernels::matvec_quantized_shared_input(jobs, count, x);
}

// y = W x (+ b) through the weight-streaming kernels: a one-product job.
void linear_into(const Linear& linear, const float* x, float* y) { shared_input_linears_into({{&linear, y}}, x); }

// HF rotate_half RoPE of `heads` vectors of head_dim at one position, in place.
void rotate_into(float* vectors, std::int64_t heads, std::int64_t head_dim, const float* cos, const float* sin) {
  const std::int64_t half = head_dim / 2;
  for (std::int64_t head = 0; head < heads; ++head) {
    float* v = vectors + head * head_dim;
    for (std::int64_t i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * cos[i] - b * sin[i];
      v[i + half] = b * cos[i + half] + a * sin[i + half];
    }
  }
}

// The attention of one decode step over the cache rows of a layer, KV head by KV head. Passed to the
// pool by pointer so that the job fits std::function's small buffer (no allocation per layer).
struct DecodeAttention {
  const float* q;
  const KvLayerRows* rows;
  std::int64_t positions, head_dim, group;
  float scale;
  float* scores;  // [heads, positions]
  float* out;     // [heads, head_dim]
  void heads(std::int64_t first, std::int64_t last) const {
    for (std::int64_t g = first; g < last; ++g)
      kernels::attention_decode_head(q + g * group * head_dim, rows->head_keys(g), rows->head_values(g), positions,
                                     head_dim, group, head_dim, scale, scores + g * group * positions,
                                     out + g * group * head_dim);
  }
};

// y[i] = W x[i] (+ b) for n input rows and products that share their input, each row computed as
// shared_input_linears_into computes a single one: rows of the f32 and bf16 kernels one at a time (their
// matrix kernels add in another order), the quantized kernels over all rows at once (their result for a
// row does not depend on the others).
void shared_input_linears_rows(const SharedInputLinears& products, const float* x, std::int64_t n) {
  bool all_f32 = true, all_bf16 = true;
  for (const auto& [linear, y] : products) {
    all_f32 = all_f32 && !linear->is_quantized() && linear->weight.scalar_type() == at::kFloat;
    all_bf16 = all_bf16 && !linear->is_quantized() && linear->weight.scalar_type() == at::kBFloat16;
  }
  if (all_f32 || all_bf16) {
    const std::int64_t in = products.begin()->first->in_features();
    for (std::int64_t i = 0; i < n; ++i) {
      SharedInputLinears row = products;
      for (auto& [linear, y] : row.items) y += linear ? i * linear->out_features() : 0;
      shared_input_linears_into(row, x + i * in);
    }
    return;
  }
  for (auto [linear, y] : products)
    kernels::matmul_quantized(quantized_view(*linear), x, y, n,
                              linear->bias.defined() ? static_cast<const float*>(linear->bias.data_ptr()) : nullptr);
}

// A float tensor [kv_heads, positions, head_dim] whose rows are contiguous, as the attention kernel reads them.
at::Tensor attention_rows(const at::Tensor& t) {
  if (t.scalar_type() == at::kFloat && t.stride(2) == 1 && t.stride(1) == t.size(2)) return t;
  return t.to(at::kFloat).contiguous();
}

}  // namespace

at::Tensor LlamaModel::forward_rows(const TokenId* ids, std::int64_t steps, std::int64_t start_pos, KvCache* cache,
                                    bool all_positions) const {
  const ModelConfig& c = config_;
  const std::int64_t hidden = c.hidden_size, heads = c.num_attention_heads, kv_heads = c.num_key_value_heads;
  const std::int64_t head_dim = c.head_dim, group = heads / kv_heads, inter = c.intermediate_size;
  const std::int64_t q_size = heads * head_dim, kv_size = kv_heads * head_dim;
  enter_compute_phase(ComputePhase::Streaming);
  rope_.ensure(start_pos + steps);
  // Each token's row of every activation, as a decode step holds one: [steps, width].
  std::vector<float> x(steps * hidden), h(steps * std::max(hidden, q_size)), q(steps * q_size), attended(steps * q_size);
  std::vector<float> k(steps * kv_size), v(steps * kv_size), gate(steps * inter), up(steps * inter);
  for (std::int64_t i = 0; i < steps; ++i) weights_.embedding.row_into(ids[i], x.data() + i * hidden);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));

  for (std::int64_t layer_index = 0; layer_index < c.num_hidden_layers; ++layer_index) {
    const LayerWeights& layer = weights_.layers[layer_index];
    for (std::int64_t i = 0; i < steps; ++i)
      rms_norm_into(x.data() + i * hidden, layer.attention_norm.data_ptr<float>(), h.data() + i * hidden, hidden, c.rms_norm_eps);
    shared_input_linears_rows({{&layer.q, q.data()}, {&layer.k, k.data()}, {&layer.v, v.data()}}, h.data(), steps);
    for (std::int64_t i = 0; i < steps; ++i) {
      const float* cos = rope_.cos_row(start_pos + i);
      const float* sin = rope_.sin_row(start_pos + i);
      rotate_into(q.data() + i * q_size, heads, head_dim, cos, sin);
      rotate_into(k.data() + i * kv_size, kv_heads, head_dim, cos, sin);
    }
    // [kv_heads, steps, head_dim] views of the new rows; with a cache, its keys and values of every position.
    at::Tensor keys = at::from_blob(k.data(), {steps, kv_heads, head_dim}, at::kFloat).transpose(0, 1);
    at::Tensor values = at::from_blob(v.data(), {steps, kv_heads, head_dim}, at::kFloat).transpose(0, 1);
    if (cache) std::tie(keys, values) = cache->append(layer_index, keys, values);
    keys = attention_rows(keys);
    values = attention_rows(values);
    // The cache's rows (and their copies) keep keys and values in one layout.
    const KvLayerRows rows{keys.data_ptr<float>(), values.data_ptr<float>(), keys.stride(0)};
    if (values.stride(0) != rows.head_stride) throw std::logic_error("forward_rows: keys and values differ in layout");

    // Token i at position start_pos + i attends to positions 0 .. start_pos + i: the decode step's
    // attention per token and KV head, spread over the pool. Items run KV head by KV head, so that a
    // thread's consecutive tokens read the same head's keys and values while they are in cache.
    struct RowsAttention {
      const float* q;
      const KvLayerRows* rows;
      std::int64_t steps, start_pos, q_size, head_dim, group;
      float scale;
      float* out;
      void items(std::int64_t first, std::int64_t last) const {
        thread_local std::vector<float> scores;
        for (std::int64_t item = first; item < last; ++item) {
          const std::int64_t g = item / steps, i = item % steps, positions = start_pos + i + 1;
          // DecodeAttention keeps each KV head's scores at its own offset: [heads up to g + 1, positions].
          if (scores.size() < static_cast<std::size_t>((g + 1) * group * positions)) scores.resize((g + 1) * group * positions);
          const DecodeAttention token{q + i * q_size, rows, positions, head_dim, group, scale, scores.data(), out + i * q_size};
          token.heads(g, g + 1);
        }
      }
    } const attention{q.data(), &rows, steps, start_pos, q_size, head_dim, group, scale, attended.data()};
    kernels::default_thread_pool().parallel_for(
        steps * kv_heads, [job = &attention](std::int64_t first, std::int64_t last) { job->items(first, last); });

    shared_input_linears_rows({{&layer.o, h.data()}}, attended.data(), steps);
    for (std::int64_t j = 0; j < steps * hidden; ++j) x[j] += h[j];

    for (std::int64_t i = 0; i < steps; ++i)
      rms_norm_into(x.data() + i * hidden, layer.mlp_norm.data_ptr<float>(), h.data() + i * hidden, hidden, c.rms_norm_eps);
    shared_input_linears_rows({{&layer.gate, gate.data()}, {&layer.up, up.data()}}, h.data(), steps);
    for (std::int64_t i = 0; i < steps; ++i) kernels::silu_mul(gate.data() + i * inter, up.data() + i * inter, inter);
    shared_input_linears_rows({{&layer.down, h.data()}}, gate.data(), steps);
    for (std::int64_t j = 0; j < steps * hidden; ++j) x[j] += h[j];
  }
  if (cache) cache->commit(steps);

  // Only the positions asked for go through the final norm and the (large) lm_head.
  const std::int64_t first = all_positions ? 0 : steps - 1, rows = steps - first;
  for (std::int64_t i = 0; i < rows; ++i)
    rms_norm_into(x.data() + (first + i) * hidden, weights_.final_norm.data_ptr<float>(), h.data() + i * hidden, hidden,
                  c.rms_norm_eps);
  at::Tensor logits = at::empty({rows, c.vocab_size}, at::kFloat);
  shared_input_linears_rows({{&weights_.lm_head, logits.data_ptr<float>()}}, h.data(), rows);
  return all_positions ? logits : logits.squeeze(0);
}

void LlamaModel::decode_step(TokenId token, std::int64_t position, KvCache& cache, DecodeContext& s) const {
  const ModelConfig& c = config_;
  const std::int64_t hidden = c.hidden_size, heads = c.num_attention_heads, kv_heads = c.num_key_value_heads;
  const std::int64_t head_dim = c.head_dim, group = heads / kv_heads, inter = c.intermediate_size;
  rope_.ensure(position + 1);
  const float* cos = rope_.cos_row(position);
  const float* sin = rope_.sin_row(position);
  const std::int64_t positions = position + 1;  // attended: the cached ones and this one
  weights_.embedding.row_into(token, s.x.data());

  for (std::int64_t layer_index = 0; layer_index < c.num_hidden_layers; ++layer_index) {
    const LayerWeights& layer = weights_.layers[layer_index];
    rms_norm_into(s.x.data(), layer.attention_norm.data_ptr<float>(), s.h.data(), hidden, c.rms_norm_eps);
    shared_input_linears_into({{&layer.q, s.q.data()}, {&layer.k, s.k.data()}, {&layer.v, s.v.data()}}, s.h.data());
    rotate_into(s.q.data(), heads, head_dim, cos, sin);
    rotate_into(s.k.data(), kv_heads, head_dim, cos, sin);
    cache.write_rows(layer_index, position, s.k.data(), s.v.data());

    const KvLayerRows rows = cache.layer_rows(layer_index);
    const DecodeAttention attention{s.q.data(), &rows, positions, head_dim, group,
                                    1.0f / std::sqrt(static_cast<float>(head_dim)), s.scores.data(), s.attended.data()};
    // A long context makes attention a real share of the step: split it by KV head over the pool.
    if (parallel_attention(positions))
      kernels::default_thread_pool().parallel_for(
          kv_heads, [job = &attention](std::int64_t first, std::int64_t last) { job->heads(first, last); });
    else
      attention.heads(0, kv_heads);

    linear_into(layer.o, s.attended.data(), s.h.data());
    for (std::int64_t i = 0; i < hidden; ++i) s.x[i] += s.h[i];

    rms_norm_into(s.x.data(), layer.mlp_norm.data_ptr<float>(), s.h.data(), hidden, c.rms_norm_eps);
    shared_input_linears_into({{&layer.gate, s.gate.data()}, {&layer.up, s.up.data()}}, s.h.data());
    kernels::silu_mul(s.gate.data(), s.up.data(), inter);
    linear_into(layer.down, s.gate.data(), s.h.data());
    for (std::int64_t i = 0; i < hidden; ++i) s.x[i] += s.h[i];
  }
  cache.commit(1);

  rms_norm_into(s.x.data(), weights_.final_norm.data_ptr<float>(), s.h.data(), hidden, c.rms_norm_eps);
  linear_into(weights_.lm_head, s.h.data(), s.logits.data());
}

}  // namespace kvchat
