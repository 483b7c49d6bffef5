#include "engine/llama_model.h"

#include <c10/core/InferenceMode.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "engine/compute_options.h"
#include "engine/kernels/quantized_matvec.h"
#include "engine/kernels/thread_pool.h"
#include "engine/rope.h"

namespace kvchat {

// The scores of a prefill's attention are computed in chunks of KV heads of about this many bytes.
constexpr std::int64_t kAttentionScoreBytes = 16 << 20;

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  at::Tensor variance = x.pow(2).mean(-1, /*keepdim=*/true);
  return x * at::rsqrt(variance + eps) * weight;
}

void copy_logits(const at::Tensor& row, std::vector<float>& logits) {
  const at::Tensor values = row.contiguous();
  logits.assign(values.data_ptr<float>(), values.data_ptr<float>() + values.numel());
}

LlamaModel::LlamaModel(ModelConfig config, ModelWeights weights)
    : config_(std::move(config)), weights_(std::move(weights)), rope_(config_) {
  fused_decode_ = fused_decode_applies();
  auto rounds_input = [](const Linear& l) {
    return l.is_quantized() && kernels::activation_rounding(l.quantized.view.type) != kernels::ActivationRounding::None;
  };
  bool any_rounded_input = rounds_input(weights_.lm_head);
  streaming_rows_ = weights_.lm_head.streaming_rows();
  for (const LayerWeights& layer : weights_.layers)
    for (const Linear* l : layer.matrices()) {
      any_rounded_input = any_rounded_input || rounds_input(*l);
      streaming_rows_ = std::min(streaming_rows_, l->streaming_rows());
    }
  row_exact_ = fused_decode_ && any_rounded_input;
}

std::shared_ptr<LlamaModel> LlamaModel::from_checkpoint(const std::string& directory, const ModelConfig& config,
                                                        WeightDtype dtype) {
  auto model = std::make_shared<LlamaModel>(config, load_model_weights(directory, config, dtype));
  spdlog::info("loaded {}: {} layers, hidden {}, heads {}/{} (kv), vocab {}, {:.1f} MiB of {} weights", directory,
               config.num_hidden_layers, config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
               config.vocab_size, model->weight_bytes() / 1048576.0, model->weight_types());
  return model;
}

std::shared_ptr<LlamaModel> LlamaModel::random(const ModelConfig& config, std::uint64_t seed, WeightDtype dtype) {
  return std::make_shared<LlamaModel>(config, random_model_weights(config, seed, dtype));
}

KvCacheShape LlamaModel::cache_shape() const {
  return KvCacheShape{config_.num_hidden_layers, config_.num_key_value_heads, config_.head_dim,
                      config_.max_position_embeddings, at::kFloat};
}

void LlamaModel::check_files_unchanged() const {
  for (const FileIdentity& file : weights_.mapped_files) {
    const std::string change = file.change();
    if (!change.empty())
      throw ModelError("the model file " + file.path + " changed on disk after it was loaded (" + change +
                       "); load the model again");
  }
}

std::string LlamaModel::weight_types() const {
  // Bytes per type name over every matrix, largest share first.
  std::vector<std::pair<std::string, std::int64_t>> shares;
  auto add = [&](const Linear& l) {
    const std::string name = l.type_name();
    auto found = std::find_if(shares.begin(), shares.end(), [&](const auto& share) { return share.first == name; });
    if (found == shares.end()) shares.emplace_back(name, l.bytes());
    else found->second += l.bytes();
  };
  add(weights_.embedding);
  for (const LayerWeights& layer : weights_.layers)
    for (const Linear* l : layer.matrices()) add(*l);
  if (!config_.tie_word_embeddings) add(weights_.lm_head);
  std::stable_sort(shares.begin(), shares.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string text;
  for (const auto& share : shares) text += (text.empty() ? "" : "+") + share.first;
  return text;
}

std::int64_t LlamaModel::weight_bytes() const { return kvchat::weight_bytes(weights_, config_.tie_word_embeddings); }

bool LlamaModel::fused_decode_applies() const {
  auto ok = [](const Linear& l) { return l.is_quantized() || l.weight.is_contiguous(); };
  if (!ok(weights_.embedding)) return false;
  for (const LayerWeights& layer : weights_.layers)
    for (const Linear* l : layer.matrices())
      if (!ok(*l)) return false;
  return ok(weights_.lm_head);
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

void LlamaModel::decode(TokenId token, std::int64_t position, KvCache& cache, DecodeContext& context) const {
  check_request(&token, 1, position, &cache);
  context.reserve(config_, std::max(position + 1, cache.capacity()));
  // prepare_rows grows the cache, if it must, before any layer runs; the naive cache has no rows.
  if (fused_decode_ && fast_kernels_enabled() && cache.prepare_rows(1)) {
    enter_compute_phase(ComputePhase::Streaming);
    decode_step(token, position, cache, context);
    return;
  }
  copy_logits(forward_checked(&token, 1, position, &cache, /*all_positions=*/false), context.logits);
}

bool LlamaModel::parallel_attention(std::int64_t positions) const {
  const std::int64_t kv_bytes = 2 * config_.num_key_value_heads * positions * config_.head_dim *
                                static_cast<std::int64_t>(sizeof(float));
  return config_.num_key_value_heads > 1 && kv_bytes >= kParallelAttentionBytes;
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
  if (streaming && parallel_attention(total)) {
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

at::Tensor LlamaModel::forward(const std::vector<TokenId>& ids, std::int64_t start_pos, KvCache* cache,
                               bool all_positions) const {
  const auto steps = static_cast<std::int64_t>(ids.size());
  check_request(ids.data(), steps, start_pos, cache);
  return forward_checked(ids.data(), steps, start_pos, cache, all_positions);
}

at::Tensor LlamaModel::forward_checked(const TokenId* ids, std::int64_t steps, std::int64_t start_pos, KvCache* cache,
                                       bool all_positions) const {
  if (row_exact_ && fast_kernels_enabled()) return forward_rows(ids, steps, start_pos, cache, all_positions);
  const bool streaming = fast_kernels_enabled() && steps <= streaming_rows_;
  enter_compute_phase(streaming ? ComputePhase::Streaming : ComputePhase::Parallel);

  const std::int64_t heads = config_.num_attention_heads, kv_heads = config_.num_key_value_heads;
  const std::int64_t head_dim = config_.head_dim, group = heads / kv_heads;
  const std::int64_t total = start_pos + steps;  // keys attended to

  at::Tensor token_ids = at::from_blob(const_cast<TokenId*>(ids), {steps}, at::kInt).to(at::kLong);
  at::Tensor x = weights_.embedding.rows(token_ids);  // [T, hidden] f32
  auto [cos, sin] = rope_.rows(start_pos, steps);

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
    attend(grouped_q, keys.to(at::kFloat), values.to(at::kFloat), mask, attended, streaming);
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

}  // namespace kvchat
