#include "engine/llama_model.h"

#include <c10/core/InferenceMode.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "engine/compute_options.h"
#include "engine/kernels/activation.h"
#include "engine/kernels/attention.h"
#include "engine/kernels/bf16.h"
#include "engine/kernels/huge_pages.h"
#include "engine/kernels/matvec.h"
#include "engine/kernels/thread_pool.h"
#include "engine/rope.h"
#include "engine/safetensors.h"

namespace kvchat {

// Up to kStreamingRows rows of x, the weight-streaming kernels beat LibTorch's GEMM, which only pays
// off once each weight is reused enough; they take the rows kGroupRows at a time, one pass over W each.
constexpr std::int64_t kStreamingRows = 8;
constexpr std::int64_t kGroupRows = 4;
// From this many attended positions on, a streaming forward splits attention over the kernels' pool.
constexpr std::int64_t kParallelAttentionTokens = 256;
// The scores of a prefill's attention are computed in chunks of KV heads of about this many bytes.
constexpr std::int64_t kAttentionScoreBytes = 16 << 20;

at::Tensor Linear::forward(const at::Tensor& x) const {
  const std::int64_t rows = x.size(0), in = weight.size(1), out = weight.size(0);
  const bool bf16 = weight.scalar_type() == at::kBFloat16;
  if (fast_kernels_enabled() && rows <= kStreamingRows && weight.is_contiguous()) {
    at::Tensor input = x.contiguous();
    at::Tensor output = at::empty({rows, out}, at::kFloat);
    const float* bias_data = bias.defined() ? bias.data_ptr<float>() : nullptr;
    // Groups of up to kGroupRows rows share one pass over W.
    for (std::int64_t first = 0; first < rows; first += kGroupRows) {
      const std::int64_t n = std::min(kGroupRows, rows - first);
      const float* in_rows = input.data_ptr<float>() + first * in;
      float* out_rows = output.data_ptr<float>() + first * out;
      if (bf16) {
        const auto* w = reinterpret_cast<const std::uint16_t*>(weight.data_ptr<at::BFloat16>());
        if (n == 1) kernels::matvec_bf16(w, in_rows, out_rows, out, in, bias_data);
        else kernels::matmul_bf16_small(w, in_rows, out_rows, n, out, in, bias_data);
      } else {
        const float* w = weight.data_ptr<float>();
        if (n == 1) kernels::matvec_f32(w, in_rows, out_rows, out, in, bias_data);
        else kernels::matmul_f32_small(w, in_rows, out_rows, n, out, in, bias_data);
      }
    }
    return output;
  }
  at::Tensor w = weight;
  if (bf16) {
    // Prefill: widen bf16 weights to f32 chunk by chunk for sgemm (LibTorch's own bf16 matmul is ~40x
    // slower), into a buffer kept by the thread: a fresh one per product would cost a page fault and a
    // zero fill per 4 KiB, about a second per prefill chunk of a 1B model.
    thread_local at::Tensor widened;
    if (!widened.defined() || widened.numel() < out * in) widened = at::empty({out * in}, at::kFloat);
    w = widened.narrow(0, 0, out * in).view({out, in});
    if (fast_kernels_enabled() && weight.is_contiguous())
      kernels::bf16_to_f32(reinterpret_cast<const std::uint16_t*>(weight.data_ptr<at::BFloat16>()), w.data_ptr<float>(),
                           weight.numel());
    else
      w.copy_(weight);
  }
  return bias.defined() ? at::linear(x, w, bias) : at::linear(x, w);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  at::Tensor variance = x.pow(2).mean(-1, /*keepdim=*/true);
  return x * at::rsqrt(variance + eps) * weight;
}

LlamaModel::LlamaModel(ModelConfig config, ModelWeights weights)
    : config_(std::move(config)), weights_(std::move(weights)) {
  at::Tensor positions = at::arange(config_.max_position_embeddings, at::kLong);
  std::tie(rope_cos_, rope_sin_) = rope_cos_sin(config_, positions);
  fused_decode_ = fused_decode_applies();
}

KvCacheShape LlamaModel::cache_shape() const {
  return KvCacheShape{config_.num_hidden_layers, config_.num_key_value_heads, config_.head_dim,
                      config_.max_position_embeddings, at::kFloat};
}

WeightDtype LlamaModel::weight_dtype() const {
  return weights_.embedding.scalar_type() == at::kBFloat16 ? WeightDtype::BFloat16 : WeightDtype::Float32;
}

std::int64_t LlamaModel::weight_bytes() const {
  std::int64_t bytes = weights_.embedding.nbytes() + weights_.final_norm.nbytes();
  auto add = [&](const Linear& l) { bytes += l.weight.nbytes() + (l.bias.defined() ? l.bias.nbytes() : 0); };
  for (const LayerWeights& layer : weights_.layers) {
    bytes += layer.attention_norm.nbytes() + layer.mlp_norm.nbytes();
    for (const Linear* l : {&layer.q, &layer.k, &layer.v, &layer.o, &layer.gate, &layer.up, &layer.down}) add(*l);
  }
  if (!config_.tie_word_embeddings) add(weights_.lm_head);
  return bytes;
}

// Attention of grouped queries [KVH, group*T, d] over keys/values [KVH, total, d] into `out` (same
// shape as the queries). GQA without repeating K/V: query heads h = g*group + j share kv head g, so
// the group is folded into the query rows.
void LlamaModel::attend(const at::Tensor& grouped_q, const at::Tensor& keys, const at::Tensor& values,
                        const at::Tensor& mask, at::Tensor& out, bool streaming) const {
  const std::int64_t kv_heads = keys.size(0), total = keys.size(1), rows = grouped_q.size(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(config_.head_dim));
  auto attend_heads = [&](std::int64_t first, std::int64_t count) {
    at::Tensor k_heads = keys.narrow(0, first, count), v_heads = values.narrow(0, first, count);
    at::Tensor scores = at::matmul(grouped_q.narrow(0, first, count), k_heads.transpose(1, 2)).mul_(scale);
    if (mask.defined()) {
      const std::int64_t steps = mask.size(0);
      scores = scores.view({count, rows / steps, steps, total}).add_(mask).view({count, rows, total});
    }
    out.narrow(0, first, count).copy_(at::matmul(at::softmax(scores, -1), v_heads));
  };
  if (streaming && total >= kParallelAttentionTokens && kv_heads > 1) {
    // A long context makes attention a real share of a decode step: split it by KV head over the
    // kernels' pool (LibTorch's own threads are parked while streaming).
    kernels::default_thread_pool().parallel_for(kv_heads, [&](std::int64_t begin, std::int64_t end) {
      c10::InferenceMode worker_guard;  // the mode is per thread
      attend_heads(begin, end - begin);
    });
  } else {
    // A few KV heads at a time: all heads' scores at once would be [KVH, group*T, total] floats, twice
    // with the softmax (256 MiB for a 1B model's 512-token chunk against 2,048 positions), a large
    // share of peak memory next to the weights. Each chunk's matrix products stay large.
    const std::int64_t bytes_per_head = rows * total * static_cast<std::int64_t>(sizeof(float));
    const std::int64_t heads_per_chunk = std::clamp<std::int64_t>(kAttentionScoreBytes / bytes_per_head, 1, kv_heads);
    for (std::int64_t first = 0; first < kv_heads; first += heads_per_chunk)
      attend_heads(first, std::min(heads_per_chunk, kv_heads - first));
  }
}

namespace {

// Buffers of the fused decode step, one set per thread that runs it: reused by every step, so a
// decode step allocates nothing for its activations.
struct DecodeScratch {
  std::vector<float> x, h, q, k, v, attended, gate, up;
  std::vector<float> scores;  // [heads, positions]: grows with the context, never shrinks
  void reserve(const ModelConfig& c) {
    const auto q_size = static_cast<std::size_t>(c.num_attention_heads * c.head_dim);
    const auto kv_size = static_cast<std::size_t>(c.num_key_value_heads * c.head_dim);
    const auto hidden = static_cast<std::size_t>(c.hidden_size), inter = static_cast<std::size_t>(c.intermediate_size);
    x.resize(hidden);
    h.resize(std::max(hidden, q_size));
    q.resize(q_size);
    attended.resize(q_size);
    k.resize(kv_size);
    v.resize(kv_size);
    gate.resize(inter);
    up.resize(inter);
  }
};
thread_local DecodeScratch decode_scratch;

// out = x * rsqrt(mean(x^2) + eps) * weight, as transformers' LlamaRMSNorm (float32).
void rms_norm_into(const float* x, const float* weight, float* out, std::int64_t n, double eps) {
  double sum = 0;
  for (std::int64_t i = 0; i < n; ++i) sum += double(x[i]) * x[i];
  const float inverse = 1.0f / std::sqrt(static_cast<float>(sum / double(n)) + static_cast<float>(eps));
  for (std::int64_t i = 0; i < n; ++i) out[i] = (x[i] * inverse) * weight[i];
}

// y_i = W_i x for projections that share their input (q/k/v, gate/up), streamed as one parallel job.
template <typename Weight>
void shared_input_into(std::initializer_list<std::pair<const Linear*, float*>> products, const float* x) {
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

void shared_input_linears_into(std::initializer_list<std::pair<const Linear*, float*>> products, const float* x) {
  if (products.begin()->first->weight.scalar_type() == at::kBFloat16) shared_input_into<std::uint16_t>(products, x);
  else shared_input_into<float>(products, x);
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
      kernels::attention_decode_head(q + g * group * head_dim, rows->keys + g * rows->head_stride,
                                     rows->values + g * rows->head_stride, positions, head_dim, group, head_dim, scale,
                                     scores + g * group * positions, out + g * group * head_dim);
  }
};

}  // namespace

bool LlamaModel::fused_decode_applies() const {
  if (!weights_.embedding.is_contiguous()) return false;
  auto ok = [](const Linear& l) { return l.weight.is_contiguous(); };
  for (const LayerWeights& layer : weights_.layers)
    for (const Linear* l : {&layer.q, &layer.k, &layer.v, &layer.o, &layer.gate, &layer.up, &layer.down})
      if (!ok(*l)) return false;
  return ok(weights_.lm_head);
}

// One token at `position` with the cache: the same computation as forward() for T = 1, written out
// over per-thread buffers, the cache's rows and the engine kernels, so that a steady-state step makes
// no LibTorch call and no allocation (tiny models spent most of a step in LibTorch's per-call cost).
// A cache without direct rows (the naive one) gets its K/V through append and LibTorch attention.
void LlamaModel::decode_step(TokenId token, std::int64_t position, KvCache& cache, float* logits) const {
  const ModelConfig& c = config_;
  const std::int64_t hidden = c.hidden_size, heads = c.num_attention_heads, kv_heads = c.num_key_value_heads;
  const std::int64_t head_dim = c.head_dim, group = heads / kv_heads, inter = c.intermediate_size;
  DecodeScratch& s = decode_scratch;
  s.reserve(c);

  if (weights_.embedding.scalar_type() == at::kBFloat16) {
    kernels::bf16_to_f32(reinterpret_cast<const std::uint16_t*>(weights_.embedding.data_ptr<at::BFloat16>()) + token * hidden,
                         s.x.data(), hidden);
  } else {
    const float* row = weights_.embedding.data_ptr<float>() + token * hidden;
    std::copy(row, row + hidden, s.x.data());
  }
  const float* cos = rope_cos_.data_ptr<float>() + position * head_dim;
  const float* sin = rope_sin_.data_ptr<float>() + position * head_dim;
  const bool direct_rows = cache.prepare_rows(1);  // grows the cache, if it must, before any layer runs
  const std::int64_t positions = position + 1;     // attended: the cached ones and this one
  // Scores for as many positions as the cache can hold: the buffer grows when the cache does, not per token.
  const auto needed_scores = static_cast<std::size_t>(heads * std::max(positions, cache.capacity()));
  if (s.scores.size() < needed_scores) s.scores.resize(std::max(needed_scores, 2 * s.scores.size()));

  for (std::int64_t layer_index = 0; layer_index < c.num_hidden_layers; ++layer_index) {
    const LayerWeights& layer = weights_.layers[layer_index];
    rms_norm_into(s.x.data(), layer.attention_norm.data_ptr<float>(), s.h.data(), hidden, c.rms_norm_eps);
    shared_input_linears_into({{&layer.q, s.q.data()}, {&layer.k, s.k.data()}, {&layer.v, s.v.data()}}, s.h.data());
    rotate_into(s.q.data(), heads, head_dim, cos, sin);
    rotate_into(s.k.data(), kv_heads, head_dim, cos, sin);
    if (direct_rows) {
      const KvLayerRows rows = cache.layer_rows(layer_index);
      for (std::int64_t g = 0; g < kv_heads; ++g) {
        const std::int64_t slot = g * rows.head_stride + position * head_dim;
        std::copy_n(s.k.data() + g * head_dim, head_dim, rows.keys + slot);
        std::copy_n(s.v.data() + g * head_dim, head_dim, rows.values + slot);
      }
      const DecodeAttention attention{s.q.data(), &rows, positions, head_dim, group,
                                      1.0f / std::sqrt(static_cast<float>(head_dim)), s.scores.data(), s.attended.data()};
      // A long context makes attention a real share of the step: split it by KV head over the pool.
      if (positions >= kParallelAttentionTokens && kv_heads > 1)
        kernels::default_thread_pool().parallel_for(
            kv_heads, [job = &attention](std::int64_t first, std::int64_t last) { job->heads(first, last); });
      else
        attention.heads(0, kv_heads);
    } else {
      auto options = at::TensorOptions().dtype(at::kFloat);
      auto [keys, values] = cache.append(layer_index, at::from_blob(s.k.data(), {kv_heads, 1, head_dim}, options),
                                         at::from_blob(s.v.data(), {kv_heads, 1, head_dim}, options));
      at::Tensor attended = at::from_blob(s.attended.data(), {kv_heads, group, head_dim}, options);
      attend(at::from_blob(s.q.data(), {kv_heads, group, head_dim}, options), keys.to(at::kFloat),
             values.to(at::kFloat), at::Tensor(), attended, /*streaming=*/true);
    }

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
  linear_into(weights_.lm_head, s.h.data(), logits);
}

void LlamaModel::decode(TokenId token, std::int64_t position, KvCache& cache, float* logits) const {
  if (fused_decode_ && fast_kernels_enabled()) {
    check_request(&token, 1, position, &cache);
    enter_compute_phase(ComputePhase::Streaming);
    decode_step(token, position, cache, logits);
    return;
  }
  const at::Tensor row = forward({token}, position, &cache).contiguous();
  std::copy_n(row.data_ptr<float>(), config_.vocab_size, logits);
}

void LlamaModel::check_request(const TokenId* ids, std::int64_t steps, std::int64_t start_pos,
                               const KvCache* cache) const {
  if (steps == 0) throw std::invalid_argument("forward: no tokens");
  if (cache ? start_pos != cache->size() : start_pos != 0)
    throw std::invalid_argument("forward: start position " + std::to_string(start_pos) +
                                " does not follow the cache (" + std::to_string(cache ? cache->size() : 0) + " tokens)");
  if (start_pos + steps > config_.max_position_embeddings)
    throw std::length_error("forward: positions up to " + std::to_string(start_pos + steps) +
                            " exceed the context limit of " + std::to_string(config_.max_position_embeddings));
  for (std::int64_t i = 0; i < steps; ++i)
    if (ids[i] < 0 || ids[i] >= config_.vocab_size)
      throw std::out_of_range("forward: token id " + std::to_string(ids[i]) + " outside the vocabulary");
}

at::Tensor LlamaModel::forward(const std::vector<TokenId>& ids, std::int64_t start_pos, KvCache* cache,
                               bool all_positions) const {
  const std::int64_t steps = static_cast<std::int64_t>(ids.size());
  check_request(ids.data(), steps, start_pos, cache);

  const bool streaming = fast_kernels_enabled() && steps <= kStreamingRows;
  enter_compute_phase(streaming ? ComputePhase::Streaming : ComputePhase::Parallel);
  if (steps == 1 && cache && streaming && fused_decode_ && !all_positions) {
    at::Tensor logits = at::empty({config_.vocab_size}, at::kFloat);
    decode_step(ids[0], start_pos, *cache, logits.data_ptr<float>());
    return logits;
  }

  const std::int64_t heads = config_.num_attention_heads, kv_heads = config_.num_key_value_heads;
  const std::int64_t head_dim = config_.head_dim, group = heads / kv_heads;
  const std::int64_t total = start_pos + steps;  // keys attended to

  at::Tensor token_ids = at::from_blob(const_cast<TokenId*>(ids.data()), {steps}, at::kInt).to(at::kLong);
  at::Tensor x = weights_.embedding.index_select(0, token_ids).to(at::kFloat);  // [T, hidden]
  at::Tensor cos = rope_cos_.narrow(0, start_pos, steps), sin = rope_sin_.narrow(0, start_pos, steps);

  // One rectangular causal mask: query i sits at absolute position start_pos + i and sees keys
  // 0 .. start_pos + i. A single decode query sees everything, so it needs none.
  at::Tensor mask;
  if (steps > 1)
    mask = at::full({steps, total}, -std::numeric_limits<float>::infinity(), at::kFloat).triu(start_pos + 1);

  for (std::int64_t layer_index = 0; layer_index < config_.num_hidden_layers; ++layer_index) {
    const LayerWeights& layer = weights_.layers[layer_index];
    at::Tensor h = rms_norm(x, layer.attention_norm, config_.rms_norm_eps);
    at::Tensor q = layer.q.forward(h).view({steps, heads, head_dim}).transpose(0, 1);        // [H, T, d]
    at::Tensor k = layer.k.forward(h).view({steps, kv_heads, head_dim}).transpose(0, 1);     // [KVH, T, d]
    at::Tensor v = layer.v.forward(h).view({steps, kv_heads, head_dim}).transpose(0, 1);
    q = apply_rope(q, cos, sin);
    k = apply_rope(k, cos, sin);

    at::Tensor keys = k, values = v;  // [KVH, total, d]: compact, never repeated per query head
    if (cache) std::tie(keys, values) = cache->append(layer_index, k, v);

    // GQA without repeating K/V: query heads h = g*group + j share kv head g, so fold the group into
    // the query rows: [KVH, group*T, d] x [KVH, d, total].
    at::Tensor grouped_q = q.reshape({kv_heads, group * steps, head_dim});
    at::Tensor attended = at::empty({kv_heads, group * steps, head_dim}, at::kFloat);
    attend(grouped_q, keys, values, mask, attended, streaming);
    attended = attended.view({heads, steps, head_dim}).transpose(0, 1).reshape({steps, heads * head_dim});
    x = x + layer.o.forward(attended);

    h = rms_norm(x, layer.mlp_norm, config_.rms_norm_eps);
    at::Tensor gated = at::silu(layer.gate.forward(h)).mul_(layer.up.forward(h));
    x = x + layer.down.forward(gated);
  }
  if (cache) cache->commit(steps);

  // Only the positions asked for go through the final norm and the (large) lm_head.
  at::Tensor last = all_positions ? x : x.narrow(0, steps - 1, 1);
  at::Tensor logits = weights_.lm_head.forward(rms_norm(last, weights_.final_norm, config_.rms_norm_eps));
  return all_positions ? logits : logits.squeeze(0);
}

// ---------------------------------------------------------------------------------------------
// Construction: from a checkpoint, or random.

namespace {

at::ScalarType storage_type(WeightDtype dtype) { return dtype == WeightDtype::BFloat16 ? at::kBFloat16 : at::kFloat; }

// Weight storage on transparent huge pages: decode streams every weight once per token, and 4 KiB
// pages cost about a tenth of the read bandwidth in TLB misses and prefetcher restarts.
at::Tensor empty_weight(const std::vector<std::int64_t>& shape, at::ScalarType type) {
  std::size_t bytes = c10::elementSize(type);
  for (std::int64_t dim : shape) bytes *= static_cast<std::size_t>(dim);
  if (bytes < (std::size_t(4) << 20)) return at::empty(shape, at::TensorOptions().dtype(type));
  void* buffer = kernels::allocate_huge_page_buffer(bytes);
  return at::from_blob(buffer, shape, [bytes](void* data) { kernels::free_huge_page_buffer(data, bytes); },
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

class CheckpointReader {
 public:
  CheckpointReader(const std::string& directory, WeightDtype dtype) : checkpoint_(directory), dtype_(dtype) {}

  // A weight matrix kept in the storage dtype; a checkpoint already in that dtype is not copied.
  at::Tensor matrix(const std::string& name, std::vector<std::int64_t> shape) {
    return as_weight(checked(name, shape), storage_type(dtype_));
  }
  // Norm weights and biases are tiny: always f32.
  at::Tensor vector(const std::string& name, std::int64_t size) { return checked(name, {size}).to(at::kFloat); }
  bool contains(const std::string& name) const { return checkpoint_.contains(name); }

 private:
  at::Tensor checked(const std::string& name, const std::vector<std::int64_t>& shape) {
    if (!checkpoint_.contains(name)) throw ModelError("checkpoint is missing tensor '" + name + "'");
    const SafetensorsEntry& entry = checkpoint_.entry(name);
    if (entry.shape != shape) {
      auto text = [](const std::vector<std::int64_t>& s) {
        std::string out = "[";
        for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
        return out + "]";
      };
      throw ModelError(checkpoint_.file_of(name) + ": tensor '" + name + "' has shape " + text(entry.shape) +
                       " but the config needs " + text(shape));
    }
    return checkpoint_.tensor(name);
  }

  SafetensorsCheckpoint checkpoint_;
  WeightDtype dtype_;
};

}  // namespace

std::shared_ptr<LlamaModel> LlamaModel::from_checkpoint(const std::string& directory, const ModelConfig& config,
                                                        WeightDtype dtype) {
  CheckpointReader reader(directory, dtype);
  const std::int64_t hidden = config.hidden_size, inter = config.intermediate_size;
  const std::int64_t q_out = config.num_attention_heads * config.head_dim;
  const std::int64_t kv_out = config.num_key_value_heads * config.head_dim;
  auto linear = [&](const std::string& prefix, std::int64_t out, std::int64_t in, bool has_bias) {
    Linear l;
    l.weight = reader.matrix(prefix + ".weight", {out, in});
    if (has_bias) l.bias = reader.vector(prefix + ".bias", out);
    return l;
  };

  ModelWeights weights;
  weights.embedding = reader.matrix("model.embed_tokens.weight", {config.vocab_size, hidden});
  for (std::int64_t i = 0; i < config.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i);
    LayerWeights layer;
    layer.attention_norm = reader.vector(p + ".input_layernorm.weight", hidden);
    layer.q = linear(p + ".self_attn.q_proj", q_out, hidden, config.attention_bias);
    layer.k = linear(p + ".self_attn.k_proj", kv_out, hidden, config.attention_bias);
    layer.v = linear(p + ".self_attn.v_proj", kv_out, hidden, config.attention_bias);
    layer.o = linear(p + ".self_attn.o_proj", hidden, q_out, config.attention_bias);
    layer.mlp_norm = reader.vector(p + ".post_attention_layernorm.weight", hidden);
    layer.gate = linear(p + ".mlp.gate_proj", inter, hidden, config.mlp_bias);
    layer.up = linear(p + ".mlp.up_proj", inter, hidden, config.mlp_bias);
    layer.down = linear(p + ".mlp.down_proj", hidden, inter, config.mlp_bias);
    weights.layers.push_back(std::move(layer));
  }
  weights.final_norm = reader.vector("model.norm.weight", hidden);
  if (config.tie_word_embeddings) {
    weights.lm_head.weight = weights.embedding;
  } else {
    weights.lm_head = linear("lm_head", config.vocab_size, hidden, false);
  }
  auto model = std::make_shared<LlamaModel>(config, std::move(weights));
  spdlog::info("loaded {}: {} layers, hidden {}, heads {}/{} (kv), vocab {}, {:.1f} MiB of {} weights", directory,
               config.num_hidden_layers, hidden, config.num_attention_heads, config.num_key_value_heads,
               config.vocab_size, model->weight_bytes() / 1048576.0, to_string(dtype));
  return model;
}

std::shared_ptr<LlamaModel> LlamaModel::random(const ModelConfig& config, std::uint64_t seed, WeightDtype dtype) {
  at::manual_seed(seed);
  const at::ScalarType type = storage_type(dtype);
  const std::int64_t hidden = config.hidden_size, inter = config.intermediate_size;
  const std::int64_t q_out = config.num_attention_heads * config.head_dim;
  const std::int64_t kv_out = config.num_key_value_heads * config.head_dim;
  // Normal(0, 0.02), transformers' initializer_range: layer outputs dominate the residual stream, so
  // a random model's greedy tokens vary like a real model's instead of echoing the input.
  auto matrix = [&](std::int64_t out, std::int64_t in) {
    at::Tensor weight = empty_weight({out, in}, at::kFloat).normal_(0.0, 0.02);
    return type == at::kFloat ? weight : as_weight(weight, type);
  };
  auto linear = [&](std::int64_t out, std::int64_t in) { return Linear{matrix(out, in), at::Tensor()}; };
  auto norm = [&]() { return at::ones({hidden}, at::kFloat); };

  ModelWeights weights;
  weights.embedding = matrix(config.vocab_size, hidden);
  for (std::int64_t i = 0; i < config.num_hidden_layers; ++i) {
    LayerWeights layer;
    layer.attention_norm = norm();
    layer.q = linear(q_out, hidden);
    layer.k = linear(kv_out, hidden);
    layer.v = linear(kv_out, hidden);
    layer.o = linear(hidden, q_out);
    layer.mlp_norm = norm();
    layer.gate = linear(inter, hidden);
    layer.up = linear(inter, hidden);
    layer.down = linear(hidden, inter);
    weights.layers.push_back(std::move(layer));
  }
  weights.final_norm = norm();
  weights.lm_head = config.tie_word_embeddings ? Linear{weights.embedding, at::Tensor()} : linear(config.vocab_size, hidden);
  return std::make_shared<LlamaModel>(config, std::move(weights));
}

}  // namespace kvchat
